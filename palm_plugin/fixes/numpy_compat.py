"""Two numpy names that fairseq 0.12 reads and numpy 2 no longer has: ``np.compat.long`` and ``np.percentile``'s
``interpolation``.

numpy 2.0 dropped its ``numpy.compat`` module (NEP 52), which fairseq names in two data paths:
``TokenBlockDataset`` under ``--sample-break-mode eos`` (the pmlm task; fairseq's language_model and masked_lm) and
``LanguagePairDataset`` under ``--num-batch-buckets N`` (translation). Both stopped at loading the data with
``AttributeError: module 'numpy' has no attribute 'compat'``. numpy 1's ``np.compat.long`` was Python's ``int``,
which as a dtype is numpy's default integer, int64 on 64-bit platforms: :func:`install` provides ``np.compat.long =
np.int64`` where numpy has no ``compat``. Past it, ``--num-batch-buckets`` failed in fairseq's ``get_buckets``:
``percentile() got an unexpected keyword argument 'interpolation'`` (numpy 1.22 renamed it ``method``, and the numpy 2
of this environment, 2.4, refuses the old name), so where ``np.percentile`` lacks it, ``get_buckets`` is replaced by
the same function with ``method``. fairseq's other numpy incompatibilities (``np.float`` and the like, its issue
#4945, open) are in code the plugin's commands do not reach (wav2vec and HuBERT span masking, the NAT CRF layer).
"""
import inspect
import types

import numpy as np


def get_buckets(sizes, num_buckets):
    """fairseq's ``data_utils.get_buckets`` (the sizes at ``num_buckets`` even percentiles, the lower data point),
    with numpy >= 1.22's name for the interpolation."""
    return np.unique(np.percentile(sizes, np.linspace(0, 100, num_buckets + 1), method="lower")[1:])


get_buckets.__palm_plugin__ = True


def install():
    """Give numpy 2 a ``compat`` namespace holding ``long``, and fairseq's ``get_buckets`` numpy 2's percentile
    (idempotent; a no-op on the numpy 1 versions fairseq was written for)."""
    if not hasattr(np, "compat"):  # numpy 1 has its own
        np.compat = types.SimpleNamespace(long=np.int64, __palm_plugin__=True)
    if "interpolation" in inspect.signature(np.percentile).parameters:
        return
    from fairseq.data import bucket_pad_length_dataset, data_utils
    from fairseq.data.audio import raw_audio_dataset

    # the modules that imported the function by name (fairseq.data imports them all) hold their own reference
    for module in (data_utils, bucket_pad_length_dataset, raw_audio_dataset):
        module.get_buckets = get_buckets
