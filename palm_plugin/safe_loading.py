"""Weights-only loading of fairseq checkpoints.

Since torch 2.6, ``torch.load`` unpickles with ``weights_only=True`` unless told otherwise; fairseq's
``checkpoint_utils.load_checkpoint_to_cpu`` does not say otherwise, so a stock fairseq checkpoint (which holds an
``argparse.Namespace`` under ``"args"`` and, in some versions, omegaconf containers under ``"cfg"``) no longer
loads. Rather than fall back to unrestricted unpickling of files users hand us, :func:`install` allow-lists
exactly the classes fairseq stores, and turns the unpickler's refusal of anything else (a pickle that would call
code, for example) into an error that names the file.

The allow-list was read off real checkpoints with ``torch.serialization.get_unsafe_globals_in_checkpoint``:
``fairseq-train`` checkpoints need ``argparse.Namespace``; configs pickled as ``DictConfig``/``ListConfig`` need
omegaconf's container, node and metadata classes plus the plain types they record as ``ref_type``/``key_type``.
"""
import argparse
import collections
import functools
import pickle
import typing

import torch


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds something other than tensors and the configuration types fairseq stores."""


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
    ]


def _explain_refusal(load_checkpoint_to_cpu):
    """Wrap fairseq's loader so a refused pickle names its file and says what to do."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load(path, *args, **kwargs):
        try:
            return load_checkpoint_to_cpu(path, *args, **kwargs)
        except pickle.UnpicklingError as error:
            raise UnsafeCheckpointError(
                f"{path}: refused to load this checkpoint: it references objects that fairseq checkpoints "
                f"never contain, so unpickling it could run code. If you made this file yourself and trust it, "
                f"re-save it as a plain state dict (tensors, numbers, strings, argparse.Namespace). "
                f"Details from torch: {error}"
            ) from error

    load.__wrapped_by_palm_plugin__ = True
    return load


def install():
    """Allow-list fairseq's checkpoint types and make fairseq's loader report refusals clearly (idempotent)."""
    torch.serialization.add_safe_globals(allowed_globals())
    from fairseq import checkpoint_utils

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "__wrapped_by_palm_plugin__", False):
        checkpoint_utils.load_checkpoint_to_cpu = _explain_refusal(checkpoint_utils.load_checkpoint_to_cpu)


def load_state(path):
    """Load a checkpoint or state dict file with weights-only unpickling; errors name the file.

    Used by the plugin's own readers (``--roberta-path``, checkpoint converters) so that every file a user hands
    us goes through the same restricted unpickler.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(
            f"{path}: refused to load: the file references objects other than tensors and fairseq's "
            f"configuration types, so unpickling it could run code. Details from torch: {error}"
        ) from error
    except (RuntimeError, EOFError) as error:
        raise RuntimeError(
            f"{path}: cannot read this file as a torch checkpoint (truncated or corrupt?). "
            f"Re-copy or re-create it. Details: {error}"
        ) from error
