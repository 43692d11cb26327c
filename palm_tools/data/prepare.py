"""palm-prepare: convert a benchmark's raw release to source/target line files (``<prefix>.src``,
``<prefix>.tgt``, one example a line) for tokenisation and ``fairseq-preprocess``. Prints how many examples were
read, kept and dropped (and why); malformed input stops it with the file and record named, and leaves no partial
output.

  palm-prepare cnndm    --stories-dir cnn/stories --stories-dir dailymail/stories --url-list all_test.txt --out raw/test
  palm-prepare xsum     --data-dir bbc-summary-data --split-file XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json \\
                        --split test --out raw/test
  palm-prepare gigaword --source test.article.txt --target test.title.txt --out raw/test
  palm-prepare squad-qg --squad-json train-v1.1.json --doclist doclist-test.txt --out raw/test
  palm-prepare msmarco  --json dev_v2.1.json --task nlg --out raw/valid
  palm-prepare coqa     --json coqa-dev-v1.0.json --out raw/valid
  palm-prepare cornell  --lines movie_lines.txt --conversations movie_conversations.txt --out-dir raw
  palm-prepare encode   --bpe gpt2 --model encoder.json --vocab-bpe vocab.bpe --inputs raw/test.src \
                        --outputs bpe/test.src
"""
import argparse
import os
import sys

from palm_tools.arguments import whole_number
from palm_tools.data.readers import cnndm, coqa, cornell, gigaword, msmarco, squad_qg, xsum
from palm_tools.data.readers.common import Counts, ReaderError, write_pairs


def build_parser():
    parser = argparse.ArgumentParser(
        prog="palm-prepare", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    commands = parser.add_subparsers(dest="benchmark", required=True)
    separator_help = "text between the parts of the source (default: ' [SEP] ')"

    p = commands.add_parser("cnndm", help="CNN/DailyMail .story files (non-anonymised)")
    p.add_argument("--stories-dir", action="append", required=True, help="a directory of .story files (repeat)")
    p.add_argument("--url-list", help="the split's URL list (all_train.txt, all_val.txt, all_test.txt); without it "
                   "every story of the directories is converted")
    p.add_argument("--sentence-separator", default=" <q> ", help="text between summary sentences (default ' <q> ', "
                   "which palm-score rouge splits on)")

    p = commands.add_parser("xsum", help="XSum summary data or .document/.summary pairs with the JSON split file")
    p.add_argument("--data-dir", required=True, help="directory of <id>.summary files")
    p.add_argument("--document-dir", help="directory of <id>.document files (preprocessed layout; default: --data-dir)")
    p.add_argument("--split-file", required=True, help="XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json")
    p.add_argument("--split", required=True, help="train, validation or test")
    p.add_argument("--skip-missing", action="store_true", help="count ids without a file as dropped instead of failing")

    p = commands.add_parser("gigaword", help="Gigaword parallel article/headline text files")
    p.add_argument("--source", required=True, help="article sentences, one a line")
    p.add_argument("--target", required=True, help="headlines, one a line")

    p = commands.add_parser("squad-qg", help="SQuAD 1.1 JSON to question generation pairs")
    p.add_argument("--squad-json", required=True, help="train-v1.1.json or dev-v1.1.json")
    p.add_argument("--doclist", help="article titles to keep, one a line (Du and Cardie's doclist-*.txt)")
    p.add_argument("--context", choices=["paragraph", "sentence"], default="paragraph",
                   help="the paragraph, or the sentence(s) holding the answer")
    p.add_argument("--separator", default=" [SEP] ", help=separator_help)
    p.add_argument("--no-answer", action="store_true", help="leave the answer span out of the source")

    p = commands.add_parser("msmarco", help="MS MARCO v2.1 JSON (Q&A or NLG task)")
    p.add_argument("--json", required=True, help="train_v2.1.json or dev_v2.1.json")
    p.add_argument("--task", choices=["qa", "nlg"], default="qa", help="target: first answer (qa) or first "
                   "well-formed answer (nlg)")
    p.add_argument("--passages", choices=["selected", "all"], default="selected",
                   help="the passages marked is_selected (default) or all of them")
    p.add_argument("--separator", default=" [SEP] ", help=separator_help)

    p = commands.add_parser("coqa", help="CoQA JSON to generative QA pairs")
    p.add_argument("--json", required=True, help="coqa-train-v1.0.json or coqa-dev-v1.0.json")
    p.add_argument("--max-history", type=whole_number(0), help="earlier turns kept in the source (default: all)")
    p.add_argument("--separator", default=" [SEP] ", help=separator_help)

    for name in ("cnndm", "xsum", "gigaword", "squad-qg", "msmarco", "coqa"):
        commands.choices[name].add_argument("--out", required=True, help="output prefix: writes PREFIX.src/.tgt")

    p = commands.add_parser("cornell", help="Cornell Movie-Dialogs to context/response pairs and splits")
    p.add_argument("--lines", required=True, help="movie_lines.txt")
    p.add_argument("--conversations", required=True, help="movie_conversations.txt")
    p.add_argument("--out-dir", required=True, help="writes {train,valid,test,train10k}.{src,tgt} here")
    p.add_argument("--min-words", type=whole_number(1), default=2, help="drop pairs with a shorter utterance")
    p.add_argument("--max-words", type=whole_number(1), default=25, help="drop pairs with a longer utterance")
    p.add_argument("--valid-size", type=whole_number(1), default=10_000, help="pairs held out for validation")
    p.add_argument("--test-size", type=whole_number(1), default=20_000, help="pairs held out for test")
    p.add_argument("--seed", type=int, default=1, help="seed of the split")

    p = commands.add_parser("encode", help="subword-encode line files with fairseq's gpt2 / bert / sentencepiece BPE")
    p.add_argument("--bpe", choices=["gpt2", "wordpiece", "sentencepiece"], required=True, help="the subword scheme")
    p.add_argument("--model", required=True, help="encoder.json (gpt2), vocab.txt (wordpiece) or the .model file "
                   "(sentencepiece)")
    p.add_argument("--vocab-bpe", help="vocab.bpe (gpt2 merges)")
    casing = p.add_mutually_exclusive_group()
    casing.add_argument("--uncased", dest="cased", action="store_false", default=None,
                        help="lower-case before WordPiece (default: as the tokenizer_config.json beside the vocabulary "
                             "says, which palm-convert writes, else as the vocabulary implies)")
    casing.add_argument("--cased", dest="cased", action="store_true", default=None, help="keep the case (see --uncased)")
    p.add_argument("--inputs", nargs="+", action="extend", required=True, help="line files to encode")
    p.add_argument("--outputs", nargs="+", action="extend", required=True, help="one output file per input")
    p.add_argument("--workers", type=whole_number(1), default=1, help="encoding processes")
    return parser


def convert(args):
    """Run the reader chosen on the command line and write its files; returns the summary lines."""
    if args.benchmark == "encode":
        from palm_tools.data import encode  # fairseq's BPE classes: the readers below need no model code

        config = encode.bpe_config(args.bpe, args.model, args.vocab_bpe, cased=args.cased)
        lines = encode.encode_files(config, args.inputs, args.outputs, args.workers)
        return [f"encode ({args.bpe}): {source} -> {target}: {n} lines"
                for source, target, n in zip(args.inputs, args.outputs, lines)]
    counts = Counts()
    if args.benchmark == "cornell":
        pairs = cornell.read_cornell_pairs(args.lines, args.conversations, counts, args.min_words, args.max_words)
        messages = [counts.summary("cornell pairs")]
        for name, split in cornell.split_pairs(pairs, args.valid_size, args.test_size, args.seed).items():
            split_counts = Counts()
            split_counts.read = len(split)
            write_pairs(os.path.join(args.out_dir, name), split, split_counts)
            messages.append(split_counts.summary(f"cornell {name}"))
        return messages
    if args.benchmark == "cnndm":
        pairs = cnndm.read_cnndm(args.stories_dir, counts, args.url_list, args.sentence_separator)
    elif args.benchmark == "xsum":
        pairs = xsum.read_xsum(args.data_dir, args.split_file, args.split, counts, args.document_dir, args.skip_missing)
    elif args.benchmark == "gigaword":
        pairs = gigaword.read_gigaword(args.source, args.target, counts)
    elif args.benchmark == "squad-qg":
        pairs = squad_qg.read_squad_qg(args.squad_json, counts, args.doclist, args.context, args.separator,
                                       with_answer=not args.no_answer)
    elif args.benchmark == "msmarco":
        pairs = msmarco.read_msmarco(args.json, counts, args.task, args.passages, args.separator)
    else:
        pairs = coqa.read_coqa(args.json, counts, args.max_history, args.separator)
    write_pairs(args.out, pairs, counts)
    return [counts.summary(f"{args.benchmark} -> {args.out}.src/.tgt")]


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        messages = convert(args)
    except ReaderError as e:
        print(f"palm-prepare: error: {e}", file=sys.stderr)
        return 1
    for message in messages:
        print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
