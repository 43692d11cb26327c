"""The products onto the vocabulary (the tied embedding matrix), and BERT's masked-LM head built on them.

The vocabulary's size is the leading dimension of the logits and of their gradient, and it is seldom a multiple of 8:
a BERT vocabulary has 30522 types, and the tasks add [MASK] and UniLMv2's pseudo token to a dictionary that
``fairseq-preprocess`` padded to a multiple of 8. cuBLAS runs a 16-bit product on the tensor cores' fast kernels only
when every leading dimension is a multiple of 16 bytes (NVIDIA's "Matrix Multiplication Background" guide, which
recommends 128 bytes on A100 and later); otherwise it takes a kernel several times slower, three times a step (the
logits, their gradient with respect to the states and to the embedding). So while training on CUDA, the product runs
with the matrix padded by zero rows to a multiple of :data:`ROW_MULTIPLE` and hands back the first ``V`` columns:
the same values, a copy of the matrix (not of the logits) a step. Without gradients (decoding, validation) the
product runs as it is: a few rows of states, where copying the matrix would cost more than the product.
"""
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

ROW_MULTIPLE = 64  # elements: 128 bytes in 16 bits; palm-bench's unaligned_vocabulary lever sets 1 (no padding)


def pads_vocabulary(features: Tensor) -> bool:
    """Whether :func:`vocabulary_logits` pads the matrix for these states: training steps on CUDA."""
    return features.is_cuda and torch.is_grad_enabled()


def vocabulary_logits(features: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear(features, weight, bias)``, ``(*, C) -> (*, V)``, with ``weight``'s ``V`` rows padded to a multiple
    of :data:`ROW_MULTIPLE` where :func:`pads_vocabulary` says so (the result is then a view with that row stride)."""
    types = weight.size(0)
    extra = -types % ROW_MULTIPLE
    if not extra or not pads_vocabulary(features):
        return F.linear(features, weight, bias)
    padded_bias = None if bias is None else F.pad(bias, (0, extra))
    return F.linear(features, F.pad(weight, (0, 0, 0, extra)), padded_bias)[..., :types]


class MaskedLMHead(nn.Module):
    """BERT's (and RoBERTa's) masked-LM head: dense, activation, LayerNorm, then the tied embedding matrix and a
    bias. The parameter names are RoBERTa's (``dense``, ``layer_norm``, ``weight``, ``bias``)."""

    def __init__(self, dim: int, vocab_size: int, embed_weight: nn.Parameter,
                 activation_fn: Callable[[Tensor], Tensor] = F.gelu, layer_norm_eps: float = 1e-5):
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.activation_fn = activation_fn
        self.layer_norm = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.weight = embed_weight
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, features: Tensor) -> Tensor:
        """``(*, C)`` -> logits ``(*, V)``."""
        return vocabulary_logits(self.layer_norm(self.activation_fn(self.dense(features))), self.weight, self.bias)
