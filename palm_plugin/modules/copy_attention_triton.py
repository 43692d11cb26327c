"""PALM's equation (3), ``e[b, t, l] = w_c^T tanh(m[b, l] + q[b, t])``, and its gradients as Triton kernels
(``--copy-attention-impl triton``; :class:`~palm_plugin.modules.copy_generator.AdditiveAttentionScores` calls them).

``m = W_m h`` ``(B, S, A)``, ``q = W_s s + b_c`` ``(B, T, A)``, ``w = w_c`` ``(A,)``. The ``B x T x S x A``
activations ``tanh(m + q)`` exist only in registers, a two-dimensional tile at a time; every sum is accumulated in
float32 whatever the inputs' dtype (float32, bfloat16 or float16).

Each kernel walks the dimension it sums over one index at a time, so the sums are elementwise additions into a
tile of accumulators and no step reduces across a tile's threads (the first kernels reduced a three-dimensional tile
over a chunk of A at every step, and measured slower than torch's blocked path on an H100: docs/benchmarks-gpu.md):

- Forward (:func:`additive_scores`): one program per sentence and tile of ``BLOCK_T`` target rows x ``BLOCK_S``
  source positions walks the attention features ``a``, adding ``w_a tanh(q[t, a] + m[l, a])`` to its scores: an
  outer sum of a column of ``q`` and one of ``m``, read from copies laid out ``(B, A, T)`` and ``(B, A, S)`` so that
  each column is contiguous.
- Backward (:func:`additive_score_gradients`): with ``g = dL/de`` and ``y = tanh(m + q)``,
  ``dL/dq[b, t] = w * sum_l g (1 - y^2)``, ``dL/dm[b, l] = w * sum_t g (1 - y^2)``, ``dL/dw = sum_{b,t,l} g y``.
  One program per (sentence, tile of ``BLOCK_T`` target rows x ``BLOCK_A`` features) walks the source positions and
  writes its query rows whole, with its tile's share of ``dL/dw``; one per (sentence, tile of ``BLOCK_S`` source
  positions x ``BLOCK_A`` features) walks the target rows and writes its memory rows whole. Both recompute ``y``
  instead of reading stored activations. Each output element is summed by one program in a fixed order (no atomics),
  and the ``dL/dw`` shares are added by torch, so the gradients are deterministic; the price is a third evaluation
  of ``tanh`` (one pass with atomic adds would need two).

``tanh(x)`` is written ``2 sigmoid(2x) - 1`` (Triton's core language has no tanh; exact in real numbers, and
saturating to +-1 without overflow; on CUDA an ``ex2`` and a division, as accurate in bfloat16 as in float32, where a
one-instruction ``tanh.approx`` would carry a relative error of 2^-11 into the gradient's ``1 - y^2``). The
attention size is a compile-time constant (one per model, one compilation); the lengths are not (fairseq's batches
change them every update). Offsets start from a 64-bit sentence index, so no product of sizes wraps at 2**31.

The kernels run on CUDA tensors; under Triton's interpreter (``TRITON_INTERPRET=1`` when triton is imported, how
tests/test_copy_triton.py runs them on a CPU, in a process of their own) on any tensors, slowly.
"""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

# (BLOCK_T, BLOCK_S, BLOCK_A): the forward kernel's tile is BLOCK_T x BLOCK_S scores, the backward kernels' BLOCK_T x
# BLOCK_A query and BLOCK_S x BLOCK_A memory gradients (powers of two, as Triton's blocks must be) with a step's values
# held ahead: half the forward's width, so that their registers let three programs share a multiprocessor, as the
# forward's do (tests/test_copy_triton.py compiles them for the H100). Not yet tuned on a card.
TILE = (64, 64, 32)
# Whether triton.jit made the kernels below for its interpreter: TRITON_INTERPRET=1 when triton was imported (Triton's
# own library functions are decorated then, so it cannot be switched later in a process).
INTERPRETED = bool(triton.knobs.runtime.interpret)


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def _scores_kernel(memory_t, query_t, weight, scores, steps, sources, padded_steps, padded_sources, DIM: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr):
    """scores[b, t, l] for one (sentence, target tile, source tile), one attention feature at a time."""
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    l = tl.program_id(2) * BLOCK_S + tl.arange(0, BLOCK_S)
    # (B, A, T') and (B, A, S'), zeros past the lengths (_padded_columns): a feature's column for the tile's rows
    # at a * padded_steps, read whole
    query_column = query_t + b * DIM * padded_steps + t
    memory_column = memory_t + b * DIM * padded_sources + l
    total = tl.zeros((BLOCK_T, BLOCK_S), dtype=tl.float32)
    for a in range(DIM):
        q = tl.load(query_column + a * padded_steps).to(tl.float32)
        m = tl.load(memory_column + a * padded_sources).to(tl.float32)
        w = tl.load(weight + a).to(tl.float32)
        total += w * _tanh(q[:, None] + m[None, :])
    tl.store(scores + b * steps * sources + t[:, None] * sources + l[None, :], total,
             mask=(t[:, None] < steps) & (l[None, :] < sources))


@triton.jit
def _step_values(features, grads, feature_mask, grad_mask):
    """A backward step's row of features ``(1, COLUMNS)``, as stored, and its gradients ``(ROWS, 1)``, one a tile
    row. The tile's loads are 16 bytes a thread where the tensors are aligned (as every launch's are), in a layout of
    their own, so each step moves the row and the column into it through shared memory: small moves (broadcast to
    the tile first, the column would move as a whole tile: more instructions and barriers, docs/benchmarks-gpu.md
    section 14)."""
    row = tl.load(features, mask=feature_mask, other=0.0)[None, :]
    column = tl.load(grads, mask=grad_mask, other=0.0)[:, None]
    return row, column


@triton.jit
def _query_gradient_kernel(memory, query, weight, grad_t, grad_query, weight_shares, steps, sources,
                           DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_A: tl.constexpr):
    """dL/dq for one (sentence, target tile, feature tile), one source position at a time, and the tile's share
    sum_{t,l} g y of dL/dw."""
    b = tl.program_id(0).to(tl.int64)
    t_tile = tl.program_id(1)
    t = t_tile * BLOCK_T + tl.arange(0, BLOCK_T)
    a = tl.program_id(2) * BLOCK_A + tl.arange(0, BLOCK_A)
    tile = (t[:, None] < steps) & (a[None, :] < DIM)
    q = tl.load(query + b * steps * DIM + t[:, None] * DIM + a[None, :], mask=tile, other=0.0).to(tl.float32)
    memory_row = memory + b * sources * DIM + a
    grad_row = grad_t + b * sources * steps + t  # (B, S, T): g[., l] of the tile's rows at l * steps
    slopes = tl.zeros((BLOCK_T, BLOCK_A), dtype=tl.float32)  # sum_l g (1 - y^2)
    outputs = tl.zeros((BLOCK_T, BLOCK_A), dtype=tl.float32)  # sum_l g y
    # each step's values are loaded a step ahead, so that their latency hides behind a step's work (Triton's
    # pipeliner leaves these loads alone); g reads 0 past the rows: adds nothing
    m, g = _step_values(memory_row, grad_row, (a < DIM) & (sources > 0), (t < steps) & (sources > 0))
    l = 0
    while l < sources:  # not range(): Triton 3.6's interpreter takes no run-time bound there (with numpy 2.4)
        ahead = l + 1 < sources
        m_next, g_next = _step_values(memory_row + (l + 1) * DIM, grad_row + (l + 1) * steps, (a < DIM) & ahead,
                                      (t < steps) & ahead)
        y = _tanh(q + m.to(tl.float32))
        gy = g * y
        outputs += gy
        slopes += g - gy * y
        m, g = m_next, g_next
        l += 1
    w = tl.load(weight + a, mask=a < DIM, other=0.0).to(tl.float32)
    tl.store(grad_query + b * steps * DIM + t[:, None] * DIM + a[None, :],
             (slopes * w[None, :]).to(grad_query.dtype.element_ty), mask=tile)
    tl.store(weight_shares + (b * tl.num_programs(1) + t_tile) * DIM + a, tl.sum(outputs, axis=0), mask=a < DIM)


@triton.jit
def _memory_gradient_kernel(memory, query, weight, grad, grad_memory, steps, sources, DIM: tl.constexpr,
                            BLOCK_S: tl.constexpr, BLOCK_A: tl.constexpr):
    """dL/dm for one (sentence, source tile, feature tile), one target row at a time."""
    b = tl.program_id(0).to(tl.int64)
    l = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    a = tl.program_id(2) * BLOCK_A + tl.arange(0, BLOCK_A)
    tile = (l[:, None] < sources) & (a[None, :] < DIM)
    m = tl.load(memory + b * sources * DIM + l[:, None] * DIM + a[None, :], mask=tile, other=0.0).to(tl.float32)
    query_row = query + b * steps * DIM + a
    grad_row = grad + b * steps * sources + l
    slopes = tl.zeros((BLOCK_S, BLOCK_A), dtype=tl.float32)  # sum_t g (1 - y^2)
    # a step ahead, as in _query_gradient_kernel
    q, g = _step_values(query_row, grad_row, (a < DIM) & (steps > 0), (l < sources) & (steps > 0))
    t = 0
    while t < steps:  # not range(): as in _query_gradient_kernel
        ahead = t + 1 < steps
        q_next, g_next = _step_values(query_row + (t + 1) * DIM, grad_row + (t + 1) * sources, (a < DIM) & ahead,
                                      (l < sources) & ahead)
        y = _tanh(m + q.to(tl.float32))
        slopes += g - g * y * y
        q, g = q_next, g_next
        t += 1
    w = tl.load(weight + a, mask=a < DIM, other=0.0).to(tl.float32)
    tl.store(grad_memory + b * sources * DIM + l[:, None] * DIM + a[None, :],
             (slopes * w[None, :]).to(grad_memory.dtype.element_ty), mask=tile)


def _runnable(kernel, tensor: Tensor):
    if tensor.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"--copy-attention-impl triton got {tensor.device.type} tensors: its kernels run on CUDA "
                         "(elsewhere only under TRITON_INTERPRET=1, for tests): use --copy-attention-impl blocked")
    return kernel


def additive_scores(memory: Tensor, query: Tensor, weight: Tensor) -> Tensor:
    """``(B, S, A)``, ``(B, T, A)``, ``(A,)`` -> the scores ``(B, T, S)`` in float32."""
    (batch, sources, dim), steps = memory.shape, query.size(1)
    scores = memory.new_empty(batch, steps, sources, dtype=torch.float32)
    block_t, block_s, _ = TILE
    grid = batch, triton.cdiv(steps, block_t), triton.cdiv(sources, block_s)
    memory_t, query_t = _padded_columns(memory, block_s), _padded_columns(query, block_t)
    _runnable(_scores_kernel, memory)[grid](
        memory_t, query_t, weight.contiguous(), scores, steps, sources, query_t.size(2), memory_t.size(2), DIM=dim,
        BLOCK_T=block_t, BLOCK_S=block_s)
    return scores


def _padded_columns(x: Tensor, block: int) -> Tensor:
    """``(B, L, A)`` -> ``(B, A, L')``, ``L'`` the length in whole tiles of ``block``, zeros past ``L``: the forward
    kernel reads each column of a tile without a mask (no bound check a load, in the loop over every feature)."""
    batch, length, dim = x.shape
    columns = x.new_zeros(batch, dim, triton.cdiv(length, block) * block)
    columns[:, :, :length] = x.transpose(1, 2)
    return columns


def additive_score_gradients(memory: Tensor, query: Tensor, weight: Tensor, grad: Tensor) -> Tuple[Tensor, ...]:
    """The gradients of :func:`additive_scores`'s inputs given ``grad`` ``(B, T, S)``: ``(B, S, A)`` and
    ``(B, T, A)`` in the dtypes of ``memory`` and ``query``, ``(A,)`` in float32."""
    memory, query, weight = memory.contiguous(), query.contiguous(), weight.contiguous()
    grad = grad.float().contiguous()
    (batch, sources, dim), steps = memory.shape, query.size(1)
    block_t, block_s, block_a = TILE
    target_tiles, feature_tiles = triton.cdiv(steps, block_t), triton.cdiv(dim, block_a)
    grad_query, grad_memory = torch.empty_like(query), torch.empty_like(memory)
    weight_shares = memory.new_empty(batch, target_tiles, dim, dtype=torch.float32)
    _runnable(_query_gradient_kernel, memory)[batch, target_tiles, feature_tiles](
        memory, query, weight, grad.transpose(1, 2).contiguous(), grad_query, weight_shares, steps, sources,
        DIM=dim, BLOCK_T=block_t, BLOCK_A=block_a)
    _runnable(_memory_gradient_kernel, memory)[batch, triton.cdiv(sources, block_s), feature_tiles](
        memory, query, weight, grad, grad_memory, steps, sources, DIM=dim, BLOCK_S=block_s, BLOCK_A=block_a)
    return grad_memory, grad_query, weight_shares.sum((0, 1))
