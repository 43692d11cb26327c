"""``--bf16`` on CPU.

fairseq treats ``--bf16`` as a TPU flag: its argument post-processing sets ``--tpu`` whenever ``--bf16`` is given,
and the trainer then asks torch_xla for a device, which fails on a CPU-only machine. bfloat16 itself runs fine on
current CPUs (fairseq's FP16Optimizer keeps fp32 master weights, the models compute softmax and masks in a
dtype-aware way). fairseq applies the architecture function after that post-processing (and the plugin is imported
during it, too late to wrap the parser), so :func:`install` wraps every registered architecture function, fairseq's
own included, with :func:`keep_bf16_on_cpu`, which undoes the TPU implication when the user asked for ``--cpu``
and torch_xla is not installed.
"""
import functools
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


def install():
    """Wrap every architecture function registered so far with :func:`keep_bf16_on_cpu` (idempotent)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    for name, arch_fn in list(ARCH_CONFIG_REGISTRY.items()):
        if getattr(arch_fn, "__palm_plugin__", False):
            continue

        @functools.wraps(arch_fn)
        def arch_keeping_bf16_on_cpu(args, arch_fn=arch_fn):
            arch_fn(args)
            keep_bf16_on_cpu(args)

        arch_keeping_bf16_on_cpu.__palm_plugin__ = True
        ARCH_CONFIG_REGISTRY[name] = arch_keeping_bf16_on_cpu
