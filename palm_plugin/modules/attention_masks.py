"""Self-attention masks of UniLM (Dong et al. 2019, section 2.2 and Figure 1), shared by UniLM and UniLMv2.

Convention: boolean masks, ``True`` = the query row may attend to the key column (the convention of
``torch.nn.functional.scaled_dot_product_attention``). :func:`to_additive` turns one into the paper's form
(0 = may attend, a very negative number = may not), in the dtype of the scores.

Sequences are right-padded. A padding key is never visible; a padding query row sees itself only, so that
softmax never runs over an empty row (its output is ignored by every loss).
"""
from enum import IntEnum

import torch


class Objective(IntEnum):
    """The language-modelling objective of a row; UniLM also marks it through the segment embedding."""

    BIDIRECTIONAL = 0
    LEFT_TO_RIGHT = 1
    RIGHT_TO_LEFT = 2
    SEQ2SEQ = 3


def _grid(seq_len: int, device=None):
    positions = torch.arange(seq_len, device=device)
    return positions.view(-1, 1), positions.view(1, -1)  # query index i (T, 1), key index j (1, T)


def bidirectional_mask(seq_len: int, device=None) -> torch.Tensor:
    """``(T, T)``: every token sees every token."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)


def left_to_right_mask(seq_len: int, device=None) -> torch.Tensor:
    """``(T, T)``: token i sees tokens j <= i (lower triangle)."""
    i, j = _grid(seq_len, device)
    return j <= i


def right_to_left_mask(seq_len: int, device=None) -> torch.Tensor:
    """``(T, T)``: token i sees tokens j >= i (upper triangle)."""
    i, j = _grid(seq_len, device)
    return j >= i


def seq2seq_mask(source_lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """``(B, T, T)``: every row sees the whole source; source rows never see the target; target row i sees the
    target up to and including i. ``source_lengths`` ``(B,)`` counts ``[SOS] S1 [EOS]``."""
    i, j = _grid(seq_len, source_lengths.device)
    src = source_lengths.view(-1, 1, 1)
    return (j < src) | ((i >= src) & (j <= i))


def unilm_mask(objectives: torch.Tensor, source_lengths: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """The mask of a mixed batch, one objective per row (UniLM pre-training).

    Args:
        objectives: ``(B,)`` :class:`Objective` values.
        source_lengths: ``(B,)`` length of ``[SOS] S1 [EOS]`` (used by SEQ2SEQ rows only).
        padding_mask: ``(B, T)`` True at padding.
    Returns:
        ``(B, T, T)`` boolean mask.
    """
    seq_len = padding_mask.size(1)
    device = padding_mask.device
    objectives = objectives.view(-1, 1, 1)
    mask = torch.where(
        objectives == Objective.LEFT_TO_RIGHT,
        left_to_right_mask(seq_len, device),
        bidirectional_mask(seq_len, device),
    )
    mask = torch.where(objectives == Objective.RIGHT_TO_LEFT, right_to_left_mask(seq_len, device), mask)
    mask = torch.where(objectives == Objective.SEQ2SEQ, seq2seq_mask(source_lengths, seq_len), mask)
    return hide_padding(mask, padding_mask)


def hide_padding(mask: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """Remove padding keys from ``mask`` ``(B, T, T)`` or ``(T, T)``; padding rows keep only themselves."""
    keys_visible = ~padding_mask.unsqueeze(1)  # (B, 1, T)
    eye = torch.eye(padding_mask.size(1), dtype=torch.bool, device=padding_mask.device)
    return torch.where(padding_mask.unsqueeze(2), eye, mask & keys_visible)


def to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask -> additive mask: 0 where attending is allowed, the dtype's most negative value elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
