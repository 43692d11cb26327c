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


def seq2seq_decoding_mask(source_padding: torch.Tensor, cached: int, new: int) -> torch.Tensor:
    """The rows of :func:`seq2seq_mask` for the last ``new`` target positions, as incremental decoding needs them.

    Columns are ``[source (S) | cached target (cached) | new rows (new)]``: the new rows see the source (padding
    hidden), every cached target token, and the new rows up to and including themselves.

    Args:
        source_padding: ``(N, S)`` True at source padding.
    Returns:
        ``(N, new, S + cached + new)`` boolean mask.
    """
    rows, device = source_padding.size(0), source_padding.device
    source = (~source_padding).unsqueeze(1).expand(rows, new, -1)
    earlier = torch.ones(rows, new, cached, dtype=torch.bool, device=device)
    own = left_to_right_mask(new, device).expand(rows, -1, -1)
    return torch.cat([source, earlier, own], dim=2)


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


def mask_from_fields(
    padding_mask: torch.Tensor,
    objectives=None,
    source_lengths=None,
    target_lengths=None,
    steps=None,
    kinds=None,
) -> torch.Tensor:
    """The mask a batch describes by its compact fields (what the datasets put in ``net_input``), padding hidden.

    * ``steps`` and ``kinds`` ``(B, T)``: the pseudo-masked LM (:func:`pmlm_mask`);
    * ``source_lengths`` and ``target_lengths`` ``(B,)``: UniLMv2's seq2seq layout (:func:`pseudo_seq2seq_mask`);
    * ``objectives`` (and ``source_lengths``) ``(B,)``: UniLM's mixed objectives (:func:`unilm_mask`);
    * none of them: bidirectional.

    Only these ``(B,)`` / ``(B, T)`` fields cross the data loader; the ``(B, T, T)`` mask is built here, on the
    model's device.
    """
    if steps is not None:
        return pmlm_mask(steps, kinds, padding_mask)
    if target_lengths is not None:
        return pseudo_seq2seq_mask(source_lengths, target_lengths, padding_mask)
    if objectives is not None:
        return unilm_mask(objectives, source_lengths, padding_mask)
    return hide_padding(bidirectional_mask(padding_mask.size(1), padding_mask.device), padding_mask)


def hide_padding(mask: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """Remove padding keys from ``mask`` ``(B, T, T)`` or ``(T, T)``; padding rows keep only themselves."""
    keys_visible = ~padding_mask.unsqueeze(1)  # (B, 1, T)
    eye = torch.eye(padding_mask.size(1), dtype=torch.bool, device=padding_mask.device)
    return torch.where(padding_mask.unsqueeze(2), eye, mask & keys_visible)


def to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask -> additive mask: 0 where attending is allowed, the dtype's most negative value elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


# ----------------------------------------------------------------------------------------------------------------
# UniLMv2 (Bao et al. 2020, section 3.2 and Figure 5): the pseudo-masked LM, and the seq2seq fine-tuning layout.
# ----------------------------------------------------------------------------------------------------------------


class PseudoMaskKind(IntEnum):
    """What a token of a pseudo-masked input is, for the mask rules of :func:`pmlm_mask`."""

    CONTEXT = 0  # an unmasked token, or the [M] slot of a masked one (the AE part): visible to every row
    PSEUDO = 1  # an appended [P] placeholder, whose top state predicts the token of its position
    ORIGINAL = 2  # an appended copy of an original masked token, context for the later factorization steps


def pmlm_mask(steps: torch.Tensor, kinds: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """The self-attention mask of the pseudo-masked LM, for any number of factorization steps.

    Rule (Figure 5 of the paper, generalised; ``s`` = factorization step, ``CONTEXT`` tokens have no step):

    * a CONTEXT key (unmasked token or [M]) is visible to every row;
    * a CONTEXT row sees CONTEXT keys only: the AE part is a plain bidirectional MLM, whatever is appended, and
      no context token can relay an original token to a pseudo token (the implicit leakage
      ``[P]_4 -> x_6 -> x_4`` of section 3.2);
    * a PSEUDO row of step i sees, besides the context, the ORIGINAL tokens of the steps < i (equation 5:
      ``p(x_{M_i} | x_{\\M>=i})``) and the PSEUDO tokens of step i (the other placeholders of its own span, which
      carry positions, not content). It never sees an original token of step >= i, its own included (the
      explicit leakage of section 3.2), nor the pseudo tokens of other steps;
    * an ORIGINAL row of step i sees the context, the ORIGINAL tokens of the steps < i and the ORIGINAL tokens of
      step i (its own span; these rows feed only the steps after i, which may see all of step i anyway).

    So with ``q`` the row and ``k`` the key: ``visible = k is CONTEXT or (q is not CONTEXT and
    ((k is ORIGINAL and s_k < s_q) or (kind_k == kind_q and s_k == s_q)))``. For the paper's example
    (``x_1..x_6``, steps ``{4, 5} -> {2}``) this gives Figure 5 cell by cell (tests/test_unilm2_attention_masks.py).

    The same rule is the seq2seq fine-tuning mask when each target token is a one-token step in target order
    (:func:`pseudo_seq2seq_mask`).

    Args:
        steps: ``(B, T)`` long, the factorization step of each PSEUDO / ORIGINAL token (any value on CONTEXT
            tokens and padding).
        kinds: ``(B, T)`` :class:`PseudoMaskKind` values.
        padding_mask: ``(B, T)`` True at padding.
    Returns:
        ``(B, T, T)`` boolean mask, True = may attend.
    """
    query_kind, key_kind = kinds.unsqueeze(2), kinds.unsqueeze(1)
    query_step, key_step = steps.unsqueeze(2), steps.unsqueeze(1)
    appended_row = query_kind != PseudoMaskKind.CONTEXT
    earlier_original = (key_kind == PseudoMaskKind.ORIGINAL) & (key_step < query_step)
    same_step_same_kind = (key_kind == query_kind) & (key_step == query_step)
    mask = (key_kind == PseudoMaskKind.CONTEXT) | (appended_row & (earlier_original | same_step_same_kind))
    return hide_padding(mask, padding_mask)


# Ranks of contexts and of padding: the steps' ranks (2 s, 2 s + 1) lie between them for any step a sequence holds.
CONTEXT_RANK, PADDING_RANK = -2 ** 30, 2 ** 30


def visibility_ranks(steps: torch.Tensor, kinds: torch.Tensor, padding_mask: torch.Tensor):
    """:func:`pmlm_mask` as two integers per token, so that a kernel decides a pair with two comparisons: query ``i``
    may attend to key ``j`` if and only if ``rank[j] <= rank[i] <= reach[j]``.

    Ranks order the tokens by what they may see: CONTEXT first (they see CONTEXT only), then by step, the PSEUDO
    token of step ``s`` (``2 s``) before the ORIGINAL one (``2 s + 1``), which also sees its own step's ORIGINAL
    tokens. A key is seen by the queries from its own rank up to its reach: every non-padding query for CONTEXT and
    ORIGINAL keys, the PSEUDO queries of its step only for a PSEUDO key. Padding token ``t`` is its own interval
    ``PADDING_RANK + t``, seen by itself only, as :func:`hide_padding` has it.

    Args:
        steps, kinds, padding_mask: as :func:`pmlm_mask` (steps between ``-2^28`` and ``2^28``).
    Returns:
        ``rank`` and ``reach``, ``(B, T)`` long each.
    """
    padding = PADDING_RANK + torch.arange(steps.size(1), device=steps.device)
    pseudo = kinds == PseudoMaskKind.PSEUDO
    rank = torch.where(kinds == PseudoMaskKind.CONTEXT, CONTEXT_RANK, 2 * steps + (kinds == PseudoMaskKind.ORIGINAL))
    reach = torch.where(pseudo, 2 * steps, PADDING_RANK - 1)
    return torch.where(padding_mask, padding, rank), torch.where(padding_mask, padding, reach)


def pseudo_seq2seq_layout(source_lengths: torch.Tensor, target_lengths: torch.Tensor, seq_len: int):
    """Steps and kinds of the fine-tuning layout ``[source | target | pseudo target | padding]`` (per row, packed).

    Args:
        source_lengths, target_lengths: ``(B,)``; row b holds ``source_lengths[b]`` source tokens, then
            ``target_lengths[b]`` target tokens, then as many pseudo tokens, then padding up to ``seq_len``.
    Returns:
        ``steps`` and ``kinds``, each ``(B, T)``: the source is CONTEXT, target token i is the ORIGINAL token of
        step i, pseudo token i the PSEUDO token of step i (padding: CONTEXT, hidden by the padding mask).
    """
    column = torch.arange(seq_len, device=source_lengths.device).unsqueeze(0)  # (1, T)
    source, target = source_lengths.unsqueeze(1), target_lengths.unsqueeze(1)  # (B, 1)
    in_target = (column >= source) & (column < source + target)
    in_pseudo = (column >= source + target) & (column < source + 2 * target)
    steps = torch.where(in_pseudo, column - source - target, torch.where(in_target, column - source, 0))
    kinds = torch.full_like(steps, PseudoMaskKind.CONTEXT)
    kinds = kinds.masked_fill(in_target, PseudoMaskKind.ORIGINAL).masked_fill(in_pseudo, PseudoMaskKind.PSEUDO)
    return steps, kinds


def pseudo_seq2seq_mask(source_lengths: torch.Tensor, target_lengths: torch.Tensor, padding_mask: torch.Tensor):
    """The UniLMv2 seq2seq fine-tuning mask over ``[source | target | pseudo target]`` (section 3.4).

    Source rows see the source; target row i sees the source and the target tokens <= i; pseudo row i sees the
    source, the target tokens < i and itself; no real row sees a pseudo row. This is :func:`pmlm_mask` with one
    factorization step per target token, in target order (:func:`pseudo_seq2seq_layout`).

    Args:
        source_lengths, target_lengths: ``(B,)``.
        padding_mask: ``(B, T)`` True at padding (every column from ``source + 2 * target`` on).
    Returns:
        ``(B, T, T)`` boolean mask.
    """
    steps, kinds = pseudo_seq2seq_layout(source_lengths, target_lengths, padding_mask.size(1))
    return pmlm_mask(steps, kinds, padding_mask)


def unilm_layout(objectives: torch.Tensor, source_lengths: torch.Tensor, seq_len: int):
    """UniLM's four masks as the pseudo-masked LM's rule (:func:`pmlm_mask`): steps and kinds ``(B, T)`` such that
    ``pmlm_mask(steps, kinds, padding)`` is :func:`unilm_mask` of the same rows.

    A bidirectional row is all CONTEXT. Left-to-right: every token the ORIGINAL token of the step of its index, so a
    row sees the earlier steps and itself; right-to-left: the step of minus its index; seq2seq: the source CONTEXT
    (seen by every row, and seeing the source only), the target left-to-right. One rule then covers the whole
    family, which lets a kernel evaluate any of its masks from one integer per token
    (:mod:`palm_plugin.modules.attention_triton`).
    """
    column = torch.arange(seq_len, device=objectives.device).unsqueeze(0)  # (1, T)
    objectives = objectives.view(-1, 1)
    ordered = (objectives == Objective.LEFT_TO_RIGHT) | (objectives == Objective.RIGHT_TO_LEFT) | (
        (objectives == Objective.SEQ2SEQ) & (column >= source_lengths.view(-1, 1)))
    steps = torch.where(objectives == Objective.RIGHT_TO_LEFT, -column, column).expand(objectives.size(0), -1)
    kinds = torch.where(ordered, int(PseudoMaskKind.ORIGINAL), int(PseudoMaskKind.CONTEXT))
    return steps.masked_fill(~ordered, 0), kinds


def as_pmlm_layout(padding_mask, objectives=None, source_lengths=None, target_lengths=None, steps=None, kinds=None):
    """Steps and kinds ``(B, T)`` of any batch of the family for :func:`pmlm_mask`, from the fields
    :func:`mask_from_fields` takes: ``pmlm_mask(*as_pmlm_layout(padding, **fields), padding)`` is
    ``mask_from_fields(padding, **fields)``."""
    if steps is not None:
        return steps, kinds
    if target_lengths is not None:
        return pseudo_seq2seq_layout(source_lengths, target_lengths, padding_mask.size(1))
    if objectives is not None:
        return unilm_layout(objectives, source_lengths, padding_mask.size(1))
    zeros = torch.zeros(padding_mask.shape, dtype=torch.long, device=padding_mask.device)
    return zeros, zeros  # bidirectional: every token CONTEXT
