"""Weights-only loading of fairseq checkpoints.

Since torch 2.6, ``torch.load`` unpickles with ``weights_only=True`` unless told otherwise; fairseq's
``checkpoint_utils.load_checkpoint_to_cpu`` does not say otherwise, so a stock fairseq checkpoint (which holds an
``argparse.Namespace`` under ``"args"`` and, in some versions, omegaconf containers under ``"cfg"``) no longer
loads. Rather than fall back to unrestricted unpickling of files users hand us, :func:`install` allow-lists
exactly the classes fairseq stores, and turns the unpickler's refusal of anything else (a pickle that would call
code, for example) into an error that names the file.

The allow-list was read off real checkpoints with ``torch.serialization.get_unsafe_globals_in_checkpoint``:
``fairseq-train`` checkpoints need ``argparse.Namespace``; configs pickled as ``DictConfig``/``ListConfig`` need
omegaconf's container, node and metadata classes plus the plain types they record as ``ref_type``/``key_type``; a
run with ``--eval-bleu`` keeps numpy arrays in its meters (the BLEU statistics), which need numpy's array
reconstruction, ``ndarray`` and the numeric dtypes (a resumed run and fairseq-generate refused such checkpoints).

fairseq's model loader is wrapped too, to name the checkpoint and the data's dictionary when the model finds that
the checkpoint was trained with another dictionary (:mod:`palm_plugin.modules.dictionary_check`), and so is
fairseq-train's, whose "ensure that the architectures match" would otherwise be the last word.

One checkpoint of another program is recognised by its parameter names and named as such: PALM's released one
(:data:`RELEASED_PALM_PREFIXES`), which users reach for first and which no reader of the plugin can use.
"""
import argparse
import collections
import functools
import os
import pickle
import pickletools
import re
import typing
import zipfile

import torch

from palm_plugin.errors import InputError
from palm_plugin.modules.dictionary_check import DictionaryMismatchError


class UnsafeCheckpointError(InputError, pickle.UnpicklingError):
    """A checkpoint holds something other than tensors and the configuration types fairseq stores."""


class CorruptCheckpointError(InputError, RuntimeError):
    """A checkpoint file is truncated or is not a torch file at all."""


class ForeignCheckpointError(InputError, ValueError):
    """A checkpoint of another program, recognised by its parameter names, that the plugin cannot read."""


# PALM's released code (alibaba/AliceMind, PreSumm's AbsSummarizer) saves {"model", "opt", "optims"}, the model's
# parameters named after an HF RoBERTa under bert.model. and PreSumm's decoder (docs/palm-authors-code.md)
RELEASED_PALM_PREFIXES = ("bert.model.embeddings.", "decoder.transformer_layers.")


def is_released_palm(names) -> bool:
    """Whether parameter names (or a pickle's strings) hold both of :data:`RELEASED_PALM_PREFIXES`."""
    names = list(names)
    return all(any(str(name).startswith(prefix) for name in names) for prefix in RELEASED_PALM_PREFIXES)


def is_released_palm_state(state) -> bool:
    """Whether a loaded checkpoint is PALM's released one (re-saved without its optimisers, so it loaded)."""
    return isinstance(state, dict) and isinstance(state.get("model"), dict) and is_released_palm(state["model"])


def released_palm_message(path) -> str:
    return (
        f"{path}: a checkpoint of PALM's released code (alibaba/AliceMind: PreSumm's bert.model.* and "
        f"decoder.transformer_layers.*), not a fairseq one; its decoder and output layer are not the paper's PALM "
        f"that the plugin builds, and nothing converts it (docs/palm-authors-code.md). Start PALM's encoder from "
        f"RoBERTa instead: --roberta-path with a fairseq RoBERTa model.pt (palm-convert hf-roberta makes one from an "
        f"HF RoBERTa folder)"
    )


def _pickled_strings(path):
    """The strings of a torch (zip) file's pickle, read op by op: nothing in the pickle runs."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = archive.read(next(name for name in archive.namelist() if name.endswith("data.pkl")))
        return [argument for _, argument, _ in pickletools.genops(data) if isinstance(argument, str)]
    except Exception:  # torch's legacy format, or a pickle cut short: nothing recognised
        return []


def numpy_array_globals():
    """What a pickled numeric numpy array references: building an empty ``ndarray`` of a dtype, whose bytes follow."""
    import numpy as np

    reconstruct = np.zeros(0).__reduce__()[0]  # numpy.core (numpy 1) or numpy._core (numpy 2): what pickles name
    numeric = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float16,
               np.float32, np.float64)
    return [reconstruct, np.ndarray, np.dtype, *(type(np.dtype(kind)) for kind in numeric)]


def allowed_globals():
    """The classes a fairseq checkpoint may reference, for ``torch.serialization.add_safe_globals``."""
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode, BooleanNode, BytesNode, FloatNode, IntegerNode, StringNode

    return [
        argparse.Namespace,
        collections.defaultdict,
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        AnyNode,
        BooleanNode,
        BytesNode,
        FloatNode,
        IntegerNode,
        StringNode,
        typing.Any,
        dict,
        list,
        int,
        float,
        str,
        bool,
        *numpy_array_globals(),
    ]


def _explain_refusal(load_checkpoint_to_cpu):
    """Wrap fairseq's loader so that a refused, truncated or corrupt file is named and the user told what to do."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load(path, *args, **kwargs):
        try:
            return load_checkpoint_to_cpu(path, *args, **kwargs)
        except Exception:
            load_state(path)  # raises UnsafeCheckpointError / CorruptCheckpointError naming the file, if that is why
            raise

    load.__palm_plugin__ = True
    return load


def _dictionary_files(task_cfg):
    """The dictionaries a fairseq task reads: ``dict.{source,target}.txt`` for pairs, ``dict.txt`` otherwise."""
    from fairseq import utils
    from fairseq.data import data_utils

    data = utils.split_paths(task_cfg.data)[0]
    languages = [utils.safe_getattr(task_cfg, side, None) for side in ("source_lang", "target_lang")]
    if hasattr(task_cfg, "source_lang") and None in languages:
        languages = data_utils.infer_language_pair(data)  # as fairseq's translation task does when -s/-t are not given
    names = [f"dict.{language}.txt" for language in dict.fromkeys(languages) if language] or ["dict.txt"]
    return " and ".join(os.path.join(data, name) for name in names)


def _name_dictionary_mismatch(load_model_ensemble_and_task):
    """Wrap fairseq's model loader (``fairseq-generate``, ``fairseq-interactive``, ``fairseq-validate``, hub
    loading) so that a checkpoint trained with another dictionary than the data's names the checkpoint, the data's
    dictionary and the dictionary the checkpoint was trained with."""

    @functools.wraps(load_model_ensemble_and_task)
    def load(filenames, arg_overrides=None, task=None, *args, **kwargs):
        try:
            return load_model_ensemble_and_task(filenames, arg_overrides, task, *args, **kwargs)
        except DictionaryMismatchError as error:
            from fairseq.checkpoint_utils import load_checkpoint_to_cpu

            # The models of an ensemble share one dictionary, so the first checkpoint's training data tells which.
            trained = load_checkpoint_to_cpu(filenames[0])["cfg"].task
            # Without a task, fairseq set one up from the checkpoint's own configuration (with the overrides).
            data = task.cfg if task is not None else load_checkpoint_to_cpu(filenames[0], arg_overrides)["cfg"].task
            raise DictionaryMismatchError(
                f"{', '.join(map(str, filenames))}: does not fit the dictionary {_dictionary_files(data)}: {error}. "
                f"This checkpoint was trained with {_dictionary_files(trained)}"
            ) from error

    load.__palm_plugin__ = True
    return load


def _surface_dictionary_mismatch(load_checkpoint):
    """Wrap fairseq-train's checkpoint loading (``--finetune-from-model``, ``--restore-file``, resuming): fairseq
    replaces any error of the model's ``load_state_dict`` by "please ensure that the architectures match", which
    buries the model's own diagnosis; a dictionary mismatch comes out as itself, with the checkpoint's name."""

    @functools.wraps(load_checkpoint)
    def load(self, filename, *args, **kwargs):
        try:
            return load_checkpoint(self, filename, *args, **kwargs)
        except Exception as error:
            if isinstance(error.__context__, DictionaryMismatchError):
                raise DictionaryMismatchError(f"{filename}: {error.__context__}") from None
            raise

    load.__palm_plugin__ = True
    return load


def install():
    """Allow-list fairseq's checkpoint types and make fairseq's loaders report refusals, unreadable files and
    dictionary mismatches clearly (idempotent)."""
    torch.serialization.add_safe_globals(allowed_globals())
    from fairseq import checkpoint_utils

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "__palm_plugin__", False):
        checkpoint_utils.load_checkpoint_to_cpu = _explain_refusal(checkpoint_utils.load_checkpoint_to_cpu)
    from fairseq.trainer import Trainer

    if not getattr(Trainer.load_checkpoint, "__palm_plugin__", False):
        Trainer.load_checkpoint = _surface_dictionary_mismatch(Trainer.load_checkpoint)
    if not getattr(checkpoint_utils.load_model_ensemble_and_task, "__palm_plugin__", False):
        checkpoint_utils.load_model_ensemble_and_task = _name_dictionary_mismatch(
            checkpoint_utils.load_model_ensemble_and_task
        )


def load_state(path):
    """Load a checkpoint or state dict file with weights-only unpickling; errors name the file.

    Used by the plugin's own readers (``--roberta-path``, checkpoint converters) so that every file a user hands
    us goes through the same restricted unpickler. Raises :class:`UnsafeCheckpointError` for a pickle that
    references anything but tensors and fairseq's configuration types, :class:`CorruptCheckpointError` for a file
    torch cannot parse (truncated ones included), and the ``OSError`` of a missing or unreadable one.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as error:
        if error.filename is not None:
            raise  # missing or unreadable: the OS error names the file already
        # torch's zip reader raises "[Errno 22] Invalid argument", naming no file, for a file cut in its first ~64 KB
        raise CorruptCheckpointError(_corruption_message(path, error)) from error
    except pickle.UnpicklingError as error:
        # a pickle that names a class or function torch does not allow (or, through an allowed one, builds a type
        # torch does not allow: a numpy array of Python objects); any other refusal is of bytes that are no pickle at
        # all ("Unsupported operand"): a corrupt file, not a dangerous one
        found = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)|but got <class '([\w.]+)'>", str(error))
        if "Weights only load failed" in str(error) and found:
            if is_released_palm(_pickled_strings(path)):  # it pickles its optimiser objects
                raise ForeignCheckpointError(released_palm_message(path)) from None
            raise UnsafeCheckpointError(
                f"{path}: refused to load this checkpoint: it references {found.group(1) or found.group(2)}, which "
                "fairseq checkpoints never contain, so unpickling it could run code. If you made this file yourself "
                "and trust it, re-save it as a plain state dict (tensors, numbers, strings, argparse.Namespace)"
            ) from error
        raise CorruptCheckpointError(_corruption_message(path, error)) from error
    except Exception as error:  # torch's parsers fail on garbage with many exception types
        raise CorruptCheckpointError(_corruption_message(path, error)) from error
    if is_released_palm_state(state):
        raise ForeignCheckpointError(released_palm_message(path))
    return state


def _corruption_message(path, error):
    return (
        f"{path}: cannot read this file as a torch checkpoint: it is truncated or corrupt (torch: "
        f"{type(error).__name__}: {' '.join(str(error).split())[:200]}). Copy it again (an interrupted copy or "
        f"download?), or resume from another checkpoint (fairseq writes checkpoints atomically, so the "
        f"checkpoint_last.pt of a killed run is complete)"
    )
