#!/usr/bin/env python
"""Convert released BERT-family checkpoints, and fairseq RoBERTa checkpoints, into ``unilm`` fairseq checkpoints.

Usage::

    # HF-format BERT / UniLM v1 / MiniLM / UniLMv2 (directory with pytorch_model.bin, config.json, vocab.txt)
    palm-convert bert --input DIR --output OUT [--num-segments 6]
    # fairseq RoBERTa (model.pt + dict.txt)
    palm-convert roberta --input model.pt --dict dict.txt --output OUT

``OUT`` receives ``model.pt`` (a fairseq checkpoint of the ``unilm`` model; ``fairseq-train --finetune-from-model
OUT/model.pt`` and ``fairseq-generate --path OUT/model.pt`` load it) and ``dict.txt`` (give it to
``fairseq-preprocess --srcdict/--tgtdict``); the bert command also copies ``vocab.txt`` for fairseq's WordPiece
tokeniser (``--bpe bert --bpe-vocab-file OUT/vocab.txt``).

Vocabulary. fairseq's dictionary starts with ``<s> <pad> </s> <unk>``; these take the rows of BERT's ``[CLS]``
(UniLM's [SOS]), ``[PAD]``, ``[SEP]`` ([EOS]) and ``[UNK]``; every other WordPiece follows in ``vocab.txt`` order,
``[MASK]`` written as ``<mask>``. UniLMv2 checkpoints also get ``<pseudo>`` (UniLMv2's placeholder, initialised
from [MASK], as the released fine-tuning code feeds [MASK] there), so ``unilm_seq2seq --pseudo-masks`` fits.

Parameters (names of the HF BERT loaders; the ``bert.`` prefix is optional; old ``gamma``/``beta`` LayerNorm names
are read too). UniLMv2's fused projection ``attention.self.qkv_linear.weight`` ``[3H, H]`` is split into query,
key and value, with ``q_bias`` / ``v_bias`` and a zero key bias; its ``rel_pos_bias.weight`` ``[heads, buckets]``
(or ``encoder.rel_pos_bias.weight``) becomes the relative position bias of a ``unilm2`` model. ``--num-segments``
larger than the checkpoint's token type vocabulary adds rows copied from type 0 (BERT has 2; UniLM v1 marks its
objectives with 6).

Every file is read with weights-only unpickling (:func:`palm_plugin.fixes.safe_loading.load_state`); outputs are
written to a temporary file, then renamed.
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

from fairseq import checkpoint_utils, options  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from palm_plugin.fixes import safe_loading  # noqa: E402
from palm_tools.atomic_files import atomic_path  # noqa: E402
from palm_plugin.models.unilm import UniLMModel  # noqa: E402

BERT_SPECIALS = {"<s>": "[CLS]", "<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]"}
MASK, PSEUDO = "<mask>", "<pseudo>"


class ConversionError(ValueError):
    """The input is not a checkpoint this script can convert; the message names the file."""


# ---------------------------------------------------------------------------------------------------------------
# Parameter names: source name (prefix stripped, LayerNorm gamma/beta renamed) -> unilm name.
# ---------------------------------------------------------------------------------------------------------------

BERT_NAMES = [
    (r"embeddings\.word_embeddings\.weight", "encoder.stack.embeddings.tokens.weight"),
    (r"embeddings\.position_embeddings\.weight", "encoder.stack.embeddings.positions.weight"),
    (r"embeddings\.token_type_embeddings\.weight", "encoder.stack.embeddings.segments.weight"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"encoder.stack.embeddings.layer_norm.\1"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.(weight|bias)", r"encoder.stack.layers.\1.q_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.(weight|bias)", r"encoder.stack.layers.\1.k_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.(weight|bias)", r"encoder.stack.layers.\1.v_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.q_bias", r"encoder.stack.layers.\1.q_proj.bias"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.v_bias", r"encoder.stack.layers.\1.v_proj.bias"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)", r"encoder.stack.layers.\1.out_proj.\2"),
    (
        r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)",
        r"encoder.stack.layers.\1.self_attn_layer_norm.\2",
    ),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)", r"encoder.stack.layers.\1.fc1.\2"),
    (r"encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)", r"encoder.stack.layers.\1.fc2.\2"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)", r"encoder.stack.layers.\1.final_layer_norm.\2"),
    (r"(?:encoder\.)?rel_pos_bias\.weight", "encoder.stack.relative_position.weight"),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1"),
    (r"cls\.seq_relationship\.(weight|bias)", r"next_sentence_head.\1"),
    (r"cls\.predictions\.transform\.dense\.(weight|bias)", r"lm_head.dense.\1"),
    (r"cls\.predictions\.transform\.LayerNorm\.(weight|bias)", r"lm_head.layer_norm.\1"),
    (r"cls\.predictions\.bias", "lm_head.bias"),
]
# Present in some files, carried by other parameters here: position ids (a buffer), the decoder's copy of the
# output bias, the tied output embedding (checked equal to the input embedding).
BERT_IGNORED = [r"embeddings\.position_ids", r"cls\.predictions\.decoder\.bias", r"cls\.predictions\.decoder\.weight"]
FUSED_QKV = re.compile(r"encoder\.layer\.(\d+)\.attention\.self\.qkv_linear\.weight")

ROBERTA_NAMES = [
    (r"encoder\.sentence_encoder\.embed_tokens\.weight", "encoder.stack.embeddings.tokens.weight"),
    (r"encoder\.sentence_encoder\.embed_positions\.weight", "encoder.stack.embeddings.positions.weight"),
    (r"encoder\.sentence_encoder\.(?:layernorm_embedding|emb_layer_norm)\.(weight|bias)", r"encoder.stack.embeddings.layer_norm.\1"),
    (r"encoder\.sentence_encoder\.layers\.(\d+)\.self_attn\.(q|k|v|out)_proj\.(weight|bias)", r"encoder.stack.layers.\1.\2_proj.\3"),
    (r"encoder\.sentence_encoder\.layers\.(\d+)\.(self_attn_layer_norm|fc1|fc2|final_layer_norm)\.(weight|bias)", r"encoder.stack.layers.\1.\2.\3"),
    (r"encoder\.lm_head\.dense\.(weight|bias)", r"lm_head.dense.\1"),
    (r"encoder\.lm_head\.layer_norm\.(weight|bias)", r"lm_head.layer_norm.\1"),
    (r"encoder\.lm_head\.bias", "lm_head.bias"),
]
ROBERTA_IGNORED = [r"encoder\.lm_head\.weight", r"encoder\.sentence_encoder\.version", r"encoder\.version"]


def rename(name, table, ignored, path):
    """The unilm name of ``name`` (None for ignored ones); unknown names are an error that names ``path``."""
    for pattern in ignored:
        if re.fullmatch(pattern, name):
            return None
    for pattern, target in table:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, target, name)
    raise ConversionError(f"{path}: unknown parameter {name!r}; this is not a BERT/UniLM/RoBERTa checkpoint we know")


# ---------------------------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------------------------


def read_state(path):
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: file not found")
    return safe_loading.load_state(path)


def read_bert(directory):
    """Return (state dict with normalised names, config dict, vocabulary list, paths)."""
    directory = Path(directory)
    paths = {name: directory / name for name in ("pytorch_model.bin", "config.json", "vocab.txt")}
    for path in paths.values():
        if not path.is_file():
            raise ConversionError(f"{path}: file not found (a BERT directory holds pytorch_model.bin, config.json, vocab.txt)")
    state = read_state(str(paths["pytorch_model.bin"]))
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ConversionError(f"{paths['pytorch_model.bin']}: not a state dict of tensors")
    try:
        config = json.loads(paths["config.json"].read_text())
    except json.JSONDecodeError as error:
        raise ConversionError(f"{paths['config.json']}: not valid JSON ({error})") from None
    vocab = paths["vocab.txt"].read_text(encoding="utf-8").split("\n")
    if vocab and vocab[-1] == "":
        vocab.pop()
    normalised = {}
    for name, tensor in state.items():
        name = re.sub(r"^bert\.", "", name)
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        normalised[name] = tensor
    return normalised, config, vocab, paths


def bert_dictionary(vocab, vocab_path, with_pseudo):
    """fairseq dictionary symbols and, per symbol, the BERT row it takes."""
    index = {}
    for row, token in enumerate(vocab):
        if not token or " " in token or token in index:
            raise ConversionError(f"{vocab_path}: line {row + 1} ({token!r}) is empty, has a space, or repeats")
        index[token] = row
    for special in list(BERT_SPECIALS.values()) + ["[MASK]"]:
        if special not in index:
            raise ConversionError(f"{vocab_path}: no {special} token; not a BERT WordPiece vocabulary")
    taken = {index[v] for v in BERT_SPECIALS.values()}
    symbols = [token if token != "[MASK]" else MASK for row, token in enumerate(vocab) if row not in taken]
    rows = [index[BERT_SPECIALS[s]] for s in ("<s>", "<pad>", "</s>", "<unk>")]
    rows += [index["[MASK]"] if s == MASK else index[s] for s in symbols]
    for symbol in symbols:
        if symbol in BERT_SPECIALS or symbol == PSEUDO:
            raise ConversionError(f"{vocab_path}: the token {symbol!r} clashes with a fairseq special symbol")
    if with_pseudo:
        symbols.append(PSEUDO)
        rows.append(index["[MASK]"])
    return symbols, torch.tensor(rows)


def convert_bert(args):
    state, config, vocab, paths = read_bert(args.input)
    bin_path = paths["pytorch_model.bin"]
    fused = {name for name in state if FUSED_QKV.fullmatch(name)}
    relative = [name for name in state if re.fullmatch(r"(?:encoder\.)?rel_pos_bias\.weight", name)]
    symbols, rows = bert_dictionary(vocab, paths["vocab.txt"], with_pseudo=bool(relative or fused))

    try:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        model_cfg = dict(
            encoder_layers=config["num_hidden_layers"],
            encoder_embed_dim=hidden,
            encoder_ffn_embed_dim=config["intermediate_size"],
            encoder_attention_heads=heads,
            max_positions=config["max_position_embeddings"],
            num_segments=max(config.get("type_vocab_size", 2), args.num_segments or 0),
            layer_norm_eps=config.get("layer_norm_eps", 1e-12),
            relative_position_buckets=state[relative[0]].size(1) if relative else 0,
            relative_position_max_distance=config.get("max_rel_pos", 128),
        )
    except KeyError as error:
        raise ConversionError(f"{paths['config.json']}: missing {error}") from None
    if config.get("hidden_act", "gelu") != "gelu":
        raise ConversionError(f"{paths['config.json']}: hidden_act {config['hidden_act']!r}; UniLM uses gelu")

    converted = {}
    for name, tensor in state.items():
        match = FUSED_QKV.fullmatch(name)
        if match:
            layer = match.group(1)
            if tensor.shape != (3 * hidden, hidden):
                raise ConversionError(f"{bin_path}: {name} has shape {tuple(tensor.shape)}, expected [3H, H] = [{3 * hidden}, {hidden}]")
            query, key, value = tensor.chunk(3, dim=0)
            prefix = f"encoder.stack.layers.{layer}."
            converted[prefix + "q_proj.weight"], converted[prefix + "k_proj.weight"] = query, key
            converted[prefix + "v_proj.weight"] = value
            converted[prefix + "k_proj.bias"] = torch.zeros(hidden, dtype=tensor.dtype)  # UniLMv2 has no key bias
            continue
        target = rename(name, BERT_NAMES, BERT_IGNORED, bin_path)
        if target is not None:
            converted[target] = tensor
    embeddings = state.get("embeddings.word_embeddings.weight")
    if embeddings is None:
        raise ConversionError(f"{bin_path}: no embeddings.word_embeddings.weight")
    output = state.get("cls.predictions.decoder.weight")
    if output is not None and not torch.equal(output, embeddings):
        raise ConversionError(f"{bin_path}: the output embedding is not tied to the input embedding (UniLM ties them)")
    if len(vocab) != embeddings.size(0):
        raise ConversionError(f"{paths['vocab.txt']}: {len(vocab)} tokens, but the embedding has {embeddings.size(0)} rows")
    converted["encoder.stack.embeddings.tokens.weight"] = embeddings[rows]
    if "lm_head.bias" in converted:
        converted["lm_head.bias"] = converted["lm_head.bias"][rows]
    segments = converted.get("encoder.stack.embeddings.segments.weight")
    if segments is not None and segments.size(0) < model_cfg["num_segments"]:
        extra = segments[:1].expand(model_cfg["num_segments"] - segments.size(0), -1)
        converted["encoder.stack.embeddings.segments.weight"] = torch.cat([segments, extra])
    arch = "unilm2" if model_cfg["relative_position_buckets"] else "unilm"
    write_output(args.output, symbols, model_cfg, converted, bin_path, arch)
    atomic_write_bytes(Path(args.output) / "vocab.txt", paths["vocab.txt"].read_bytes())


def convert_roberta(args):
    state = read_state(args.input)
    if not isinstance(state, dict) or "model" not in state:
        raise ConversionError(f"{args.input}: not a fairseq checkpoint (no 'model' entry)")
    if not os.path.isfile(args.dict):
        raise ConversionError(f"{args.dict}: file not found")
    weights = state["model"]
    cfg = state.get("cfg") or {}
    model_args = cfg.get("model") if isinstance(cfg, dict) or OmegaConf.is_config(cfg) else None
    if model_args is None and state.get("args") is not None:
        model_args = vars(state["args"])
    heads = (model_args or {}).get("encoder_attention_heads")
    if heads is None:
        raise ConversionError(f"{args.input}: the checkpoint does not record encoder_attention_heads")
    tokens = weights.get("encoder.sentence_encoder.embed_tokens.weight")
    if tokens is None:
        raise ConversionError(f"{args.input}: no encoder.sentence_encoder.embed_tokens.weight; not a RoBERTa checkpoint")
    layers = 1 + max(
        int(m.group(1)) for m in (re.match(r"encoder\.sentence_encoder\.layers\.(\d+)\.", k) for k in weights) if m
    )
    positions = weights["encoder.sentence_encoder.embed_positions.weight"]
    dictionary = Dictionary.load(args.dict)
    symbols = dictionary.symbols[dictionary.nspecial :]
    # RoBERTa's task appends <mask> to dict.txt; so do ours.
    if len(dictionary) + (MASK not in dictionary.indices) != tokens.size(0):
        raise ConversionError(f"{args.dict}: {len(dictionary)} symbols (+ <mask>) do not match the {tokens.size(0)} embeddings of {args.input}")
    padding = dictionary.pad()
    model_cfg = dict(
        encoder_layers=layers,
        encoder_embed_dim=tokens.size(1),
        encoder_ffn_embed_dim=weights["encoder.sentence_encoder.layers.0.fc1.weight"].size(0),
        encoder_attention_heads=heads,
        # fairseq's learned positions start after the padding index; BERT's (and ours) at 0.
        max_positions=positions.size(0) - padding - 1,
        num_segments=args.num_segments or 6,
        layer_norm_eps=1e-5,
        relative_position_buckets=0,
        relative_position_max_distance=128,
    )
    converted = {}
    for name, tensor in weights.items():
        target = rename(name, ROBERTA_NAMES, ROBERTA_IGNORED, args.input)
        if target is not None:
            converted[target] = tensor
    converted["encoder.stack.embeddings.positions.weight"] = positions[padding + 1 :]
    # RoBERTa has no segment embeddings: zeros keep its function exactly while the segments learn.
    converted["encoder.stack.embeddings.segments.weight"] = torch.zeros(model_cfg["num_segments"], tokens.size(1))
    write_output(args.output, symbols, model_cfg, converted, args.input, "unilm")


# ---------------------------------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------------------------------


def fairseq_cfg(output, model_cfg):
    """A complete fairseq configuration (as fairseq-train would save it) for the converted model."""
    argv = [str(output), "--user-dir", str(REPO / "palm_plugin"), "--task", "unilm_seq2seq", "--arch", "unilm",
            "--criterion", "unilm_cloze"]
    for key, value in model_cfg.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    return OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)


def write_output(output, symbols, model_cfg, converted, source_path, arch_family):
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    dictionary = Dictionary()
    for symbol in symbols:
        dictionary.add_symbol(symbol)
    dictionary.add_symbol(MASK)
    cfg = fairseq_cfg(output, model_cfg)
    model = UniLMModel.build_model(OmegaConf.create(cfg["model"]), argparse.Namespace(source_dictionary=dictionary))
    expected = model.state_dict()
    for name, tensor in converted.items():
        if name not in expected:
            raise ConversionError(f"{source_path}: parameter for {name!r} has no place in a {arch_family} model")
        if tensor.shape != expected[name].shape:
            raise ConversionError(
                f"{source_path}: shape mismatch for {name}: the file has {tuple(tensor.shape)}, the model built from "
                f"its config needs {tuple(expected[name].shape)}"
            )
    missing = sorted(set(expected) - set(converted) - {"lm_head.weight"})
    essential = [n for n in missing if n.startswith("encoder.")]
    if essential:
        raise ConversionError(f"{source_path}: missing parameters {essential[:5]}{' ...' if len(essential) > 5 else ''}")
    if missing:
        print(f"not in {source_path}, initialised randomly: {', '.join(missing)}", file=sys.stderr)
    expected.update({k: v.to(expected[k].dtype) for k, v in converted.items()})
    expected["lm_head.weight"] = expected["encoder.stack.embeddings.tokens.weight"]
    model.load_state_dict(expected, strict=True)
    state = {
        "args": None,
        "cfg": cfg,
        "model": model.state_dict(),
        "optimizer_history": [
            {"criterion_name": "UniLMClozeCriterion", "optimizer_name": "none", "lr_scheduler_state": {"best": None},
             "num_updates": 0}
        ],
        "extra_state": {},
        "last_optimizer_state": None,
    }
    atomic_save(output / "model.pt", state)
    atomic_write_bytes(output / "dict.txt", "".join(f"{s} 1\n" for s in symbols).encode("utf-8"))
    print(f"wrote {output / 'model.pt'} ({model_cfg['encoder_layers']} layers, {model_cfg['encoder_embed_dim']} dims, "
          f"{len(dictionary)} symbols, {model_cfg['num_segments']} segments, relative position buckets "
          f"{model_cfg['relative_position_buckets']}) and {output / 'dict.txt'}")


def atomic_save(path, state):
    with atomic_path(path) as temporary:
        checkpoint_utils.torch_persistent_save(state, temporary)


def atomic_write_bytes(path, data):
    with atomic_path(path) as temporary:
        Path(temporary).write_bytes(data)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bert = commands.add_parser("bert", help="HF-format BERT / UniLM v1 / MiniLM / UniLMv2 directory")
    bert.add_argument("--input", required=True, help="directory with pytorch_model.bin, config.json, vocab.txt")
    roberta = commands.add_parser("roberta", help="fairseq RoBERTa checkpoint")
    roberta.add_argument("--input", required=True, help="fairseq checkpoint (model.pt)")
    roberta.add_argument("--dict", required=True, help="the checkpoint's dict.txt")
    for command in (bert, roberta):
        command.add_argument("--output", required=True, help="output directory (model.pt, dict.txt)")
        command.add_argument(
            "--num-segments", type=int, default=None,
            help="segment types of the converted model (UniLM v1 objectives need 6; default: the checkpoint's, "
                 "6 for RoBERTa)",
        )
    args = parser.parse_args(argv)
    try:
        (convert_bert if args.command == "bert" else convert_roberta)(args)
    except ConversionError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
