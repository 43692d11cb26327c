#!/usr/bin/env python
"""Convert published checkpoints into the plugin's formats, and unilm checkpoints back out.

Usage::

    # HF BERT / UniLM v1 / MiniLM / UniLMv2 directory as published (or a .zip of one)
    palm-convert bert --input DIR --output OUT [--max-positions 768] [--num-segments 6]
    # fairseq RoBERTa (model.pt + dict.txt) -> unilm
    palm-convert roberta --input model.pt --dict dict.txt --output OUT
    # HF RoBERTa directory -> what PALM's --roberta-path reads (fairseq RoBERTa model.pt, dict.txt, GPT-2 BPE files)
    palm-convert hf-roberta --input DIR --output OUT
    # a unilm checkpoint (converted, or trained here) -> HF BERT directory (UniLMv2: the released fast-qkv layout)
    palm-convert export --input checkpoint.pt --output HF_DIR

``OUT`` of ``bert``/``roberta`` receives ``model.pt`` (a fairseq checkpoint of the ``unilm`` model: ``fairseq-train
--finetune-from-model OUT/model.pt`` adopts its sizes and segment ids, see :mod:`palm_plugin.fixes.checkpoint_paths`;
``fairseq-generate --path OUT/model.pt`` loads it), ``dict.txt`` (for ``fairseq-preprocess --srcdict/--tgtdict``),
and for ``bert`` ``vocab.txt`` and ``tokenizer_config.json`` (whether the vocabulary is lower-cased), which
``palm-prepare encode --bpe wordpiece --model OUT/vocab.txt`` reads.

Each conversion's rules are documented beside their code: :mod:`palm_tools.convert.reading` (input directories,
weights-only loading), :mod:`palm_tools.convert.bert` (vocabulary, parameter names, defaults),
:mod:`palm_tools.convert.roberta` and :mod:`palm_tools.convert.export`.

Outputs are written to a temporary file, then renamed.
"""
import argparse
import sys
from pathlib import Path

from palm_plugin.fixes import safe_loading
from palm_tools.arguments import number_between, whole_number
from palm_tools.convert import ConversionError
from palm_tools.convert.bert import convert_bert
from palm_tools.convert.export import export
from palm_tools.convert.roberta import convert_hf_roberta, convert_roberta


def build_parser():
    """palm-convert's command line: one sub-command per conversion."""
    parser = argparse.ArgumentParser(prog="palm-convert", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bert = commands.add_parser("bert", help="HF BERT / UniLM v1 / MiniLM / UniLMv2 directory (or .zip) -> unilm")
    bert.add_argument("--input", required=True, help="HF directory (config.json, vocab.txt or tokenizer.json, and "
                      "model.safetensors, a sharded index, or pytorch_model.bin), or a .zip of one")
    bert.add_argument("--layer-norm-eps", type=number_between(0, 1, "a LayerNorm epsilon (BERT: 1e-12)"),
                      help="LayerNorm epsilon (default: config.json's; without it 1e-5 for UniLM v1, else 1e-12)")
    roberta = commands.add_parser("roberta", help="fairseq RoBERTa checkpoint -> unilm")
    roberta.add_argument("--input", required=True, help="fairseq checkpoint (model.pt)")
    roberta.add_argument("--dict", required=True, help="the checkpoint's dict.txt")
    for command in (bert, roberta):
        command.add_argument("--output", required=True, help="output directory (model.pt, dict.txt)")
        command.add_argument(
            "--num-segments", type=whole_number(1), default=None,
            help="segment types of the converted model (UniLM v1 objectives need 6; default: the checkpoint's, "
                 "6 for RoBERTa)",
        )
        command.add_argument("--max-positions", type=whole_number(1), default=None,
                             help="position embeddings of the converted model (default: the checkpoint's); more are "
                                  "filled as the authors' s2s-ft does, by copying the pre-trained rows again")
        command.add_argument("--seed", type=int, default=1,
                             help="random seed of the parameters the checkpoint lacks (an MLM head a sentence-embedding "
                                  "model does not ship, a next-sentence head): fine-tuning results depend on them")
    hf_roberta = commands.add_parser("hf-roberta", help="HF RoBERTa directory -> fairseq RoBERTa for --roberta-path")
    hf_roberta.add_argument("--input", required=True, help="HF directory (config.json, vocab.json, merges.txt and "
                            "model.safetensors / pytorch_model.bin), or a .zip of one")
    hf_roberta.add_argument("--output", required=True, help="output directory (model.pt, dict.txt, encoder.json, vocab.bpe)")
    out = commands.add_parser("export", help="unilm checkpoint -> HF BERT directory")
    out.add_argument("--input", required=True, help="a unilm checkpoint (palm-convert output or fairseq-train's)")
    out.add_argument("--output", required=True, help="output directory (config.json, vocab.txt, model.safetensors)")
    out.add_argument("--dict", help="the dictionary it was trained with (default: dict.txt beside it, else its data's)")
    out.add_argument("--vocab", help="WordPiece vocab.txt whose order to keep (default: vocab.txt beside it; without "
                     "one, the dictionary's order)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    commands = {"bert": convert_bert, "roberta": convert_roberta, "hf-roberta": convert_hf_roberta, "export": export}
    output = Path(args.output).resolve()
    for option in ("input", "dict", "vocab"):
        given = getattr(args, option, None)
        source = Path(given).resolve() if given else None
        if source is not None and output in (source, source.parent):
            sys.exit(f"error: --output {args.output} is the folder of --{option} {given}: the files written there "
                     "(model.pt, dict.txt, vocab.txt, tokenizer_config.json, ...) would replace the input's; choose "
                     "another folder")
    try:
        commands[args.command](args)
    except (ConversionError, safe_loading.UnsafeCheckpointError, safe_loading.CorruptCheckpointError,
            safe_loading.ForeignCheckpointError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
