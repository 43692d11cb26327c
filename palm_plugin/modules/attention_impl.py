"""``--attention-impl`` of the UniLM family: how the self-attention of a full sequence is computed, and where each
way can run.

* ``sdpa``: torch's ``scaled_dot_product_attention`` with a dense mask (for UniLMv2 a dense float mask + relative
  bias, :mod:`palm_plugin.modules.unilm_transformer`); runs everywhere.
* ``flex``: torch's FlexAttention (:mod:`palm_plugin.modules.flex_attention`).
* ``triton``: the plugin's Triton kernels (:mod:`palm_plugin.modules.attention_triton`).

``flex`` and ``triton`` hand every layer a :class:`~palm_plugin.modules.fused_attention.FusedMask`, built once per
forward; incremental decoding keeps SDPA with either.
"""
import importlib.util

import torch

from palm_plugin.modules.fused_attention import SDPA_INSTEAD, TritonAttentionError

IMPLEMENTATIONS = ("sdpa", "flex", "triton")
HELP = ("how the self-attention of a full sequence is computed. sdpa (default): torch's scaled_dot_product_attention "
        "with a dense mask (and, for UniLMv2, a dense float mask + relative bias per batch); runs everywhere. flex: "
        "torch's FlexAttention (palm_plugin/modules/flex_attention.py): the mask as a block mask built from the "
        "batch's structure, whose fully masked 128 x 128 tiles are skipped, and UniLMv2's relative position bias "
        "applied inside the kernel, so no (batch, heads, length, length) bias and gradient exist; it needs CUDA for "
        "the backward, and trained slower than sdpa on an H100 (0.63x on pmlm, 0.97x on UniLM's pre-training mix: "
        "docs/benchmarks-gpu.md, section 8). triton: the plugin's own kernels (palm_plugin/modules/attention_triton.py"
        "): FlashAttention's tiles with the batch's mask read per tile and its hidden tiles skipped, UniLMv2's bias "
        "read and its gradient summed per bucket inside the kernels, attention dropout drawn inside them; needs CUDA "
        "and the triton package, not yet measured on a card (docs/benchmarks-gpu.md, section 9). flex has no "
        "attention dropout (train with --attention-dropout 0); incremental decoding uses sdpa with every choice")


def triton_installed() -> bool:
    """Whether the triton package can be imported (the plugin's kernels need it; torch's CUDA builds bring it)."""
    return importlib.util.find_spec("triton") is not None


def triton_runs_here() -> bool:
    """Whether the plugin's Triton kernels can run in this process: a CUDA device, or Triton's interpreter (tests)."""
    if not triton_installed():
        return False
    import triton

    return torch.cuda.is_available() or bool(triton.knobs.runtime.interpret)


def check_usable(impl: str, training: bool, attention_dropout: float) -> None:
    """Refuse ``impl`` where it cannot run, when a model is built, naming the option to use instead."""
    if impl == "flex":
        from palm_plugin.modules import flex_attention

        flex_attention.check_usable(training, attention_dropout)
    elif impl == "triton":
        if not triton_installed():
            raise TritonAttentionError(f"its kernels need the triton package (pip install triton), which is not "
                                       f"installed; {SDPA_INSTEAD}")
        if not triton_runs_here():
            raise TritonAttentionError(f"its kernels run on CUDA, and no CUDA device is available (torch "
                                       f"{torch.__version__}); {SDPA_INSTEAD}")
