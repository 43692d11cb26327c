"""UniLM-family attention through torch's FlexAttention (``--attention-impl flex``).

The SDPA path (:mod:`palm_plugin.modules.unilm_transformer`) hands every layer a dense mask: boolean ``(B, 1, T, T)``
for UniLM, and for UniLMv2 an additive float ``(B, h, T, T)`` = mask + relative position bias that requires grad,
read by each layer's attention and written back, as a gradient of the same size, by its backward. FlexAttention
(``torch.nn.attention.flex_attention``) takes instead

* a ``BlockMask``: the mask evaluated per tile of 128 x 128 (query x key). Tiles the mask hides completely are never
  computed; tiles it shows completely run without evaluating it. It is built once per forward from the batch's
  compact fields (:func:`mask_mod`: each row's objective, source lengths, factorization steps and token kinds,
  padding; the rules of :mod:`palm_plugin.modules.attention_masks`), and shared by every layer;
* a ``score_mod`` for UniLMv2's relative position bias (:func:`relative_position_score_mod`): inside the kernel
  each score ``(b, h, i, j)`` reads ``table[h, pos[b, j] - pos[b, i] + P - 1]`` from the ``(h, 2P - 1)`` bias of
  every offset (:meth:`RelativePositionBias.table`). No ``(B, h, T, T)`` tensor exists; the kernel's backward
  accumulates the gradient of that small table, which flows to the bucket weights through ``F.embedding``.

Limits of FlexAttention, each refused with the option to use instead rather than worked around silently
(:func:`check_usable`): its backward runs on CUDA only (on the CPU it raises NotImplementedError), so training
needs a GPU; it has no dropout on the attention probabilities, so training needs ``--attention-dropout 0``.
The forward runs on the CPU (compiled; inference, tests). Incremental decoding keeps the SDPA path, and so does a
mask handed over as a tensor rather than as the batch's fields (with a warning: nothing to build a block mask from).
"""
import warnings
from typing import Callable, Dict, Optional

import torch

from palm_plugin.errors import CommandError
from palm_plugin.modules.attention_masks import Objective, PseudoMaskKind, mask_from_fields, pseudo_seq2seq_layout
from palm_plugin.modules.fused_attention import SDPA_INSTEAD, FusedMask

try:
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    BlockMask = create_block_mask = flex_attention = None

BLOCK_SIZE = 128  # FlexAttention's tile, query rows x key columns
# the enums' values as plain ints: inductor's CPU template fails to lower a mask_mod comparing with IntEnum members
LEFT_TO_RIGHT, RIGHT_TO_LEFT = int(Objective.LEFT_TO_RIGHT), int(Objective.RIGHT_TO_LEFT)
SEQ2SEQ = int(Objective.SEQ2SEQ)
CONTEXT, ORIGINAL = int(PseudoMaskKind.CONTEXT), int(PseudoMaskKind.ORIGINAL)


class FlexAttentionError(CommandError):
    """What FlexAttention cannot do, with the option to use instead."""

    prefix = "--attention-impl flex: "


def check_usable(training: bool, attention_dropout: float):
    """Refuse what FlexAttention cannot do, when a model is built: any use without it in torch; training without
    CUDA (its backward is not implemented on the CPU) or with attention dropout (it has none)."""
    if flex_attention is None:
        raise FlexAttentionError(f"torch {torch.__version__} has no torch.nn.attention.flex_attention (torch 2.5 and "
                                 f"later have it); {SDPA_INSTEAD}")
    if training and not torch.cuda.is_available():
        raise FlexAttentionError(f"FlexAttention's backward runs only on CUDA and no CUDA device is available "
                                 f"(torch {torch.__version__}); to train on the CPU, {SDPA_INSTEAD}")
    if training and attention_dropout > 0:
        raise FlexAttentionError(f"FlexAttention has no dropout on the attention probabilities; train with "
                                 f"--attention-dropout 0, or keep --attention-dropout {attention_dropout} and "
                                 f"{SDPA_INSTEAD}")


# ------------------------------------------------------------------------------------------------ mask_mod
def mask_mod(padding_mask, objectives=None, source_lengths=None, target_lengths=None, steps=None,
             kinds=None) -> Callable:
    """The mask_mod(b, h, q, kv) -> bool (True = may attend) of the batch the compact fields describe: the rules of
    :func:`~palm_plugin.modules.attention_masks.mask_from_fields` stated for one (query, key) pair, the kernel
    reading the per-example tensors by index.

    The rule is the batch's family's alone, as in :func:`mask_from_fields`: the pseudo-masked LM's by steps and
    kinds (:func:`~palm_plugin.modules.attention_masks.pmlm_mask`; UniLMv2's seq2seq fine-tuning is its
    one-step-per-target-token layout), else UniLM's by the row's objective
    (:func:`~palm_plugin.modules.attention_masks.unilm_mask`), else none; padding hidden
    (:func:`~palm_plugin.modules.attention_masks.hide_padding`). The kernel evaluates the rule on every pair of a
    partial tile, in the forward and twice in the backward, so it carries no other family's terms, and reads 32-bit
    fields (the kernel's own index type: 64-bit comparisons take two instructions each on a GPU). A training run
    sees one family, so it compiles one kernel.

    Args:
        padding_mask: ``(B, T)`` True at padding; the other fields as :func:`mask_from_fields` takes them.
    """
    padding = padding_mask
    if steps is None and target_lengths is not None:
        steps, kinds = pseudo_seq2seq_layout(source_lengths, target_lengths, padding.size(1))
    if steps is not None:
        rule = _pmlm_rule(steps.int(), torch.full_like(steps, CONTEXT, dtype=torch.int) if kinds is None
                          else kinds.int())
    elif objectives is not None:
        rule = _unilm_rule(objectives.int(), source_lengths.int())
    else:
        rule = None

    def visible(b, h, q, kv):
        shown = ~padding[b, kv] if rule is None else rule(b, q, kv) & ~padding[b, kv]
        return torch.where(padding[b, q], q == kv, shown)  # padding keys hidden, a padding row sees itself only

    return visible


def _unilm_rule(objectives, source_lengths) -> Callable:
    """UniLM (section 2.2): what a row of ``objectives[b]`` sees (bidirectional rows every key)."""
    def rule(b, q, kv):
        objective, source = objectives[b], source_lengths[b]
        left_to_right = objective == LEFT_TO_RIGHT
        right_to_left = objective == RIGHT_TO_LEFT
        seq2seq = objective == SEQ2SEQ
        return (~(left_to_right | right_to_left | seq2seq) | (left_to_right & (kv <= q))
                | (right_to_left & (kv >= q)) | (seq2seq & ((kv < source) | ((q >= source) & (kv <= q)))))

    return rule


def _pmlm_rule(steps, kinds) -> Callable:
    """UniLMv2 (Figure 5): a CONTEXT key is visible to every row; an appended row also sees the ORIGINAL keys of
    earlier steps and the keys of its own step and kind."""
    def rule(b, q, kv):
        query_kind, key_kind, query_step, key_step = kinds[b, q], kinds[b, kv], steps[b, q], steps[b, kv]
        return (key_kind == CONTEXT) | ((query_kind != CONTEXT) & (
            ((key_kind == ORIGINAL) & (key_step < query_step))
            | ((key_kind == query_kind) & (key_step == query_step))))

    return rule


class MaskFields:
    """A batch's compact mask description (what the datasets put in ``net_input``), on the model's device; handed
    to :class:`~palm_plugin.modules.unilm_transformer.UniLMTransformer` in place of a dense mask, which builds the
    block mask from it (flex) or the dense mask (sdpa)."""

    def __init__(self, padding_mask, objectives=None, source_lengths=None, target_lengths=None, steps=None,
                 kinds=None):
        self.padding_mask = padding_mask
        self.fields = dict(objectives=objectives, source_lengths=source_lengths, target_lengths=target_lengths,
                           steps=steps, kinds=kinds)

    def dense(self) -> torch.Tensor:
        """``(B, T, T)`` boolean, :func:`~palm_plugin.modules.attention_masks.mask_from_fields`."""
        return mask_from_fields(self.padding_mask, **self.fields)

    def mask_mod(self) -> Callable:
        return mask_mod(self.padding_mask, **self.fields)


# ------------------------------------------------------------------------------------------------ score_mod
def relative_position_score_mod(table: torch.Tensor, positions: torch.Tensor) -> Callable:
    """UniLMv2's relative position bias inside the kernel: ``score + table[h, pos[b, kv] - pos[b, q] + P - 1]``.

    Args:
        table: ``(h, 2P - 1)``, :meth:`~palm_plugin.modules.relative_position.RelativePositionBias.table` (the bias
            of every offset ``1 - P .. P - 1``), in the scores' dtype; its gradient comes from the kernel.
        positions: ``(B, T)`` position ids of the sequence (queries and keys alike).
    """
    center = table.size(1) // 2
    # 32-bit as the mask's fields; contiguous: the default positions are an expanded view, and the kernel is
    # specialised on strides
    positions = positions.int().contiguous()

    def score_mod(score, b, h, q, kv):
        return score + table[h, positions[b, kv] - positions[b, q] + center]

    return score_mod


# ------------------------------------------------------------------------------------------------ the kernel
_COMPILED: Dict[tuple, Callable] = {}
# How FlexAttention is compiled on CUDA: "dynamic", one kernel for every batch shape; or "static", one a shape, the
# benchmark's flex_static lever (an experiment: with symbolic lengths inductor cannot prove them multiples of its
# 128-wide tiles and generates the kernels with a bound check on every load, IS_DIVISIBLE=False; docs/benchmarks-gpu.md,
# section 8)
CUDA_SHAPES = "dynamic"


def _compiled(function: Callable, device: torch.device) -> Callable:
    """``function`` through inductor, once per device type: FlexAttention is efficient only as the kernel inductor
    generates (run eagerly it materialises the scores), so it is compiled whatever ``--compile-layers`` and its test
    backend say. On CUDA shapes are dynamic from the first call (fairseq's batches change size every update), unless
    :data:`CUDA_SHAPES` says static. On the CPU they are static: inductor's CPU template of torch 2.13 fails to compile
    some mask_mods with symbolic sizes (C++ errors, e.g. an undeclared ``cur_kvSplitSize``), so each new shape
    compiles anew (about 20 s)."""
    dynamic = device.type == "cuda" and CUDA_SHAPES == "dynamic"
    key = function, device.type, dynamic
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(function, dynamic=dynamic, fullgraph=True)
        if device.type != "cuda" and function is flex_attention:
            warnings.warn("--attention-impl flex on the CPU compiles FlexAttention once per batch shape (about 20 s "
                          "each, inference only); for CPU work use --attention-impl sdpa", stacklevel=3)
    return _COMPILED[key]


def block_mask(mask_mod_fn: Callable, batch: int, length: int, device) -> "BlockMask":
    """The ``BlockMask`` of ``mask_mod_fn`` over ``(batch, length, length)``, shared by all heads and layers.
    Compiled on CUDA, so that the ``(B, T, T)`` boolean mask is never materialised there; on the CPU (inference,
    tests) the eager construction evaluates it once, which costs less than a compilation per batch shape."""
    device = torch.device(device)
    build = _compiled(create_block_mask, device) if device.type == "cuda" else create_block_mask
    return build(mask_mod_fn, batch, None, length, length, device=device, BLOCK_SIZE=BLOCK_SIZE)


class FlexMask(FusedMask):
    """What every layer of one forward shares under ``--attention-impl flex``: the block mask and the score_mod."""

    def __init__(self, block_mask: "BlockMask", score_mod: Optional[Callable] = None):
        self.block_mask = block_mask
        self.score_mod = score_mod

    def attend(self, q, k, v, dropout_p: float = 0.0) -> torch.Tensor:
        if dropout_p > 0:  # the model refuses this when built; a stack built directly is stopped here
            raise FlexAttentionError(f"FlexAttention has no attention dropout; set attention_dropout 0 (now "
                                     f"{dropout_p}) or {SDPA_INSTEAD}")
        if q.requires_grad and q.device.type != "cuda":
            raise FlexAttentionError(f"FlexAttention's backward runs only on CUDA, and this forward on {q.device} "
                                     f"records a graph for one; run inference under torch.no_grad(), or "
                                     f"{SDPA_INSTEAD}")
        return _compiled(flex_attention, q.device)(q, k, v, score_mod=self.score_mod, block_mask=self.block_mask)


def block_counts(mask: "BlockMask") -> Dict[str, int]:
    """How many ``BLOCK_SIZE`` tiles of a block mask (summed over the batch; heads broadcast) the kernel skips (the
    mask hides all of them), computes without the mask_mod (``full``: all visible) and with it (``partial``)."""
    partial = int(mask.kv_num_blocks.sum())
    full = int(mask.full_kv_num_blocks.sum()) if mask.full_kv_num_blocks is not None else 0
    q_blocks, kv_blocks = mask.kv_num_blocks.size(-1), -(-mask.seq_lengths[1] // mask.BLOCK_SIZE[1])
    total = mask.kv_num_blocks.size(0) * mask.kv_num_blocks.size(1) * q_blocks * kv_blocks
    return {"total": total, "skipped": total - partial - full, "partial": partial, "full": full}
