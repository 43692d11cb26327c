"""PALM's pointer-generator output layer (Bi et al. 2020, section 2.3, equations (2)-(8)).

For decoder state ``s_t`` and encoder states ``h_l`` (``l = 1..m``):

    (2) P_v(y)  = softmax(W_e (W_v s_t + b_v))                      W_e tied to the input embedding
    (3) e_tl    = w_c^T tanh(W_m h_l + W_s s_t + b_c)
    (4) alpha_t = softmax(e_t)                                      over source positions
    (5) z_t     = sum_l alpha_tl h_l
    (6) P_c(y)  = sum_{l: x_l = y} alpha_tl                         over the extended vocabulary
    (7) P(y)    = lambda P_v(y) + (1 - lambda) P_c(y)
    (8) lambda  = sigmoid(w_z z_t + w_s s_t + b_m)

The copy attention (3)-(5) is a layer of its own (additive attention), not one of the decoder's cross-attention
heads. Everything after the projections is computed in float32 and in log space, without ever forming ``log 0``:
for a type that no source position holds, (7) is ``log lambda + log P_v`` with ``log lambda = logsigmoid(g)``; for
the (at most ``S``) types in the source it is ``logaddexp(log lambda + log P_v, log(1 - lambda) + log P_c)`` with
``log(1 - lambda) = logsigmoid(-g)``. A saturated gate or a sharp softmax therefore stays finite.

Position markers of the extended vocabulary have no ``P_v`` entry; :data:`LOG_ZERO` (the log of float32's smallest
normal number) stands in for ``log 0`` there, so that fairseq's label smoothing, which sums log-probabilities over
the whole vocabulary, stays finite.
"""
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor

TINY = torch.finfo(torch.float32).tiny
LOG_ZERO = float(torch.log(torch.tensor(TINY)))


@with_incremental_state
class PointerGenerator(nn.Module):
    """The distribution over the (extended) vocabulary for each decoder state.

    Args:
        decoder_dim: size of the decoder states ``s_t``.
        encoder_dim: size of the encoder states ``h_l``.
        output_embedding: ``W_e``, the input embedding matrix ``(V, decoder_dim)`` (tied, not copied).
        num_types: size of the extended vocabulary (``V`` plus the source position markers, if any).
        copy: False for the "- pointer-generator" ablation (PALM Table 6): only equation (2).
        attention_dim: output size of ``W_m`` and ``W_s`` (the additive attention's hidden size).
    """

    def __init__(
        self,
        decoder_dim: int,
        encoder_dim: int,
        output_embedding: nn.Parameter,
        num_types: int,
        copy: bool = True,
        attention_dim: Optional[int] = None,
    ):
        super().__init__()
        if num_types < output_embedding.size(0):
            raise ValueError(f"num_types ({num_types}) is smaller than the embedding ({output_embedding.size(0)} rows)")
        self.num_types = num_types
        self.copy = copy
        self.vocab_projection = nn.Linear(decoder_dim, output_embedding.size(1))  # W_v, b_v
        self.output_embedding = output_embedding  # W_e
        if copy:
            attention_dim = attention_dim or decoder_dim
            self.memory_projection = nn.Linear(encoder_dim, attention_dim, bias=False)  # W_m
            self.query_projection = nn.Linear(decoder_dim, attention_dim)  # W_s, b_c
            self.attention_vector = nn.Linear(attention_dim, 1, bias=False)  # w_c
            self.gate = nn.Linear(encoder_dim + decoder_dim, 1)  # [w_z; w_s], b_m

    def vocabulary_log_probs(self, states: Tensor) -> Tensor:
        """Equation (2) in log space: ``(B, T, C) -> (B, T, num_types)`` float32; marker columns get LOG_ZERO."""
        logits = F.linear(self.vocab_projection(states), self.output_embedding)
        log_p_vocab = F.log_softmax(logits.float(), dim=-1)
        extra_types = self.num_types - log_p_vocab.size(-1)
        if extra_types:
            log_p_vocab = F.pad(log_p_vocab, (0, extra_types), value=LOG_ZERO)
        return log_p_vocab

    def copy_attention(self, states: Tensor, encoder_states: Tensor, padding_mask: Optional[Tensor], incremental_state):
        """Equations (3)-(5).

        Args:
            states: ``(B, T, C_dec)`` decoder states (``T = 1`` when decoding incrementally).
            encoder_states: ``(B, S, C_enc)``.
            padding_mask: ``(B, S)`` True at padding, or None.
        Returns:
            ``alpha`` ``(B, T, S)`` float32 and the context vectors ``z`` ``(B, T, C_enc)``.
        """
        memory = self._projected_memory(encoder_states, incremental_state)  # (B, S, A)
        query = self.query_projection(states)  # (B, T, A)
        scores = self.attention_vector(torch.tanh(memory.unsqueeze(1) + query.unsqueeze(2))).squeeze(-1).float()
        if padding_mask is not None:
            scores = scores.masked_fill(padding_mask.unsqueeze(1), float("-inf"))
        alpha = F.softmax(scores, dim=-1)
        context = torch.bmm(alpha.to(encoder_states.dtype), encoder_states)
        return alpha, context

    def forward(
        self,
        states: Tensor,
        encoder_out: Optional[Dict],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
    ) -> Tensor:
        """Log-probabilities ``log P(y)`` of equation (7).

        Args:
            states: ``(B, T, C_dec)`` decoder output.
            encoder_out: fairseq encoder output dict with ``encoder_out`` ``[(S, B, C_enc)]``,
                ``encoder_padding_mask`` ``[(B, S)]`` (or ``[]``) and ``src_tokens`` ``[(B, S)]``.
        Returns:
            ``(B, T, num_types)`` float32 log-probabilities (``logsumexp`` over the last axis is 0).
        """
        log_p_vocab = self.vocabulary_log_probs(states)
        if not self.copy:
            return log_p_vocab
        encoder_states = encoder_out["encoder_out"][0].transpose(0, 1)
        padding_mask = encoder_out["encoder_padding_mask"][0] if len(encoder_out["encoder_padding_mask"]) else None
        src_tokens = encoder_out["src_tokens"][0]
        alpha, context = self.copy_attention(states, encoder_states, padding_mask, incremental_state)

        gate = self.gate(torch.cat((context, states), dim=-1)).float()  # (8), before the sigmoid: (B, T, 1)
        # (7) for a type no source position holds is log(lambda P_v); only the <= S source types need the mixture.
        log_probs = F.logsigmoid(gate) + log_p_vocab
        index = src_tokens.unsqueeze(1).expand_as(alpha)
        same_type = src_tokens.unsqueeze(2) == src_tokens.unsqueeze(1)  # (B, S, S): x_l' == x_l
        p_copy = torch.bmm(alpha, same_type.to(alpha.dtype))  # (6) for the type at each position l: (B, T, S)
        mixed = torch.logaddexp(log_probs.gather(2, index), F.logsigmoid(-gate) + torch.log(p_copy.clamp_min(TINY)))
        # A type held at several positions is written once per position with equal values; only its first position
        # passes the gradient on, so that the scatter below counts it once.
        mixed = torch.where(_first_occurrence(same_type).unsqueeze(1), mixed, mixed.detach())
        return log_probs.scatter(2, index, mixed)

    def _projected_memory(self, encoder_states: Tensor, incremental_state) -> Tensor:
        """``W_m h_l`` ``(B, S, A)``: computed once per sentence when decoding incrementally."""
        if incremental_state is None:
            return self.memory_projection(encoder_states)
        cached = self.get_incremental_state(incremental_state, "copy_memory")
        if cached is not None:
            return cached["memory"]
        memory = self.memory_projection(encoder_states)
        self.set_incremental_state(incremental_state, "copy_memory", {"memory": memory})
        return memory

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Follow beam search's reordering (and pruning) of hypotheses, as the encoder output does."""
        cached = self.get_incremental_state(incremental_state, "copy_memory")
        if cached is not None:
            self.set_incremental_state(
                incremental_state, "copy_memory", {"memory": cached["memory"].index_select(0, new_order)}
            )


def _first_occurrence(same_type: Tensor) -> Tensor:
    """``(B, S)`` bool: True at the first position of each type, from ``same_type[b, l, l'] = x_l == x_l'``."""
    earlier = torch.ones_like(same_type[0]).tril(diagonal=-1)  # l' < l
    return ~(same_type & earlier).any(dim=2)
