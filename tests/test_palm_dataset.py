"""continuation_pair data: pair boundaries against a sentence-by-sentence reference, lazy items, masking."""
import tracemalloc

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary

from palm_plugin.data.continuation_pair_dataset import ContinuationPairDataset, build_pair_index
from palm_plugin.data.token_masking import TokenMaskingPolicy
from tests.conftest import binarize


def random_corpus(rng, documents=40, longest=60):
    """Item sizes of a binarized corpus: sentences (tokens + EOS) with a blank item (EOS only) between documents."""
    sizes = []
    for d in range(documents):
        if d:
            sizes.append(1)
        sizes.extend(rng.integers(1, longest, size=rng.integers(1, 7)) + 1)
    return np.array(sizes)


def reference_pairs(sizes, max_source, max_target, mode):
    """The pairs by their definition, greedily, one document and one start sentence at a time.

    Returns (source_start, source_length, target_start, target_length) in the sentence stream and the counts of
    truncated sources and targets (fragments in fraction mode)."""
    documents, current = [], []
    for size in sizes:
        if size == 1:
            documents.append(current)
            current = []
        else:
            current.append(int(size) - 1)
    documents.append(current)
    pairs, truncated_src, truncated_tgt, offset = [], 0, 0, 0
    for lengths in documents:
        starts = np.concatenate(([0], np.cumsum(lengths))) + offset
        for i in range(len(lengths)):
            if mode == "sentence":
                if i + 1 == len(lengths):
                    break
                j = i + 1
                while j < len(lengths) - 1 and sum(lengths[i:j + 1]) <= max_source:
                    j += 1
                k = j + 1
                while k < len(lengths) and sum(lengths[j:k + 1]) <= max_target:
                    k += 1
                source, target = sum(lengths[i:j]), sum(lengths[j:k])
                truncated_src += source > max_source
                truncated_tgt += target > max_target
                pairs.append((starts[i], min(source, max_source), starts[j], min(target, max_target)))
            else:
                budget = max_source + max_target
                k = i + 1
                while k < len(lengths) and sum(lengths[i:k + 1]) <= budget:
                    k += 1
                fragment = sum(lengths[i:k])
                if fragment < 2:
                    continue
                truncated_tgt += fragment > budget
                fragment = min(fragment, budget)
                source = min(max(int(round(fragment * max_source / budget)), 1), fragment - 1)
                pairs.append((starts[i], source, starts[i] + source, fragment - source))
        offset += sum(lengths)
    return [np.array(column) for column in zip(*pairs)], truncated_src, truncated_tgt


@pytest.mark.parametrize("mode", ["sentence", "fraction"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pair_index_matches_reference(mode, seed):
    sizes = random_corpus(np.random.default_rng(seed))
    index = build_pair_index(sizes, 40, 12, mode)
    (source_start, source_length, target_start, target_length), truncated_src, truncated_tgt = reference_pairs(
        sizes, 40, 12, mode
    )
    np.testing.assert_array_equal(index.source_start, source_start)
    np.testing.assert_array_equal(index.source_length, source_length)
    np.testing.assert_array_equal(index.target_start, target_start)
    np.testing.assert_array_equal(index.target_length, target_length)
    assert (index.truncated_sources, index.truncated_targets) == (truncated_src, truncated_tgt)
    assert truncated_src + truncated_tgt > 0  # the corpus has sentences longer than the limits


def test_offsets_of_a_corpus_past_2_31_tokens_do_not_overflow():
    """fairseq's mmap datasets keep item sizes as int32; the token stream's offsets must count past 2**31."""
    from palm_plugin.data.continuation_pair_dataset import sentence_layout

    sizes = np.array([2**30, 2**30, 6, 1, 4], dtype=np.int32)  # a blank line (size 1) ends the first document
    _, offsets, _ = sentence_layout(sizes)
    # sentences without their EOS: 2**30 - 1, 2**30 - 1, 5 and (after the blank line) 3 tokens
    assert offsets.tolist() == [0, 2**30 - 1, 2**31 - 2, 2**31 + 3, 2**31 + 6]


def test_unknown_split_mode_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown split mode 'words': expected 'sentence' or 'fraction'"):
        build_pair_index(np.array([4, 5, 1]), 8, 4, "words")


@pytest.mark.parametrize("sizes, limits, mode, pairs, truncated", [
    # document 1: sentences of 3, 4, 5 tokens; document 2: one sentence (no pair); document 3: 50 then 2 tokens.
    # pairs: (s0+s1 | s2 truncated to 4), (s1 | s2 truncated), (s4 truncated to 8 | s5)
    ([4, 5, 6, 1, 3, 1, 51, 3], (8, 4), "sentence", ([0, 3, 14], [7, 4, 8], [7, 7, 64], [4, 4, 2]), (1, 2)),
    # a source limit small next to the target's (2 / 30): a short fragment's source share rounds to 0 tokens, yet
    # every pair keeps at least one source token (and one target token), as the module docstring says.
    # document 1: sentences of 3 and 2 tokens; document 2: one of 40 tokens (cut to 32); document 3: one token.
    # fragments: 5 tokens (5 * 2/32 rounds to 0 -> 1 | 4), 2 tokens (0 -> 1 | 1), 32 of 40 tokens (2 | 30)
    ([4, 3, 1, 41, 1, 2], (2, 30), "fraction", ([0, 3, 5], [1, 1, 2], [1, 4, 7], [4, 1, 30]), (0, 1)),
], ids=["sentence", "fraction-share-rounds-to-zero"])
def test_pair_index_by_hand(sizes, limits, mode, pairs, truncated):
    index = build_pair_index(np.array(sizes), *limits, mode)
    for name, expected in zip(("source_start", "source_length", "target_start", "target_length"), pairs):
        np.testing.assert_array_equal(getattr(index, name), expected, err_msg=name)
    assert (index.truncated_sources, index.truncated_targets) == truncated
    assert (index.documents, index.documents_without_pairs) == (3, 1)


class ListCorpus(torch.utils.data.Dataset):
    """An in-memory stand-in for fairseq's indexed dataset: items and their ``sizes``."""

    def __init__(self, items):
        self.items = [torch.tensor(item) for item in items]
        self.sizes = np.array([len(item) for item in items])

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self):
        return len(self.items)


def make_dataset(mode="sentence", max_source=12, max_target=6, seed=3, objective="continuation"):
    dictionary = Dictionary()
    for i in range(40):
        dictionary.add_symbol(f"w{i}")
    mask = dictionary.add_symbol("<mask>")
    rng = np.random.default_rng(seed)
    eos = dictionary.eos()
    items, sentences = [], []
    for d in range(6):
        if d:
            items.append([eos])
        for _ in range(rng.integers(2, 6)):
            sentence = list(rng.integers(dictionary.nspecial, mask, size=rng.integers(2, 8)))
            items.append(sentence + [eos])
            sentences.append(sentence)
    corpus = ListCorpus(items)
    pairs = build_pair_index(corpus.sizes, max_source, max_target, mode)
    dataset = ContinuationPairDataset(corpus, pairs, dictionary, mask, TokenMaskingPolicy(), seed=7, objective=objective)
    return dataset, np.concatenate(sentences), dictionary



@pytest.mark.parametrize("mode", ["sentence", "fraction"])
def test_sizes_for_batching_are_those_of_the_items(mode):
    """fairseq batches by ``num_tokens`` (--max-tokens) and filters by ``size``: the lengths of the items' source and
    target, </s> included, one index at a time or vectorised."""
    dataset, _, _ = make_dataset(mode)
    indices = np.arange(len(dataset))
    lengths = [(len(dataset[i]["source"]), len(dataset[i]["target"])) for i in indices]
    assert [dataset.size(i) for i in indices] == lengths
    assert [dataset.num_tokens(i) for i in indices] == [max(pair) for pair in lengths]
    assert dataset.num_tokens_vec(indices).tolist() == [max(pair) for pair in lengths]
    # fairseq's --max-tokens batching reads the vector (its Cython loop takes int64): the batches of the per-item sizes
    from fairseq.data import data_utils

    by_vector = data_utils.batch_by_size(indices, dataset.num_tokens, max_tokens=40,
                                         num_tokens_vec=dataset.num_tokens_vec(indices))
    by_item = data_utils.batch_by_size(indices, dataset.num_tokens, max_tokens=40)
    assert [b.tolist() for b in by_vector] == [b.tolist() for b in by_item] and len(by_item) > 1


def test_batch_order_is_fairseqs_language_pair_order():
    """Shuffled by fairseq's seeded numpy state, then sorted by target and then source length: the order of
    fairseq's LanguagePairDataset over the same lengths (checked on a draw where the two sorts disagree)."""
    from fairseq.data import LanguagePairDataset, data_utils

    dataset, _, dictionary = make_dataset("sentence")
    sources, targets = dataset.source_sizes(), dataset.target_sizes()
    reference = LanguagePairDataset(dataset, sources, dictionary, dataset, targets, dictionary, shuffle=True)
    for seed in (1, 2):
        with data_utils.numpy_seed(seed):
            ours = dataset.ordered_indices()
        with data_utils.numpy_seed(seed):
            expected = reference.ordered_indices()
        assert ours.tolist() == expected.tolist()
    assert sorted(ours.tolist()) == list(range(len(dataset))) and len(set(targets.tolist())) > 1


def test_filter_by_size_drops_the_pairs_over_either_limit():
    dataset, _, _ = make_dataset("sentence")
    sources, targets = dataset.source_sizes(), dataset.target_sizes()
    limits = (int(np.median(sources)), int(np.median(targets)))
    kept, dropped = dataset.filter_indices_by_size(np.arange(len(dataset)), limits)
    expected = (sources <= limits[0]) & (targets <= limits[1])
    assert kept.tolist() == np.flatnonzero(expected).tolist() and sorted(dropped) == np.flatnonzero(~expected).tolist()
    assert 0 < len(kept) < len(dataset)


@pytest.mark.parametrize("mode", ["sentence", "fraction"])
def test_items_hold_the_indexed_tokens(mode):
    dataset, stream, dictionary = make_dataset(mode)
    pad, eos = dictionary.pad(), dictionary.eos()
    for index in range(len(dataset)):
        item = dataset[index]
        start, length = dataset.pairs.source_start[index], dataset.pairs.source_length[index]
        original = stream[start:start + length]
        target_start, target_length = dataset.pairs.target_start[index], dataset.pairs.target_length[index]
        assert item["target"].tolist() == list(stream[target_start:target_start + target_length]) + [eos]
        source, mlm_target = item["source"].numpy(), item["mlm_target"].numpy()
        assert len(source) == len(mlm_target) == length + 1 and source[-1] == eos and mlm_target[-1] == pad
        selected = mlm_target[:-1] != pad
        assert selected.sum() == max(1, int(np.ceil(0.15 * length)))
        np.testing.assert_array_equal(mlm_target[:-1][selected], original[selected])
        np.testing.assert_array_equal(source[:-1][~selected], original[~selected])


@pytest.mark.parametrize("mode", ["sentence", "fraction"])
def test_masked_span_items_hide_one_span_of_the_fragment(mode):
    """MASS-like: the source is the pair's whole fragment with one contiguous span, as long as the pair's target,
    corrupted; the target is that span's original tokens; its place varies over items and epochs."""
    dataset, stream, dictionary = make_dataset(mode, objective="masked_span")
    pad, eos = dictionary.pad(), dictionary.eos()
    starts = set()
    for epoch in (1, 2, 3):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            item = dataset[index]
            begin = dataset.pairs.source_start[index]
            span = int(dataset.pairs.target_length[index])
            fragment = stream[begin:begin + dataset.pairs.source_length[index] + span]
            source, mlm_target = item["source"].numpy()[:-1], item["mlm_target"].numpy()[:-1]
            assert len(source) == len(fragment) and item["source"][-1] == eos
            selected = np.flatnonzero(mlm_target != pad)
            assert len(selected) == span and np.all(np.diff(selected) == 1), "one contiguous span"
            assert item["target"].tolist() == list(fragment[selected]) + [eos]
            np.testing.assert_array_equal(np.delete(source, selected), np.delete(fragment, selected))
            starts.add(int(selected[0]))
    assert len(starts) > 3, "the span's place is drawn, not fixed"


def test_unconditional_items_have_no_source():
    """BERT+LM-like: the decoder's target is the continuation, and the encoder reads EOS alone."""
    dataset, stream, dictionary = make_dataset(objective="unconditional")
    for index in range(len(dataset)):
        item = dataset[index]
        start, length = dataset.pairs.target_start[index], dataset.pairs.target_length[index]
        assert item["source"].tolist() == [dictionary.eos()]
        assert item["mlm_target"].tolist() == [dictionary.pad()]
        assert item["target"].tolist() == list(stream[start:start + length]) + [dictionary.eos()]


def test_masking_is_seeded_by_epoch_and_index():
    dataset, _, _ = make_dataset()
    first = [dataset[i]["source"] for i in range(len(dataset))]
    assert all(torch.equal(a, dataset[i]["source"]) for i, a in enumerate(first))
    dataset.set_epoch(2)
    second = [dataset[i]["source"] for i in range(len(dataset))]
    assert any(not torch.equal(a, b) for a, b in zip(first, second))


def test_masking_replaces_80_10_10():
    dataset, stream, dictionary = make_dataset(max_source=200, max_target=50)
    mask = dictionary.index("<mask>")
    counts = np.zeros(3)
    for epoch in range(1, 60):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            item = dataset[index]
            selected = item["mlm_target"].numpy() != dictionary.pad()
            source, original = item["source"].numpy()[selected], item["mlm_target"].numpy()[selected]
            counts += [(source == mask).sum(), ((source != mask) & (source != original)).sum(), (source == original).sum()]
    fractions = counts / counts.sum()
    # random replacements that draw the original token count as unchanged: 0.1 * (1 - 1/40) and 0.1 * (1 + 1/40)
    np.testing.assert_allclose(fractions, [0.8, 0.0975, 0.1025], atol=0.02)


def test_collater_uses_the_translation_layout():
    dataset, _, dictionary = make_dataset()
    batch = dataset.collater([dataset[i] for i in range(3)])
    pad, eos = dictionary.pad(), dictionary.eos()
    for row, index in enumerate(batch["id"].tolist()):
        target = dataset[index]["target"]
        assert batch["target"][row, : len(target)].tolist() == target.tolist()
        assert batch["net_input"]["prev_output_tokens"][row, : len(target)].tolist() == [eos] + target[:-1].tolist()
        assert batch["mlm_target"][row, : len(dataset[index]["source"])].tolist() == dataset[index]["mlm_target"].tolist()
    assert batch["ntokens"] == int(batch["target"].ne(pad).sum())
    assert batch["net_input"]["src_tokens"].shape == batch["mlm_target"].shape


def test_pair_index_memory_is_a_few_arrays():
    """2M sentences: building the index allocates a bounded number of bytes per sentence and keeps 24 per pair."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(2, 40, size=2_000_000)
    sizes[rng.random(len(sizes)) < 0.05] = 1  # document breaks
    tracemalloc.start()
    index = build_pair_index(sizes, 400, 100, "sentence")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = sum(getattr(index, name).nbytes for name in ("source_start", "source_length", "target_start", "target_length"))
    assert kept == 24 * len(index)
    assert peak < 200 * len(sizes), f"peak {peak / 1e6:.0f} MB for {len(sizes)} sentences"


def test_stage_ae_refuses_the_unconditional_objective():
    """Stage ae trains the encoder alone, which --objective unconditional leaves without a source: an error that
    says which stages to run, not a run that learns nothing."""
    from types import SimpleNamespace

    from palm_plugin.criterions.palm_mlm_lm import PalmMlmLmCriterion

    dictionary = Dictionary()
    task = SimpleNamespace(cfg=SimpleNamespace(objective="unconditional"), target_dictionary=dictionary)
    # the options as the user types them (choices are case-sensitive)
    with pytest.raises(ValueError, match="train stage ae with --objective continuation, then stage joint with "
                                         "--objective unconditional$"):
        PalmMlmLmCriterion(task, "ae", 0.0, 1.0)
    assert PalmMlmLmCriterion(task, "joint", 0.0, 1.0).stage == "joint"


def test_a_split_loaded_without_an_epoch_is_the_first_shards(tmp_path):
    """DATA = a:b:c: fairseq-generate and fairseq-eval-lm load their split with ``load_dataset(split)``, no epoch: the
    task reads the first directory's, as epoch 1; fairseq-train's epoch e reads directory (e - 1) % 3."""
    from palm_plugin.tasks.continuation_pair import ContinuationPairConfig, ContinuationPairTask

    dictionary = Dictionary()
    words = [(dictionary.add_symbol(f"context{k}"), dictionary.add_symbol(f"continued{k}")) for k in range(3)]
    shards = []
    for index, (context, continued) in enumerate(words):  # a document of two sentences a shard
        shards.append(tmp_path / f"s{index}")
        shards[-1].mkdir()
        dictionary.save(str(shards[-1] / "dict.txt"))
        binarize(shards[-1] / "valid", [[context], [continued]], dictionary)
    task = ContinuationPairTask.setup_task(ContinuationPairConfig(data=":".join(map(str, shards)), seed=1))

    def continuation(**epoch):
        task.load_dataset("valid", **epoch)
        dataset = task.dataset("valid")
        assert len(dataset) == 1
        return [task.dictionary[t] for t in dataset[0]["target"].tolist()]

    assert continuation() == ["continued0", "</s>"]
    assert [continuation(epoch=epoch) for epoch in (1, 2, 3, 4)] == [
        ["continued0", "</s>"], ["continued1", "</s>"], ["continued2", "</s>"], ["continued0", "</s>"]]


def parts_of_a_split(folder):
    """A continuation_pair data folder whose train split was binarized in two parts (train, train1), a document of
    two sentences each (ending with a blank line, so that the parts read together stay two documents); returns the
    task and each part's continuation as words."""
    from palm_plugin.tasks.continuation_pair import ContinuationPairConfig, ContinuationPairTask

    dictionary = Dictionary()
    parts = [(dictionary.add_symbol(f"context{k}"), dictionary.add_symbol(f"continued{k}")) for k in range(2)]
    dictionary.save(str(folder / "dict.txt"))
    for k, (context, continued) in enumerate(parts):
        binarize(folder / f"train{k or ''}", [[context], [continued], []], dictionary)
    task = ContinuationPairTask.setup_task(ContinuationPairConfig(data=str(folder), seed=1))
    return task, [[f"continued{k}", "</s>"] for k in range(2)]


def test_a_split_loaded_without_combine_is_its_first_part_only(tmp_path):
    """fairseq-generate and fairseq-validate load their split with ``load_dataset(split)``, no combine: a split
    binarized in parts (train, train1) is read as its first part, as fairseq's tasks do; fairseq-train's combine=True
    reads every part."""
    task, continuations = parts_of_a_split(tmp_path)

    def loaded(**combine):
        task.load_dataset("train", **combine)
        dataset = task.dataset("train")
        return [[task.dictionary[t] for t in dataset[i]["target"].tolist()] for i in range(len(dataset))]

    assert loaded() == continuations[:1]
    assert loaded(combine=True) == continuations


def test_a_loaded_split_logs_its_pairs_mode_and_lines(tmp_path, caplog):
    task, _ = parts_of_a_split(tmp_path)
    with caplog.at_level("INFO", logger="palm_plugin.tasks.continuation_pair"):
        task.load_dataset("train", combine=True)
    assert [r.getMessage() for r in caplog.records] == ["train: 2 pairs (sentence mode) from 6 lines"]
