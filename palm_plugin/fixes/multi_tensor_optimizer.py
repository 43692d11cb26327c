"""fairseq's Adam, mixed-precision wrapper and gradient norm work one tensor at a time; here each is a multi-tensor
operation.

On a GPU every tensor operation is a kernel launch, and the card found PALM's steps bound by launches
(docs/benchmarks-gpu.md, section 7). Without apex, fairseq's ``--optimizer adam`` is its own ``Adam``, a Python loop
of about ten operations per parameter; under ``--fp16`` / ``--bf16`` its ``FP16Optimizer`` copies each gradient into
the fp32 master copy and each master weight back, one ``copy_`` per parameter, and under ``--bf16`` (one master
tensor per parameter; ``--fp16`` flattens them) zeroes each master gradient apart; ``utils.clip_grad_norm_`` takes
one norm per gradient.

:func:`adam_step` runs Adam's operations, in the same order and with the same scalars, over all parameters of a group
at once (``torch._foreach_*``): the same bits on the CPU. It takes the groups whose parameters and gradients are
dense float32 tensors on one device (fairseq's trainer makes one such group, the fp32 master copy included), in one
pass per step count; fairseq's loop does the others (``--amsgrad``, the half-precision weights of
``--memory-efficient-fp16``). It holds the square roots of at most :data:`CHUNK` elements at once, where the loop
held one parameter's. The copies and zeroing are ``_foreach_copy_`` and ``_foreach_zero_``, the same bits; the norms
``_foreach_norm``, each torch's own norm of a gradient, to which a GPU's multi-tensor reduction may add rounding
differences in the last bits.

:func:`use_fairseq_loops` puts fairseq's loops back on one optimizer: ``palm-bench``'s ``fairseq_loops`` lever, the
baseline that measures this module.
"""
import math
import types
from collections import defaultdict

import torch
from fairseq.optim.adam import Adam

NAMES = ("_sync_fp16_grads_to_fp32", "_sync_fp32_params_to_fp16", "zero_grad")
CHUNK = 1 << 24  # elements of the Adam denominators one multi-tensor pass holds (64 MB in float32)
ORIGINALS = {}  # fairseq's functions, by name (and "clip_grad_norm_"), kept for use_fairseq_loops


def _flat_pieces(self, params, grads):
    """``(p, piece)`` of each of ``params`` with its piece of the flat master copy (of its gradient with ``grads``),
    laid out as fairseq lays them: by device, in the order given."""
    by_device = defaultdict(list)
    for p in params:
        by_device[p.device.index].append(p)
    for device, flat in self.fp32_params.items():
        whole, offset = flat.grad.data if grads else flat.data, 0
        for p in by_device[device]:
            numel = p.data.numel()
            yield p, whole[offset : offset + numel]
            offset += numel


def _sync_fp16_grads_to_fp32(self):
    """The gradients into the fp32 master copy (fairseq's method, its per-parameter copies as one)."""
    if not self._needs_sync:
        return
    targets, sources = [], []
    if self.has_flat_params:
        for p, piece in _flat_pieces(self, [p for p in self.fp16_params if p.requires_grad], grads=True):
            if p.grad is None:
                piece.zero_()
            else:
                targets.append(piece)
                sources.append(p.grad.data.view(-1))
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
        for p, piece in _flat_pieces(self, self.fp16_params, grads=False):
            targets.append(p.data)
            sources.append(piece.view_as(p.data))
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
    """fairseq's ``utils.clip_grad_norm_`` with the gradients' norms taken together, on the gradients' device
    (fairseq's: the current CUDA device whenever there is one, the gradients' own too in training). fairseq's own runs
    where it does something else: one gradient, apex's fused norm, mixture-of-experts gradients, gradients on several
    devices (pipeline parallelism) or on an XLA device."""
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


def _chunks(params):
    """``params`` in consecutive runs of at most :data:`CHUNK` elements (a larger parameter alone)."""
    run, size = [], 0
    for p in params:
        if run and size + p.numel() > CHUNK:
            yield run
            run, size = [], 0
        run.append(p)
        size += p.numel()
    if run:
        yield run


def _adam_group(optimizer, group) -> bool:
    """fairseq's Adam update of one group as multi-tensor operations, one pass per step count (a parameter that had
    no gradient in some update lags behind the others); False (nothing changed) where the group needs fairseq's
    loop."""
    params = [p for p in group["params"] if p.grad is not None]
    if not params:
        return True
    states = [optimizer.state[p] for p in params]
    if (group.get("amsgrad", False) or len({id(p) for p in params}) < len(params)  # a parameter listed twice
            or any(not isinstance(s.get("step", 0), int) for s in states)  # tensor steps of a torch checkpoint
            or any(p.dtype != torch.float32 or p.grad.dtype != torch.float32 or p.grad.is_sparse
                   or p.device != params[0].device for p in params)):
        return False
    by_step = defaultdict(list)
    for p, state in zip(params, states):
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(p.data), exp_avg_sq=torch.zeros_like(p.data))
        else:
            state["exp_avg"], state["exp_avg_sq"] = state["exp_avg"].to(p.data), state["exp_avg_sq"].to(p.data)
        state["step"] += 1
        by_step[state["step"]].append(p)
    beta1, beta2 = group["betas"]
    for step, stepped in by_step.items():
        step_size = group["lr"] * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
        for run in _chunks(stepped):
            data, grads = [p.data for p in run], [p.grad.data for p in run]
            exp_avg = [optimizer.state[p]["exp_avg"] for p in run]
            exp_avg_sq = [optimizer.state[p]["exp_avg_sq"] for p in run]
            torch._foreach_mul_(exp_avg, beta1)
            torch._foreach_add_(exp_avg, grads, alpha=1 - beta1)
            torch._foreach_mul_(exp_avg_sq, beta2)
            torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
            denominators = torch._foreach_sqrt(exp_avg_sq)
            torch._foreach_add_(denominators, group["eps"])
            if group["weight_decay"] != 0:
                torch._foreach_add_(data, data, alpha=-group["weight_decay"] * group["lr"])
            torch._foreach_addcdiv_(data, exp_avg, denominators, value=-step_size)
    return True


def adam_step(self, closure=None):
    """fairseq's ``Adam.step``: multi-tensor where a group allows (:func:`_adam_group`), fairseq's loop otherwise."""
    loss = closure() if closure is not None else None
    with torch.no_grad():
        left = [group for group in self.param_groups if not _adam_group(self, group)]
    if left:  # fairseq's loop over the groups it has to do
        groups, self.param_groups = self.param_groups, left
        try:
            ORIGINALS["adam_step"](self)
        finally:
            self.param_groups = groups
    return loss


def use_fairseq_loops(optimizer):
    """Give ``optimizer`` (fairseq's FP16Optimizer, or an optimizer fairseq's trainer builds without one, such as
    ``FairseqAdam``) fairseq's own loops back, on this instance only: the baseline of this module's speed."""
    from fairseq.optim import FairseqOptimizer
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    inner = optimizer.fp32_optimizer if isinstance(optimizer, _FP16OptimizerMixin) else optimizer
    if type(inner).clip_grad_norm is not FairseqOptimizer.clip_grad_norm:  # a wrapper with a norm of its own
        raise ValueError(f"fairseq_loops: {type(optimizer).__name__} is neither fairseq's FP16Optimizer nor an "
                         f"optimizer it wraps; use --fp16 / --bf16 (not --memory-efficient-*) or fp32")
    if inner is not optimizer:
        for name in NAMES:
            setattr(optimizer, name, types.MethodType(ORIGINALS[name], optimizer))

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        return ORIGINALS["clip_grad_norm_"](self.params, max_norm, aggregate_norm_fn)

    inner.clip_grad_norm = types.MethodType(clip_grad_norm, inner)
    adam = getattr(inner, "_optimizer", None)
    if isinstance(adam, Adam):  # with torch's step hooks and profiler label, as the class's own step has
        adam.step = types.MethodType(torch.optim.Optimizer.profile_hook_step(ORIGINALS["adam_step"]), adam)


def install():
    """Replace fairseq's loops with the multi-tensor operations (idempotent)."""
    from fairseq import utils
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    if getattr(utils.clip_grad_norm_, "__palm_plugin__", False):
        return
    ORIGINALS["adam_step"] = Adam.step
    Adam.step = adam_step
    replacements = {"_sync_fp16_grads_to_fp32": _sync_fp16_grads_to_fp32,
                    "_sync_fp32_params_to_fp16": _sync_fp32_params_to_fp16, "zero_grad": zero_grad}
    for name in NAMES:
        ORIGINALS[name] = getattr(_FP16OptimizerMixin, name)
        setattr(_FP16OptimizerMixin, name, replacements[name])
    ORIGINALS["clip_grad_norm_"] = utils.clip_grad_norm_
    clip_grad_norm_.__palm_plugin__ = True
    utils.clip_grad_norm_ = clip_grad_norm_
