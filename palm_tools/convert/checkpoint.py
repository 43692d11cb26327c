"""Writing a converted model: a fairseq checkpoint with the complete configuration fairseq-train would save (of the
unilm model; of fairseq's RoBERTa for ``hf-roberta``), its dict.txt, and the whole-or-nothing writes every output of
palm-convert goes through."""
import argparse
import sys
from pathlib import Path

import torch
from fairseq import checkpoint_utils, options
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

import palm_plugin
from palm_plugin.models.unilm import UniLMModel
from palm_plugin.modules.dictionary_check import FINGERPRINT
from palm_tools.atomic_files import atomic_path
from palm_tools.convert import ConversionError, some_names
from palm_tools.convert.names import MASK


def fairseq_cfg(output, model_cfg, task_cfg, task="unilm_seq2seq", arch="unilm", criterion="unilm_cloze"):
    """A complete fairseq configuration (as fairseq-train would save it) for the converted model: what fairseq's
    loaders (``--finetune-from-model``, ``--path``, the hub's ``from_pretrained``) build the task and model from."""
    # the plugin as already imported: fairseq refuses a --user-dir that names it by another path (a symlink, say)
    argv = [str(output), "--user-dir", palm_plugin.__path__[0], "--task", task, "--arch", arch,
            "--criterion", criterion]
    for key, value in {**model_cfg, **task_cfg}.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    # a model without a dataclass (fairseq's roberta) keeps its options in a Namespace: plain types load weights-only
    return {key: vars(value) if isinstance(value, argparse.Namespace) else value for key, value in cfg.items()}


def untrained_checkpoint(cfg, weights):
    """A fairseq checkpoint before any update: the state fairseq-train saves, without an optimizer state (as after
    --no-save-optimizer-state; fairseq reads it with .get) and with an optimizer history naming the criterion."""
    return {
        "args": None,
        "cfg": cfg,
        "model": weights,
        "optimizer_history": [
            {"criterion_name": CRITERION_REGISTRY[cfg["criterion"]["_name"]].__name__, "optimizer_name": "none",
             "lr_scheduler_state": {"best": None}, "num_updates": 0}
        ],
        "extra_state": {},
    }


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
                f"its config needs {tuple(expected[name].shape)}; the config.json beside the weights must be the "
                "model's own"
            )
    missing = sorted(set(expected) - set(converted) - {"lm_head.weight", FINGERPRINT})  # the record: the model's own
    essential = [n for n in missing if n.startswith("encoder.")]
    if essential:
        raise ConversionError(f"{source_path}: missing parameters {some_names(essential)}; the file holds part of "
                              "the model, or another one than config.json describes: convert the model's complete "
                              "weights")
    if missing:
        print(f"not in {source_path}, so as a new model starts them (weights at random, biases at 0, LayerNorm "
              f"scales at 1): {', '.join(missing)}", file=sys.stderr)
    if any(name.startswith("lm_head.") for name in missing):
        print("no MLM head in this checkpoint (a sentence-embedding model?): the output layer that predicts tokens "
              "starts untrained, with its softmax weights tied to the input embeddings; fine-tuning trains it",
              file=sys.stderr)
    expected.update({k: v.to(expected[k].dtype) for k, v in converted.items()})
    expected["lm_head.weight"] = expected["encoder.stack.embeddings.tokens.weight"]
    model.load_state_dict(expected, strict=True)
    atomic_save(output / "model.pt", untrained_checkpoint(cfg, model.state_dict()))
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
