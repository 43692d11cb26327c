"""``--checkpoint-activations``, fairseq's option of the same name on the plugin's layers: each Transformer layer keeps
only its inputs for the backward pass and runs its forward again there, trading about one forward pass more per
update for the activations inside the layers (attention scores, feed-forward, dropout masks): what lets long
sequences or large batches fit in a GPU's memory.

Through ``torch.utils.checkpoint`` in its non-reentrant form (torch's recommended one: any arguments, the mask
objects of the fused attention paths included, and it composes with ``--compile-layers``). The random state is
restored for the recomputation, so dropout draws the same masks and the gradients are those of the plain layers.
A layer is wrapped in place (its ``forward``), so parameter names do not change; it checkpoints only in training
with gradients on, and a model built from a checkpoint for use (fairseq-generate, hub loading) is not wrapped.
"""
import functools
from typing import Iterable

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from palm_plugin.modules.compiled_layers import for_training

HELP = ("keep only each Transformer layer's inputs for the backward pass and recompute the rest there: less memory "
        "for about one more forward pass per update, the same gradients "
        "(palm_plugin/modules/activation_checkpoints.py)")


def _checkpointed(layer: nn.Module, forward, *args, **kwargs):
    if layer.training and torch.is_grad_enabled():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


def _wrap(layer: nn.Module) -> None:
    layer.forward = functools.partial(_checkpointed, layer, layer.forward)


def checkpoint_layers(layers: Iterable[nn.Module]) -> int:
    """Checkpoint each of ``layers`` in place (:func:`~palm_plugin.modules.compiled_layers.for_training`); returns how
    many were wrapped."""
    return for_training(layers, _wrap)
