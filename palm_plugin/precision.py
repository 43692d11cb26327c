"""``--bf16`` on CPU.

fairseq treats ``--bf16`` as a TPU flag: its argument post-processing sets ``--tpu`` whenever ``--bf16`` is given,
and the trainer then asks torch_xla for a device, which fails on a CPU-only machine. bfloat16 itself runs fine on
current CPUs (fairseq's FP16Optimizer keeps fp32 master weights, the models compute softmax and masks in a
dtype-aware way). fairseq applies the architecture function after that post-processing, so every architecture of
the plugin calls :func:`keep_bf16_on_cpu` to undo the TPU implication when the user asked for ``--cpu`` and
torch_xla is not installed.
"""
import importlib.util
import logging

logger = logging.getLogger(__name__)


def keep_bf16_on_cpu(args) -> None:
    """Train in bfloat16 on the CPU for ``--cpu --bf16`` instead of looking for a TPU (idempotent)."""
    if (
        getattr(args, "bf16", False)
        and getattr(args, "cpu", False)
        and getattr(args, "tpu", False)
        and importlib.util.find_spec("torch_xla") is None
    ):
        logger.info("--cpu --bf16: training in bfloat16 on the CPU (fairseq's implied --tpu is turned off)")
        args.tpu = False
