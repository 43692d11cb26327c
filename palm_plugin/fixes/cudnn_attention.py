"""cuDNN's fused attention off: fairseq's batches change shape every update.

On Hopper GPUs, torch picks cuDNN's fused attention for fp16/bf16 inputs of ``scaled_dot_product_attention``, and
cuDNN builds and caches an execution graph for every input shape it has not seen. fairseq batches text by length,
so the shapes keep changing and a run with ``--fp16``/``--bf16`` spends its first hundreds of updates building
graphs: both the UniLM stack and PALM (through fairseq's ``MultiheadAttention``, which calls the same function)
trained several times slower than in fp32 on an H100 until the graphs for most shapes existed, while fixed-length
pmlm blocks did not slow down (measured in docs/benchmarks-gpu.md). The flash and memory-efficient kernels that
torch uses instead need no per-shape graph. The switch is process-wide (torch has no per-module one), so fairseq's
own models trained with the plugin loaded get it too.
"""
import torch


def install():
    """Turn cuDNN's scaled-dot-product attention backend off (idempotent; a no-op without CUDA)."""
    torch.backends.cuda.enable_cudnn_sdp(False)
