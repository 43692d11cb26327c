"""palm-score: the evaluation metrics of the PALM / UniLM / UniLMv2 papers, computed the way those papers report them.

Subcommands (each writes a small JSON file with ``--out`` and prints a one-line summary):

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
* ``ppl``    perplexity from ``fairseq-generate --score-reference`` output (its per-token base-2 log probabilities,
  the ``P-`` lines) or from a ``fairseq-validate`` / ``fairseq-train`` log (``valid on '...' subset`` lines).

Hypotheses and references are files with one example per line, or the output of ``fairseq-generate`` (``D-`` lines,
or ``H-`` lines when no detokenizer ran, ordered by sample id; references from its ``T-`` lines unless ``--ref``
gives the raw reference file).
"""
import argparse
import collections
import json
import os
import re
import string
import sys
import tempfile

from palm_tools.atomic_files import atomic_open


class ScoreError(Exception):
    """Bad input for a metric: the message names the file and what is wrong."""


# --------------------------------------------------------------------------------------------------- input files


def read_lines(path):
    """The lines of a UTF-8 text file without their line ends. Only ``\n`` ends a line (as for ``wc -l`` and
    fairseq), not the other separators ``str.splitlines`` knows, such as U+2028."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise ScoreError(f"cannot read {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ScoreError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from e
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


_GENERATE_LINE = re.compile(r"^([HDTP])-(\d+)\t(.*)$")


def read_generate_output(path):
    """Parse ``fairseq-generate`` output. Returns ``(hypotheses, references, positional_scores)``, each a dict from
    sample id to the first (best) entry for that id: hypothesis text (``D-`` preferred over ``H-``), reference
    text (``T-``) and the list of per-token base-2 log probabilities (``P-``)."""
    hyps, detoks, refs, scores = {}, {}, {}, {}
    for number, line in enumerate(read_lines(path), 1):
        match = _GENERATE_LINE.match(line)
        if not match:
            continue
        kind, sample_id, rest = match.group(1), int(match.group(2)), match.group(3)
        if kind == "T":
            refs.setdefault(sample_id, rest)
            continue
        if kind == "P":
            try:
                scores.setdefault(sample_id, [float(x) for x in rest.split()])
            except ValueError as e:
                raise ScoreError(f"{path}:{number}: a P- line must hold numbers: {line[:80]!r}") from e
            continue
        parts = rest.split("\t", 1)
        text = parts[1] if len(parts) == 2 else ""
        (detoks if kind == "D" else hyps).setdefault(sample_id, text)
    return (detoks or hyps), refs, scores


def load_examples(args):
    """Hypotheses and reference streams (a list of lists, one list per reference file) from the command line."""
    if args.generate:
        by_id, generate_refs, _ = read_generate_output(args.generate)
        if not by_id:
            raise ScoreError(f"{args.generate} holds no H-/D- lines: is it the output of fairseq-generate?")
        ids = sorted(by_id)
        hyps = [by_id[i] for i in ids]
        if args.ref:
            refs = [read_lines(path) for path in args.ref]
            for path, stream in zip(args.ref, refs):
                if ids[-1] >= len(stream):
                    raise ScoreError(f"{args.generate} has sample id {ids[-1]} but {path} has {len(stream)} lines")
            return hyps, [[stream[i] for i in ids] for stream in refs]
        missing = [i for i in ids if i not in generate_refs]
        if missing:
            raise ScoreError(f"{args.generate} has no T- line for sample {missing[0]}: pass the references with --ref")
        return hyps, [[generate_refs[i] for i in ids]]
    if not args.hyp or not args.ref:
        raise ScoreError("give --hyp FILE and --ref FILE, or --generate FILE (fairseq-generate output)")
    hyps = read_lines(args.hyp)
    refs = [read_lines(path) for path in args.ref]
    for path, stream in zip(args.ref, refs):
        if len(stream) != len(hyps):
            raise ScoreError(f"{args.hyp} has {len(hyps)} lines but {path} has {len(stream)}: one example a line")
    if not hyps:
        raise ScoreError(f"{args.hyp} is empty")
    return hyps, refs


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
            raise ScoreError(f"example {i + 1} has no non-empty reference")
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
            raise ScoreError(f"example {i + 1} has no non-empty reference")
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


# ---------------------------------------------------------------------------------------------------- perplexity


def perplexity_from_generate(path):
    """Token-level perplexity from ``fairseq-generate --score-reference`` output: 2 ** (-mean of all P- values),
    the end-of-sentence token included (fairseq prints the positional scores in base 2)."""
    _, _, scores = read_generate_output(path)
    tokens = sum(len(s) for s in scores.values())
    if not tokens:
        raise ScoreError(f"{path} holds no P- lines: run fairseq-generate with --score-reference and without --quiet")
    log2_sum = sum(sum(s) for s in scores.values())
    return {"ppl": 2 ** (-log2_sum / tokens), "tokens": tokens, "sentences": len(scores), "source": "generate"}


_VALID_LINE = re.compile(r"valid on '([^']+)' subset(.*)$")
_LOG_FIELD = re.compile(r"\|\s*([A-Za-z_0-9]+)\s+(-?[0-9.]+(?:e-?\d+)?)")


def perplexity_from_log(path, subset="valid"):
    """Perplexity from the last ``valid on '<subset>' subset`` line of a fairseq-validate or fairseq-train log
    (simple or json log format): 2 ** nll_loss when the criterion logs nll_loss (label smoothing), else 2 ** loss."""
    fields = None
    for line in read_lines(path):
        match = _VALID_LINE.search(line)
        if match and match.group(1) == subset:
            fields = {k: float(v) for k, v in _LOG_FIELD.findall(match.group(2))}
            continue
        start = line.find("{")
        if start >= 0 and f'"{subset}_loss"' in line:
            try:
                record = json.loads(line[start:])
            except json.JSONDecodeError:
                continue
            prefix = f"{subset}_"
            fields = {k[len(prefix):]: float(v) for k, v in record.items() if k.startswith(prefix)}
    if fields is None:
        raise ScoreError(f"{path} has no \"valid on '{subset}' subset\" line: is it a fairseq-validate log?")
    key = "nll_loss" if "nll_loss" in fields else "loss"
    if key not in fields:
        raise ScoreError(f"{path}: the '{subset}' line logs no loss")
    result = {"ppl": 2 ** fields[key], "from": key, key: fields[key], "source": "log", "subset": subset}
    if "ppl" in fields:
        result["logged_ppl"] = fields["ppl"]
    return result


# ------------------------------------------------------------------------------------------------ command line


def write_json(path, result):
    """Write ``result`` as JSON through a temporary file renamed into place."""
    with atomic_open(path) as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")


def _add_text_inputs(parser):
    parser.add_argument("--hyp", help="hypotheses, one example a line")
    parser.add_argument("--ref", action="append", help="references, one example a line (repeat for more references)")
    parser.add_argument("--generate", help="fairseq-generate output instead of --hyp (references from T- lines "
                        "unless --ref is given; then sample ids index the lines of --ref)")
    parser.add_argument("--out", help="write the scores to this JSON file")


def build_parser():
    parser = argparse.ArgumentParser(prog="palm-score", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("rouge", help="ROUGE-1/2/L F1 as files2rouge (ROUGE-1.5.5 -c 95 -r 1000 -n 2 -a -m)")
    _add_text_inputs(p)
    p.add_argument("--sentence-split", choices=["marker", "period", "none"], default="marker",
                   help="how ROUGE-L splits a line into sentences: at <q> markers (default), after every period "
                   "(files2rouge's default), or not at all")
    p.add_argument("--no-stemming", action="store_true", help="turn off Porter stemming (ROUGE-1.5.5 without -m)")

    p = commands.add_parser("bleu", help="corpus BLEU-4 (sacrebleu)")
    _add_text_inputs(p)
    p.add_argument("--tokenize", default="13a", help="sacrebleu tokenizer: 13a (default, mteval), none (text is "
                   "already tokenised, as in question generation), intl, char, ...")
    p.add_argument("--lowercase", action="store_true", help="compare lower-cased text")

    p = commands.add_parser("rougel", help="ROUGE-L F_beta as coco-caption computes it (MS MARCO, QG)")
    _add_text_inputs(p)
    p.add_argument("--beta", type=float, default=1.2, help="recall weight (coco-caption and MS MARCO use 1.2)")
    p.add_argument("--lowercase", action="store_true", help="compare lower-cased text")

    p = commands.add_parser("f1", help="word-overlap F1 of normalised answers (CoQA, SQuAD)")
    _add_text_inputs(p)

    p = commands.add_parser("meteor", help="METEOR 1.5 (Java; the jar of the pycocoevalcap package)")
    _add_text_inputs(p)

    p = commands.add_parser("ppl", help="perplexity from fairseq-generate --score-reference output or a validate log")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--generate", help="output of fairseq-generate --score-reference")
    source.add_argument("--log", help="fairseq-validate or fairseq-train log")
    p.add_argument("--subset", default="valid", help="which subset's validation line to read from --log")
    p.add_argument("--out", help="write the result to this JSON file")
    return parser


def run(args):
    """Compute the metric chosen on the command line; returns ``(result dict, one-line summary)``."""
    if args.command == "ppl":
        if args.generate:
            result = perplexity_from_generate(args.generate)
        else:
            result = perplexity_from_log(args.log, args.subset)
        return result, f"PPL {result['ppl']:.2f}"
    hyps, refs = load_examples(args)
    if args.command == "rouge":
        if len(refs) != 1:
            raise ScoreError("rouge takes exactly one --ref (summarisation has one reference per example)")
        result = rouge(hyps, refs[0], args.sentence_split, stemming=not args.no_stemming)
        summary = "ROUGE-1 {:.2f} ROUGE-2 {:.2f} ROUGE-L {:.2f} (F1)".format(
            *(result[k]["f"] for k in ("rouge-1", "rouge-2", "rouge-l"))
        )
    elif args.command == "f1":
        result = answer_f1(hyps, refs)
        summary = f"F1 {result['f1']:.2f}"
    elif args.command == "meteor":
        result = meteor(hyps, refs)
        summary = f"METEOR {result['meteor']:.2f} (METEOR 1.5, -norm)"
    elif args.command == "bleu":
        result = bleu(hyps, refs, args.tokenize, args.lowercase)
        summary = f"BLEU-4 {result['bleu']:.2f} ({result['signature']})"
    else:
        result = rouge_l(hyps, refs, args.beta, args.lowercase)
        summary = f"ROUGE-L {result['rouge-l']:.2f} (beta {args.beta})"
    result["examples"] = len(hyps)
    return result, summary


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        result, summary = run(args)
    except ScoreError as e:
        print(f"palm-score: error: {e}", file=sys.stderr)
        return 1
    result["metric"] = args.command
    if args.out:
        write_json(args.out, result)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
