"""RoBERTa checkpoints: fairseq RoBERTa -> unilm checkpoint (``palm-convert roberta``), and an HF RoBERTa directory
-> the fairseq RoBERTa that PALM's ``--roberta-path`` reads (``palm-convert hf-roberta``)."""
import argparse
import json
import os
import re
import sys
from pathlib import Path

import torch
from fairseq.data import Dictionary
from omegaconf import OmegaConf

from palm_plugin.modules import table_extension
from palm_tools.convert import ConversionError, some_names
from palm_tools.convert.checkpoint import (atomic_save, atomic_write_bytes, fairseq_cfg, untrained_checkpoint,
                                          write_output)
from palm_tools.convert.names import (BERT_IGNORED, BERT_NAMES, GPT2_SPECIALS, HF_ROBERTA_HEAD, MASK, ROBERTA_IGNORED,
                                      ROBERTA_NAMES, TIED_OUTPUT, rename)
from palm_tools.convert.reading import opened_input, read_state, read_weights


def convert_roberta(args):
    state = read_state(args.input)
    if not isinstance(state, dict) or "model" not in state:
        raise ConversionError(f"{args.input}: not a fairseq checkpoint (no 'model' entry); pass the model.pt of a "
                              "fairseq RoBERTa (an HF RoBERTa folder: palm-convert hf-roberta)")
    if not os.path.isfile(args.dict):
        raise ConversionError(f"{args.dict}: file not found; pass the dict.txt the RoBERTa model was trained with")
    weights = state["model"]
    cfg = state.get("cfg") or {}
    model_args = cfg.get("model") if isinstance(cfg, dict) or OmegaConf.is_config(cfg) else None
    if model_args is None and state.get("args") is not None:
        model_args = vars(state["args"])
    heads = (model_args or {}).get("encoder_attention_heads")
    if heads is None:
        raise ConversionError(f"{args.input}: the checkpoint does not record encoder_attention_heads (in its cfg "
                              "or args); pass the model.pt as fairseq saved it")
    tokens = weights.get("encoder.sentence_encoder.embed_tokens.weight")
    if tokens is None:
        raise ConversionError(f"{args.input}: no encoder.sentence_encoder.embed_tokens.weight; not a RoBERTa checkpoint: "
                              "pass the model.pt of a fairseq RoBERTa")
    essential = ("encoder.sentence_encoder.embed_positions.weight", "encoder.sentence_encoder.layers.0.fc1.weight")
    missing = [name for name in essential if name not in weights]
    if missing:
        raise ConversionError(f"{args.input}: missing {some_names(missing)}; convert the model's complete weights")
    layers = 1 + max(
        int(m.group(1)) for m in (re.match(r"encoder\.sentence_encoder\.layers\.(\d+)\.", k) for k in weights) if m
    )
    positions = weights["encoder.sentence_encoder.embed_positions.weight"]
    dictionary = Dictionary.load(args.dict)
    symbols = dictionary.symbols[dictionary.nspecial :]
    # RoBERTa's task appends <mask> to dict.txt; so do ours.
    if len(dictionary) + (MASK not in dictionary.indices) != tokens.size(0):
        raise ConversionError(f"{args.dict}: {len(dictionary)} symbols (+ <mask>) do not match the {tokens.size(0)} "
                              f"embeddings of {args.input}; pass the dict.txt the RoBERTa model was trained with")
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
    # an absent key means transformers' RobertaConfig default, which HF runs the file with: 1e-12 and gelu
    epsilon, activation = config.get("layer_norm_eps", 1e-12), config.get("hidden_act", "gelu")
    if epsilon != 1e-5 or activation != "gelu":
        said = "" if "layer_norm_eps" in config else " (not in the file: transformers' default)"
        raise ConversionError(f"{config_path}: layer_norm_eps {epsilon}{said} / hidden_act {activation!r}: fairseq's "
                              f"RoBERTa has 1e-5 and gelu")
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    size = len(by_id)
    if [i for _, i in by_id] != list(range(size)) or [t for t, _ in by_id[:4]] != GPT2_SPECIALS or by_id[-1][0] != MASK:
        raise ConversionError(f"{vocab_path}: not RoBERTa's layout (ids 0..V-1, {' '.join(GPT2_SPECIALS)} first, "
                              f"<mask> last)")
    pad = config.get("pad_token_id", 1)
    if pad != vocab["<pad>"]:
        raise ConversionError(f"{config_path}: pad_token_id {pad}, but {vocab_path} has <pad> at {vocab['<pad>']}: "
                              "HF numbers the positions from pad_token_id + 1, fairseq's RoBERTa from <pad> + 1; the "
                              "folder's config.json must be the model's own")
    tokens = state.get("embeddings.word_embeddings.weight")
    if tokens is None or tokens.size(0) != size:
        raise ConversionError(f"{weights_path}: the token embedding does not have the {size} rows of {vocab_path}; "
                              "the folder's vocab.json must be the model's own")
    model_args = dict(
        encoder_layers=config["num_hidden_layers"], encoder_embed_dim=config["hidden_size"],
        encoder_ffn_embed_dim=config["intermediate_size"], encoder_attention_heads=config["num_attention_heads"],
        max_positions=config["max_position_embeddings"] - pad - 1,
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
        raise ConversionError(f"{weights_path}: missing {some_names(missing)}; convert the model's complete weights")
    if dropped:
        print(f"not used by fairseq's RoBERTa (dropped): {', '.join(d for d in dropped if 'token_type' not in d)}",
              file=sys.stderr)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    # the configuration of fairseq's masked_lm / roberta, so that fairseq's own loaders read it as they read a
    # published RoBERTa (RobertaModel.from_pretrained(OUT, "model.pt"))
    cfg = fairseq_cfg(output, model_args, {"tokens_per_sample": model_args["max_positions"]}, task="masked_lm",
                      arch="roberta", criterion="masked_lm")
    atomic_save(output / "model.pt", untrained_checkpoint(cfg, weights))
    atomic_write_bytes(output / "dict.txt", "".join(f"{i} 1\n" for i in range(4, size - 1)).encode("utf-8"))
    atomic_write_bytes(output / "encoder.json", json.dumps(vocab, ensure_ascii=False).encode("utf-8"))
    # fairseq's gpt2 BPE drops the first line (#version) and the last of vocab.bpe: end with a newline
    atomic_write_bytes(output / "vocab.bpe", (merges if merges.endswith("\n") else merges + "\n").encode("utf-8"))
    print(f"wrote {output / 'model.pt'} (fairseq RoBERTa: {model_args['encoder_layers']} layers, "
          f"{model_args['encoder_embed_dim']} dims, {size} symbols), dict.txt, encoder.json, vocab.bpe: "
          f"fairseq-train --arch palm_base --roberta-path {output / 'model.pt'}; fairseq-preprocess --srcdict "
          f"{output / 'dict.txt'}; palm-prepare encode --bpe gpt2 --model {output / 'encoder.json'} --vocab-bpe "
          f"{output / 'vocab.bpe'}")
