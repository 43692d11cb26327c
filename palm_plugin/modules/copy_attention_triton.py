"""PALM's equation (3), ``e[b, t, l] = w_c^T tanh(m[b, l] + q[b, t])``, and its gradients as Triton kernels
(``--copy-attention-impl triton``; :class:`~palm_plugin.modules.copy_generator.AdditiveAttentionScores` calls them).

``m = W_m h`` ``(B, S, A)``, ``q = W_s s + b_c`` ``(B, T, A)``, ``w = w_c`` ``(A,)``. The ``B x T x S x A``
activations ``tanh(m + q)`` exist only in registers, a tile at a time; every sum is accumulated in float32 whatever
the inputs' dtype (float32, bfloat16 or float16).

- Forward (:func:`additive_scores`): one program per sentence and tile of ``BLOCK_T`` target rows x ``BLOCK_S``
  source positions; it walks the attention size in chunks of ``BLOCK_A``, each chunk a ``(BLOCK_T, BLOCK_S,
  BLOCK_A)`` block of activations reduced against ``w`` at once, and writes its ``(BLOCK_T, BLOCK_S)`` scores.
- Backward (:func:`additive_score_gradients`): with ``g = dL/de`` and ``y = tanh(m + q)``,
  ``dL/dq[b, t] = w * sum_l g (1 - y^2)``, ``dL/dm[b, l] = w * sum_t g (1 - y^2)``, ``dL/dw = sum_{b,t,l} g y``.
  Two passes recompute ``y`` instead of reading stored activations: one program per (sentence, target tile,
  attention chunk) walks the source and writes its query rows whole, with its tile's share of ``dL/dw``; one per
  (sentence, source tile, attention chunk) walks the target and writes its memory rows whole. Each output element
  is summed by one program in a fixed order (no atomics), and the ``dL/dw`` shares are added by torch, so the
  gradients are deterministic; the price is a third evaluation of ``tanh`` (one pass with atomic adds would need
  two).

``tanh(x)`` is written ``2 sigmoid(2x) - 1`` (Triton's core language has no tanh; exact in real numbers, and
saturating to +-1 without overflow). The attention size is a compile-time constant (one per model: one compilation,
loops over it unrolled); the lengths are not (fairseq's batches change them every update). Offsets start from a
64-bit sentence index, so no product of sizes wraps at 2**31. Inputs are made contiguous (they are, as the outputs of
the projections).

The kernels run on CUDA tensors; under Triton's interpreter (``TRITON_INTERPRET=1`` when triton is imported, how
tests/test_copy_triton.py runs them on a CPU, in a process of their own) on any tensors, slowly.
"""
from typing import Dict, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

# (BLOCK_T, BLOCK_S, BLOCK_A): the tile of target rows x source positions x attention features whose activations one
# program holds at a time (powers of two, as Triton's blocks must be): 8192 floats, 64 per thread of Triton's default
# 4 warps. Not yet tuned on a card.
TILE = (32, 32, 8)
# Whether triton.jit made the kernels below for its interpreter: TRITON_INTERPRET=1 when triton was imported (Triton's
# own library functions, tl.sum included, are decorated then, so it cannot be switched later in a process).
INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _scores_kernel(memory, query, weight, scores, steps, sources, DIM: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_A: tl.constexpr):
    """scores[b, t, l] for one (sentence, target tile, source tile), summing over A a chunk at a time."""
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    l = tl.program_id(2) * BLOCK_S + tl.arange(0, BLOCK_S)
    query_rows = query + b * steps * DIM
    memory_rows = memory + b * sources * DIM
    total = tl.zeros((BLOCK_T, BLOCK_S), dtype=tl.float32)
    for start in range(0, DIM, BLOCK_A):
        a = start + tl.arange(0, BLOCK_A)
        # masked loads read 0: tanh(0) = 0 and w = 0 past A, so partial tiles add nothing
        q = tl.load(query_rows + t[:, None] * DIM + a[None, :], mask=(t[:, None] < steps) & (a[None, :] < DIM),
                    other=0.0).to(tl.float32)
        m = tl.load(memory_rows + l[:, None] * DIM + a[None, :], mask=(l[:, None] < sources) & (a[None, :] < DIM),
                    other=0.0).to(tl.float32)
        w = tl.load(weight + a, mask=a < DIM, other=0.0).to(tl.float32)
        y = 2 * tl.sigmoid(2 * (q[:, None, :] + m[None, :, :])) - 1  # tanh, (BLOCK_T, BLOCK_S, BLOCK_A)
        total += tl.sum(y * w[None, None, :], axis=2)
    tl.store(scores + b * steps * sources + t[:, None] * sources + l[None, :], total,
             mask=(t[:, None] < steps) & (l[None, :] < sources))


@triton.jit
def _query_gradient_kernel(memory, query, weight, grad, grad_query, weight_shares, steps, sources, DIM: tl.constexpr,
                           BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_A: tl.constexpr):
    """dL/dq for one (sentence, target tile, attention chunk), summing over the whole source, and the tile's share
    sum_{t,l} g y of dL/dw."""
    b = tl.program_id(0).to(tl.int64)
    t_tile = tl.program_id(1)
    t = t_tile * BLOCK_T + tl.arange(0, BLOCK_T)
    a = tl.program_id(2) * BLOCK_A + tl.arange(0, BLOCK_A)
    q = tl.load(query + b * steps * DIM + t[:, None] * DIM + a[None, :], mask=(t[:, None] < steps) & (a[None, :] < DIM),
                other=0.0).to(tl.float32)
    memory_rows = memory + b * sources * DIM
    grad_rows = grad + b * steps * sources
    slopes = tl.zeros((BLOCK_T, BLOCK_A), dtype=tl.float32)  # sum_l g (1 - y^2)
    outputs = tl.zeros((BLOCK_T, BLOCK_A), dtype=tl.float32)  # sum_l g y
    start = 0
    while start < sources:  # not range(): Triton 3.6's interpreter takes no run-time bound there (with numpy 2.4)
        l = start + tl.arange(0, BLOCK_S)
        m = tl.load(memory_rows + l[:, None] * DIM + a[None, :], mask=(l[:, None] < sources) & (a[None, :] < DIM),
                    other=0.0).to(tl.float32)
        # g = 0 outside the tile: those terms vanish from both sums
        g = tl.load(grad_rows + t[:, None] * sources + l[None, :], mask=(t[:, None] < steps) & (l[None, :] < sources),
                    other=0.0)[:, :, None]
        y = 2 * tl.sigmoid(2 * (q[:, None, :] + m[None, :, :])) - 1
        gy = g * y
        outputs += tl.sum(gy, axis=1)
        slopes += tl.sum(g - gy * y, axis=1)
        start += BLOCK_S
    w = tl.load(weight + a, mask=a < DIM, other=0.0).to(tl.float32)
    tl.store(grad_query + b * steps * DIM + t[:, None] * DIM + a[None, :],
             (slopes * w[None, :]).to(grad_query.dtype.element_ty), mask=(t[:, None] < steps) & (a[None, :] < DIM))
    tl.store(weight_shares + (b * tl.num_programs(1) + t_tile) * DIM + a, tl.sum(outputs, axis=0), mask=a < DIM)


@triton.jit
def _memory_gradient_kernel(memory, query, weight, grad, grad_memory, steps, sources, DIM: tl.constexpr,
                            BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_A: tl.constexpr):
    """dL/dm for one (sentence, source tile, attention chunk), summing over the whole target."""
    b = tl.program_id(0).to(tl.int64)
    l = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    a = tl.program_id(2) * BLOCK_A + tl.arange(0, BLOCK_A)
    m = tl.load(memory + b * sources * DIM + l[:, None] * DIM + a[None, :],
                mask=(l[:, None] < sources) & (a[None, :] < DIM), other=0.0).to(tl.float32)
    query_rows = query + b * steps * DIM
    grad_rows = grad + b * steps * sources
    slopes = tl.zeros((BLOCK_S, BLOCK_A), dtype=tl.float32)  # sum_t g (1 - y^2)
    start = 0
    while start < steps:  # not range(): as in _query_gradient_kernel
        t = start + tl.arange(0, BLOCK_T)
        q = tl.load(query_rows + t[:, None] * DIM + a[None, :], mask=(t[:, None] < steps) & (a[None, :] < DIM),
                    other=0.0).to(tl.float32)
        g = tl.load(grad_rows + t[:, None] * sources + l[None, :], mask=(t[:, None] < steps) & (l[None, :] < sources),
                    other=0.0)[:, :, None]
        y = 2 * tl.sigmoid(2 * (q[:, None, :] + m[None, :, :])) - 1
        slopes += tl.sum(g - g * y * y, axis=0)
        start += BLOCK_T
    w = tl.load(weight + a, mask=a < DIM, other=0.0).to(tl.float32)
    tl.store(grad_memory + b * sources * DIM + l[:, None] * DIM + a[None, :],
             (slopes * w[None, :]).to(grad_memory.dtype.element_ty), mask=(l[:, None] < sources) & (a[None, :] < DIM))


def _runnable(kernel, tensor: Tensor):
    if tensor.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"--copy-attention-impl triton got {tensor.device.type} tensors: its kernels run on CUDA "
                         "(elsewhere only under TRITON_INTERPRET=1, for tests): use --copy-attention-impl blocked")
    return kernel


def additive_scores(memory: Tensor, query: Tensor, weight: Tensor) -> Tensor:
    """``(B, S, A)``, ``(B, T, A)``, ``(A,)`` -> the scores ``(B, T, S)`` in float32."""
    memory, query, weight = memory.contiguous(), query.contiguous(), weight.contiguous()
    (batch, sources, dim), steps = memory.shape, query.size(1)
    scores = memory.new_empty(batch, steps, sources, dtype=torch.float32)
    block_t, block_s, _ = TILE
    grid = batch, triton.cdiv(steps, block_t), triton.cdiv(sources, block_s)
    _runnable(_scores_kernel, memory)[grid](memory, query, weight, scores, steps, sources, **_constants(dim))
    return scores


def additive_score_gradients(memory: Tensor, query: Tensor, weight: Tensor, grad: Tensor) -> Tuple[Tensor, ...]:
    """The gradients of :func:`additive_scores`'s inputs given ``grad`` ``(B, T, S)``: ``(B, S, A)`` and
    ``(B, T, A)`` in the dtypes of ``memory`` and ``query``, ``(A,)`` in float32."""
    memory, query, weight = memory.contiguous(), query.contiguous(), weight.contiguous()
    grad = grad.float().contiguous()
    (batch, sources, dim), steps = memory.shape, query.size(1)
    block_t, block_s, block_a = TILE
    target_tiles, chunks = triton.cdiv(steps, block_t), triton.cdiv(dim, block_a)
    grad_query, grad_memory = torch.empty_like(query), torch.empty_like(memory)
    weight_shares = memory.new_empty(batch, target_tiles, dim, dtype=torch.float32)
    _runnable(_query_gradient_kernel, memory)[batch, target_tiles, chunks](
        memory, query, weight, grad, grad_query, weight_shares, steps, sources, **_constants(dim))
    _runnable(_memory_gradient_kernel, memory)[batch, triton.cdiv(sources, block_s), chunks](
        memory, query, weight, grad, grad_memory, steps, sources, **_constants(dim))
    return grad_memory, grad_query, weight_shares.sum((0, 1))


def _constants(dim: int) -> Dict[str, int]:
    """The kernels' compile-time arguments: the attention size (one per model) and the tile."""
    block_t, block_s, block_a = TILE
    return {"DIM": dim, "BLOCK_T": block_t, "BLOCK_S": block_s, "BLOCK_A": block_a}
