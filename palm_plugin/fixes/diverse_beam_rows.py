"""``--diverse-beam-groups``: fairseq's diverse beam search reads the diversity counts of other sentences, or fails.

``DiverseBeamSearch.step`` (cumulative diversity, fairseq #5069) keeps ``group_overlap``, one row per sentence of the
batch in the order of its first step, and at later steps indexes it with the ``original_batch_idxs`` that
``SequenceGenerator`` passes: the batch's sample ids (``sample["id"]``, the sentences' numbers in the data set), less
the finished sentences. Those are rows only for a batch whose ids are 0 .. B-1 in order. Any other batch penalises
each sentence with another sentence's counts (fairseq-generate's first batch, whose ids are a permutation of 0 .. B-1
sorted by length), or fails with ``IndexError: index 4 is out of bounds for dimension 0 with size 4`` at the first
batch whose ids reach its size, after the earlier batches were printed.

:func:`install` wraps ``step`` to pass it rows: the ids of the first step are kept, and the ids of a later step
(those of the sentences not finished, in the same order) are mapped to their positions among them.
"""
import functools

import torch


def _rows_of_the_first_step(step_function):
    @functools.wraps(step_function)
    def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
        if original_batch_idxs is not None:
            if step == 0:
                self.palm_first_step_ids = original_batch_idxs
            # a sample id appears once in a batch: its row is its position at the first step (a sum, not a host sync)
            rows = torch.arange(len(self.palm_first_step_ids), device=original_batch_idxs.device)
            original_batch_idxs = original_batch_idxs[:, None].eq(self.palm_first_step_ids[None, :]).mul(rows).sum(1)
        return step_function(self, step, lprobs, scores, prev_output_tokens, original_batch_idxs)

    step.__palm_plugin__ = True
    return step


def install():
    """Wrap ``DiverseBeamSearch.step`` (idempotent)."""
    from fairseq.search import DiverseBeamSearch

    if not getattr(DiverseBeamSearch.step, "__palm_plugin__", False):
        DiverseBeamSearch.step = _rows_of_the_first_step(DiverseBeamSearch.step)
