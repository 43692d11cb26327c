"""Relative position bias of UniLMv2 (Bao et al. 2020, section 4.1; the bucketing of T5, Raffel et al. 2020).

Every attention score ``q_i . k_j`` gets a learned scalar ``b[h, bucket(pos_j - pos_i)]`` per head ``h``. The
offset is taken between *position ids*, not between indices in the input: UniLMv2 appends pseudo tokens and copies
of original tokens that carry the position id of the token they stand for, so the bias must follow the ids.

The bias is computed once per forward pass from the position ids and added to the scores of every layer (the
table is shared by all layers); incremental decoding reads each step's rows from a table of every offset, computed
once per batch of sentences (:meth:`RelativePositionBias.table`).

Parameter layout: ``RelativePositionBias.weight`` is ``[num_heads, num_buckets]``, the layout of the released
UniLMv2 checkpoints' ``bert.rel_pos_bias.weight`` (a bias-free ``nn.Linear(num_buckets, num_heads)`` applied to
one-hot buckets there), so converting a released checkpoint is a plain copy, with no transpose.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


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

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        # T5's bidirectional scheme needs an exact bucket in each half and a log range beyond it
        if num_buckets < 4 or max_distance <= num_buckets // 4:
            raise ValueError(
                f"relative position buckets {num_buckets} / max distance {max_distance}: need at least 4 buckets and "
                f"a max distance above a quarter of them (UniLMv2: 32 / 128); 0 buckets turns the bias off"
            )
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.zeros(num_heads, num_buckets))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """
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
        max_positions``, column ``offset + P - 1``. Decoding computes it once per batch of sentences and reads each
        step's rows from it (:meth:`rows`) instead of bucketing the step's offsets again."""
        offsets = torch.arange(1 - max_positions, max_positions, device=self.weight.device)
        buckets = relative_position_bucket(offsets, self.num_buckets, self.max_distance, bidirectional=True)
        return F.embedding(buckets, self.weight.t()).t()

    @staticmethod
    def rows(table: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """:meth:`forward`'s ``(B, num_heads, T, S)`` bias read from a :meth:`table` (the same values)."""
        offsets = key_positions.unsqueeze(1) - query_positions.unsqueeze(2) + (table.size(1) // 2)
        return F.embedding(offsets, table.t()).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}"
