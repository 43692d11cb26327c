"""Analytic FLOP counts of one training step, and the machine's measured matmul throughput.

Counting (the convention of "model FLOPs utilisation", Chowdhery et al. 2022, appendix B): only matrix products
count, at 2 FLOPs per multiply-add; a training step costs 3x the forward pass (the backward pass computes two
products per forward product: gradients of inputs and of weights). So each linear layer ``d_in -> d_out`` applied
to ``n`` rows costs ``6 n d_in d_out`` per step: ``6 * params * tokens`` for the layers every token goes through.
Attention adds, per layer, ``3 * 2 * 2 * T_q * T_k * d`` for ``Q K^T`` and ``A V`` over the full ``T_q x T_k``
matrix (a masked score is computed, then discarded). Embedding lookups, layer norms, softmaxes, activations and
the optimizer's update are not counted; output layers count only on the rows they are applied to (the masked
positions for an MLM head, every target position for a decoder). Shapes are read from the actual batch, padding
included (every config here has at most a few padded positions).

tests/test_benchmark.py checks these formulas against ``torch.utils.flop_counter.FlopCounterMode`` on real steps.
"""
import time
from dataclasses import dataclass

import torch

TRAIN = 3  # forward + backward (2x forward) for every matrix product


@dataclass(frozen=True)
class Dims:
    """Sizes of a model: ``layers`` (encoder, or the shared stack), ``decoder_layers``, model dim ``d``, feed-forward
    dim ``f``, output vocabulary ``vocab``, copy attention dim ``copy`` (0: no copy layer), ``pointer_generator``
    (PALM's output layer, with its ``W_v`` projection even without copying)."""

    layers: int
    d: int
    f: int
    vocab: int
    decoder_layers: int = 0
    copy: int = 0
    pointer_generator: bool = False


def encoder_stack(dims: Dims, rows: int, width: int) -> float:
    """Forward FLOPs of ``dims.layers`` self-attention blocks over ``rows`` sequences of ``width`` tokens."""
    d, f = dims.d, dims.f
    per_layer = 2 * width * (4 * d * d + 2 * d * f) + 4 * width * width * d
    return rows * dims.layers * per_layer


def lm_head(dims: Dims, predicted: int) -> float:
    """Forward FLOPs of a BERT / RoBERTa LM head (dense ``d x d`` then the tied ``d x V`` output) on ``predicted``
    rows."""
    return 2 * predicted * (dims.d * dims.d + dims.d * dims.vocab)


def decoder_stack(dims: Dims, rows: int, target: int, source: int) -> float:
    """Forward FLOPs of ``dims.decoder_layers`` Transformer decoder blocks: self-attention (4 projections),
    cross-attention (queries and output on the target, keys and values on the source) and feed-forward."""
    d, f = dims.d, dims.f
    per_layer = (
        2 * target * (6 * d * d + 2 * d * f)
        + 2 * source * 2 * d * d
        + 4 * target * target * d
        + 4 * target * source * d
    )
    return rows * dims.decoder_layers * per_layer


def decoder_output(dims: Dims, rows: int, target: int, source: int) -> float:
    """Forward FLOPs of the decoder's output layer: fairseq's tied projection, or PALM's pointer-generator
    (``W_v``, tied ``W_e``, ``W_m`` on the source, ``W_s`` on the target, ``w_c`` over the ``target x source``
    additive scores, the context ``alpha H`` and the gate)."""
    d, a = dims.d, dims.copy
    flops = 2 * rows * target * d * dims.vocab
    if dims.pointer_generator:
        flops += 2 * rows * target * d * d  # W_v
    if a:
        flops += 2 * rows * (source * d * a + target * d * a + target * source * a + target * source * d)
        flops += 2 * rows * target * 2 * d  # gate
    return flops


def encoder_decoder_step(dims: Dims, rows: int, source: int, target: int, mlm_predicted: int = 0) -> float:
    """Training FLOPs of a fairseq Transformer / PALM step (``mlm_predicted``: rows of PALM's encoder MLM head)."""
    forward = encoder_stack(dims, rows, source) + decoder_stack(dims, rows, target, source)
    forward += decoder_output(dims, rows, target, source) + lm_head(dims, mlm_predicted)
    return TRAIN * forward


def encoder_only_step(dims: Dims, rows: int, width: int, predicted: int, passes: int = 1) -> float:
    """Training FLOPs of a masked-LM style step: ``passes`` runs of the stack over ``rows x width`` tokens and the
    LM head on ``predicted`` rows in all."""
    return TRAIN * (passes * encoder_stack(dims, rows, width) + lm_head(dims, predicted))


def synchronize(device) -> None:
    """Wait for the kernels queued on ``device`` (CUDA runs them asynchronously: a clock read before they finish
    times their launch, not their work); nothing to wait for on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure_matmul(size: int = 2048, shapes=((512, 768, 3072),), repeats: int = 5, dtype=torch.float32,
                   device: str = "cpu", warmup_s: float = 0.3) -> dict:
    """Time ``torch.mm`` in ``dtype`` on ``device`` on a square ``size`` GEMM and on Transformer feed-forward
    ``shapes`` ``(m, k, n)``, on random operands (a GPU's clock, and so its throughput, depends on the data: zeros
    run faster than real activations).

    Returns ``{"dtype", "device", "shapes": [{"m", "k", "n", "gflops"}], "peak_gflops": best median}``; the peak is
    the machine limit the training runs' utilisation is measured against. On CUDA the clock is read after
    ``torch.cuda.synchronize()`` (kernels run asynchronously). Each shape is first multiplied for ``warmup_s``
    seconds: thread pool start, kernel selection, and a GPU's clock rising to its working level.
    """
    # several products per clock reading on a GPU: one 8192^3 product takes about a millisecond there
    per_reading = 10 if torch.device(device).type == "cuda" else 1
    results = []
    for m, k, n in ((size, size, size),) + tuple(shapes):
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        start = time.perf_counter()
        while True:
            torch.mm(a, b)
            synchronize(device)
            if time.perf_counter() - start >= warmup_s:
                break
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(per_reading):
                torch.mm(a, b)
            synchronize(device)
            times.append((time.perf_counter() - start) / per_reading)
        times.sort()
        results.append({"m": m, "k": k, "n": n, "gflops": 2 * m * k * n / times[len(times) // 2] / 1e9})
    return {"dtype": str(dtype).replace("torch.", ""), "device": str(device), "shapes": results,
            "peak_gflops": max(r["gflops"] for r in results)}
