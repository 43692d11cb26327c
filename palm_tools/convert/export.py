"""unilm checkpoint (converted, or trained here) -> HF BERT directory (``palm-convert export``); UniLMv2 models in
the released fast-qkv layout."""
import json
import re
from pathlib import Path

import torch
from fairseq.data import Dictionary

from palm_plugin.modules.dictionary_check import FINGERPRINT, differing_rows
from palm_plugin.modules.table_extension import TOKENS
from palm_tools.atomic_files import atomic_path
from palm_tools.convert import ConversionError, some_names
from palm_tools.convert.checkpoint import atomic_write_bytes
from palm_tools.convert.names import BERT_IGNORED, BERT_NAMES, BERT_SPECIALS, MASK, PSEUDO, rename
from palm_tools.convert.reading import read_state


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


def export_dictionary(checkpoint, cfg, weights, args):
    """The dictionary the checkpoint was trained with (``--dict``, dict.txt beside it, or its data's dictionary),
    with the symbols the tasks add (<mask>, and <pseudo> when the embedding has a row for it); checked against the
    checkpoint's record of its symbols when it has one."""
    rows = weights[TOKENS].size(0)
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
        raise ConversionError(f"{path}: {len(dictionary)} symbols, but {checkpoint} has {rows} embedding rows: pass "
                              "--dict with the dict.txt of the data it was trained on")
    differ = differing_rows(weights[FINGERPRINT], dictionary) if FINGERPRINT in weights else []
    if differ:
        raise ConversionError(f"{path}: not the dictionary {checkpoint} was trained with ({len(differ)} of its "
                              f"{rows} rows name other symbols, the first row {differ[0]}); pass --dict with the "
                              "dict.txt of the data it was trained on")
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
    embeddings = weights[TOKENS]
    dictionary = export_dictionary(checkpoint, cfg, weights, args)
    bert_name = {**BERT_SPECIALS, MASK: "[MASK]"}
    vocab_path = Path(args.vocab) if args.vocab else checkpoint.parent / "vocab.txt"
    if vocab_path.is_file():  # the published order, so that a converted checkpoint goes back row for row
        vocab = vocab_path.read_text(encoding="utf-8").splitlines()
        ours = {bert_name.get(symbol, symbol): index for index, symbol in enumerate(dictionary.symbols)}
        missing = [token for token in vocab if token not in ours]
        if missing:
            raise ConversionError(f"{vocab_path}: tokens not in the checkpoint's dictionary: {some_names(missing)}; "
                                  "pass the vocab.txt the checkpoint was converted from (--vocab), or none")
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
        if ours in ("lm_head.weight", "encoder.stack.relative_position.weight", FINGERPRINT) or ours.startswith("classification_heads."):
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
