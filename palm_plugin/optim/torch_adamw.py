"""``--optimizer torch_adamw``: torch's ``AdamW`` in its fused or foreach implementation (off by default).

fairseq's ``--optimizer adam`` without apex (DESIGN §5: apex does not install here) is fairseq's own Adam, a
Python loop of about ten tensor operations per parameter, which the plugin runs as the same operations over all
parameters at once (``palm_plugin/fixes/multi_tensor_optimizer.py``). torch's ``fused`` implementation updates all
tensors in a few multi-tensor kernels, ``foreach`` in a few per operation. The update
is AdamW's, as fairseq's Adam is (decoupled weight decay); the two differ only in where epsilon sits (torch: ``m / (sqrt(v / bc2) + eps)``; fairseq: ``m / (sqrt(v) + eps)`` rescaled), which moves an
update where gradients are near epsilon. On 2 CPU cores fairseq's Adam was the faster (DESIGN §6); the card decides
(docs/benchmarks-gpu.md). fairseq's ``FP16Optimizer`` hands the optimizer an fp32 master copy of each parameter
under ``--bf16``, and one flat fp32 tensor under ``--fp16``, which this optimizer accepts (``supports_flat_params``).
"""
import ast
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

IMPLEMENTATIONS = ("fused", "foreach", "for-loop")


@dataclass
class TorchAdamWConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for AdamW"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for AdamW"})
    weight_decay: float = field(
        default=0.0, metadata={"help": "decoupled weight decay (0, as fairseq's adam; not torch's default 0.01)"}
    )
    adamw_impl: ChoiceEnum(IMPLEMENTATIONS) = field(
        default="fused",
        metadata={"help": "torch's implementation: fused (one kernel per tensor group), foreach (multi-tensor "
                          "kernels) or for-loop (one parameter at a time, the reference)"},
    )
    lr: List[float] = II("optimization.lr")


@register_optimizer("torch_adamw", dataclass=TorchAdamWConfig)
class TorchAdamW(FairseqOptimizer):
    def __init__(self, cfg: TorchAdamWConfig, params):
        super().__init__(cfg)
        impl = cfg.adamw_impl
        self._optimizer = torch.optim.AdamW(params, **self.optimizer_config, fused=impl == "fused",
                                            foreach=impl == "foreach")

    @property
    def optimizer_config(self):
        """Arguments that override those saved in a checkpoint when it is loaded (fairseq's convention)."""
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        betas = self.cfg.adam_betas  # "(0.9, 0.98)" from the command line, a list from a config
        betas = ast.literal_eval(betas) if isinstance(betas, str) else betas
        return {"lr": lr, "betas": tuple(float(b) for b in betas), "eps": self.cfg.adam_eps,
                "weight_decay": self.cfg.weight_decay}

    @property
    def supports_flat_params(self):
        return True
