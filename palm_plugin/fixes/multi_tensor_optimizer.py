"""fairseq's mixed-precision wrapper and gradient norm work one tensor at a time; here each is one multi-tensor
operation.

Under ``--fp16`` / ``--bf16`` fairseq's ``FP16Optimizer`` keeps an fp32 master copy of the weights: every update it
copies each parameter's gradient into that copy, and each updated master weight back into the model, one
``copy_`` per parameter; under ``--bf16`` (where fairseq keeps one master tensor per parameter instead of one flat
tensor) it also zeroes each master gradient apart. Without apex, fairseq's ``utils.clip_grad_norm_`` takes one norm
per gradient, and every ``FP16Optimizer.clip_grad_norm`` calls it. On a GPU each of these is a kernel launch: about
four per parameter and update under ``--bf16``, about 1,000 for a base model, whose launches the card measured at
half of PALM's step (docs/benchmarks-gpu.md, section 7: 7,152 launches and 320 ms of host time for a 247 ms step of
PALM without the copy layer). Here the same copies, zeroing and norms are ``torch._foreach_copy_``,
``torch._foreach_zero_`` and ``torch._foreach_norm``: a few kernels each on a GPU, a loop inside torch on the CPU.
The copies and zeroing give the same bits; the norms are torch's own of each gradient, summed in float32, to which a
GPU's multi-tensor reduction may add rounding differences in the last bits.

:func:`use_fairseq_loops` puts fairseq's loops back on one optimizer: ``palm-bench``'s ``fairseq_loops`` lever, the
baseline that measures this module.
"""
import types
from collections import defaultdict

import torch

NAMES = ("_sync_fp16_grads_to_fp32", "_sync_fp32_params_to_fp16", "zero_grad")
ORIGINALS = {}  # fairseq's functions, by name (and "clip_grad_norm_"), kept for use_fairseq_loops


def _sync_fp16_grads_to_fp32(self):
    """The gradients into the fp32 master copy (fairseq's method, its per-parameter copies as one)."""
    if not self._needs_sync:
        return
    targets, sources = [], []
    if self.has_flat_params:
        by_device = defaultdict(list)
        for p in self.fp16_params:
            if p.requires_grad:
                by_device[p.device.index].append(p)
        for device, flat in self.fp32_params.items():
            offset = 0
            for p in by_device[device]:
                numel = p.data.numel()
                if p.grad is None:
                    flat.grad.data[offset : offset + numel].zero_()
                else:
                    targets.append(flat.grad.data[offset : offset + numel])
                    sources.append(p.grad.data.view(-1))
                offset += numel
    else:
        for p, p32 in zip(self.fp16_params, self.fp32_params):
            if not p.requires_grad:
                continue
            if p.grad is None:
                p32.grad = torch.zeros_like(p.data, dtype=torch.float)
            elif p32.grad is None:
                p32.grad = p.grad.data.float()
            else:
                targets.append(p32.grad.data)
                sources.append(p.grad.data)
    if targets:
        torch._foreach_copy_(targets, sources)
    self._needs_sync = False


def _sync_fp32_params_to_fp16(self):
    """The updated master weights back into the model (fairseq's method, its per-parameter copies as one)."""
    targets, sources = [], []
    if self.has_flat_params:
        by_device = defaultdict(list)
        for p in self.fp16_params:
            by_device[p.device.index].append(p)
        for device, flat in self.fp32_params.items():
            offset = 0
            for p in by_device[device]:
                numel = p.data.numel()
                targets.append(p.data)
                sources.append(flat.data[offset : offset + numel].view_as(p.data))
                offset += numel
    else:
        for p, p32 in zip(self.fp16_params, self.fp32_params):
            if p.requires_grad:
                targets.append(p.data)
                sources.append(p32.data)
    if targets:
        torch._foreach_copy_(targets, sources)


def zero_grad(self):
    """fairseq's method; the per-parameter master gradients of ``--bf16`` zeroed as one."""
    if self.has_flat_params:
        return ORIGINALS["zero_grad"](self)
    for p in self.fp16_params:
        p.grad = None
    grads = [p32.grad for p32 in self.fp32_params if p32.grad is not None]
    if grads:
        torch._foreach_zero_(grads)
    self._needs_sync = False
    if self.scaler is not None:
        self._multiply_factor = 1.0 / float(self.scaler.loss_scale)


def clip_grad_norm_(params, max_norm, aggregate_norm_fn=None) -> torch.Tensor:
    """fairseq's ``utils.clip_grad_norm_`` with the gradients' norms taken together. fairseq's own runs where it
    does something else: one gradient, apex's fused norm, mixture-of-experts gradients, gradients on several devices
    (pipeline parallelism) or on an XLA device."""
    from fairseq import utils

    params = [params] if torch.is_tensor(params) else list(params)
    with_grad = [p for p in params if p is not None and getattr(p, "grad", None) is not None]
    grads = [p.grad.detach() for p in with_grad]
    if (len(grads) < 2 or utils.multi_tensor_l2norm_available or any(hasattr(p, "expert") for p in with_grad)
            or len({g.device for g in grads}) > 1 or grads[0].device.type == "xla"):
        return ORIGINALS["clip_grad_norm_"](params, max_norm, aggregate_norm_fn)
    total_norm = torch.norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)))
    if aggregate_norm_fn is not None:
        total_norm = aggregate_norm_fn(total_norm)
    if max_norm > 0:
        clip_coef = (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1)
        torch._foreach_mul_(grads, clip_coef)
    return total_norm


def use_fairseq_loops(optimizer):
    """Give ``optimizer`` (fairseq's FP16Optimizer, or any FairseqOptimizer) fairseq's own loops back, on this
    instance only: the baseline of this module's speed."""
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    if isinstance(optimizer, _FP16OptimizerMixin):
        for name in NAMES:
            setattr(optimizer, name, types.MethodType(ORIGINALS[name], optimizer))
    inner = getattr(optimizer, "fp32_optimizer", optimizer)

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        return ORIGINALS["clip_grad_norm_"](self.params, max_norm, aggregate_norm_fn)

    inner.clip_grad_norm = types.MethodType(clip_grad_norm, inner)


def install():
    """Replace fairseq's loops with the multi-tensor operations (idempotent)."""
    from fairseq import utils
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    if getattr(utils.clip_grad_norm_, "__palm_plugin__", False):
        return
    replacements = {"_sync_fp16_grads_to_fp32": _sync_fp16_grads_to_fp32,
                    "_sync_fp32_params_to_fp16": _sync_fp32_params_to_fp16, "zero_grad": zero_grad}
    for name in NAMES:
        ORIGINALS[name] = getattr(_FP16OptimizerMixin, name)
        setattr(_FP16OptimizerMixin, name, replacements[name])
    ORIGINALS["clip_grad_norm_"] = utils.clip_grad_norm_
    clip_grad_norm_.__palm_plugin__ = True
    utils.clip_grad_norm_ = clip_grad_norm_
