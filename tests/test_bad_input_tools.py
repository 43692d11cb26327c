"""The tools' bad inputs that no other test tries, one table per tool: each case writes its files, runs the tool's
``main`` in this process, and checks the exit status, the last line of the error (what, where, what to do) and that
the tool wrote nothing (every file it was given is unchanged, and no other file appeared)."""
import gzip
import json
import re
import sys
import zipfile

import pytest
import torch

from palm_tools.convert import cli as convert
from palm_tools.data import prepare
from palm_tools.scoring import cli as score


def lines(*rows):
    return "".join(f"{row}\n" for row in rows)


# (id, {file: text}, arguments with {tmp} for the folder, last line of stderr as a regex)
SCORE_CASES = [
    ("rouge-two-refs", {"h": "a b\n", "r1": "a b\n", "r2": "a c\n"}, ["rouge", "--hyp", "{tmp}/h", "--ref", "{tmp}/r1",
                                                                     "--ref", "{tmp}/r2"],
     r"rouge takes exactly one --ref \(summarisation has one reference per example\)$"),
    ("generate-without-hypotheses", {"g": lines("S-0\ta b", "T-0\ta b")}, ["bleu", "--generate", "{tmp}/g"],
     r"{tmp}/g holds no H-/D- lines: is it the output of fairseq-generate\?$"),
    ("generate-without-targets", {"g": lines("S-0\ta b", "H-0\t-0.5\ta b", "D-0\t-0.5\ta b")},
     ["bleu", "--generate", "{tmp}/g"], r"{tmp}/g has no T- line for sample 0: pass the references with --ref$"),
    ("empty-hypotheses", {"h": "", "r": ""}, ["bleu", "--hyp", "{tmp}/h", "--ref", "{tmp}/r"], r"{tmp}/h is empty$"),
    ("positional-scores-not-numbers", {"g": lines("S-0\ta b", "T-0\ta b", "H-0\t-0.5\ta b", "P-0\t-0.1 x")},
     ["ppl", "--generate", "{tmp}/g"], r"{tmp}/g:4: a P- line must hold numbers: "),
    ("out-a-folder", {"h": "a b\n", "r": "a b\n"}, ["bleu", "--hyp", "{tmp}/h", "--ref", "{tmp}/r", "--out", "{tmp}"],
     r"--out {tmp} is a folder: give a file name \(e\.g\. {tmp}/out\.txt\)$"),
]


@pytest.mark.parametrize("files, arguments, message", [c[1:] for c in SCORE_CASES], ids=[c[0] for c in SCORE_CASES])
def test_palm_score(files, arguments, message, tmp_path, capsys):
    assert_refused(score.main, files, arguments, message, tmp_path, capsys, prefix="palm-score: error: ")


def test_palm_score_not_utf8(tmp_path, capsys):
    (tmp_path / "r").write_text("a b\n")
    (tmp_path / "h").write_bytes("caf\xe9\n".encode("latin-1"))
    assert score.main(["bleu", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"palm-score: error: {tmp_path}/h is not valid UTF-8 (invalid continuation byte at byte 3); convert it from "
        f"the encoding it was written in, e.g. `iconv -f latin1 -t utf-8 {tmp_path}/h > {tmp_path}/h.utf8.txt`")
    (tmp_path / "h").write_bytes(gzip.compress(b"a b\n"))  # the advice leads to the right next step
    assert score.main(["bleu", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"palm-score: error: {tmp_path}/h is gzip-compressed, not UTF-8 text (invalid start byte at byte 1); first "
        f"run `gunzip -k {tmp_path}/h` and give the text")


PREPARE_CASES = [
    ("coqa-without-data", {"c.json": json.dumps({"version": 1})}, ["coqa", "--json", "{tmp}/c.json", "--out",
                                                                  "{tmp}/out"],
     r"{tmp}/c.json: missing field 'data' \(is it a CoQA file\?\); palm-prepare reads each benchmark's files as "
     r"released .* use the original file"),
    ("coqa-more-questions", {"c.json": json.dumps({"data": [{"id": "x", "story": "s", "questions": [
        {"input_text": "q1", "turn_id": 1}, {"input_text": "q2", "turn_id": 2}], "answers": [
        {"input_text": "a1", "turn_id": 1}]}]})}, ["coqa", "--json", "{tmp}/c.json", "--out", "{tmp}/out"],
     r"{tmp}/c.json: conversation x: 2 questions but 1 answers; .* use the original file"),
    ("msmarco-without-column", {"m.json": json.dumps({"query": {"0": "q"}, "passages": {"0": []}})},
     ["msmarco", "--json", "{tmp}/m.json", "--out", "{tmp}/out"],
     r"{tmp}/m.json: missing column 'answers' \(is it an MS MARCO v2.1 file with answers\?\); .* use the original"),
    ("cornell-malformed-line", {"l.txt": lines("L1 +++$+++ u0 +++$+++ m0 +++$+++ A +++$+++ Hello there."),
                                "c.txt": lines("u0 +++$+++ u1 +++$+++ m0")},
     ["cornell", "--lines", "{tmp}/l.txt", "--conversations", "{tmp}/c.txt", "--out-dir", "{tmp}/out"],
     r"{tmp}/c.txt:1: expected 4 fields separated by '\+\+\+\$\+\+\+', .* use the original file"),
    ("xsum-split-not-json", {"split.json": "{not json", "d/1.summary": "x"},
     ["xsum", "--data-dir", "{tmp}/d", "--split-file", "{tmp}/split.json", "--split", "test", "--out", "{tmp}/out"],
     r"{tmp}/split.json is not JSON: .*; .* use the original file"),
    ("cornell-too-few-pairs", {"l.txt": lines("L1 +++$+++ u0 +++$+++ m0 +++$+++ A +++$+++ Hello there friend.",
                                              "L2 +++$+++ u1 +++$+++ m0 +++$+++ B +++$+++ Hi to you too."),
                               "c.txt": lines("u0 +++$+++ u1 +++$+++ m0 +++$+++ ['L1', 'L2']")},
     ["cornell", "--lines", "{tmp}/l.txt", "--conversations", "{tmp}/c.txt", "--out-dir", "{tmp}/out"],
     r"only 1 pairs: cannot hold out 10000 \+ 20000 for valid and test"),
]


@pytest.mark.parametrize("files, arguments, message", [c[1:] for c in PREPARE_CASES], ids=[c[0] for c in PREPARE_CASES])
def test_palm_prepare(files, arguments, message, tmp_path, capsys):
    assert_refused(prepare.main, files, arguments, message, tmp_path, capsys, prefix="palm-prepare: error: ")


def test_palm_prepare_gpt2_without_merges(tmp_path, capsys):
    """argparse cannot require --vocab-bpe for one --bpe only: the check names the option."""
    assert_refused(prepare.main, {"encoder.json": "{}", "t.txt": "a\n"},
                   ["encode", "--bpe", "gpt2", "--model", "{tmp}/encoder.json", "--inputs", "{tmp}/t.txt", "--outputs",
                    "{tmp}/t.bpe"], r"gpt2 needs --model encoder.json and --vocab-bpe vocab.bpe$", tmp_path, capsys,
                   prefix="palm-prepare: error: ")


def _safetensors(path):
    from safetensors.torch import save_file

    save_file({"embeddings.word_embeddings.weight": torch.zeros(1, 2)}, str(path))
    return path.read_bytes()


def torch_file(path, value):
    torch.save(value, path)
    return path.read_bytes()


CONVERT_CASES = [
    ("bert-input-a-plain-file", {"model.txt": "weights"}, ["bert", "--input", "{tmp}/model.txt", "--output",
                                                           "{tmp}/out"],
     r"^error: .*{tmp}/model.txt"),
    ("bert-config-not-json", {"hf/config.json": "{nope", "hf/vocab.txt": "[PAD]\n",
                              "hf/model.safetensors": lambda p: _safetensors(p)},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"], r"^error: {tmp}/hf/config.json"),
    ("bert-weights-not-a-pickle", {"hf/config.json": "{}", "hf/vocab.txt": "[PAD]\n", "hf/pytorch_model.bin": "x"},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/pytorch_model.bin: cannot read this file as a torch checkpoint: it is truncated or corrupt "
     r"\(torch: UnpicklingError: .*\)\. Copy it again"),
    ("export-not-a-plugin-checkpoint", {"x.pt": lambda p: torch_file(p, {"weights": torch.zeros(2)})},
     ["export", "--input", "{tmp}/x.pt", "--output", "{tmp}/out"],
     r"^error: {tmp}/x.pt: not a fairseq checkpoint of the plugin \(no cfg / model\)"),
    ("export-corrupt", {"c.pt": lambda p: torch_file(p, {"w": torch.zeros(100)})[:60]},
     ["export", "--input", "{tmp}/c.pt", "--output", "{tmp}/out"],
     r"^error: {tmp}/c.pt: cannot read this file as a torch checkpoint: it is truncated or corrupt \(torch: .*\)\. "
     r"Copy it again .*complete\)$"),
]


@pytest.mark.parametrize("files, arguments, message", [c[1:] for c in CONVERT_CASES], ids=[c[0] for c in CONVERT_CASES])
def test_palm_convert(files, arguments, message, tmp_path, capsys):
    def run(argv):
        with pytest.raises(SystemExit) as stopped:
            convert.main(argv)
        print(stopped.value.code, file=sys.stderr)  # where SystemExit prints its message
        return 1 if stopped.value.code else 0

    assert_refused(run, files, arguments, message, tmp_path, capsys, prefix="")


def test_palm_convert_zip_without_config(tmp_path, capsys):
    with zipfile.ZipFile(tmp_path / "model.zip", "w") as archive:
        archive.writestr("model/vocab.txt", "[PAD]\n")
    before = (tmp_path / "model.zip").read_bytes()
    with pytest.raises(SystemExit) as stopped:
        convert.main(["bert", "--input", str(tmp_path / "model.zip"), "--output", str(tmp_path / "out")])
    assert str(stopped.value.code).startswith(f"error: {tmp_path}/model.zip") and "config.json" in stopped.value.code
    assert (tmp_path / "model.zip").read_bytes() == before and not (tmp_path / "out").exists()


def assert_refused(main, files, arguments, message, tmp_path, capsys, prefix):
    """Write ``files`` (text, or a function of the path that writes it and returns its bytes) under ``tmp_path``, run
    ``main`` with ``arguments``: exit 1, the last line of stderr is ``prefix`` + ``message`` (a regex with {tmp}),
    every given file unchanged and no other file written."""
    written = {}
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content = content(path)
            path.write_bytes(content)
        else:
            path.write_text(content)
        written[path] = path.read_bytes()
    assert main([a.format(tmp=tmp_path) for a in arguments]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(prefix + message.replace("{tmp}", re.escape(str(tmp_path))), last), last
    assert {p: p.read_bytes() for p in written} == written
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(written)


def test_palm_plot_on_a_missing_log_names_it_and_what_to_give(tmp_path):
    from palm_tools.plot import main

    missing = tmp_path / "train.log"
    with pytest.raises(SystemExit) as stopped:
        main([str(missing), "-o", str(tmp_path / "curves.png")])
    assert str(stopped.value) == (f"palm-plot: {missing}: no such file or folder; give the log fairseq-train wrote (its "
                                  f"output, e.g. fairseq-train ... 2>&1 | tee train.log, or --log-file FILE) or its "
                                  f"--tensorboard-logdir folder")
    assert not (tmp_path / "curves.png").exists()
