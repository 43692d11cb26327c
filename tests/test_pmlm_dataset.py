"""Pseudo-masked LM examples: the layout of the paper's Figure 4, and the dataset's items and batches."""
import numpy as np
import pytest
import torch
from fairseq.data import Dictionary

from palm_plugin.data.blockwise_masking import BlockwiseMaskingPolicy
from palm_plugin.data.pmlm_dataset import PseudoMaskedLMDataset, pseudo_masked_example, sentence_pair
from palm_plugin.data.symbols import MASK_SYMBOL, PSEUDO_SYMBOL
from palm_plugin.data.token_masking import TokenMaskingPolicy
from palm_plugin.modules.attention_masks import PseudoMaskKind as K

C, P, O = int(K.CONTEXT), int(K.PSEUDO), int(K.ORIGINAL)


def test_figure_4_layout():
    """x1..x6 (ids 11..16), x2, x4, x5 masked; factorization order {x4, x5} -> {x2}."""
    tokens = np.array([11, 12, 13, 14, 15, 16])
    steps = np.array([-1, 1, -1, 0, 0, -1])
    noised = np.array([11, 99, 13, 99, 99, 16])  # 99 = [M]
    example = pseudo_masked_example(tokens, steps, noised, pseudo_idx=77)
    assert example["source"].tolist() == [11, 99, 13, 99, 99, 16, 77, 77, 14, 15, 77, 12]
    assert example["positions"].tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 3, 4, 1, 1]
    assert example["kinds"].tolist() == [C, C, C, C, C, C, P, P, O, O, P, O]
    assert example["steps"][6:].tolist() == [0, 0, 0, 0, 1, 1]
    # AE predicts at the [M] slots, PAR at the [P] tokens; nothing else is predicted.
    assert example["target"].tolist() == [-1, 12, -1, 14, 15, -1, 14, 15, -1, -1, 12, -1]
    # int64 throughout, as documented: the collater copies them into LongTensors (targets index the vocabulary)
    assert {name: array.dtype for name, array in example.items()} == dict.fromkeys(example, np.dtype(np.int64))


def test_layout_without_pseudo_part_or_without_ae():
    tokens, steps, noised = np.array([11, 12, 13]), np.array([-1, 0, -1]), np.array([11, 99, 13])
    ae_only = pseudo_masked_example(tokens, steps, noised, 77, append_pseudo=False)
    assert ae_only["source"].tolist() == [11, 99, 13] and ae_only["target"].tolist() == [-1, 12, -1]
    par_only = pseudo_masked_example(tokens, steps, noised, 77, predict_masked_slots=False)
    assert par_only["source"].tolist() == [11, 99, 13, 77, 12]
    assert par_only["target"].tolist() == [-1, -1, -1, 12, -1]


@pytest.mark.parametrize("given", [np.int32, np.uint8, bool])
def test_segments_of_any_integer_dtype_come_back_as_int64(given):
    """Segment ids handed over in another dtype (e.g. read from a compact array, or a boolean "second segment"
    mask) come back as int64 like every other field, with or without the appended part, the values unchanged."""
    tokens, steps, noised = np.array([11, 12, 13, 14]), np.array([-1, 0, -1, 1]), np.array([11, 99, 13, 99])
    segments = np.array([0, 0, 1, 1]).astype(given)
    plain = pseudo_masked_example(tokens, steps, noised, 77, append_pseudo=False, segments=segments)
    full = pseudo_masked_example(tokens, steps, noised, 77, segments=segments)
    assert plain["segments"].tolist() == [0, 0, 1, 1]
    assert full["segments"].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]  # step 0 is x2 (segment 0), step 1 is x4 (1)
    for example in (plain, full):
        assert {name: array.dtype for name, array in example.items()} == dict.fromkeys(example, np.dtype(np.int64))


def make_dictionary(words=40):
    dictionary = Dictionary()
    for index in range(words):
        dictionary.add_symbol(f"w{index}")
    mask, pseudo = dictionary.add_symbol(MASK_SYMBOL), dictionary.add_symbol(PSEUDO_SYMBOL)
    return dictionary, mask, pseudo


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items
        self.sizes = np.array([len(item) for item in items])

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self):
        return len(self.items)


def make_dataset(lengths=(30, 50, 12, 80), random_token_prob=0.1, **kwargs):
    dictionary, mask, pseudo = make_dictionary()
    rng = np.random.default_rng(0)
    items = [
        torch.tensor([dictionary.bos(), *rng.integers(dictionary.nspecial, mask, n - 2), dictionary.eos()])
        for n in lengths
    ]
    dataset = PseudoMaskedLMDataset(
        ListDataset(items),
        dictionary,
        mask_idx=mask,
        pseudo_idx=pseudo,
        masking=BlockwiseMaskingPolicy(),
        replacement=TokenMaskingPolicy(mask_token_prob=1 - 0.1 - random_token_prob, random_token_prob=random_token_prob),
        seed=3,
        **kwargs,
    )
    return dataset, items, dictionary, mask, pseudo


def test_items_are_consistent_pseudo_masked_examples():
    dataset, items, dictionary, mask, pseudo = make_dataset()
    for index, original in enumerate(items):
        item = dataset[index]
        n = len(original)
        kinds, target, source = item["kinds"], item["target"], item["source"]
        slots = (kinds[:n] == C) & target[:n].ne(dictionary.pad())
        pseudo_rows, original_rows = kinds == P, kinds == O
        masked = int(slots.sum())
        budget = BlockwiseMaskingPolicy().budget(n - 2)  # BOS and EOS are not maskable
        assert budget <= masked <= budget + 5
        assert len(source) == n + 2 * masked <= dataset.num_tokens(index)
        assert dataset.size(index) == n
        # BOS / EOS never masked; targets are the original tokens
        assert not slots[0] and not slots[-1]
        assert torch.equal(target[:n][slots], original[slots])
        # every masked position appears once as [P] (predicting it) and once as its original token
        assert sorted(item["positions"][pseudo_rows].tolist()) == torch.nonzero(slots).flatten().tolist()
        assert sorted(item["positions"][original_rows].tolist()) == torch.nonzero(slots).flatten().tolist()
        assert (source[pseudo_rows] == pseudo).all()
        assert torch.equal(source[original_rows], original[item["positions"][original_rows]])
        assert torch.equal(target[pseudo_rows], original[item["positions"][pseudo_rows]])
        # [P] and original tokens of one step are contiguous: [P]*k then originals*k, steps in increasing order
        appended_steps = item["steps"][n:]
        assert (appended_steps[1:] >= appended_steps[:-1]).all()
        assert not (source[:n] == pseudo).any()  # [P] never appears in the text part (not even as a random token)


def test_random_replacement_never_draws_the_pseudo_symbol():
    dataset, items, dictionary, mask, pseudo = make_dataset(lengths=(400,) * 20, random_token_prob=0.9)
    replaced = 0
    for index in range(len(items)):
        text = dataset[index]["source"][:400]
        assert not (text == pseudo).any()
        replaced += int(((text != items[index]) & (text != mask)).sum())
    assert replaced > 500  # the random branch really ran


def test_deterministic_per_seed_epoch_index():
    dataset, *_ = make_dataset()
    first = dataset[1]
    assert all(torch.equal(first[k], dataset[1][k]) for k in ("source", "positions", "steps", "kinds", "target"))
    dataset.set_epoch(2)
    assert not torch.equal(first["source"], dataset[1]["source"]) or not torch.equal(first["steps"], dataset[1]["steps"])


def test_collater_pads_every_field():
    dataset, items, dictionary, *_ = make_dataset()
    samples = [dataset[i] for i in range(len(items))]
    batch = dataset.collater(samples)
    width = max(len(s["source"]) for s in samples)
    net_input = batch["net_input"]
    for key in ("src_tokens", "position_ids", "steps", "kinds"):
        assert net_input[key].shape == (len(items), width)
    assert batch["target"].shape == (len(items), width)
    for row, sample in enumerate(samples):
        n = len(sample["source"])
        assert torch.equal(net_input["src_tokens"][row, :n], sample["source"])
        assert (net_input["src_tokens"][row, n:] == dictionary.pad()).all()
        assert (batch["target"][row, n:] == dictionary.pad()).all()
    assert batch["ntokens"] == sum(len(s["source"]) for s in samples)


def test_collater_of_one_sample_is_a_batch_of_one_row():
    # A last batch may hold a single example: it is a real batch (only an empty list collates to {}), equal to its
    # row in a batch with a shorter example (the longest sample first, so that batch has no extra padding).
    dataset, items, dictionary, *_ = make_dataset()
    longest, shorter = dataset[3], dataset[2]
    single, pair = dataset.collater([longest]), dataset.collater([longest, shorter])
    assert single["nsentences"] == 1 and single["id"].tolist() == [3]
    assert single["ntokens"] == len(longest["source"])
    for key in ("src_tokens", "position_ids", "segment_ids", "steps", "kinds"):
        assert torch.equal(single["net_input"][key], pair["net_input"][key][:1])
    assert torch.equal(single["net_input"]["src_tokens"][0], longest["source"])
    assert torch.equal(single["target"], pair["target"][:1])
    assert dataset.collater([]) == {}


def test_ae_only_items_have_nothing_appended():
    dataset, items, *_ = make_dataset(append_pseudo=False)
    for index, original in enumerate(items):
        assert len(dataset[index]["source"]) == len(original) == dataset.num_tokens(index)


def test_needs_one_objective():
    with pytest.raises(ValueError, match="at least one loss"):
        make_dataset(append_pseudo=False, predict_masked_slots=False)


def test_prefetch_reaches_the_token_dataset():
    """fairseq asks a dataset that supports prefetching (its cached indexed format) to load a batch's indices first:
    the wrapper passes on both the capability and the indices."""

    class Prefetching(ListDataset):
        supports_prefetch = True

        def prefetch(self, indices):
            self.prefetched = list(indices)

    dataset = make_dataset()[0]
    assert not dataset.supports_prefetch
    dataset.dataset = Prefetching(dataset.dataset.items)
    assert dataset.supports_prefetch
    dataset.prefetch([3, 1])
    assert dataset.dataset.prefetched == [3, 1]


def test_a_block_of_one_sentence_is_cut_between_two_of_its_tokens_uniformly():
    """Section 2.2's [SOS] S1 [EOS] S2 [EOS] from a block without an inner sentence end: every cut that leaves a
    token on each side, equally often."""
    bos, eos = 0, 2
    body = np.arange(10, 16)  # six tokens, then the sentence's [EOS]
    rng, cuts = np.random.default_rng(0), []
    for _ in range(2000):
        tokens, segments = sentence_pair(np.append(body, eos), bos, eos, rng)
        first = int((segments == 0).sum()) - 2  # [SOS] S1 [EOS]
        assert tokens.tolist() == [bos, *body[:first], eos, *body[first:], eos]
        cuts.append(first)
    counts = np.bincount(cuts, minlength=7)
    assert counts[0] == counts[6] == 0 and (counts[1:6] > 300).all()
    tokens, segments = sentence_pair(np.array([10, 11, eos]), bos, eos, rng)  # the shortest block that can be cut
    assert tokens.tolist() == [bos, 10, eos, 11, eos] and segments.tolist() == [0, 0, 0, 1, 1]
    # segment ids index an embedding table, as token ids do: integers (tolist() above reads 0.0 as 0)
    assert tokens.dtype == segments.dtype == np.int64


def test_a_block_of_several_sentences_is_cut_at_an_inner_sentence_end_uniformly():
    """Section 2.2's [SOS] S1 [EOS] S2 [EOS] from a block of sentences of unequal lengths: the cut is one of the
    sentence ends inside the block, each equally often, the last one included when only one token follows it
    (both sides keep a token). The block's last [EOS], or a cut last sentence without one (fairseq's
    --sample-break-mode none), is never a cut."""
    bos, eos = 0, 2
    block = [10, 11, eos, 12, 13, 14, eos, 15, eos]  # sentences of 2, 3 and 1 tokens
    expected = {  # cut -> (tokens, segments), written out
        2: ([bos, 10, 11, eos, 12, 13, 14, eos, 15, eos], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]),
        6: ([bos, 10, 11, eos, 12, 13, 14, eos, 15, eos], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]),
    }
    rng, seen = np.random.default_rng(0), []
    for _ in range(400):
        tokens, segments = sentence_pair(np.array(block), bos, eos, rng)
        cut = int((segments == 0).sum()) - 2  # [SOS] S1 [EOS]: S1 is the block up to the cut
        assert (tokens.tolist(), segments.tolist()) == expected[cut]
        seen.append(cut)
    assert 150 < seen.count(2) < 250 and seen.count(2) + seen.count(6) == 400
    tokens, segments = sentence_pair(np.array([10, eos, 11, 12]), bos, eos, rng)  # the last sentence is cut
    assert tokens.tolist() == [bos, 10, eos, 11, 12, eos] and segments.tolist() == [0, 0, 0, 1, 1, 1]


def test_a_block_ending_with_an_empty_line_keeps_a_token_in_s2():
    """An empty line of the corpus is a sentence of [EOS] alone (fairseq-preprocess), so a block can end with
    [EOS] [EOS]: that inner [EOS] is no cut (S2 would be empty); the block is cut between two of its tokens."""
    bos, eos = 0, 2
    expected = {  # len(S1) -> (tokens, segments), written out
        1: ([bos, 10, eos, 11, eos, eos], [0, 0, 0, 1, 1, 1]),
        2: ([bos, 10, 11, eos, eos, eos], [0, 0, 0, 0, 1, 1]),
    }
    rng, seen = np.random.default_rng(0), set()
    for _ in range(50):
        tokens, segments = sentence_pair(np.array([10, 11, eos, eos]), bos, eos, rng)
        first = int((segments == 0).sum()) - 2  # [SOS] S1 [EOS]
        assert (tokens.tolist(), segments.tolist()) == expected[first]
        seen.add(first)
    assert seen == {1, 2}


def test_unshuffled_order_is_by_length_then_index_and_epochs_reach_the_token_dataset():
    """Without shuffling (valid/test), fairseq's convention: shortest first, equal lengths in corpus order. An epoch
    set on the dataset is passed on to the dataset it wraps (fairseq's BaseWrapperDataset does so), which may hold
    an epoch-dependent corpus."""
    class EpochRecordingDataset(ListDataset):
        epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    dataset, items, *_ = make_dataset(lengths=(30, 12, 50, 12, 30, 8), shuffle=False)
    lengths = [len(item) for item in items]
    assert dataset.ordered_indices().tolist() == sorted(range(len(items)), key=lambda i: (lengths[i], i))
    dataset.dataset = EpochRecordingDataset(items)
    dataset.set_epoch(4)
    assert dataset.dataset.epochs == [4] and dataset.epoch == 4


def test_shuffled_order_is_the_seeded_shuffle_sorted_stably_by_length():
    """Training order: the permutation drawn from the dataset's seed, then sorted by length keeping that permutation's
    order among equal lengths (so equal-length examples are batched in shuffled, not corpus or sort-internal, order).
    Hundreds of examples over a few lengths: numpy's default argsort is unstable at that size and reorders ties."""
    from fairseq.data import data_utils

    lengths = np.random.default_rng(1).choice([8, 12, 16, 20, 30], size=600).tolist()
    dataset, items, *_ = make_dataset(lengths=lengths)
    with data_utils.numpy_seed(dataset.seed):
        shuffled = np.random.permutation(len(items)).tolist()
    expected = sorted(shuffled, key=lambda i: lengths[i])  # Python's sort is stable
    assert dataset.ordered_indices().tolist() == expected
    assert expected != sorted(range(len(items)), key=lambda i: (lengths[i], i))  # the shuffle shows in the ties
