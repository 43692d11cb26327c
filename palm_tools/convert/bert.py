"""HF BERT / UniLM v1 / MiniLM / UniLMv2 directory -> unilm checkpoint (``palm-convert bert``).

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
"""
import json
import re
import sys
from pathlib import Path

import torch

from palm_plugin.modules import table_extension
from palm_tools.convert import ConversionError
from palm_tools.convert.checkpoint import atomic_write_bytes, write_output
from palm_tools.convert.names import (BERT_IGNORED, BERT_NAMES, BERT_SPECIALS, FUSED_QKV, MASK, PSEUDO, TIED_OUTPUT,
                                      TRAINING_ONLY, rename)
from palm_tools.convert.reading import opened_input, read_bert
from palm_tools.data import encode


def bert_dictionary(vocab, vocab_path, with_pseudo):
    """fairseq dictionary symbols and, per symbol, the BERT row it takes."""
    index = {}
    for row, token in enumerate(vocab):
        if not token or " " in token or token in index:
            raise ConversionError(f"{vocab_path}: line {row + 1} ({token!r}) is empty, has a space, or repeats; a "
                                  "WordPiece vocabulary has one distinct token a line: use the model's own file")
        index[token] = row
    for special in list(BERT_SPECIALS.values()) + ["[MASK]"]:
        if special not in index:
            raise ConversionError(f"{vocab_path}: no {special} token; not a BERT WordPiece vocabulary: use the "
                                  "model's own")
    taken = {index[v] for v in BERT_SPECIALS.values()}
    symbols = [token if token != "[MASK]" else MASK for row, token in enumerate(vocab) if row not in taken]
    rows = [index[BERT_SPECIALS[s]] for s in ("<s>", "<pad>", "</s>", "<unk>")]
    rows += [index["[MASK]"] if s == MASK else index[s] for s in symbols]
    for symbol in symbols:
        if symbol in BERT_SPECIALS or symbol == PSEUDO:
            raise ConversionError(f"{vocab_path}: the token {symbol!r} clashes with a fairseq special symbol (BERT's "
                                  f"[CLS] [PAD] [SEP] [UNK] become <s> <pad> </s> <unk>, and <pseudo> is added); "
                                  f"rename it in a copy of the folder (e.g. to '{symbol}_': its row keeps its "
                                  f"embedding) and convert the copy")
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

    needed = max(config.get("type_vocab_size", 2), target_segment + 1)
    if args.num_segments is not None and args.num_segments < needed:
        raise ConversionError(
            f"--num-segments {args.num_segments}: the converted model needs at least {needed} segment types (the "
            f"checkpoint's {config.get('type_vocab_size', 2)} trained rows, and the fine-tuning target's segment "
            f"{target_segment}); drop --num-segments or give {needed} or more")
    try:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        model_cfg = dict(
            encoder_layers=config["num_hidden_layers"],
            encoder_embed_dim=hidden,
            encoder_ffn_embed_dim=config["intermediate_size"],
            encoder_attention_heads=heads,
            max_positions=args.max_positions or config["max_position_embeddings"],
            num_segments=max(needed, args.num_segments or 0),
            layer_norm_eps=eps,
            relative_position_buckets=state[relative[0]].size(1) if relative else 0,
            relative_position_max_distance=config.get("max_rel_pos", 128),
        )
    except KeyError as error:
        raise ConversionError(f"{paths['config.json']}: missing {error}, which a BERT-family config.json holds: "
                              "use the model's own config.json") from None
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
        raise ConversionError(f"{paths['vocab']}: {len(vocab)} tokens, but the embedding has {embeddings.size(0)} rows; "
                              "the folder's vocabulary must be the model's own")
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
