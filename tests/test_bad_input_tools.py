"""The tools' bad inputs that no other test tries, one table per tool: each case writes its files, runs the tool's
``main`` in this process, and checks the exit status, the last line of the error (what, where, what to do) and that
the tool wrote nothing (every file it was given is unchanged, and no other file appeared)."""
import errno
import gzip
import json
import os
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


BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


# (id, {file: text}, arguments with {tmp} for the folder, last line of stderr as a regex)
SCORE_CASES = [
    ("rouge-two-refs", {"h": "a b\n", "r1": "a b\n", "r2": "a c\n"}, ["rouge", "--hyp", "{tmp}/h", "--ref", "{tmp}/r1",
                                                                     "--ref", "{tmp}/r2"],
     r"rouge takes exactly one --ref \(summarisation has one reference per example\)$"),
    ("generate-without-hypotheses", {"g": lines("S-0\ta b", "T-0\ta b")}, ["bleu", "--generate", "{tmp}/g"],
     r"{tmp}/g holds no H-/D- lines: is it the output of fairseq-generate\?$"),
    ("generate-without-targets", {"g": lines("S-0\ta b", "H-0\t-0.5\ta b", "D-0\t-0.5\ta b")},
     ["bleu", "--generate", "{tmp}/g"], r"{tmp}/g has no T- line for sample 0: pass the references with --ref$"),
    ("hypotheses-without-references", {"h": "a b\n"}, ["bleu", "--hyp", "{tmp}/h"],
     r"give --hyp FILE and --ref FILE, or --generate FILE \(fairseq-generate output\)$"),
    ("empty-hypotheses", {"h": "", "r": ""}, ["bleu", "--hyp", "{tmp}/h", "--ref", "{tmp}/r"], r"{tmp}/h is empty$"),
    ("positional-scores-not-numbers", {"g": lines("S-0\ta b", "T-0\ta b", "H-0\t-0.5\ta b", "P-0\t-0.1 x")},
     ["ppl", "--generate", "{tmp}/g"], r"{tmp}/g:4: a P- line must hold numbers: "),
    ("out-a-folder", {"h": "a b\n", "r": "a b\n"}, ["bleu", "--hyp", "{tmp}/h", "--ref", "{tmp}/r", "--out", "{tmp}"],
     r"--out {tmp} is a folder: give a file name \(e\.g\. {tmp}/out\.txt\)$"),
    ("out-under-a-file", {"h": "a b\n", "r": "a b\n"}, ["bleu", "--hyp", "{tmp}/h", "--ref", "{tmp}/r", "--out",
                                                        "{tmp}/h/scores.json"],
     r"--out {tmp}/h/scores.json: {tmp}/h is a file, not a folder; give a path in a folder$"),
    ("generate-sample-past-the-references", {"g": lines("S-2\ta", "H-2\t-0.5\ta b", "D-2\t-0.5\ta b"),
                                             "r": lines("a b", "c")},
     ["bleu", "--generate", "{tmp}/g", "--ref", "{tmp}/r"],
     r"{tmp}/g has sample id 2 but {tmp}/r has 2 lines: --ref must be the references of the split fairseq-generate "
     r"ran on \(its --gen-subset\), one example a line$"),
    ("validation-line-without-loss", {"log": "epoch 001 | valid on 'valid' subset | ppl 3.2 | wps 100\n"},
     ["ppl", "--log", "{tmp}/log"],
     r"{tmp}/log: the last 'valid' line logs no loss \(it logs ppl, wps\); give the log as fairseq-validate or "
     r"fairseq-train wrote it$"),
    ("rougel-references-all-empty", {"h": "a b\n", "r1": " \n", "r2": "\n"},
     ["rougel", "--hyp", "{tmp}/h", "--ref", "{tmp}/r1", "--ref", "{tmp}/r2"],
     r"example 1 \(line 1 of each --ref\) has no non-empty reference: give it one, or leave the example out of --hyp "
     r"and every --ref$"),
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


@pytest.mark.parametrize("missing", ["jar", "java"])
def test_palm_score_meteor_without_its_jar_or_java(missing, tmp_path, capsys, monkeypatch):
    if missing == "jar":
        monkeypatch.setitem(sys.modules, "pycocoevalcap", None)  # what find_spec sees when it is not installed
        message = r"METEOR needs the METEOR 1.5 jar of the PyPI package pycocoevalcap: pip install pycocoevalcap$"
    else:
        monkeypatch.setenv("PATH", str(tmp_path / "bin"))
        message = r"METEOR 1.5 is a Java program: install a Java runtime \(e\.g\. apt-get install default-jre\)$"
    assert_refused(score.main, {"h": "a b\n", "r": "a b\n"}, ["meteor", "--hyp", "{tmp}/h", "--ref", "{tmp}/r"],
                   message, tmp_path, capsys, prefix="palm-score: error: ")


def test_palm_score_out_cut_off_leaves_the_earlier_file_whole(tmp_path, capsys, monkeypatch):
    def disk_full(result, handle, **options):
        handle.write('{"bl')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(score.json, "dump", disk_full)
    assert_refused(score.main, {"h": "a b\n", "r": "a b\n", "scores.json": '{"bleu": 100.0}\n'},
                   ["bleu", "--hyp", "{tmp}/h", "--ref", "{tmp}/r", "--out", "{tmp}/scores.json"],
                   r"--out {tmp}/scores.json: No space left on device; give a file in a folder you can write$",
                   tmp_path, capsys, prefix="palm-score: error: ")


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
    ("cnndm-stories-folder-missing", {}, ["cnndm", "--stories-dir", "{tmp}/stories", "--out", "{tmp}/out"],
     r"cannot list the stories directory {tmp}/stories: No such file or directory; pass the cnn/stories and "
     r"dailymail/stories directories with --stories-dir$"),
    ("xsum-id-without-document", {"d/1.summary": "Rain is expected.\n", "split.json": json.dumps({"test": [1]})},
     ["xsum", "--data-dir", "{tmp}/d", "--document-dir", "{tmp}/docs", "--split-file", "{tmp}/split.json", "--split",
      "test", "--out", "{tmp}/out"],
     r"{tmp}/split.json: test id 1 has no file {tmp}/docs/1.document: pass --skip-missing to count the missing ids "
     r"as dropped$"),
    ("wordpiece-vocabulary-missing", {"t.txt": "a\n"},
     ["encode", "--bpe", "wordpiece", "--model", "{tmp}/vocab.txt", "--inputs", "{tmp}/t.txt", "--outputs",
      "{tmp}/t.wp"],
     r"cannot read the WordPiece vocabulary {tmp}/vocab.txt: No such file or directory; pass the model's vocab.txt "
     r"with --model \(palm-convert writes one\)$"),
    ("encode-input-not-utf8", {"vocab.txt": lines(*BERT_SPECIALS, "the"),
                               "t.txt": lambda path: "caf\xe9\n".encode("latin-1")},
     ["encode", "--bpe", "wordpiece", "--uncased", "--model", "{tmp}/vocab.txt", "--inputs", "{tmp}/t.txt",
      "--outputs", "{tmp}/t.wp"],
     r"{tmp}/t.txt is not valid UTF-8 \(invalid continuation byte at byte 3\); convert it from the encoding it was "
     r"written in, e.g. `iconv -f latin1 -t utf-8 {tmp}/t.txt > {tmp}/t.utf8.txt`$"),
    ("msmarco-still-gzip-compressed", {"dev_v2.1.json.gz": lambda path: gzip.compress(b"{}")},
     ["msmarco", "--json", "{tmp}/dev_v2.1.json.gz", "--out", "{tmp}/out"],
     r"{tmp}/dev_v2.1.json.gz is gzip-compressed, not UTF-8 text \(invalid start byte at byte 1\); first run "
     r"`gunzip -k {tmp}/dev_v2.1.json.gz` and give the text$"),
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


def test_palm_prepare_wordpiece_vocabulary_it_may_not_read(tmp_path, capsys):
    vocab, text = tmp_path / "vocab.txt", tmp_path / "t.txt"
    vocab.write_text(lines(*BERT_SPECIALS))
    vocab.chmod(0)
    if os.access(vocab, os.R_OK):
        pytest.skip("this user reads a file whatever its permissions (root)")
    text.write_text("a\n")
    for casing in ([], ["--uncased"]):  # the casing is read from the vocabulary, or given
        assert prepare.main(["encode", "--bpe", "wordpiece", *casing, "--model", str(vocab), "--inputs", str(text),
                             "--outputs", str(tmp_path / "t.wp")]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"palm-prepare: error: cannot read --model {vocab}: Permission denied; give a file you can read")
    assert sorted(tmp_path.iterdir()) == [text, vocab]


def _safetensors(path, rows=1):
    from safetensors.torch import save_file

    save_file({"embeddings.word_embeddings.weight": torch.zeros(rows, 2)}, str(path))
    return path.read_bytes()


def torch_file(path, value):
    torch.save(value, path)
    return path.read_bytes()


TINY_BERT = dict(hidden_size=2, num_attention_heads=1, num_hidden_layers=1, intermediate_size=4,
                 max_position_embeddings=8)
ROBERTA = {"encoder.sentence_encoder.embed_tokens.weight": torch.zeros(10, 2),
           "encoder.sentence_encoder.embed_positions.weight": torch.zeros(6, 2),
           "encoder.sentence_encoder.layers.0.fc1.weight": torch.zeros(4, 2)}
ROBERTA_CFG = {"model": {"encoder_attention_heads": 1}}

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
    ("bert-tokenizer-json-not-wordpiece", {"hf/config.json": "{}", "hf/model.safetensors": lambda p: _safetensors(p),
                                           "hf/tokenizer.json": json.dumps({"model": {"type": "BPE", "vocab": {}}})},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/tokenizer.json: not a WordPiece tokenizer \(model type 'BPE'\); palm-convert bert takes "
     r"BERT-family models \(an HF RoBERTa folder: palm-convert hf-roberta\)$"),
    ("bert-tokenizer-json-ids-with-a-gap", {"hf/config.json": "{}", "hf/model.safetensors": lambda p: _safetensors(p),
                                            "hf/tokenizer.json": json.dumps({"model": {"type": "WordPiece", "vocab": {
                                                "[PAD]": 0, "[UNK]": 2}}})},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/tokenizer.json: the WordPiece ids are not 0..1; use the model's own tokenizer.json$"),
    ("bert-tokenizer-json-not-json", {"hf/config.json": "{}", "hf/model.safetensors": lambda p: _safetensors(p),
                                      "hf/tokenizer.json": '{"model": '},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/tokenizer.json: not valid JSON \(.*\); use the model's own tokenizer.json$"),
    ("bert-vocab-not-utf8", {"hf/config.json": "{}", "hf/model.safetensors": lambda p: _safetensors(p),
                             "hf/vocab.txt": lambda p: "[PAD]\ncaf\xe9\n".encode("latin-1")},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/vocab.txt: not UTF-8 text \(invalid continuation byte at byte 9\); use the model's own "
     r"file, as published \(UTF-8\)$"),
    ("bert-safetensors-unreadable", {"hf/config.json": "{}", "hf/vocab.txt": "[PAD]\n",
                                     "hf/model.safetensors": lambda p: _safetensors(p)[:20]},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/model.safetensors: not a readable safetensors file \(.+\); download it again \(a download "
     r"cut short\?\)$"),
    ("bert-vocab-without-cls", {"hf/config.json": "{}", "hf/model.safetensors": lambda p: _safetensors(p),
                                "hf/vocab.txt": lines("[PAD]", "[UNK]", "[SEP]", "[MASK]")},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/vocab.txt: no \[CLS\] token; not a BERT WordPiece vocabulary: use the model's own$"),
    ("bert-vocab-token-clashes-with-fairseq", {"hf/config.json": "{}", "hf/model.safetensors": lambda p: _safetensors(p),
                                               "hf/vocab.txt": lines(*BERT_SPECIALS, "<s>")},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/vocab.txt: the token '<s>' clashes with a fairseq special symbol \(BERT's \[CLS\] \[PAD\] "
     r"\[SEP\] \[UNK\] become <s> <pad> </s> <unk>, and <pseudo> is added\); rename it in a copy of the folder "
     r"\(e\.g\. to '<s>_': its row keeps its embedding\) and convert the copy$"),
    ("bert-vocab-of-another-size", {"hf/config.json": json.dumps(TINY_BERT), "hf/vocab.txt": lines(*BERT_SPECIALS),
                                    "hf/model.safetensors": lambda p: _safetensors(p, rows=3)},
     ["bert", "--input", "{tmp}/hf", "--output", "{tmp}/out"],
     r"^error: {tmp}/hf/vocab.txt: 5 tokens, but the embedding has 3 rows; the folder's vocabulary must be the "
     r"model's own$"),
    ("roberta-without-head-count", {"r.pt": lambda p: torch_file(p, {"model": ROBERTA}), "dict.txt": "a 1\n"},
     ["roberta", "--input", "{tmp}/r.pt", "--dict", "{tmp}/dict.txt", "--output", "{tmp}/out"],
     r"^error: {tmp}/r.pt: the checkpoint does not record encoder_attention_heads \(in its cfg or args\); pass the "
     r"model.pt as fairseq saved it$"),
    ("roberta-without-embedding", {"r.pt": lambda p: torch_file(p, {"model": {}, "cfg": ROBERTA_CFG}),
                                   "dict.txt": "a 1\n"},
     ["roberta", "--input", "{tmp}/r.pt", "--dict", "{tmp}/dict.txt", "--output", "{tmp}/out"],
     r"^error: {tmp}/r.pt: no encoder.sentence_encoder.embed_tokens.weight; not a RoBERTa checkpoint: pass the "
     r"model.pt of a fairseq RoBERTa$"),
    ("roberta-without-layers", {"r.pt": lambda p: torch_file(p, {"model": {
        "encoder.sentence_encoder.embed_tokens.weight": torch.zeros(6, 2)}, "cfg": ROBERTA_CFG}), "dict.txt": "a 1\n"},
     ["roberta", "--input", "{tmp}/r.pt", "--dict", "{tmp}/dict.txt", "--output", "{tmp}/out"],
     r"^error: {tmp}/r.pt: missing encoder.sentence_encoder.embed_positions.weight, "
     r"encoder.sentence_encoder.layers.0.fc1.weight; convert the model's complete weights$"),
    ("roberta-dictionary-of-another-size", {"r.pt": lambda p: torch_file(p, {"model": ROBERTA, "cfg": ROBERTA_CFG}),
                                            "dict.txt": lines("a 1", "b 1")},
     ["roberta", "--input", "{tmp}/r.pt", "--dict", "{tmp}/dict.txt", "--output", "{tmp}/out"],
     r"^error: {tmp}/dict.txt: 6 symbols \(\+ <mask>\) do not match the 10 embeddings of {tmp}/r.pt; pass the "
     r"dict.txt the RoBERTa model was trained with$"),
    ("export-without-dictionary", {"run/c.pt": lambda p: torch_file(p, {
        "cfg": {"model": {"_name": "unilm"}, "task": {"data": str(p.parent.parent / "data")}},
        "model": {"encoder.stack.embeddings.tokens.weight": torch.zeros(6, 2)}})},
     ["export", "--input", "{tmp}/run/c.pt", "--output", "{tmp}/out"],
     r"^error: {tmp}/data/dict.src.txt: no dictionary for {tmp}/run/c.pt; pass --dict \(the dict.txt it was trained "
     r"with\)$"),
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


def test_palm_convert_names_the_parameters_it_starts_untrained(tmp_path, capsys):
    """A sentence-embedding model ships no MLM head (nor next-sentence head): the conversion says which parameters
    start untrained, and what that means for the output layer."""
    import transformers

    from tests.test_convert_checkpoint import tiny_bert_config, write_bert_dir

    config = tiny_bert_config()
    source = write_bert_dir(tmp_path / "bert", transformers.BertModel(config), config)
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    assert capsys.readouterr().err.strip().splitlines()[-2:] == [
        f"not in {source / 'pytorch_model.bin'}, so as a new model starts them (weights at random, biases at 0, "
        "LayerNorm scales at 1): lm_head.bias, lm_head.dense.bias, lm_head.dense.weight, lm_head.layer_norm.bias, "
        "lm_head.layer_norm.weight, next_sentence_head.bias, next_sentence_head.weight",
        "no MLM head in this checkpoint (a sentence-embedding model?): the output layer that predicts tokens starts "
        "untrained, with its softmax weights tied to the input embeddings; fine-tuning trains it"]
    state = torch.load(tmp_path / "out" / "model.pt", weights_only=False)["model"]  # what the line says they are
    for name in ("lm_head.bias", "lm_head.dense.bias", "lm_head.layer_norm.bias", "next_sentence_head.bias"):
        assert not state[name].any(), name
    assert (state["lm_head.layer_norm.weight"] == 1).all()
    assert state["lm_head.dense.weight"].std() > 0 and state["next_sentence_head.weight"].std() > 0


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
