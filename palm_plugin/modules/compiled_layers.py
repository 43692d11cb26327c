"""The ``torch.compile`` levers, off by default: ``--compile-layers`` (each Transformer layer of a model built for
training) and the functions other modules hand to :func:`compiled` (PALM's ``--compile-copy-attention``).

A compiled layer (inductor) runs its elementwise work (bias adds, GELU, dropout, residual adds, layer norms) in a
few fused kernels: fewer launches, fewer reads and writes of the activations, which is what bounds a GPU at the
batch sizes of docs/benchmarks-gpu.md. Each layer is compiled in place (``nn.Module.compile``: parameter names in
the state dict do not change); the first batch's shape compiles, a second compiles once more with its sizes symbolic
(torch's automatic dynamic shapes), and later lengths and sizes reuse that code (a batch of one sentence compiles
once more: torch specializes sizes of 1). A model built
from a checkpoint's configuration for use (fairseq-generate, hub loading) is not compiled: decoding takes other
paths (incremental states), which compiling would only slow down.
"""
from typing import Callable, Dict, Iterable, Tuple

import torch
import torch.nn as nn

from palm_plugin.fixes.saved_model_build import building_from_checkpoint

HELP = ("torch.compile each Transformer layer for training (palm_plugin/modules/compiled_layers.py; off by default, "
        "measured in docs/benchmarks-gpu.md)")
BACKEND = "inductor"  # tests/test_speed_options.py swaps in "aot_eager" (same graphs, no code generation)
_COMPILED: Dict[Tuple[Callable, str], Callable] = {}


def compiling() -> bool:
    """Whether a model built now compiles what its options ask: not when it is built from a checkpoint for use."""
    return not building_from_checkpoint()


def for_training(layers: Iterable[nn.Module], change: Callable[[nn.Module], None]) -> int:
    """``change`` each of ``layers`` in place, unless the model is being built from a checkpoint for use; returns how
    many were changed."""
    if not compiling():
        return 0
    layers = list(layers)
    for layer in layers:
        change(layer)
    return len(layers)


def compile_layers(layers: Iterable[nn.Module]) -> int:
    """Compile each of ``layers`` in place (:func:`for_training`); returns how many were compiled."""
    return for_training(layers, lambda layer: layer.compile(backend=BACKEND))


def compiled(function: Callable) -> Callable:
    """``function`` through ``torch.compile`` with :data:`BACKEND`, compiled once per backend. Shapes are dynamic
    from the first call: fairseq's batches change their size every update. ``fullgraph``: where torch would give up
    compiling (a graph break, too many recompilations) it raises instead of running ``function`` eagerly, which for
    the functions written to be fused would allocate what they were written to avoid."""
    key = function, BACKEND
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(function, backend=BACKEND, dynamic=True, fullgraph=True)
    return _COMPILED[key]
