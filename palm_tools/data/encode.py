"""Subword encoding of line files with fairseq's own BPE classes, so that ``fairseq-generate --bpe ...`` decodes
exactly what was encoded: GPT-2 byte-level BPE (PALM and RoBERTa; ``encoder.json`` + ``vocab.bpe``), WordPiece
(converted BERT / UniLM checkpoints; their ``vocab.txt``) and sentencepiece (models trained from scratch).
Used as ``palm-prepare encode``.

WordPiece casing follows the vocabulary unless told otherwise (:func:`lower_case`); encoding that turns more than
1% of the words into ``[UNK]`` warns with the count and the likely cause."""
import json
import multiprocessing
import os
import signal
import sys
from argparse import Namespace
from pathlib import Path

from palm_plugin.tokenizer_files import (GPT2_ENCODER, GPT2_MERGES, HF_TOKENIZER, SENTENCEPIECE, SENTENCEPIECE_VOCAB,
                                         WORDPIECE, kind_mismatch)
from palm_tools.atomic_files import atomic_open
from palm_tools.text_files import not_utf8
from palm_tools.data.readers.common import ReaderError

_encoder = None


UNK_WARNING = 0.01


def lower_case(directory, vocab):
    """Whether text must be lower-cased for the WordPiece ``vocab`` (a list) of an HF or palm-convert directory, and
    where that was read: ``tokenizer_config.json``'s ``do_lower_case``, else ``tokenizer.json``'s normaliser, else
    the vocabulary itself (no upper-case WordPiece: uncased)."""
    directory = Path(directory)
    path = directory / "tokenizer_config.json"
    if path.is_file():
        value = json.loads(path.read_text(encoding="utf-8")).get("do_lower_case")
        if value is not None:
            return bool(value), f"{path} do_lower_case"
    path = directory / "tokenizer.json"
    if path.is_file():
        normalizer = json.loads(path.read_text(encoding="utf-8")).get("normalizer") or {}
        if "lowercase" in normalizer:
            return bool(normalizer["lowercase"]), f"{path} normalizer"
    words = [t for t in vocab if not (t.startswith("[") and t.endswith("]"))]
    cased = any(t != t.lower() for t in words)
    return not cased, "the vocabulary (" + ("has" if cased else "has no") + " upper-case WordPiece)"


def bpe_config(kind, model, vocab_bpe=None, cased=None):
    """The fairseq ``--bpe`` configuration for ``kind`` (gpt2, wordpiece or sentencepiece). WordPiece casing:
    ``cased``, or when None what :func:`lower_case` reads beside the vocabulary file."""
    if kind == "gpt2":
        if not vocab_bpe:
            raise ReaderError("gpt2 needs --model encoder.json and --vocab-bpe vocab.bpe")
        return Namespace(bpe="gpt2", gpt2_encoder_json=model, gpt2_vocab_bpe=vocab_bpe)
    if kind == "wordpiece":
        if cased is None:
            if os.path.isfile(model):
                check_kind(model, "--model", EXPECTED["bpe_vocab_file"][1], kind)
            try:
                vocab = Path(model).read_text(encoding="utf-8").split()
            except OSError as e:
                raise ReaderError(f"cannot read the WordPiece vocabulary {model}: {e.strerror}; pass the model's "
                                  "vocab.txt with --model (palm-convert writes one)") from e
            uncased, source = lower_case(Path(model).parent, vocab)
            cased = not uncased
            print(f"encode: {'cased' if cased else 'lower-cased'} WordPiece (from {source})", file=sys.stderr)
        return Namespace(bpe="bert", bpe_vocab_file=model, bpe_cased=cased)
    return Namespace(bpe="sentencepiece", sentencepiece_model=model, sentencepiece_enable_sampling=False,
                     sentencepiece_alpha=None)


# the file each option of each scheme takes: (configuration field, option, kind of file)
EXPECTED = {"gpt2_encoder_json": ("--model", GPT2_ENCODER), "gpt2_vocab_bpe": ("--vocab-bpe", GPT2_MERGES),
            "bpe_vocab_file": ("--model", WORDPIECE), "sentencepiece_model": ("--model", SENTENCEPIECE)}
# palm-prepare's scheme that takes each kind of file
SCHEME_OF = {GPT2_ENCODER: "--bpe gpt2", GPT2_MERGES: "--bpe gpt2 (as --vocab-bpe)", WORDPIECE: "--bpe wordpiece",
             SENTENCEPIECE: "--bpe sentencepiece",
             SENTENCEPIECE_VOCAB: "--bpe sentencepiece with the .model file beside it",
             HF_TOKENIZER: "--bpe wordpiece with the vocab.txt beside it (palm-convert writes one)"}


def build_encoder(config):
    from fairseq.data import encoders

    for field, (option, expected) in EXPECTED.items():
        path = getattr(config, field, None)
        if path is None:
            continue
        if not os.path.isfile(path):
            raise ReaderError(f"cannot read the {config.bpe} model file {path}; pass the model file the tokenizer was "
                              "trained into (--model)")
        check_kind(path, option, expected, config.bpe)
    return encoders.build_bpe(config)


def check_kind(path, option, expected, bpe):
    """Stop unless the file ``path`` given as ``option`` is ``expected`` (a kind :func:`palm_plugin.tokenizer_files.tokenizer_file_kind` names)."""
    try:
        mismatch = kind_mismatch(path, option, expected, bpe, SCHEME_OF)
    except OSError as e:  # a file that is there but cannot be read (its permissions)
        raise ReaderError(f"cannot read {option} {path}: {e.strerror}; give a file you can read") from e
    if mismatch:
        raise ReaderError(mismatch)


def _init_worker(config):
    global _encoder
    _encoder = build_encoder(config)


def _start_worker(config):
    """A pool worker: SIGTERM and SIGHUP end it, whatever handlers the parent had when it forked (the pool's
    terminate sends SIGTERM to a worker waiting on the task queue's lock, which the pool holds by then; a Python
    handler that does not exit, inherited from a host process, left that worker, and the parent joining it, waiting
    forever)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    _init_worker(config)


def _encode_line(line):
    """The encoded line, its words and how many of its pieces are [UNK]."""
    encoded = _encoder.encode(line.rstrip("\n"))
    return encoded, len(line.split()), encoded.split().count("[UNK]")


def encode_files(config, inputs, outputs, workers=1):
    """Encode each input file line by line into the matching output file (written to a temporary file, then
    renamed). Returns the number of lines of each file."""
    if len(inputs) != len(outputs):
        raise ReaderError(f"{len(inputs)} inputs but {len(outputs)} outputs: give one output per input")
    # an output that is an input (or another output) would replace text not yet read: refuse before writing
    seen = {os.path.realpath(path): f"input {path}" for path in inputs}
    for path in outputs:
        clash = seen.get(os.path.realpath(path))
        if clash:
            raise ReaderError(f"output {path} is also {clash}: it would be overwritten; give each output its own "
                              "new file name")
        seen[os.path.realpath(path)] = f"output {path}"
    counts = []
    _init_worker(config)
    with multiprocessing.Pool(workers, _start_worker, (config,)) if workers > 1 else _Serial() as pool:
        for source, target in zip(inputs, outputs):
            try:
                with open(source, encoding="utf-8-sig") as f, atomic_open(target) as out:  # -sig: no BOM piece
                    lines = words = unknown = 0
                    for encoded, line_words, line_unknown in pool.imap(_encode_line, f, chunksize=256):
                        out.write(encoded + "\n")
                        lines += 1
                        words += line_words
                        unknown += line_unknown
            except OSError as e:
                raise ReaderError(f"cannot encode {source}: {e.strerror}") from e
            except UnicodeDecodeError as e:
                what, todo = not_utf8(source)
                raise ReaderError(f"{source} is {what} ({e.reason} at byte {e.start}); {todo}") from e
            counts.append(lines)
            if unknown > UNK_WARNING * words:
                print(_unknown_warning(config, source, unknown, words), file=sys.stderr)
    return counts


def _unknown_warning(config, source, unknown, words):
    cause = ("the vocabulary has no piece for some characters or scripts of the text"
             if not hasattr(config, "bpe_cased") else
             f"the text was encoded {'cased' if config.bpe_cased else 'lower-cased'}; if the vocabulary is "
             f"{'uncased, pass --uncased' if config.bpe_cased else 'cased, pass --cased'} (otherwise the vocabulary "
             "lacks pieces for some characters of the text)")
    return (f"warning: {source}: {unknown} of {words} words ({100 * unknown / max(words, 1):.1f}%) became [UNK]; "
            f"likely cause: {cause}")


class _Serial:
    """The one-process stand-in for ``multiprocessing.Pool`` (same ``imap``, a context manager)."""

    def imap(self, function, iterable, chunksize=1):
        return map(function, iterable)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
