"""Batches that keep every example.

fairseq's ``data_utils.batch_by_size`` documents that a batch's size is "less than N or a multiple of N"
(``--required-batch-size-multiple N``, 8 by default), then drops the last batch when its size is not a multiple
of N, even when it is smaller than N (fairseq issue #5036). Up to N - 1 examples of every training epoch,
validation and ``fairseq-generate`` run are silently lost: a test set of 13 sentences batched by ``--max-tokens``
gives 8 hypotheses. :func:`install` keeps fairseq's batches and gives back the dropped remainder as a last batch.
"""
import numpy as np


def install():
    """Patch ``fairseq.data.data_utils.batch_by_size`` (idempotent)."""
    from fairseq.data import data_utils

    batch_by_size = data_utils.batch_by_size
    if getattr(batch_by_size, "__palm_plugin__", False):
        return

    def batch_by_size_keeping_all(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                                  required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                                required_batch_size_multiple, fixed_shapes)
        if fixed_shapes is not None:  # that path drops nothing
            return batches
        # fairseq's batches are consecutive slices of ``indices``: what was dropped is their tail
        kept = sum(len(batch) for batch in batches)
        if kept < len(indices):
            batches = list(batches) + [indices[kept:].astype(np.int64)]
        return batches

    batch_by_size_keeping_all.__palm_plugin__ = True
    data_utils.batch_by_size = batch_by_size_keeping_all
