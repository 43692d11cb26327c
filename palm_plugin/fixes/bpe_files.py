"""A tokenizer file of another scheme given to fairseq's ``--bpe`` ends in a traceback deep in the tokenizer.

``fairseq-interactive --bpe sentencepiece --sentencepiece-model vocab.txt`` (a WordPiece vocabulary, which a
converted BERT-family checkpoint comes with) stops in sentencepiece's ``could not parse ModelProto``; the reverse,
a sentencepiece model as ``--bpe-vocab-file``, in a ``UnicodeDecodeError``; a missing file in sentencepiece's or
transformers' own words. The same happens to the Python API (``from_pretrained(..., bpe=...)``), which builds its
BPE through the same function.

:func:`install` wraps ``fairseq.data.encoders.build_bpe`` (``fairseq-generate``, ``fairseq-interactive`` and the
hub interface all build there): before fairseq reads a local file named by the chosen scheme's options, the file is
checked (:mod:`palm_plugin.tokenizer_files`) and a file of another kind stops the command with what it is and which
options take it. URLs (fairseq's GPT-2 defaults) are left to fairseq's download.
"""
import functools
import os
from argparse import Namespace

from omegaconf import DictConfig

from palm_plugin.errors import CommandError
from palm_plugin.tokenizer_files import FAIRSEQ_FILES, FAIRSEQ_SCHEME_OF, kind_mismatch


class TokenizerFileError(CommandError):
    """A ``--bpe`` option names a file that is missing or of another tokenizer scheme."""


def _is_url(path):
    return "://" in path


def check_bpe_files(cfg):
    """Stop with one line if a file option of the BPE scheme ``cfg`` chooses is missing or of another kind."""
    if isinstance(cfg, DictConfig):
        choice = cfg.get("_name")
    elif isinstance(cfg, Namespace):
        choice = getattr(cfg, "bpe", None)
    else:
        return  # a bare name: the scheme's defaults
    for field, (option, expected) in FAIRSEQ_FILES.get(choice, {}).items():
        path = getattr(cfg, field, None)
        if not path or _is_url(str(path)):
            continue
        path = str(path)
        if not os.path.isfile(path):
            raise TokenizerFileError(f"{option} {path}: no such file; give {expected}, the one the text was "
                                     f"encoded with (--bpe {choice})")
        mismatch = kind_mismatch(path, option, expected, choice, FAIRSEQ_SCHEME_OF)
        if mismatch:
            raise TokenizerFileError(mismatch)


def install():
    from fairseq.data import encoders

    if getattr(encoders.build_bpe, "__palm_plugin__", False):
        return
    original = encoders.build_bpe

    @functools.wraps(original)
    def build_bpe_checking_files(cfg, *args, **kwargs):
        check_bpe_files(cfg)
        return original(cfg, *args, **kwargs)

    build_bpe_checking_files.__palm_plugin__ = True
    encoders.build_bpe = build_bpe_checking_files
