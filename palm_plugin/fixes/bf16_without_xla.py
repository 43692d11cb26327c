"""``--bf16`` on a GPU or CPU, without torch_xla.

fairseq 0.12 treats ``--bf16`` as a TPU flag: its argument post-processing sets ``--tpu`` whenever ``--bf16`` is
given, and the trainer then asks torch_xla for a device. Without torch_xla that fails on every machine: on a CPU
(``--cpu --bf16``) and on a CUDA GPU alike, with ``AttributeError: 'NoneType' object has no attribute
'xla_device'``. bfloat16 itself runs on both (fairseq's FP16Optimizer keeps fp32 master weights; the models compute
softmax and masks in a dtype-aware way). fairseq applies the architecture function after that post-processing
(and the plugin is imported during it, too late to wrap the parser), so :func:`install` wraps every registered
architecture function, fairseq's own included, with :func:`keep_bf16_off_tpu`, which undoes the TPU implication
when torch_xla is not installed (no TPU can be used then anyway).
"""
import functools
import importlib.util
import logging

logger = logging.getLogger(__name__)


def keep_bf16_off_tpu(args) -> None:
    """Train in bfloat16 on the CPU or GPU for ``--bf16`` instead of looking for a TPU (idempotent)."""
    if getattr(args, "bf16", False) and getattr(args, "tpu", False) and importlib.util.find_spec("torch_xla") is None:
        where = "the CPU" if getattr(args, "cpu", False) else "the GPU"
        logger.info(f"--bf16: training in bfloat16 on {where} (fairseq's implied --tpu is turned off: no torch_xla)")
        args.tpu = False


def install():
    """Wrap every architecture function registered so far with :func:`keep_bf16_off_tpu` (idempotent)."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    for name, arch_fn in list(ARCH_CONFIG_REGISTRY.items()):
        if getattr(arch_fn, "__palm_plugin__", False):
            continue

        @functools.wraps(arch_fn)
        def arch_keeping_bf16_off_tpu(args, arch_fn=arch_fn):
            arch_fn(args)
            keep_bf16_off_tpu(args)

        arch_keeping_bf16_off_tpu.__palm_plugin__ = True
        ARCH_CONFIG_REGISTRY[name] = arch_keeping_bf16_off_tpu
