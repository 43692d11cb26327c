"""Subword encoding of line files with fairseq's own BPE classes, so that ``fairseq-generate --bpe ...`` decodes
exactly what was encoded: GPT-2 byte-level BPE (PALM and RoBERTa; ``encoder.json`` + ``vocab.bpe``), WordPiece
(converted BERT / UniLM checkpoints; their ``vocab.txt``) and sentencepiece (models trained from scratch).
Used as ``palm-prepare encode``."""
import multiprocessing
import os
from argparse import Namespace

from palm_tools.atomic_files import atomic_open
from palm_tools.readers.common import ReaderError

_encoder = None


def bpe_config(kind, model, vocab_bpe=None, cased=True):
    """The fairseq ``--bpe`` configuration for ``kind`` (gpt2, wordpiece or sentencepiece)."""
    if kind == "gpt2":
        if not vocab_bpe:
            raise ReaderError("gpt2 needs --model encoder.json and --vocab-bpe vocab.bpe")
        return Namespace(bpe="gpt2", gpt2_encoder_json=model, gpt2_vocab_bpe=vocab_bpe)
    if kind == "wordpiece":
        return Namespace(bpe="bert", bpe_vocab_file=model, bpe_cased=cased)
    return Namespace(bpe="sentencepiece", sentencepiece_model=model, sentencepiece_enable_sampling=False,
                     sentencepiece_alpha=None)


def build_encoder(config):
    from fairseq.data import encoders

    for path in (getattr(config, name, None) for name in ("gpt2_encoder_json", "gpt2_vocab_bpe", "bpe_vocab_file",
                                                          "sentencepiece_model")):
        if path is not None and not os.path.isfile(path):
            raise ReaderError(f"cannot read the {config.bpe} model file {path}")
    return encoders.build_bpe(config)


def _init_worker(config):
    global _encoder
    _encoder = build_encoder(config)


def _encode_line(line):
    return _encoder.encode(line.rstrip("\n"))


def encode_files(config, inputs, outputs, workers=1):
    """Encode each input file line by line into the matching output file (written to a temporary file, then
    renamed). Returns the number of lines of each file."""
    if len(inputs) != len(outputs):
        raise ReaderError(f"{len(inputs)} inputs but {len(outputs)} outputs: give one output per input")
    counts = []
    _init_worker(config)
    with multiprocessing.Pool(workers, _init_worker, (config,)) if workers > 1 else _Serial() as pool:
        for source, target in zip(inputs, outputs):
            try:
                with open(source, encoding="utf-8") as f, atomic_open(target) as out:
                    lines = 0
                    for encoded in pool.imap(_encode_line, f, chunksize=256):
                        out.write(encoded + "\n")
                        lines += 1
            except OSError as e:
                raise ReaderError(f"cannot encode {source}: {e.strerror}") from e
            except UnicodeDecodeError as e:
                raise ReaderError(f"{source} is not UTF-8 text ({e.reason} at byte {e.start})") from e
            counts.append(lines)
    return counts


class _Serial:
    """The one-process stand-in for ``multiprocessing.Pool`` (same ``imap``, a context manager)."""

    def imap(self, function, iterable, chunksize=1):
        return map(function, iterable)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
