"""What kind of tokenizer file a path holds, read from its content.

A file of another scheme given by mistake (a WordPiece ``vocab.txt`` where a sentencepiece model goes, and the
reverse) would otherwise fail deep inside the tokenizer library (``could not parse ModelProto``,
``UnicodeDecodeError``) or encode every word as [UNK]. ``palm-prepare encode`` and fairseq's ``--bpe`` options
(:mod:`palm_plugin.fixes.bpe_files`) check their files with :func:`tokenizer_file_kind` and name the scheme that
takes the file.
"""
import json
from pathlib import Path

SENTENCEPIECE = "a sentencepiece model"
SENTENCEPIECE_VOCAB = "a sentencepiece .vocab"
WORDPIECE = "a WordPiece vocab.txt"
GPT2_ENCODER = "a GPT-2 encoder.json"
GPT2_MERGES = "GPT-2 merges (vocab.bpe)"
HF_TOKENIZER = "an HF tokenizer.json"

# fairseq's --bpe options: the scheme that takes each kind of file, as fairseq's options name it
FAIRSEQ_SCHEME_OF = {
    WORDPIECE: "--bpe bert --bpe-vocab-file FILE",
    SENTENCEPIECE: "--bpe sentencepiece --sentencepiece-model FILE",
    GPT2_ENCODER: "--bpe gpt2 --gpt2-encoder-json FILE",
    GPT2_MERGES: "--bpe gpt2 --gpt2-vocab-bpe FILE",
    SENTENCEPIECE_VOCAB: "--bpe sentencepiece with the .model file beside it",
    HF_TOKENIZER: "--bpe bert with the vocab.txt beside it (palm-convert writes one)",
}
# fairseq's BPE name -> its configuration fields that name a file, with their option and the kind they take
FAIRSEQ_FILES = {
    "sentencepiece": {"sentencepiece_model": ("--sentencepiece-model", SENTENCEPIECE)},
    "bert": {"bpe_vocab_file": ("--bpe-vocab-file", WORDPIECE)},
    "gpt2": {"gpt2_encoder_json": ("--gpt2-encoder-json", GPT2_ENCODER),
             "gpt2_vocab_bpe": ("--gpt2-vocab-bpe", GPT2_MERGES)},
}


def tokenizer_file_kind(path):
    """One of the kinds above, or what else the file is ("a binary file", "a text file", ...)."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text[:4096]:
        import sentencepiece

        try:
            sentencepiece.SentencePieceProcessor(model_file=str(path))
            return SENTENCEPIECE
        except (RuntimeError, OSError):
            return "a binary file"
    head = text.lstrip()
    if head.startswith("{"):
        try:
            content = json.loads(text)
        except ValueError:
            return "a file that is not valid JSON"
        return HF_TOKENIZER if isinstance(content, dict) and "model" in content else GPT2_ENCODER
    if head.startswith("#version"):
        return GPT2_MERGES
    lines = [line for line in text.split("\n")[:1000] if line]
    if lines and all("\t" in line for line in lines):
        return SENTENCEPIECE_VOCAB
    if lines and all(" " not in line.strip() for line in lines):
        return WORDPIECE
    return "a text file"


def kind_mismatch(path, option, expected, bpe, scheme_of):
    """The sentence that says ``path`` (given as ``option`` of ``--bpe bpe``) is not ``expected`` and which scheme
    (``scheme_of``: kind -> options) takes it; None when it is ``expected``."""
    kind = tokenizer_file_kind(path)
    if kind == expected:
        return None
    scheme = scheme_of.get(kind)
    return (f"{option} {path} is {kind}, but --bpe {bpe} takes {expected} there; "
            + (f"for this file pass {scheme.replace('FILE', str(path))}" if scheme else f"pass {expected}"))
