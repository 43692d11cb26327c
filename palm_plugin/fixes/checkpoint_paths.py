"""Checkpoint paths that fairseq misreads, and model sizes that fine-tuning must not make users retype.

fairseq-train ``--finetune-from-model DIR`` trains from scratch after an INFO line ("No existing checkpoint found"),
because ``PathManager.exists`` accepts a directory and the trainer then finds no file; a ``--restore-file`` that
does not exist does the same; an HF ``pytorch_model.bin`` or ``model.safetensors`` given to ``--finetune-from-model``
/ ``--restore-file`` / ``--path`` ends in ``KeyError: 'best_loss'`` or an unpickling traceback. And fine-tuning a
checkpoint needs its layers, dimensions, heads, positions and segments retyped on the command line, or fairseq
stops with "ensure that the architectures match" after a traceback.

:func:`install` wraps ``fairseq.options.parse_args_and_arch`` (every fairseq command parses there, after the
plugin is imported), and after parsing:

* checks each checkpoint path given and stops with what to do as the last line of output: a directory (name the
  checkpoint file in it; an HF directory: convert it with ``palm-convert``), a missing file, an HF weights file;
* stops when ``--finetune-from-model`` is a checkpoint of the other family (a UniLM one under a ``palm_*`` arch, a
  PALM one under ``unilm_*``), where fairseq failed at loading with "ensure that the architectures match", and says
  which archs take it (or ``--roberta-path``, which starts PALM's encoder from a BERT-family checkpoint);
* for ``--finetune-from-model`` (and ``--path``: the task's fields only) of a checkpoint of the same model, adopts
  the checkpoint's sizes (:data:`SIZES`) and the task's segment ids and layout (:data:`TASK_FIELDS`: a checkpoint
  fine-tuned with ``--pseudo-masks`` decodes with it; after ``pmlm``, its S1 / S2 segments 0 / 1) that the command
  line does not set. A size set on the command line that differs stops with the flags to use; a larger
  ``--max-positions`` or ``--num-segments`` is allowed: the model grows the checkpoint's tables when it loads them
  (:mod:`palm_plugin.modules.table_extension`), as the papers' 768-position fine-tuning needs. A checkpoint without a
  relative position bias (BERT, UniLM v1, MiniLM) gives no relative sizes: a ``unilm2_*`` arch keeps its own and
  starts its bias at zero. PALM's ``--roberta-path`` of a converted BERT-family checkpoint gives its LayerNorm
  epsilon.
"""
import logging
import os
import re

import torch

from palm_plugin.errors import CommandError
from palm_plugin.fixes.parsed_arguments import check_after_parsing

logger = logging.getLogger(__name__)

# Model fields that fix the shape of a checkpoint's parameters (unilm's and palm's names).
SIZES = re.compile(
    r"(encoder|decoder)_(layers|embed_dim|ffn_embed_dim|attention_heads)|max_positions|(encoder|decoder)_max_positions"
    r"|num_segments|relative_position_(buckets|max_distance)|layer_norm_eps"
)
GROWABLE = ("max_positions", "num_segments")
TASK_FIELDS = ("source_segment", "target_segment", "pseudo_masks")
# the segment ids of S1 / S2 in the tasks that pre-train with two segments: fine-tuning adopts them
PRETRAINING_SEGMENTS = {"pmlm": {"source_segment": 0, "target_segment": 1}}
# the task that decodes each family of the plugin's models (DESIGN.md section 1)
DECODING_TASK = {"palm": "translation", "unilm": "unilm_seq2seq"}
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class CheckpointPathError(CommandError):
    """A checkpoint path or checkpoint that the command cannot use."""


def _flag(name):
    return "--" + name.replace("_", "-")


def _given(arguments, name):
    """Whether the command line sets option ``name`` (``--x-y V`` or ``--x-y=V``)."""
    flag = _flag(name)
    return any(a == flag or a.startswith(flag + "=") for a in arguments)


def _convert_hint(path):
    return (f"convert it first: palm-convert bert --input {path} --output converted (or hf-roberta for RoBERTa), "
            f"then pass converted/model.pt")


def read_checkpoint(path, option):
    """The checkpoint at ``path`` (weights-only, memory-mapped when possible); stops with what to do when ``path``
    is not a fairseq checkpoint file."""
    from palm_plugin.fixes import safe_loading

    if os.path.isdir(path):
        if any(os.path.isfile(os.path.join(path, name)) for name in HF_WEIGHTS):
            raise CheckpointPathError(f"{option} {path}: a Hugging Face model directory, not a fairseq checkpoint; "
                                      + _convert_hint(path))
        found = sorted(name for name in os.listdir(path) if name.endswith(".pt"))
        raise CheckpointPathError(f"{option} {path}: a directory; pass the checkpoint file in it"
                                  + (f" ({', '.join(os.path.join(path, n) for n in found[:3])})" if found else
                                     " (it holds no .pt file)"))
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        there = sorted(name for name in os.listdir(folder) if name.endswith(".pt")) if os.path.isdir(folder) else []
        raise CheckpointPathError(f"{option} {path}: file not found; " + (
            f"the checkpoints in {folder}: {', '.join(there[:5])}" if there else
            f"{folder} holds no .pt file" if os.path.isdir(folder) else f"there is no folder {folder}"))
    if path.endswith(".safetensors") or path.endswith(".index.json"):
        raise CheckpointPathError(f"{option} {path}: Hugging Face weights, not a fairseq checkpoint; "
                                  + _convert_hint(os.path.dirname(path) or "."))
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # files in torch's legacy (non-zip) format cannot be memory-mapped
            state = safe_loading.load_state(path)
    except (safe_loading.UnsafeCheckpointError, safe_loading.CorruptCheckpointError,
            safe_loading.ForeignCheckpointError) as error:
        raise CheckpointPathError(str(error)) from None
    except Exception as error:
        try:
            safe_loading.load_state(path)  # its errors name the file and the cause
        except Exception as named:
            raise CheckpointPathError(str(named)) from None
        raise CheckpointPathError(f"{path}: cannot read ({error})") from None
    if not isinstance(state, dict) or "model" not in state or not ({"cfg", "args"} & set(state)):
        if safe_loading.is_released_palm_state(state):
            raise CheckpointPathError(safe_loading.released_palm_message(path))
        kind = "an HF state dict (e.g. pytorch_model.bin)" if isinstance(state, dict) and state and all(
            torch.is_tensor(v) for v in state.values()) else "not a fairseq checkpoint"
        raise CheckpointPathError(f"{option} {path}: {kind}; " + _convert_hint(os.path.dirname(path) or "."))
    return state


def _config(state, section):
    """A section of the checkpoint's configuration as a dict (fairseq stores dicts, omegaconf containers, or
    argparse namespaces: ``args`` in old checkpoints, ``cfg.model`` in models without a dataclass)."""
    import argparse

    from omegaconf import OmegaConf

    cfg = state.get("cfg")
    part = cfg.get(section) if cfg is not None and hasattr(cfg, "get") else state.get("args")
    if OmegaConf.is_config(part):
        part = OmegaConf.to_container(part, resolve=True)
    if isinstance(part, argparse.Namespace):
        part = vars(part)
    return dict(part) if isinstance(part, dict) else {}


def _same_model(args, model_cfg):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    name = model_cfg.get("_name") or model_cfg.get("arch")
    ours = getattr(args, "arch", None)
    return name is not None and ours is not None and (
        ARCH_MODEL_NAME_REGISTRY.get(name, name) == ARCH_MODEL_NAME_REGISTRY.get(ours, ours))


def adopt(args, arguments, state, path, sizes=True):
    """Set the checkpoint's sizes (and segment ids) on ``args`` where the command line does not; stop on a
    conflicting size. Returns the adopted ``{name: value}``."""
    model_cfg, task_cfg = _config(state, "model"), _config(state, "task")
    adopted, conflicts = {}, []
    if sizes and _same_model(args, model_cfg):
        for name, value in model_cfg.items():
            if not SIZES.fullmatch(name) or value is None:
                continue
            if name.startswith("relative_position_") and not model_cfg.get("relative_position_buckets"):
                continue  # no relative bias in the checkpoint: a unilm2 model adds one, all zero (table_extension)
            if not _given(arguments, name):
                setattr(args, name, value)
                adopted[name] = value
            elif getattr(args, name) != value and not (name in GROWABLE and getattr(args, name) > value):
                conflicts.append((name, getattr(args, name), value))
    task = task_cfg.get("_name") or task_cfg.get("task") or getattr(args, "task", None)  # cfg, or args of old
    segments = task_cfg if task == getattr(args, "task", None) else PRETRAINING_SEGMENTS.get(task, {})
    for name in TASK_FIELDS:
        if name in segments and hasattr(args, name) and not _given(arguments, name):
            setattr(args, name, segments[name])
            adopted[name] = segments[name]
    if conflicts:
        differences = "; ".join(f"{_flag(n)} {mine} (checkpoint: {theirs})" for n, mine, theirs in conflicts)
        flags = " ".join(f"{_flag(n)} {theirs}" for n, _, theirs in conflicts)
        raise CheckpointPathError(
            f"{path} was trained with other sizes: {differences}.\nDrop these flags (the checkpoint's sizes are "
            f"adopted) or pass the checkpoint's: {flags}")
    if adopted:
        logger.info(f"from {path}: " + ", ".join(f"{k}={v}" for k, v in adopted.items()))
    return adopted


def check(args, arguments):
    """Check the checkpoint paths of a parsed fairseq command line; adopt what a fine-tuned checkpoint fixes."""
    finetune = getattr(args, "finetune_from_model", None)
    if finetune:
        state = read_checkpoint(finetune, "--finetune-from-model")
        check_model_family(args, state, finetune)
        adopt(args, arguments, state, finetune)
    roberta = getattr(args, "roberta_path", None)
    if roberta and os.path.isfile(roberta) and not _given(arguments, "layer_norm_eps"):
        state = read_checkpoint(roberta, "--roberta-path")
        eps = _config(state, "model").get("layer_norm_eps")
        if eps is not None and "encoder.stack.embeddings.tokens.weight" in state["model"]:  # palm-convert bert's
            args.layer_norm_eps = eps
            logger.info(f"from {roberta}: layer_norm_eps={eps}")
    restore = getattr(args, "restore_file", None)
    if restore and restore != "checkpoint_last.pt":  # the default is looked up in --save-dir, and may be absent
        read_checkpoint(restore, "--restore-file")
    paths = getattr(args, "path", None)
    if paths and isinstance(paths, str):  # generate / interactive / validate: --path a.pt:b.pt
        for index, path in enumerate(paths.split(os.pathsep)):
            state = read_checkpoint(path, "--path")
            check_decoding_task(args, state, path)
            if index == 0:
                adopt(args, arguments, state, path, sizes=False)


def check_model_family(args, state, path):
    """Stop when ``--finetune-from-model`` is a checkpoint of another model than ``--arch``'s and one of them is the
    plugin's (fairseq failed at loading, "please ensure that the architectures match", after a traceback). Models of
    fairseq's own are left to fairseq: some load each other's checkpoints (transformer_align a transformer's)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_REGISTRY

    def family(name):
        return ARCH_MODEL_NAME_REGISTRY.get(name) or (name if name in MODEL_REGISTRY else None)

    model_cfg = _config(state, "model")
    arch, ours = model_cfg.get("_name") or model_cfg.get("arch"), getattr(args, "arch", None)
    theirs, mine = family(arch), family(ours)
    # DECODING_TASK's keys are the plugin's two families
    if theirs is None or mine is None or theirs == mine or not {theirs, mine} & set(DECODING_TASK):
        return
    archs = [a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m == theirs]
    hint = ""
    # --roberta-path starts PALM's encoder from a RoBERTa or BERT-family checkpoint; UniLMv2's relative position
    # bias has no place in it (palm_roberta_init)
    if mine == "palm" and (theirs == "roberta" or theirs == "unilm" and
                           "encoder.stack.relative_position.weight" not in state["model"]):
        kind = "RoBERTa" if theirs == "roberta" else "BERT-family or UniLM v1"
        hint = f"; to start PALM's encoder from a {kind} checkpoint, pass it as --roberta-path"
    raise CheckpointPathError(
        f"--finetune-from-model {path} is a {theirs} model (--arch {arch}), and --arch {ours} is a {mine} model: "
        f"give a {theirs} arch ({', '.join(archs)}){hint}")


def check_decoding_task(args, state, path):
    """Stop when ``--task`` cannot decode the family of the checkpoint's model (a UniLM checkpoint under
    ``translation`` fails on a missing ``<mask>``, a PALM one under ``unilm_seq2seq`` on a missing config key)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    model_cfg = _config(state, "model")
    name = model_cfg.get("_name") or model_cfg.get("arch")
    family = ARCH_MODEL_NAME_REGISTRY.get(name, name)
    task = getattr(args, "task", None)
    decoding = hasattr(args, "beam")  # generate, interactive; not validate, which scores any task
    if decoding and family in DECODING_TASK and task != DECODING_TASK[family] and task in DECODING_TASK.values():
        task_cfg = _config(state, "task")
        trained = task_cfg.get("_name") or task_cfg.get("task")  # cfg, or args of old (as adopt reads it)
        raise CheckpointPathError(
            f"--path {path} is a {family} model (trained with --task {trained}), which --task {task} cannot decode; "
            f"decode it with --task {DECODING_TASK[family]}")


def install():
    """Check every parsed command line (:func:`~palm_plugin.fixes.parsed_arguments.check_after_parsing`)."""
    check_after_parsing("__palm_checkpoint_paths__", check)
