"""fairseq's batching keeps every example once the plugin is imported (palm_plugin/fixes/batch_remainder.py)."""
import numpy as np
import pytest
import torch

import palm_plugin  # noqa: F401  (installs the fix)
from fairseq.data import FairseqDataset, data_utils
from fairseq.data.data_utils_fast import batch_by_size_fn, batch_by_size_vec


def _sizes(count, seed=0):
    return np.random.RandomState(seed).randint(3, 40, size=count).astype(np.int64)


@pytest.mark.parametrize("count", [1, 7, 13, 64, 101])
@pytest.mark.parametrize("max_tokens,max_sentences", [(None, 4), (200, None), (150, 6)])
@pytest.mark.parametrize("multiple", [1, 8])
def test_batches_are_fairseqs_own_with_nothing_dropped(count, max_tokens, max_sentences, multiple):
    sizes = _sizes(count)
    indices = np.argsort(sizes, kind="mergesort").astype(np.int64)
    # fairseq's batcher itself, before data_utils.batch_by_size drops the remainder
    raw = batch_by_size_vec(indices, sizes[indices], max_tokens or -1, max_sentences or -1, multiple)

    for batches in (
        data_utils.batch_by_size(indices, lambda i: sizes[i], sizes[indices], max_tokens, max_sentences, multiple),
        data_utils.batch_by_size(list(indices), lambda i: sizes[i], None, max_tokens, max_sentences, multiple),
    ):
        assert [b.tolist() for b in batches] == [b.tolist() for b in raw]
        assert np.concatenate(batches).tolist() == indices.tolist()  # every example once, in order
        assert all(len(b) < multiple or len(b) % multiple == 0 for b in batches)  # fairseq's documented contract


class Sentences(FairseqDataset):
    def __init__(self, sizes):
        self.sizes = sizes

    def __getitem__(self, index):
        return torch.ones(int(self.sizes[index]), dtype=torch.long)

    def __len__(self):
        return len(self.sizes)

    def num_tokens(self, index):
        return int(self.sizes[index])


def test_thirteen_sentences_give_thirteen_through_a_dataset():
    """The route fairseq-train / fairseq-generate take, ``FairseqDataset.batch_by_size``: 13 sentences batched by
    tokens make batches of 8 and 5, and fairseq alone drops the 5."""
    assert sum(map(len, batch_by_size_fn(np.arange(13, dtype=np.int64), lambda i: 5, 1000, -1, 8))) == 13
    batches = Sentences(np.full(13, 5)).batch_by_size(np.arange(13), max_tokens=1000, required_batch_size_multiple=8)
    assert np.concatenate(batches).tolist() == list(range(13))


def test_install_over_fairseqs_batcher_passes_each_call_on_and_adds_the_dropped_tail(monkeypatch):
    """The plugin installed the fix when it was imported; installed here over a stand-in for fairseq's batch_by_size
    (which drops a last batch of 5 for a multiple of 8, and keeps its fixed-shape batches as they are), the wrapper
    hands fairseq the call it got and returns fairseq's batches, the dropped tail added."""
    from palm_plugin.fixes import batch_remainder

    calls = []

    def fairseqs(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                 required_batch_size_multiple=1, fixed_shapes=None):
        calls.append((indices.tolist(), num_tokens_vec, max_tokens, max_sentences, required_batch_size_multiple,
                      fixed_shapes))
        if fixed_shapes is not None:
            return [indices[:4], indices[4:]]
        batches = [indices[start:start + 8] for start in range(0, len(indices), 8)]
        return batches if len(batches[-1]) % 8 == 0 else batches[:-1]

    monkeypatch.setattr(data_utils, "batch_by_size", fairseqs)
    batch_remainder.install()
    wrapped = data_utils.batch_by_size
    assert wrapped is not fairseqs
    assert [b.tolist() for b in wrapped(range(13), len, None, 1000, None, 8)] == [list(range(8)), list(range(8, 13))]
    assert [b.tolist() for b in wrapped(range(6), len, fixed_shapes=[(4, 10)])] == [[0, 1, 2, 3], [4, 5]]
    assert calls == [(list(range(13)), None, 1000, None, 8, None), (list(range(6)), None, None, None, 1, [(4, 10)])]
