"""UniLM pre-training data (objective mix, segments, next sentence prediction, masking) and a real fairseq-train."""
import numpy as np
import pytest
import torch
from fairseq.data import Dictionary, ListDataset
from scipy import stats

from palm_plugin.data.token_masking import TokenMaskingPolicy
from palm_plugin.data.unilm_pretraining_dataset import NOT_NEXT, UniLMPretrainingDataset, sentence_chunks
from palm_plugin.modules.attention_masks import Objective
from tests.conftest import REPO

DOCUMENTS, WORDS_PER_DOCUMENT = 40, 5


def corpus():
    """40 documents of 3-5 sentences; document k only uses its own 5 words, so any token tells its document."""
    d = Dictionary()
    for k in range(DOCUMENTS):
        for w in range(WORDS_PER_DOCUMENT):
            d.add_symbol(f"d{k}w{w}")
    mask = d.add_symbol("<mask>")
    rng = np.random.default_rng(0)
    items = []
    for k in range(DOCUMENTS):
        first = d.index(f"d{k}w0")
        for _ in range(rng.integers(3, 6)):
            items.append(list(rng.integers(first, first + WORDS_PER_DOCUMENT, size=rng.integers(3, 7))) + [d.eos()])
        items.append([d.eos()])  # the empty line between documents
    items = [torch.tensor(item) for item in items]
    return d, mask, ListDataset(items, np.array([len(i) for i in items]))


def document_of(d, token):
    return (token - d.nspecial) // WORDS_PER_DOCUMENT


def build(tokens_per_sample=24, **kwargs):
    d, mask, sentences = corpus()
    policy = TokenMaskingPolicy(mask_prob=0.15, span_length_probs=(0.8, 0.1, 0.1))
    return d, UniLMPretrainingDataset(sentences, d, tokens_per_sample, policy, mask, seed=3, **kwargs)


def test_chunks_stay_inside_documents_and_the_budget():
    """Chunks by hand, on documents of unequal lengths; a corpus with no usable text gives empty integer ranges (not
    numpy's float default for an empty array), so indexing the corpus with them still works."""
    sizes = np.array([4, 3, 1, 6, 6, 6, 1, 30, 1, 2, 1, 3])  # items include [EOS]; 1 = document break
    starts, ends, lengths, documents = sentence_chunks(sizes, budget=10)
    # Sentences are added while they fit; a single 1-token sentence (size 2) makes no chunk, a 2-token one (A and B
    # of one token each) does.
    assert starts.tolist() == [0, 3, 5, 7, 11]
    assert ends.tolist() == [2, 5, 6, 8, 12]
    assert lengths.tolist() == [5, 10, 5, 10, 2]  # the 29-token sentence is cut to the budget
    assert documents.tolist() == [0, 1, 1, 2, 4]
    assert (sizes[starts] > 1).all()  # the ranges index the corpus's items: a chunk starts on a sentence
    # Documents of one token each (a chunk needs two text tokens): four empty ranges, which still index the corpus.
    sizes = np.array([2, 1, 2, 1, 1, 2])
    for empty in sentence_chunks(sizes, budget=10):
        assert empty.tolist() == [] and sizes[empty].tolist() == []


def test_objective_mix_segments_and_next_sentence_prediction():
    d, dataset = build()
    counts = np.zeros(4)
    next_labels = []
    for index in range(len(dataset)):
        for epoch in range(1, 41):
            dataset.set_epoch(epoch)
            item = dataset[index]
            objective = Objective(item["objective"])
            counts[objective] += 1
            original = torch.where(item["target"].ne(d.pad()), item["target"], item["tokens"])
            segments = item["segments"].tolist()
            length = len(original)
            assert original[0] == d.bos() and original[-1] == d.eos()
            if objective in (Objective.LEFT_TO_RIGHT, Objective.RIGHT_TO_LEFT):
                assert segments == [2 if objective == Objective.LEFT_TO_RIGHT else 3] * length
                assert (original[1:-1] != d.eos()).all()
                continue
            source = item["source_length"]
            assert original[source - 1] == d.eos() and (original[1 : source - 1] != d.eos()).all()
            first, second = (0, 1) if objective == Objective.BIDIRECTIONAL else (4, 5)
            assert segments == [first] * source + [second] * (length - source)
            # B comes from A's document unless NSP drew a random text (then from another document).
            a_document = document_of(d, int(original[1]))
            b_documents = {document_of(d, int(t)) for t in original[source:-1]}
            if objective == Objective.BIDIRECTIONAL:
                next_labels.append(item["next_sentence"])
                assert b_documents == ({a_document} if item["next_sentence"] == 0 else b_documents - {a_document})
            else:
                assert item["next_sentence"] == -1 and b_documents == {a_document}
    # Section 2.4: 1/3 bidirectional, 1/3 seq2seq, 1/6 left-to-right, 1/6 right-to-left (chi-square test).
    expected = counts.sum() * np.array([1 / 3, 1 / 6, 1 / 6, 1 / 3])  # in Objective order
    assert stats.chisquare(counts, expected).pvalue > 1e-3, counts
    assert not stats.chisquare(counts, counts.sum() * np.full(4, 0.25)).pvalue > 1e-3  # the test can tell
    assert stats.binomtest(int(np.sum(np.array(next_labels) == NOT_NEXT)), len(next_labels), 0.5).pvalue > 1e-3


def test_masking_is_reproducible_and_follows_the_policy():
    d, dataset = build()
    dataset.set_epoch(1)
    first = [dataset[i] for i in range(len(dataset))]
    again = [dataset[i] for i in range(len(dataset))]
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(first, again))
    dataset.set_epoch(2)
    assert any(not torch.equal(a["tokens"], dataset[i]["tokens"]) for i, a in enumerate(first))
    predicted = text = masked = runs = 0
    for epoch in range(1, 21):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            item = dataset[index]
            chosen = item["target"].ne(d.pad())
            special = (item["tokens"] == d.bos()) | (item["tokens"] == d.eos())
            assert not (chosen & special).any()
            n = int((~special).sum())
            assert int(chosen.sum()) == int(np.ceil(0.15 * n))
            predicted += int(chosen.sum())
            text += n
            masked += int((item["tokens"][chosen] == d.index("<mask>")).sum())
            runs += int((chosen[1:] & chosen[:-1]).sum())
    assert abs(masked / predicted - 0.8) < 0.03
    assert runs > 0  # bigrams and trigrams happen


def write_documents(path, rng, documents=30):
    words = [f"w{i}" for i in range(40)]
    lines = []
    for _ in range(documents):
        for _ in range(rng.integers(2, 6)):
            lines.append(" ".join(rng.choice(words, size=rng.integers(4, 12))))
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_fairseq_train_unilm_pretraining(tmp_path, cli):
    rng = np.random.default_rng(0)
    write_documents(tmp_path / "train.txt", rng)
    write_documents(tmp_path / "valid.txt", rng, documents=6)
    data = tmp_path / "bin"
    cli("fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "train.txt", "--validpref",
        tmp_path / "valid.txt", "--destdir", data, "--workers", "1")
    result = cli("fairseq-train", data, "--user-dir", REPO / "palm_plugin", "--task", "unilm_pretraining", "--arch",
                 "unilm_tiny", "--criterion", "unilm_cloze", "--tokens-per-sample", "32", "--optimizer", "adam",
                 "--lr", "1e-3", "--batch-size", "8", "--max-update", "4", "--cpu", "--save-dir", tmp_path / "ckpt",
                 "--log-format", "simple", "--log-interval", "1", "--no-epoch-checkpoints")
    log = result.stdout + result.stderr
    assert "num_updates 4" in log
    assert "next_sentence_loss" in log and "nll_loss" in log
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").exists()
    refused = cli("fairseq-train", data, "--user-dir", REPO / "palm_plugin", "--task", "unilm_pretraining", "--arch",
                  "unilm2_tiny", "--criterion", "unilm_cloze", "--optimizer", "adam", "--lr", "1e-3", "--batch-size",
                  "8", "--max-update", "1", "--cpu", "--save-dir", tmp_path / "ckpt2", check=False)
    assert refused.returncode != 0 and "segment ids 0-5" in refused.stderr


def test_random_replacement_never_draws_the_pseudo_symbol():
    """A converted UniLMv2 dictionary holds <pseudo>: random replacement must not put it into the text (here every
    predicted token is replaced at random, about 27 of the draws would be <pseudo> otherwise)."""
    d, mask, sentences = corpus()
    pseudo = d.add_symbol("<pseudo>")
    d.add_symbol("d_last")  # a regular type after it: the draws span the whole dictionary
    policy = TokenMaskingPolicy(mask_prob=0.15, mask_token_prob=0.0, random_token_prob=1.0)
    dataset = UniLMPretrainingDataset(sentences, d, 24, policy, mask, seed=3)
    drawn = []
    for epoch in range(1, 41):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            item = dataset[index]
            selected = item["target"].ne(d.pad())
            drawn.append(item["tokens"][selected])
    drawn = torch.cat(drawn)
    assert len(drawn) > 4000 and d.index("d_last") in drawn.tolist()
    assert pseudo not in drawn.tolist() and mask not in drawn.tolist()


def test_batches_are_ordered_by_length_in_a_seeded_shuffle():
    """fairseq batches consecutive indices of ``ordered_indices``: all of them once, sizes not decreasing, and the
    order of equal sizes drawn from numpy's generator (which fairseq seeds per epoch): the permutation drawn, sorted
    stably by size, as fairseq's LanguagePairDataset sorts (numpy's default argsort reorders ties at 56 chunks)."""
    _, dataset = build()
    orders = []
    for seed in (1, 2):
        np.random.seed(seed)
        shuffled = np.random.permutation(len(dataset)).tolist()
        np.random.seed(seed)
        orders.append(dataset.ordered_indices())
        assert orders[-1].tolist() == sorted(shuffled, key=lambda i: dataset.sizes[i])  # Python's sort is stable
    for order in orders:
        assert sorted(order.tolist()) == list(range(len(dataset)))
        assert (np.diff(dataset.sizes[order]) >= 0).all()
    assert orders[0].tolist() != orders[1].tolist()


def test_a_and_b_are_cut_at_every_sentence_boundary_of_the_chunk():
    """Section 2.4: segments A and B are text spans of the chunk; with several sentences the cut falls between
    two of them, and each boundary gets its turn."""
    d, dataset = build()
    checked = 0
    for index in range(len(dataset)):
        lengths = [len(s) for s in dataset._sentences(index)]
        text_length = min(sum(lengths), dataset.budget)
        boundaries = {int(b) for b in np.cumsum(lengths)[:-1] if b < text_length}
        if len(boundaries) < 2:
            continue
        cuts = set()
        for epoch in range(1, 80):
            dataset.set_epoch(epoch)
            item = dataset[index]
            if Objective(item["objective"]) in (Objective.BIDIRECTIONAL, Objective.SEQ2SEQ):
                cuts.add(item["source_length"] - 2)  # [SOS] A [EOS]
        assert cuts == boundaries, index
        checked += 1
    assert checked >= 10


def test_a_one_sentence_chunk_is_cut_between_any_two_of_its_tokens_and_sizes_bound_the_items():
    """With no sentence boundary the A/B cut falls inside the sentence, at each of its inner positions alike.
    fairseq batches by num_tokens (--max-tokens): it must bound every item's length, equal it for A [EOS] B."""
    d = Dictionary()
    words = [d.add_symbol(f"w{i}") for i in range(20)]
    mask = d.add_symbol("<mask>")
    items = [torch.tensor([*words[k : k + 6], d.eos()]) for k in (0, 7)]
    items.insert(1, torch.tensor([d.eos()]))  # two one-sentence documents
    sentences = ListDataset(items, np.array([len(i) for i in items]))
    policy = TokenMaskingPolicy(mask_prob=0.15)
    dataset = UniLMPretrainingDataset(sentences, d, 24, policy, mask, seed=5)
    assert len(dataset) == 2
    cuts = np.zeros(6, dtype=int)
    for epoch in range(1, 400):
        dataset.set_epoch(epoch)
        for index in range(2):
            item = dataset[index]
            assert len(item["tokens"]) <= dataset.num_tokens(index) == dataset.size(index)
            assert dataset.num_tokens_vec(np.array([index])).tolist() == [dataset.num_tokens(index)]
            if Objective(item["objective"]) in (Objective.BIDIRECTIONAL, Objective.SEQ2SEQ):
                cuts[item["source_length"] - 2] += 1
                if item["next_sentence"] != NOT_NEXT:
                    assert len(item["tokens"]) == dataset.num_tokens(index) == 6 + 3
    assert cuts[0] == 0 and cuts[1:].sum() > 250
    # equal chances of the 5 inner cuts: a chi-square test, far from significant unless one is missing or favoured
    assert stats.chisquare(cuts[1:]).pvalue > 1e-3, cuts


def test_the_smallest_sample_holds_sos_a_eos_b_eos():
    d, mask, sentences = corpus()
    policy = TokenMaskingPolicy(mask_prob=0.15)
    with pytest.raises(ValueError, match=r"--tokens-per-sample must be at least 5 \(\[SOS\] A \[EOS\] B \[EOS\]\)"):
        UniLMPretrainingDataset(sentences, d, 4, policy, mask, seed=3)
    dataset = UniLMPretrainingDataset(sentences, d, 5, policy, mask, seed=3)
    assert max(len(dataset[index]["tokens"]) for index in range(len(dataset))) <= 5
    # B is a single token here: next sentence prediction still swaps it for another document's token half the time.
    labels = []
    for index in range(len(dataset)):
        item = dataset[index]
        if Objective(item["objective"]) == Objective.BIDIRECTIONAL:
            labels.append(item["next_sentence"])
            original = torch.where(item["target"] != d.pad(), item["target"], item["tokens"]).tolist()
            assert len(original) == 5  # [SOS] a [EOS] b [EOS]
            same = document_of(d, original[1]) == document_of(d, original[3])
            assert same == (item["next_sentence"] != NOT_NEXT), (original, item["next_sentence"])
    assert len(labels) > 10 and stats.binomtest(labels.count(NOT_NEXT), len(labels), 0.5).pvalue > 1e-3, labels


def test_the_task_refuses_a_model_with_fewer_segment_types_than_its_six_objective_segments():
    """The pre-training data marks each row's objective with segment ids 0-5: a model of 6 segment types is built,
    one of 5 is refused at build, naming the option to change."""
    import argparse

    from palm_plugin.models.unilm import unilm_tiny
    from palm_plugin.tasks.unilm_pretraining import UniLMPretrainingConfig, UniLMPretrainingTask

    def model_config(segments):  # what fairseq-train gives the task: --arch unilm_tiny --num-segments N
        namespace = argparse.Namespace(num_segments=segments)
        unilm_tiny(namespace)
        namespace.arch = "unilm"
        return namespace

    d, _, _ = corpus()
    task = UniLMPretrainingTask(UniLMPretrainingConfig(data="unused"), d)
    assert task.build_model(model_config(6)).cfg.num_segments == 6
    with pytest.raises(ValueError, match="the model has 5 segment types: use a unilm_\\* arch .* or --num-segments 6"):
        task.build_model(model_config(5))


@pytest.mark.parametrize("span_length_probs, least, most", [("0,1", 0.8, 1.0), ("1", 0.15, 0.35)])
def test_span_length_probs_shapes_the_masked_positions_of_the_tasks_data(monkeypatch, span_length_probs, least, most):
    """--span-length-probs 0,1 masks bigrams: nearly every masked token has a masked neighbour (spans are cut only at
    a sentence's end or at the budget); with 1, positions are drawn one at a time, and ~2 * 15% of them have one."""
    from palm_plugin.tasks import unilm_pretraining

    d, _, sentences = corpus()
    monkeypatch.setattr(unilm_pretraining, "load_sentences", lambda *args: sentences)  # the data the task reads
    cfg = unilm_pretraining.UniLMPretrainingConfig(data="unused", seed=3, span_length_probs=span_length_probs)
    task = unilm_pretraining.UniLMPretrainingTask(cfg, d)
    task.load_dataset("train")
    dataset = task.datasets["train"]
    masked = paired = 0
    for epoch in (1, 2, 3):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            chosen = dataset[index]["target"].ne(d.pad())
            neighbour = torch.zeros_like(chosen)
            neighbour[1:] |= chosen[:-1]
            neighbour[:-1] |= chosen[1:]
            masked += int(chosen.sum())
            paired += int((chosen & neighbour).sum())
    assert least < paired / masked < most, paired / masked
