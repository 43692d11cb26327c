"""The metrics of the PALM / UniLM / UniLMv2 papers, computed the way those papers report them. Each takes the
hypotheses and the references and returns a dict of scores; the palm-score subcommand of each:

* ``rouge``  ROUGE-1 / ROUGE-2 / ROUGE-L F1 for summarisation, as files2rouge reports them. files2rouge runs the
  ROUGE-1.5.5 Perl script with ``-c 95 -r 1000 -n 2 -a -m``: lower-cased alphanumeric tokens, Porter stemming of
  tokens longer than three characters, F1 averaged over examples. Its ROUGE-L is the summary-level LCS over
  sentence-split texts (ROUGE-Lsum). We compute the same with the ``rouge-score`` package and ROUGE-1.5.5's own
  stemming (palm_tools/scoring/rouge155.py); the sentences of a line are split at ``<q>`` markers (how our readers
  join summary sentences) or, as files2rouge does by default, after every period. We report the exact mean over
  examples; the Perl script prints the mean of its 1000 bootstrap resamples, which differs from it by resampling
  noise (about sigma / sqrt(1000 N): 0.01 point on a test set of 10K summaries). tests/test_score_rouge_perl.py
  checks every example's score and the averages against the Perl script.
* ``bleu``   corpus BLEU-4 with sacrebleu (tokenisation and casing are options and are written to the JSON file;
  question generation papers score lower-cased, already tokenised text: use ``--tokenize none --lowercase``).
* ``rougel`` sentence-level ROUGE-L F_beta as the coco-caption scorer computes it (whitespace tokens, beta 1.2,
  precision and recall each maximised over the references): the script used by the MS MARCO leaderboard and by
  the question generation papers.
* ``f1``     word-overlap F1 of normalised answers, the CoQA (and SQuAD) measure.
* ``meteor`` METEOR 1.5 (the Java jar that the PyPI package pycocoevalcap ships, with its WordNet synonyms and
  paraphrase table), the version coco-caption and the question generation papers' scripts run.
"""
import collections
import os
import re
import string
import tempfile

from palm_tools.scoring import ScoreError


# --------------------------------------------------------------------------------------------------------- ROUGE

# "<q>", also as WordPiece decoding spells it ("< q >")
_MARKER = re.compile(r"\s*<\s*q\s*>\s*|\n")


def split_sentences(text, mode):
    """Sentences of one line: ``marker`` splits at ``<q>`` markers (``< q >`` too) and newlines, ``period`` after every period
    (files2rouge's default ``--eos .``), ``none`` keeps the line as one sentence."""
    if mode == "marker":
        parts = _MARKER.split(text)
    elif mode == "period":
        parts = _MARKER.sub(" ", text).replace(".", ".\n").split("\n")
    else:
        parts = [_MARKER.sub(" ", text)]
    return [p.strip() for p in parts if p.strip()]


def rouge_examples(hyps, refs, sentence_split="marker", stemming=True):
    """ROUGE-1, ROUGE-2 and ROUGE-Lsum precision, recall and F1 (in percent) of each example: a list of
    ``{"rouge-1": {"p", "r", "f"}, "rouge-2": ..., "rouge-l": ...}``."""
    from rouge_score import rouge_scorer

    from palm_tools.scoring.rouge155 import Rouge155Tokenizer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], tokenizer=Rouge155Tokenizer(stemming))
    names = {"rouge1": "rouge-1", "rouge2": "rouge-2", "rougeLsum": "rouge-l"}
    examples = []
    for hyp, ref in zip(hyps, refs):
        scores = scorer.score(
            "\n".join(split_sentences(ref, sentence_split)), "\n".join(split_sentences(hyp, sentence_split))
        )
        examples.append(
            {
                name: {"p": 100 * scores[key].precision, "r": 100 * scores[key].recall, "f": 100 * scores[key].fmeasure}
                for key, name in names.items()
            }
        )
    return examples


def rouge(hyps, refs, sentence_split="marker", stemming=True):
    """Mean ROUGE-1, ROUGE-2 and ROUGE-Lsum precision, recall and F1 (in percent) over the examples, as
    ROUGE-1.5.5 averages them."""
    examples = rouge_examples(hyps, refs, sentence_split, stemming)
    return {
        name: {kind: sum(e[name][kind] for e in examples) / len(examples) for kind in "prf"} for name in examples[0]
    }


# ---------------------------------------------------------------------------------------------------------- BLEU


def bleu(hyps, ref_streams, tokenize="13a", lowercase=False):
    """Corpus BLEU-4 (sacrebleu) with its signature, n-gram precisions and brevity penalty."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    score = metric.corpus_score(hyps, ref_streams)
    return {
        "bleu": score.score,
        "precisions": list(score.precisions),
        "brevity_penalty": score.bp,
        "hyp_len": score.sys_len,
        "ref_len": score.ref_len,
        "tokenize": tokenize,
        "lowercase": lowercase,
        "signature": str(metric.get_signature()),
    }


# ------------------------------------------------------------------------------------------------------- ROUGE-L


def lcs_length(a, b):
    """Length of the longest common subsequence of two token lists (O(len(a) * len(b)) time, O(len(b)) memory)."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(hyps, ref_streams, beta=1.2, lowercase=False):
    """Mean sentence-level ROUGE-L F_beta in percent. Per example, as in the coco-caption scorer: precision and
    recall of the LCS are each maximised over the non-empty references, then combined as
    (1 + beta^2) P R / (R + beta^2 P)."""
    total = 0.0
    for i, hyp in enumerate(hyps):
        candidate = (hyp.lower() if lowercase else hyp).split()
        references = [(s[i].lower() if lowercase else s[i]).split() for s in ref_streams]
        references = [r for r in references if r]
        if not references:
            raise ScoreError(f"example {i + 1} (line {i + 1} of each --ref) has no non-empty reference: give it one, "
                             "or leave the example out of --hyp and every --ref")
        precision = recall = 0.0
        if candidate:
            for reference in references:
                common = lcs_length(candidate, reference)
                precision = max(precision, common / len(candidate))
                recall = max(recall, common / len(reference))
        if precision > 0 and recall > 0:
            total += (1 + beta**2) * precision * recall / (recall + beta**2 * precision)
    return {"rouge-l": 100 * total / len(hyps), "beta": beta, "lowercase": lowercase}


# ------------------------------------------------------------------------------------------------------------ F1


def normalize_answer(text):
    """SQuAD / CoQA answer normalisation: lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def answer_f1(hyps, ref_streams):
    """Mean word-overlap F1 in percent (the CoQA / SQuAD measure) of normalised answers, maximised over the
    non-empty references; an answer that normalises to nothing scores 1 against a reference that does too. (CoQA's official
    script also averages over leave-one-out subsets of its four dev references; one reference file means one.)"""
    total = 0.0
    for i, hyp in enumerate(hyps):
        predicted = normalize_answer(hyp).split()
        references = [normalize_answer(s[i]).split() for s in ref_streams if s[i].strip()]
        if not references:
            raise ScoreError(f"example {i + 1} (line {i + 1} of each --ref) has no non-empty reference: give it one, "
                             "or leave the example out of --hyp and every --ref")
        best = 0.0
        for reference in references:
            if not predicted or not reference:
                best = max(best, float(predicted == reference))
                continue
            same = sum((collections.Counter(predicted) & collections.Counter(reference)).values())
            if same:
                precision, recall = same / len(predicted), same / len(reference)
                best = max(best, 2 * precision * recall / (precision + recall))
        total += best
    return {"f1": 100 * total / len(hyps)}


# -------------------------------------------------------------------------------------------------------- METEOR


def meteor_jar():
    """The METEOR 1.5 jar (with its English paraphrase table and WordNet synonyms) that the PyPI package
    pycocoevalcap ships: the one coco-caption and the question generation papers' scripts run."""
    import importlib.util

    spec = importlib.util.find_spec("pycocoevalcap")
    locations = list(spec.submodule_search_locations or []) if spec else []
    jars = [os.path.join(d, "meteor", "meteor-1.5.jar") for d in locations]
    jars = [j for j in jars if os.path.isfile(j)]
    if not jars:
        raise ScoreError("METEOR needs the METEOR 1.5 jar of the PyPI package pycocoevalcap: pip install pycocoevalcap")
    return jars[0]


def meteor(hyps, ref_streams, language="en"):
    """Corpus METEOR 1.5 in percent, as ``java -jar meteor-1.5.jar HYP REF -l en -norm -r N`` computes it
    (normalised text, exact / stem / synonym / paraphrase matches; the score aggregates the statistics of all
    segments). With several references per example, an empty one is replaced by the first."""
    import shutil
    import subprocess

    jar = meteor_jar()
    if shutil.which("java") is None:
        raise ScoreError("METEOR 1.5 is a Java program: install a Java runtime (e.g. apt-get install default-jre)")
    with tempfile.TemporaryDirectory() as tmp:
        hyp_file, ref_file = os.path.join(tmp, "hyp"), os.path.join(tmp, "ref")
        with open(hyp_file, "w", encoding="utf-8") as f:
            f.writelines(" ".join(h.split()) + "\n" for h in hyps)
        with open(ref_file, "w", encoding="utf-8") as f:
            for i in range(len(hyps)):
                refs = [" ".join(s[i].split()) for s in ref_streams]
                f.writelines((r or refs[0]) + "\n" for r in refs)
        command = ["java", "-Xmx2G", "-jar", jar, hyp_file, ref_file, "-l", language, "-norm",
                   "-r", str(len(ref_streams))]
        result = subprocess.run(command, capture_output=True, text=True)
    match = re.search(r"^Final score:\s+([0-9.eE-]+)", result.stdout, re.MULTILINE)
    if result.returncode != 0 or not match:
        raise ScoreError(f"METEOR failed ({' '.join(command[:4])}): {(result.stderr or result.stdout)[-500:]}")
    return {"meteor": 100 * float(match.group(1)), "version": "1.5", "options": "-l en -norm"}
