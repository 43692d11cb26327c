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

The additive attention (3) is elementwise work over ``B x T x S x A`` values (batch, target, source, attention
size): :class:`AdditiveAttentionScores` never stores that tensor. It computes it in cache-sized blocks and recomputes
them in the backward pass (``--copy-attention-impl blocked``), or has torch.compile fuse each pass into reduction
kernels that never write it (``compiled``), or runs hand-written Triton kernels that hold it a tile at a time in
registers (``triton``, :mod:`palm_plugin.modules.copy_attention_triton`).

Position markers of the extended vocabulary have no ``P_v`` entry; :data:`LOG_ZERO` (the log of float32's smallest
normal number) stands in for ``log 0`` there, so that fairseq's label smoothing, which sums log-probabilities over
the whole vocabulary, stays finite.
"""
import logging
from functools import lru_cache, partial
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor

from palm_plugin.errors import CommandError
from palm_plugin.modules.attention_impl import triton_installed
from palm_plugin.modules.compiled_layers import compiled
from palm_plugin.modules.lm_head import vocabulary_logits

logger = logging.getLogger(__name__)

TINY = torch.finfo(torch.float32).tiny
LOG_ZERO = float(torch.log(torch.tensor(TINY)))

# Elements of one block of equation (3)'s activations (rows of S x A values): on a CPU, 1 MiB of float32, about a
# core's L2 cache, so a block stays in cache between its forward and recomputed backward use (block sizes measured in
# docs/benchmarks.md); on an accelerator, blocks large enough to keep the number of kernel launches low while bounding
# the memory.
BLOCK_ELEMENTS = {"cpu": 2**18}
ACCELERATOR_BLOCK_ELEMENTS = 2**26
# Devices on which the backward pass sums the memory gradient one target row at a time (a row stays in cache); on
# others one reduction per block, since a kernel launch per row made the loop launch-bound on a GPU
# (docs/benchmarks-gpu.md).
ROW_BY_ROW = {"cpu"}
# How equation (3) is evaluated (:class:`AdditiveAttentionScores`): PALM's --copy-attention-impl. auto: triton on
# CUDA tensors (1.16-1.43x faster PALM steps than blocked on an H100: docs/benchmarks-gpu.md, section 8), blocked
# elsewhere.
COPY_ATTENTION_IMPLS = ("auto", "blocked", "compiled", "triton")


class CopyAttentionImplError(CommandError):
    """--copy-attention-impl cannot run here: the command stops with one line naming the value to use instead."""


def check_copy_attention_impl(impl: str) -> None:
    """Refuse ``impl`` where it cannot run, naming the option to use instead: ``triton`` needs the triton package and
    a CUDA device (or Triton's interpreter, ``TRITON_INTERPRET=1``, which tests use on a CPU)."""
    if impl != "triton":
        return
    if not triton_installed():
        raise CopyAttentionImplError("--copy-attention-impl triton needs the triton package (pip install triton), "
                                     "which is not installed: use --copy-attention-impl compiled (or blocked)")
    from palm_plugin.modules import copy_attention_triton

    if not torch.cuda.is_available() and not copy_attention_triton.INTERPRETED:
        raise CopyAttentionImplError("--copy-attention-impl triton runs its kernels on CUDA, and no CUDA device is "
                                     "available: use --copy-attention-impl blocked (the CPU's fastest)")


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

    ``scores_impl`` (an attribute, "blocked" unless PALM's ``--copy-attention-impl`` sets it) selects the evaluation
    of equation (3), one of :data:`COPY_ATTENTION_IMPLS` (:class:`AdditiveAttentionScores`).
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
        self.scores_impl = "blocked"
        self.vocab_projection = nn.Linear(decoder_dim, output_embedding.size(1))  # W_v, b_v
        self.output_embedding = output_embedding  # W_e
        if copy:
            attention_dim = attention_dim or decoder_dim
            self.memory_projection = nn.Linear(encoder_dim, attention_dim, bias=False)  # W_m
            self.query_projection = nn.Linear(decoder_dim, attention_dim)  # W_s, b_c
            self.attention_vector = nn.Linear(attention_dim, 1, bias=False)  # w_c (its weight; see copy_attention)
            self.gate = nn.Linear(encoder_dim + decoder_dim, 1)  # [w_z; w_s], b_m

    def vocabulary_log_probs(self, states: Tensor) -> Tensor:
        """Equation (2) in log space: ``(B, T, C) -> (B, T, num_types)`` float32; marker columns get LOG_ZERO."""
        logits = vocabulary_logits(self.vocab_projection(states), self.output_embedding)
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
        # (3): (B, T, S) float32
        scores = AdditiveAttentionScores.apply(memory, query, self.attention_vector.weight, self.scores_impl)
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
        # Outside autocast: under fp16 autocast the bmm of (6) would run in fp16, where P_c underflows and TINY
        # rounds to 0 (log 0, then NaN gradients). The gate is one row of weights, cheap in float32, and its bias
        # gradient sums B x T terms that cancel, which fp16 rounding spoils (tests/test_gpu.py).
        with torch.autocast(device_type=states.device.type, enabled=False):
            return self._mixture(log_p_vocab, alpha, context, states, src_tokens)

    def _mixture(self, log_p_vocab: Tensor, alpha: Tensor, context: Tensor, states: Tensor, src_tokens: Tensor):
        """Equations (6)-(8) in float32 log space, given (2) and (4)-(5)."""
        gate_input = torch.cat((context.float(), states.float()), dim=-1)
        gate = F.linear(gate_input, self.gate.weight.float(), self.gate.bias.float())  # (8), before the sigmoid
        log_lambda = F.logsigmoid(gate)
        index = src_tokens.unsqueeze(1).expand_as(alpha)
        same_type = src_tokens.unsqueeze(2) == src_tokens.unsqueeze(1)  # (B, S, S): x_l' == x_l
        p_copy = torch.bmm(alpha, same_type.to(alpha.dtype))  # (6) for the type at each position l: (B, T, S)
        mixed = torch.logaddexp(
            log_lambda + log_p_vocab.gather(2, index), F.logsigmoid(-gate) + torch.log(p_copy.clamp_min(TINY))
        )
        # A type held at several positions is written once per position with equal values; only its first position
        # passes the gradient on, so that the scatter below counts it once.
        mixed = torch.where(_first_occurrence(same_type).unsqueeze(1), mixed, mixed.detach())
        # (7) for a type no source position holds is log(lambda P_v); only the <= S source types need the mixture,
        # written in place: the sum is a fresh (B, T, V) tensor that autograd does not keep.
        return (log_lambda + log_p_vocab).scatter_(2, index, mixed)

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


class AdditiveAttentionScores(torch.autograd.Function):
    """Equation (3), ``e[b, t, l] = w_c^T tanh(m[b, l] + q[b, t])``, without storing the ``(B, T, S, A)`` activations.

    ``apply(memory, query, weight, impl="blocked")``: ``memory`` ``(B, S, A)`` (``W_m h_l``), ``query`` ``(B, T, A)``
    (``W_s s_t + b_c``), ``weight`` ``(1, A)`` (``w_c``), ``impl`` one of :data:`COPY_ATTENTION_IMPLS`; returns the
    scores ``(B, T, S)`` in float32, whatever the inputs' dtype (the activations are computed in float32 too), and
    gradients in the inputs' dtypes.

    Storing the activations, as autograd would, costs more than computing them twice: writing and reading back a
    tensor of B x T x S x A floats (151 MB per copy for palm_base at length 512), several such copies in the backward
    pass, and page faults on each fresh allocation. Three evaluations of the same sums, each recomputing the
    activations in the backward pass from the saved inputs:

    - blocked (the default): the activations of a block of rows ``(b, t)`` (:data:`BLOCK_ELEMENTS`) are computed,
      reduced and dropped while they are in cache, with torch's kernels; the backward pass recomputes them block by
      block. The matrix products are those of autograd's linear layer ``A -> 1``: ``y w`` in the forward pass,
      ``g^T y`` (for ``w_c``) and, per row, ``g y'`` over the source (for the query) in the backward pass, so FLOP
      counts agree.
    - compiled: the sums written over the whole ``(B, T, S, A)`` and compiled
      (:func:`~palm_plugin.modules.compiled_layers.compiled`); inductor makes each a reduction kernel (Triton on a
      GPU) that computes the activations where it sums them (checked in the code it generates for the CPU), so the
      memory traffic is that of the inputs and outputs. Batches with a dimension of size 1 take the blocked path.
    - triton: hand-written kernels over two-dimensional tiles of float32 accumulators
      (:mod:`~palm_plugin.modules.copy_attention_triton`); one pass forward, two deterministic passes backward.

    The first two use ``tanh(x) = 2 sigmoid(2x) - 1`` (exactly; in float32 within 2e-7 of tanh), so with
    ``y = sigmoid(2m + 2q)``: ``e = 2 w_c^T y - sum(w_c)`` and ``tanh'(x) = 1 - tanh(x)^2 = 4 y (1 - y)``. torch's
    CPU ``sigmoid`` is about ten times faster than its ``tanh``.
    """

    @staticmethod
    def forward(ctx, memory: Tensor, query: Tensor, weight: Tensor, impl: str = "blocked") -> Tensor:
        ctx.save_for_backward(memory, query, weight)
        scores, ctx.gradients = _evaluation(impl, memory, query)
        return scores(memory, query, weight.view(-1))

    @staticmethod
    def backward(ctx, grad: Tensor):
        memory, query, weight = ctx.saved_tensors
        # one layout for the compiled code and the kernels (an expanded gradient is another)
        grad_memory, grad_query, grad_weight = ctx.gradients(memory, query, weight.view(-1), grad.float().contiguous())
        return (grad_memory.to(memory.dtype), grad_query.to(query.dtype),
                grad_weight.view_as(weight).to(weight.dtype), None)


def _evaluation(impl: str, memory: Tensor, query: Tensor):
    """The functions ``(memory, query, w) -> scores`` and ``(memory, query, w, grad) -> gradients`` of ``impl``."""
    if impl == "auto":
        impl = _auto_impl(memory)
    if impl == "triton":
        from palm_plugin.modules import copy_attention_triton

        return copy_attention_triton.additive_scores, copy_attention_triton.additive_score_gradients
    if impl not in COPY_ATTENTION_IMPLS:
        raise ValueError(f"copy attention impl {impl!r}: choose one of {', '.join(COPY_ATTENTION_IMPLS)}")
    # torch specialises dimensions of size 1, so each would compile anew: the blocked path takes those batches
    if impl == "compiled" and min(memory.size(0), memory.size(1), query.size(1)) > 1:
        return partial(_sigmoid_scores, compiled(_weighted_sums)), partial(_sigmoid_gradients, _gradient_sums)
    return partial(_sigmoid_scores, _blocked_weighted_sums), partial(_sigmoid_gradients, _blocked_gradient_sums)


def _auto_impl(memory: Tensor) -> str:
    """``--copy-attention-impl auto``: the Triton kernels on CUDA, the blocked path elsewhere; on CUDA without the
    triton package the blocked path too, said once, since it is the slower one there."""
    if not memory.is_cuda:
        return "blocked"
    if triton_installed():
        return "triton"
    _warn_blocked_on_cuda()
    return "blocked"


@lru_cache(maxsize=None)
def _warn_blocked_on_cuda() -> None:
    logger.warning("--copy-attention-impl auto: the triton package is not installed, so PALM's copy layer runs the "
                   "blocked path on CUDA, the slower one there (docs/benchmarks-gpu.md, section 8): pip install "
                   "triton, or give --copy-attention-impl compiled or blocked")


def _sigmoid_scores(weighted_sums, memory: Tensor, query: Tensor, w: Tensor) -> Tensor:
    """Equation (3) as ``2 w_c^T sigmoid(2m + 2q) - sum(w_c)``, the sums from ``weighted_sums``."""
    w = w.float()
    return weighted_sums(memory.float() * 2, query.float() * 2, w).mul_(2).sub_(w.sum())


def _sigmoid_gradients(gradient_sums, memory: Tensor, query: Tensor, w: Tensor, grad: Tensor):
    """The gradients of :func:`_sigmoid_scores`' inputs (float32), the sums from ``gradient_sums``."""
    w = w.float()
    grad_memory, grad_query, grad_weight = gradient_sums(memory.float() * 2, query.float() * 2, grad)
    return grad_memory.mul_(4 * w), grad_query.mul_(4 * w), grad_weight.mul_(2).sub_(grad.sum())


def _weighted_sums(memory2: Tensor, query2: Tensor, w: Tensor) -> Tensor:
    """``sum_a w_a y[b, t, l, a]`` ``(B, T, S)``, written whole (the compiled evaluation)."""
    return (torch.sigmoid(memory2.unsqueeze(1) + query2.unsqueeze(2)) * w).sum(-1)


def _gradient_sums(memory2: Tensor, query2: Tensor, grad: Tensor):
    """With ``g = grad`` ``(B, T, S)``: ``sum_t g y (1 - y)`` ``(B, S, A)``, ``sum_l g y (1 - y)`` ``(B, T, A)`` and
    ``sum_{b,t,l} g y`` ``(1, A)`` (the compiled evaluation). Each sum is compiled on its own, and ``y (1 - y)`` is
    written ``sigmoid(x) sigmoid(-x)``: where an expensive value is used twice, inductor writes the activations to
    memory, which is what fusing avoids."""
    return (compiled(_memory_slope_sums)(memory2, query2, grad), compiled(_query_slope_sums)(memory2, query2, grad),
            compiled(_output_gradient_sums)(memory2, query2, grad))


def _memory_slope_sums(memory2: Tensor, query2: Tensor, grad: Tensor) -> Tensor:
    """``sum_t g tanh'(m + q) / 4`` ``(B, S, A)``: the memory's gradient, but for the factor ``4 w_c``."""
    x = memory2.unsqueeze(1) + query2.unsqueeze(2)
    return (grad.unsqueeze(-1) * torch.sigmoid(x) * torch.sigmoid(-x)).sum(1)


def _query_slope_sums(memory2: Tensor, query2: Tensor, grad: Tensor) -> Tensor:
    """``sum_l g tanh'(m + q) / 4`` ``(B, T, A)``: the query's gradient, but for the factor ``4 w_c``."""
    x = memory2.unsqueeze(1) + query2.unsqueeze(2)
    return (grad.unsqueeze(-1) * torch.sigmoid(x) * torch.sigmoid(-x)).sum(2)


def _output_gradient_sums(memory2: Tensor, query2: Tensor, grad: Tensor) -> Tensor:
    """``sum_{b,t,l} g y`` ``(1, A)``: ``w_c``'s gradient is twice this, less ``sum(g)``."""
    return (grad.unsqueeze(-1) * torch.sigmoid(memory2.unsqueeze(1) + query2.unsqueeze(2))).sum((0, 1, 2)).unsqueeze(0)


def _blocked_weighted_sums(memory2: Tensor, query2: Tensor, w: Tensor) -> Tensor:
    """:func:`_weighted_sums`, block by block (the default evaluation)."""
    (batch, sources, dim), steps = memory2.shape, query2.size(1)
    sums = memory2.new_empty(batch, steps, sources)
    blocks, workspace = _blocks(memory2, steps)
    for b, t in blocks:
        y = _activations(memory2, query2, b, t, workspace)
        torch.mm(y.view(-1, dim), w.view(dim, 1), out=sums[b, t].view(-1, 1))
    return sums


def _blocked_gradient_sums(memory2: Tensor, query2: Tensor, grad: Tensor):
    """:func:`_gradient_sums`, block by block (the default evaluation)."""
    (_, sources, dim), steps = memory2.shape, query2.size(1)
    grad_memory = torch.zeros_like(memory2)
    grad_query = torch.empty_like(query2)
    grad_weight = memory2.new_zeros(1, dim)
    blocks, workspace = _blocks(memory2, steps)
    for b, t in blocks:
        y = _activations(memory2, query2, b, t, workspace)
        g = grad[b, t]  # (rows of b, rows of t, S)
        grad_weight += torch.mm(g.reshape(1, -1), y.view(-1, dim))  # not addmm_: FLOP counters skip it
        y.addcmul_(y, y, value=-1)  # y (1 - y), in place
        torch.bmm(g.reshape(-1, 1, sources), y.view(-1, sources, dim), out=grad_query[b, t].view(-1, 1, dim))
        if y.device.type in ROW_BY_ROW:
            for row in range(y.size(1)):
                grad_memory[b].addcmul_(y[:, row], g[:, row].unsqueeze(-1))
        else:
            grad_memory[b] += y.mul_(g.unsqueeze(-1)).sum(1)
    return grad_memory, grad_query, grad_weight


def _blocks(memory: Tensor, steps: int):
    """The blocks of rows of the ``(B, T, S, A)`` activations, and a workspace to compute one in.

    Returns ``[(batch slice, target slice)]`` covering ``B x T``, and a float32 tensor ``(b rows, t rows, S, A)``
    (the largest block): rows of one sentence at a time, or whole sentences at a time when a sentence's rows fit.
    """
    batch, sources, dim = memory.shape
    budget = BLOCK_ELEMENTS.get(memory.device.type, ACCELERATOR_BLOCK_ELEMENTS)
    rows = max(1, budget // (sources * dim))
    batch_rows, target_rows = (max(1, rows // steps), steps) if rows >= steps else (1, rows)
    blocks = [
        (slice(b, b + batch_rows), slice(t, t + target_rows))
        for b in range(0, batch, batch_rows)
        for t in range(0, steps, target_rows)
    ]
    return blocks, memory.new_empty(min(batch_rows, batch), target_rows, sources, dim)


def _activations(memory2: Tensor, query2: Tensor, b: slice, t: slice, workspace: Tensor) -> Tensor:
    """``sigmoid(2 m + 2 q)`` for the rows ``(b, t)``, written into (a contiguous leading part of) ``workspace``."""
    query_rows = query2[b, t]  # (rows of b, rows of t, A)
    y = workspace[: query_rows.size(0), : query_rows.size(1)]
    torch.add(memory2[b].unsqueeze(1), query_rows.unsqueeze(2), out=y)
    return y.sigmoid_()


def _first_occurrence(same_type: Tensor) -> Tensor:
    """``(B, S)`` bool: True at the first position of each type, from ``same_type[b, l, l'] = x_l == x_l'``."""
    earlier = torch.ones_like(same_type[0]).tril(diagonal=-1)  # l' < l
    return ~(same_type & earlier).any(dim=2)
