"""Data preparation for the experiments: the chitchat generation and selection data (and the converted MiniLM
with its WordPiece copy of them) under WORK/prepared, each folder built once."""
import hashlib
import json
import os
import random
import shutil
import sys

from palm_tools.atomic_files import atomic_open
from palm_tools.experiments.logged_run import run_checked
from palm_tools.experiments.rows import REAL_MODELS, SEL


# palm-data's chitchat pairs that prepare reads: in its pieces (they choose the test pairs) and as raw text
PAIR_FILES = tuple(f"{form}/{split}.{side}" for form in ("tok", "raw") for split in (
    "chitchat10k.train", "chitchat.valid", "chitchat.test") for side in ("src", "tgt"))
# the files of the data folder the runs read (each that exists, recorded by check_data_files): the dictionary, the
# fine-tuning pairs in both forms, the pre-training text
DATA_FILES = ("dict.txt", *PAIR_FILES, "bin/pretrain/train.bin", "bin/sotu/train.bin", "pretrain/train.txt")


def _stage(folder, build):
    """Build ``folder`` in a temporary sibling and rename it when complete; reuse it when it exists."""
    if folder.exists():
        return
    temporary = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    build(temporary)
    temporary.rename(folder)


def _fits(source, target, scale):
    """Pairs every family reads uncut: UniLM adds [SOS] and two [EOS], translation one [EOS] per side."""
    return 0 < len(source.split()) <= scale.max_source - 2 and 0 < len(target.split()) <= scale.max_target - 2


def _pairs(folder, split):
    return list(zip(*((folder / f"chitchat.{split}.{side}").read_text().splitlines() for side in ("src", "tgt"))))


def choose_pairs(tok, scale):
    """Indices of the random test and valid pairs both tasks evaluate on, and of the selection training pairs."""
    rng = random.Random(1)
    chosen = {}
    for split, count in (("test", scale.eval_pairs), ("valid", scale.eval_pairs)):
        fitting = [i for i, (s, t) in enumerate(_pairs(tok, split)) if _fits(s, t, scale)]
        chosen[split] = sorted(rng.sample(fitting, min(count, len(fitting))))
    train = list(zip(*((tok / f"chitchat10k.train.{side}").read_text().splitlines() for side in ("src", "tgt"))))
    fitting = [i for i, (s, t) in enumerate(train) if _fits(s, t, scale)]
    chosen["train"] = sorted(rng.sample(fitting, min(scale.select_train_pairs, len(fitting))))
    return chosen


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def _selection_examples(pairs, seed):
    """(context, candidate, label): each context with its real reply and with the reply of another random pair."""
    rng = random.Random(seed)
    examples = []
    for i, (context, reply) in enumerate(pairs):
        other = rng.randrange(len(pairs) - 1)
        other += other >= i
        examples += [(context, reply, "1"), (context, pairs[other][1], "0")]
    rng.shuffle(examples)
    return examples


def inputs(plan):
    """The files of the data folder ``prepare`` reads for this plan (palm-data builds them when one is missing): the
    chitchat pairs in palm-data's pieces (they choose the test pairs) and as raw text; palm-data's dictionary and
    pre-training text for rows in its pieces; for real-weights pre-trainings, the raw pre-training text unless
    WORK/prepared already holds it in WordPiece (a card is given that, not palm-data's output)."""
    names = list(PAIR_FILES)
    rows = [row for e in plan.experiments for row in e.rows]
    if any(row.model not in REAL_MODELS for row in rows):
        names += ["dict.txt", "bin/sotu/train.bin", str(plan.pretrain_text.relative_to(plan.data) / "train.bin")
                  if plan.pretrain_text.is_relative_to(plan.data) else None]
    if (any(row.pretrain and row.pretrain != "minilm" for row in rows if row.model in REAL_MODELS)
            and not plan.wordpiece_pretrain_text.exists()):
        names.append("pretrain/train.txt" if plan.scale.corpus == "all" else "raw/sotu.train.txt")
    return list(dict.fromkeys(name for name in names if name))


def prepare(plan, log):
    """Data folders the runs read, under WORK/prepared (each built once): chitchat generation and selection data in
    the sentencepiece dictionary of palm-data, and (when the real-weights table is planned) the converted MiniLM
    with the same pairs in its WordPiece vocabulary."""
    scale, data, out = plan.scale, plan.data, plan.prepared
    corpus = ["--pretraining-corpus", "all"] if scale.corpus == "all" and not scale.pretrain_data else []
    if any(not (data / name).exists() for name in inputs(plan)):
        run_checked("palm-data", ["--out", data, *corpus], log)  # reuses the stages it finds complete
    out.mkdir(parents=True, exist_ok=True)
    chosen = choose_pairs(data / "tok", scale)
    lines = {"train": list(zip(*((data / "tok" / f"chitchat10k.train.{side}").read_text().splitlines()
                                 for side in ("src", "tgt"))))}
    lines.update({split: _pairs(data / "tok", split) for split in ("valid", "test")})
    raw = {"train": list(zip(*((data / "raw" / f"chitchat10k.train.{side}").read_text().splitlines()
                               for side in ("src", "tgt"))))}
    raw.update({split: _pairs(data / "raw", split) for split in ("valid", "test")})

    def text_files(folder, source):
        """gen: all 10K training pairs, the chosen valid/test pairs; sel: the chosen pairs as selection examples."""
        for side, column in (("src", 0), ("tgt", 1)):
            _write(folder / f"train.{side}", [p[column] for p in source["train"]])
            for split in ("valid", "test"):
                _write(folder / f"{split}.{side}", [source[split][i][column] for i in chosen[split]])
        for split in ("train", "valid", "test"):
            examples = _selection_examples([source[split][i] for i in chosen[split]], seed=len(split))
            for name, column in (("input0", 0), ("input1", 1), ("label", 2)):
                _write(folder / f"sel.{split}.{name}", [e[column] for e in examples])

    # the selection data only when a table has the task, palm-data's pieces only when a row is not real-weights
    selection = any(SEL in e.tasks for e in plan.experiments)

    def binarize(folder, text, dictionary, vocab):
        def gen(target):
            run_checked("fairseq-preprocess", ["--source-lang", "src", "--target-lang", "tgt", "--trainpref",
                                               text / "train", "--validpref", text / "valid", "--testpref",
                                               text / "test", "--srcdict", dictionary, "--tgtdict", dictionary,
                                               "--destdir", target, "--workers", 1], log)
        _stage(out / f"gen-{vocab}", gen)
        if not selection:
            return

        def sel(target):
            for name in ("input0", "input1", "label"):
                known = ["--srcdict", dictionary] if name != "label" else []
                run_checked("fairseq-preprocess", ["--only-source", "--trainpref", text / f"sel.train.{name}",
                                                   "--validpref", text / f"sel.valid.{name}", "--testpref",
                                                   text / f"sel.test.{name}", *known, "--destdir", target / name,
                                                   "--workers", 1], log)
        _stage(out / f"sel-{vocab}-plain", sel)
        # pmlm adds <pseudo> after <mask>: the same binaries with a dictionary that has it (appended rows keep ids)
        plain = out / f"sel-{vocab}-plain"

        def pseudo(target):
            for item in plain.rglob("*"):
                if item.is_file():
                    (target / item.relative_to(plain)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(item, target / item.relative_to(plain))
            with open(target / "input0" / "dict.txt", "a") as handle:
                handle.write("<pseudo> 0\n")
        _stage(out / f"sel-{vocab}-pseudo", pseudo)

    def spm_text(folder):
        text_files(folder, lines)
    if any(row.model not in REAL_MODELS for e in plan.experiments for row in e.rows):
        _stage(out / "text-spm", spm_text)
        binarize(out, out / "text-spm", data / "dict.txt", "spm")

    if any(row.model in REAL_MODELS for e in plan.experiments for row in e.rows) and not plan.minilm_missing:
        try:
            _stage(plan.minilm_dir, lambda target: run_checked(
                "palm-convert", ["bert", "--input", plan.minilm_source, "--output", target], log))
        except RuntimeError as error:  # the real-weights rows say why; the other tables go on
            plan.minilm_missing = f"palm-convert bert failed: {str(error).splitlines()[0]}"
            return

        def wordpiece_text(folder):
            text_files(folder, raw)
            names = [p for p in sorted(folder.iterdir())]
            run_checked("palm-prepare", ["encode", "--bpe", "wordpiece", "--model", plan.minilm_dir / "vocab.txt",
                                         "--inputs", *names, "--outputs",
                                         *[folder / ("wp." + p.name) for p in names]], log)
            for p in names:
                os.replace(folder / ("wp." + p.name), p)
        _stage(out / "text-wordpiece", wordpiece_text)
        binarize(out, out / "text-wordpiece", plan.minilm_dir / "dict.txt", "wordpiece")
        if any(row.pretrain and row.pretrain != "minilm" for e in plan.experiments for row in e.rows
               if row.model in REAL_MODELS):
            _stage(plan.wordpiece_pretrain_text, lambda target: wordpiece_pretraining_text(plan, target, log))


def wordpiece_pretraining_text(plan, target, log):
    """The pre-training corpus's raw text (documents separated by blank lines) in the real checkpoint's WordPiece
    vocabulary, binarized with its dictionary: what every continued pre-training of the real-weights table reads."""
    raw = plan.data / "pretrain" / "train.txt" if plan.scale.corpus == "all" else plan.data / "raw" / "sotu.train.txt"
    run_checked("palm-prepare", ["encode", "--bpe", "wordpiece", "--model", plan.minilm_dir / "vocab.txt",
                                 "--inputs", raw, "--outputs", target / "train.wp"], log)
    run_checked("fairseq-preprocess", ["--only-source", "--trainpref", target / "train.wp", "--srcdict",
                                       plan.minilm_dir / "dict.txt", "--destdir", target, "--workers", 2], log)
    (target / "train.wp").unlink()


def check_data_files(plan, record_new=True):
    """A work folder keeps the sha256 of the data files its runs were made from (WORK/data.json), as it keeps their
    scale: palm-data's output changes with its version and its packages' (sotu's split did), and a later seed made
    from other text under the same folder name would be averaged with the first ones unseen. Files recorded on one
    side only are added (a record from before a file existed), unless ``record_new`` is False (``--plan-only``,
    which writes nothing)."""
    record = plan.work / "data.json"
    made = json.loads(record.read_text()) if record.exists() else {}
    now = {}
    for name in DATA_FILES:
        path = plan.data / name
        if path.exists():
            with open(path, "rb") as handle:
                now[name] = hashlib.file_digest(handle, "sha256").hexdigest()
    changed = sorted(name for name in set(made) & set(now) if made[name] != now[name])
    if changed:
        sys.exit(f"palm-experiments: {plan.work}'s runs were made from other data than {plan.data} ({', '.join(changed)} "
                 f"differ from the sha256 in {record}); give the data folder they were made with, or another --work "
                 f"folder")
    if record_new and now.keys() - made.keys():
        with atomic_open(record) as handle:
            json.dump(dict(sorted({**made, **now}.items())), handle, indent=1)
