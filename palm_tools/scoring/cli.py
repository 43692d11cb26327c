"""palm-score: the evaluation metrics of the PALM / UniLM / UniLMv2 papers, computed the way those papers report them.

Subcommands (each writes a small JSON file with ``--out`` and prints a one-line summary):

* ``rouge``, ``bleu``, ``rougel``, ``f1``, ``meteor``: :mod:`palm_tools.scoring.metrics` says how each is computed;
  hypotheses and references are read as :mod:`palm_tools.scoring.inputs` describes.
* ``ppl``: :mod:`palm_tools.scoring.perplexity`.
"""
import argparse
import json
import math
import sys

from palm_tools.arguments import number_between
from palm_tools.atomic_files import atomic_open
from palm_tools.scoring import ScoreError
from palm_tools.scoring.inputs import load_examples
from palm_tools.scoring.metrics import answer_f1, bleu, meteor, rouge, rouge_l
from palm_tools.scoring.perplexity import perplexity_from_generate, perplexity_from_log


def write_json(path, result):
    """Write ``result`` as JSON through a temporary file renamed into place."""
    try:
        with atomic_open(path) as f:
            json.dump(result, f, indent=2, sort_keys=True)
            f.write("\n")
    except OSError as error:
        raise ScoreError(f"--out {error}" if error.strerror is None else
                         f"--out {path}: {error.strerror}; give a file in a folder you can write") from error


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
    p.add_argument("--beta", type=number_between(0, math.inf, "a recall weight"), default=1.2,
                   help="recall weight (coco-caption and MS MARCO use 1.2)")
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
        result["metric"] = args.command
        if args.out:
            write_json(args.out, result)
    except ScoreError as e:
        print(f"palm-score: error: {e}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
