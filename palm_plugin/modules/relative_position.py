"""Relative position bias of UniLMv2 (Bao et al. 2020, section 4.1; the bucketing of T5, Raffel et al. 2020).

Every attention score ``q_i . k_j`` gets a learned scalar ``b[h, bucket(pos_j - pos_i)]`` per head ``h``. The
offset is taken between *position ids*, not between indices in the input: UniLMv2 appends pseudo tokens and copies
of original tokens that carry the position id of the token they stand for, so the bias must follow the ids.

The bias of every offset between the model's positions is computed once per forward pass (or, when decoding, once
per batch of sentences: :meth:`RelativePositionBias.table`), and each layer's scores read theirs from it by the two
tokens' position ids, the mask folded in (:func:`masked_offset_bias`). Bucketing every (query, key) pair, as
:meth:`RelativePositionBias.forward` states the bias, gives the same values at the cost of a dozen passes over
``(B, T, S)`` integers, and a gradient that reaches the buckets through a ``(B, T, S, h)`` embedding backward.

Parameter layout: ``RelativePositionBias.weight`` is ``[num_heads, num_buckets]``, the layout of the released
UniLMv2 checkpoints' ``bert.rel_pos_bias.weight`` (a bias-free ``nn.Linear(num_buckets, num_heads)`` applied to
one-hot buckets there), so converting a released checkpoint is a plain copy, with no transpose.
"""
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from palm_plugin.errors import InputValueError


def relative_position_bucket(
    relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
) -> torch.Tensor:
    """Map offsets ``key_position - query_position`` to buckets in ``[0, num_buckets)`` (T5's scheme).

    Bidirectional: half of the buckets for keys at or before the query (offset <= 0), half for keys after it.
    Within a half, the first half of its buckets holds the exact distances ``0 .. max_exact - 1`` and the other
    half holds distances ``max_exact .. max_distance`` on a logarithmic scale; every distance >= ``max_distance``
    shares the last bucket. Unidirectional: only offsets <= 0 are distinguished (positive ones fall in bucket 0).

    Args:
        relative_position: integer tensor of any shape, ``key_position - query_position``.
    Returns:
        a long tensor of the same shape.
    """
    buckets = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    # log(distance / max_exact) is evaluated only where it is used (distance >= max_exact), in fp32 whatever the
    # model's dtype, so that bucket boundaries do not move under fp16/bf16 training.
    log_ratio = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    distance_if_large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, distance_if_large)


class RelativePositionBias(nn.Module):
    """A learned scalar per (head, relative-position bucket), added to the attention scores.

    ``weight``: ``[num_heads, num_buckets]`` (see the module docstring for why this layout).
    """

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int):
        super().__init__()
        # T5's bidirectional scheme needs an exact bucket in each half and a log range beyond it
        if num_buckets < 4 or max_distance <= num_buckets // 4:
            raise InputValueError(
                f"relative position buckets {num_buckets} / max distance {max_distance}: need at least 4 buckets and "
                f"a max distance above a quarter of them (UniLMv2: 32 / 128); 0 buckets turns the bias off"
            )
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.zeros(num_heads, num_buckets))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """The bias as section 4.1 states it, every (query, key) pair bucketed: the definition the tests hold
        :func:`masked_offset_bias` (what the model computes) to.

        Args:
            query_positions: ``(B, T)`` long position ids of the query rows.
            key_positions: ``(B, S)`` long position ids of the key columns.
        Returns:
            ``(B, num_heads, T, S)`` bias in the dtype of ``weight``.
        """
        offsets = key_positions.unsqueeze(1) - query_positions.unsqueeze(2)  # (B, T, S): key - query
        buckets = relative_position_bucket(offsets, self.num_buckets, self.max_distance, bidirectional=True)
        return F.embedding(buckets, self.weight.t()).permute(0, 3, 1, 2)

    def table(self, max_positions: int) -> torch.Tensor:
        """``(num_heads, 2 P - 1)``: the bias of every offset ``1 - P .. P - 1`` between positions below ``P =
        max_positions``, column ``offset + P - 1``: what :func:`masked_offset_bias` reads the scores' bias from, in
        training once per forward pass, in decoding once per batch of sentences."""
        return F.embedding(self.offset_buckets(max_positions), self.weight.t()).t()

    def offset_buckets(self, max_positions: int) -> torch.Tensor:
        """``(2 P - 1,)`` long: the bucket of every offset ``1 - P .. P - 1`` (index ``offset + P - 1``), from which
        :meth:`table` reads the bias, and the Triton kernels (:mod:`palm_plugin.modules.attention_triton`) sum the
        gradient per bucket."""
        offsets = torch.arange(1 - max_positions, max_positions, device=self.weight.device)
        return relative_position_bucket(offsets, self.num_buckets, self.max_distance, bidirectional=True)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}"


def masked_offset_bias(table: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor,
                       mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The additive attention mask of UniLMv2: ``table[h, key_pos - query_pos + P - 1]`` where ``mask`` lets the
    query see the key, the dtype's most negative value elsewhere.

    Args:
        table: ``(h, 2P - 1)`` bias of every offset (:meth:`RelativePositionBias.table`) in the scores' dtype.
        query_positions ``(B, T)``, key_positions ``(B, S)``: position ids, below ``P``.
        mask: boolean ``(B, T, S)`` or ``(T, S)``, True where attending is allowed; None: everywhere.
    Returns:
        ``(B, h, T, S)``, laid out heads first (``(h, B, T, S')`` in memory, ``S'`` the multiple of 16 from ``S`` up):
        the last dimension is contiguous and every other stride a multiple of 16, as CUDA's fused attention kernels
        take a bias without copying it, and no copy is made to put the heads second.
    """
    return _MaskedOffsetBias.apply(table, query_positions, key_positions, mask)


class _MaskedOffsetBias(torch.autograd.Function):
    """:func:`masked_offset_bias` as one gather forward, and a backward that sums the gradient of every (query, key)
    pair into its offset's cell without a scatter over ``B x h x T x S`` pairs.

    The sum is taken in two steps: over the pairs of equal (query position, key position) and the batch, by
    multiplying with the one-hot matrices of the positions (``sum_b A_q^T G A_k``, ``(h, P, P)``), then over the
    diagonals of that matrix, each one offset. On CUDA the products run on the tensor cores, deterministically; the
    CPU, where a scatter-add is a cheap serial loop and these products are not, adds the gradient into its cells
    directly (``index_add_``)."""

    @staticmethod
    def forward(ctx, table, query_positions, key_positions, mask):
        heads, width = table.shape
        index = key_positions.unsqueeze(1) - query_positions.unsqueeze(2) + width // 2  # (B, T, S)
        if mask is not None:  # a hidden pair reads an extra cell holding the most negative value
            index = index.masked_fill(~mask, width)
            table = torch.cat([table, table.new_full((heads, 1), torch.finfo(table.dtype).min)], dim=1)
        # the backward needs the positions on CUDA, the index on the CPU (kept as int32: half the memory); nothing
        # when no gradient is asked for (decoding)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(*((query_positions, key_positions) if table.is_cuda else (index.int(),)))
        ctx.width = width
        # SDPA's memory-efficient kernel on CUDA pads a bias whose strides are not multiples of 8 elements: a copy
        # of (B, h, T, S) per layer in the forward, two more and a zeroing in the backward (docs/benchmarks-gpu.md,
        # section 8). The gather writes rows of a multiple of 16 cells instead and hands out their first S.
        keys = index.size(-1)
        index = F.pad(index, (0, -keys % 16))  # the extra columns read cell 0 and are never used
        return table[:, index].transpose(0, 1)[..., :keys]

    @staticmethod
    def backward(ctx, grad):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        if grad.is_cuda:
            cells = offset_sums(grad, *ctx.saved_tensors, ctx.width)
        else:  # the hidden pairs' extra cell (index == width) is dropped after the sum
            (index,) = ctx.saved_tensors
            per_head = grad.transpose(0, 1).reshape(grad.size(1), -1).to(_sum_dtype(grad))
            cells = per_head.new_zeros(grad.size(1), ctx.width + 1).index_add_(1, index.reshape(-1), per_head)
            cells = cells[:, :ctx.width]
        return cells.to(grad.dtype), None, None, None


def offset_sums(grad: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor,
                width: int) -> torch.Tensor:
    """``(h, width)`` (float32, or float64 for a float64 ``grad``): ``sum over b, i, j of grad[b, h, i, j]`` per offset
    ``key_pos[j] - query_pos[i]`` (column ``offset + width // 2``), for ``grad`` ``(B, h, T, S)``; the two steps of
    :class:`_MaskedOffsetBias`. The products accumulate in float32 and round once to ``grad``'s dtype."""
    batch, heads, queries, keys = grad.shape
    positions = width // 2 + 1
    one_hot_keys = F.one_hot(key_positions, positions).to(grad.dtype)  # (B, S, P)
    one_hot_queries = F.one_hot(query_positions, positions).to(grad.dtype).reshape(batch * queries, positions)
    by_key = grad.reshape(batch, heads * queries, keys) @ one_hot_keys  # (B, h T, P): summed per key position
    by_key = by_key.view(batch, heads, queries, positions).transpose(1, 2).reshape(batch * queries, heads * positions)
    pairs = one_hot_queries.t() @ by_key  # (P, h P): and per query position, the batch summed in the same product
    pairs = pairs.view(positions, heads, positions).transpose(0, 1).to(_sum_dtype(grad))  # (h, P, P)
    # the diagonals as columns: rows reversed, each padded to 2P and the whole re-read with rows of 2P - 1, which
    # shifts row r by r, so that [p, q] lands in column q - p + P - 1
    skewed = F.pad(pairs.flip(1), (0, positions)).reshape(heads, -1)[:, :positions * width]
    return skewed.reshape(heads, positions, width).sum(1)


def _sum_dtype(grad: torch.Tensor) -> torch.dtype:
    """Sums over many pairs in float32 at least: fp16 / bf16 gradients would round them."""
    return torch.promote_types(grad.dtype, torch.float32)
