"""The pmlm task on real fairseq-preprocess output: dictionary symbols, blocks, and the objectives of Table 6."""
import argparse

import numpy as np
import pytest
import torch

from palm_plugin.criterions.pmlm_ae_par import PseudoMaskedLMCriterion
from palm_plugin.data.symbols import MASK_SYMBOL, PSEUDO_SYMBOL
from palm_plugin.models.unilm import UniLMConfig, UniLMModel
from palm_plugin.modules.attention_masks import PseudoMaskKind as K
from palm_plugin.tasks.pmlm import PseudoMaskedLMConfig, PseudoMaskedLMTask
from palm_plugin.tasks.unilm_seq2seq import UniLMSeq2SeqConfig, UniLMSeq2SeqTask
from tests.conftest import binarize, run_cli


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pmlm")
    rng = np.random.default_rng(0)
    with open(directory / "train.txt", "w") as f:
        for _ in range(12):  # documents of 3 lines, separated by a blank line
            for _ in range(3):
                f.write(" ".join(f"w{i}" for i in rng.integers(20, size=rng.integers(8, 15))) + "\n")
            f.write("\n")
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", directory / "train.txt", "--destdir", directory / "bin",
            "--workers", "1")
    return directory / "bin"


def load(data_dir, objective, tokens_per_sample=24, **options):
    cfg = PseudoMaskedLMConfig(
        data=str(data_dir), objective=objective, tokens_per_sample=tokens_per_sample, seed=1, **options
    )
    task = PseudoMaskedLMTask.setup_task(cfg)
    task.load_dataset("train")
    return task, task.dataset("train")


def test_dictionary_gets_mask_then_pseudo(data_dir):
    task, _ = load(data_dir, "ae_par")
    d = task.dictionary
    assert d.index(MASK_SYMBOL) == task.mask_idx and d.index(PSEUDO_SYMBOL) == task.pseudo_idx
    assert task.pseudo_idx == len(d) - 1 and task.mask_idx < task.pseudo_idx  # <mask> may already be in dict.txt


def test_blocks_start_with_bos_and_appended_tokens_reuse_positions(data_dir):
    task, dataset = load(data_dir, "ae_par")
    assert task.max_positions() == 24
    for index in range(len(dataset)):
        item = dataset[index]
        n = dataset.size(index)
        assert n <= 24 and item["source"][0] == task.dictionary.bos()
        assert item["positions"].max() < n  # appended tokens reuse the text's positions


def test_lines_longer_than_a_block_are_cut_not_dropped(data_dir, caplog):
    """complete_doc never splits a line: lines of 9-16 tokens with blocks of 10 would exceed the positions."""
    with caplog.at_level("WARNING"):
        _, dataset = load(data_dir, "ae_par", tokens_per_sample=10)
    assert "lose their end" in caplog.text
    assert max(dataset.size(i) for i in range(len(dataset))) <= 10
    assert len(dataset) >= 36  # every line still gives a block
    # --sample-break-mode none packs text across lines: nothing is cut, and nothing to warn about
    caplog.clear()
    with caplog.at_level("WARNING"):
        _, dataset = load(data_dir, "ae_par", tokens_per_sample=10, sample_break_mode="none")
    assert "lose their end" not in caplog.text
    lines = (data_dir.parent / "train.txt").read_text().splitlines()
    assert int(dataset.dataset.sizes.sum()) == sum(len(line.split()) + 1 for line in lines)  # every token, [EOS]s


def test_a_line_one_token_longer_than_a_block_is_cut_and_one_that_fills_it_is_not(data_dir, caplog):
    """A block holds tokens_per_sample - 3 tokens of text ([SOS] and two [EOS] added): lines of exactly that many
    tokens (their [EOS] included) are whole; the longest lines, one token more, are cut and counted."""
    lines = [line.split() for line in (data_dir.parent / "train.txt").read_text().splitlines() if line]
    longest = max(len(words) + 1 for words in lines)
    at_longest = sum(len(words) + 1 == longest for words in lines)
    for tokens_per_sample, cut in ((longest + 3, 0), (longest + 2, at_longest)):
        caplog.clear()
        with caplog.at_level("WARNING"):
            _, dataset = load(data_dir, "ae_par", tokens_per_sample=tokens_per_sample)
        assert max(dataset.size(i) for i in range(len(dataset))) <= tokens_per_sample
        warned = f"{cut} lines are longer than a block ({longest - 1} tokens)"
        assert (warned in caplog.text) == bool(cut) and ("lose their end" in caplog.text) == bool(cut)


@pytest.mark.parametrize(
    "objective,ae,par,single_token_steps",
    [("ae_par", True, True, False), ("ae", True, False, False), ("par", False, True, False),
     ("ar", False, True, True), ("ae_ar", True, True, True)],
)
def test_objectives_of_table_6(data_dir, objective, ae, par, single_token_steps):
    task, dataset = load(data_dir, objective)
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    kinds, target = batch["net_input"]["kinds"], batch["target"]
    predicted = target.ne(task.dictionary.pad())
    assert bool((predicted & (kinds == K.CONTEXT)).any()) == ae
    assert bool((kinds == K.PSEUDO).any()) == par
    assert bool((predicted & (kinds == K.PSEUDO)).any()) == par
    lengths = []
    for index in range(len(dataset)):
        item = dataset[index]
        pseudo_steps = item["steps"][item["kinds"] == K.PSEUDO]
        lengths += torch.bincount(pseudo_steps).tolist() if len(pseudo_steps) else []
    if par:
        assert (max(lengths) == 1) == single_token_steps

    torch.manual_seed(0)
    model = UniLMModel(
        UniLMConfig(encoder_layers=1, encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=2,
                    max_positions=32, num_segments=2, relative_position_buckets=8),
        task.dictionary,
    )
    loss, sample_size, log = PseudoMaskedLMCriterion(argparse.Namespace(target_dictionary=task.dictionary))(model, batch)
    assert (log["ae_count"] > 0) == ae and (log["par_count"] > 0) == par
    assert sample_size == max(log["ae_count"], log["par_count"])  # the number of masked tokens
    assert float(loss.detach()) == pytest.approx(float(log["ae_loss"] + log["par_loss"]))


def test_mask_prob_sets_the_share_of_text_that_is_masked(data_dir):
    """--mask-prob: Algorithm 1 masks spans until at least that share of the maskable text tokens is masked (the
    last span may overshoot by up to --max-block-length - 1 tokens)."""
    task, dataset = load(data_dir, "ae_par", mask_prob=0.4)
    special = torch.tensor([task.dictionary.bos(), task.dictionary.eos()])
    for index in range(len(dataset)):
        item = dataset[index]
        text = item["kinds"] == K.CONTEXT
        maskable = int((~torch.isin(item["source"][text], special)).sum())
        masked = int((item["kinds"] == K.PSEUDO).sum())
        assert np.ceil(0.4 * maskable) <= masked < np.ceil(0.4 * maskable) + 6, index


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="fairseq-preprocess"):
        PseudoMaskedLMTask.setup_task(PseudoMaskedLMConfig(data=str(tmp_path), seed=1))


def test_fine_tuning_dictionary_lines_up_with_pre_training(data_dir, tmp_path):
    """unilm_seq2seq --pseudo-masks on the same dict.txt adds [M] and [P] at the same indices as pmlm, so a
    pre-trained checkpoint's embedding rows mean the same symbols when fine-tuning starts from it."""
    pre_training, _ = load(data_dir, "ae_par")
    for side in ("src", "tgt"):
        (tmp_path / f"dict.{side}.txt").write_text((data_dir / "dict.txt").read_text())
    fine_tuning = UniLMSeq2SeqTask.setup_task(UniLMSeq2SeqConfig(data=str(tmp_path), pseudo_masks=True, seed=1))
    assert fine_tuning.dictionary.symbols == pre_training.dictionary.symbols


def test_inputs_are_two_segments_of_contiguous_text(data_dir):
    """Section 2.2: the pre-training input is "[SOS] S1 [EOS] S2 [EOS]" with segment ids 0 / 1; S1 S2 is
    contiguous text of the corpus; appended [P] / original tokens take the segment (and position) of their token."""
    task, dataset = load(data_dir, "ae_par", tokens_per_sample=40)
    d = task.dictionary
    with open(data_dir.parent / "train.txt") as f:
        corpus = [d.index(w) for w in f.read().split()]  # the text without line breaks (blank lines: none)
    corpus_text = " " + " ".join(map(str, corpus)) + " "
    second_segments = 0
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            item = dataset[index]
            text = item["kinds"] == K.CONTEXT
            tokens, segments, positions = item["source"], item["segments"], item["positions"]
            # the text, with [M] / random replacements undone from the targets
            original = torch.where(item["target"][text] != d.pad(), item["target"][text], tokens[text])
            n = len(original)
            assert positions[text].tolist() == list(range(n))  # positions run on through both segments
            assert original[0] == d.bos() and original[-1] == d.eos()
            first_eos = int(torch.nonzero(segments[text] == 1)[0]) - 1 if (segments[text] == 1).any() else n - 1
            assert original[first_eos] == d.eos()
            assert segments[text].tolist() == [0] * (first_eos + 1) + [1] * (n - first_eos - 1)
            second_segments += int((segments[text] == 1).any())
            words = [t for t in original.tolist() if t not in (d.bos(), d.eos())]
            assert " " + " ".join(map(str, words)) + " " in corpus_text  # S1 S2 is contiguous text
            appended = ~text
            assert torch.equal(segments[appended], segments[text][positions[appended]])
    assert second_segments == 2 * len(dataset)  # every block has a second segment
    batch = dataset.collater([dataset[i] for i in range(4)])
    assert batch["net_input"]["segment_ids"].eq(1).any()


def test_epochs_cycle_through_colon_separated_shards(tmp_path):
    """DATA = a:b:c: epoch e reads shard (e - 1) % 3, the rule of fairseq's own tasks (translation, masked_lm)."""
    from fairseq.data import Dictionary

    from palm_plugin.data.monolingual import load_sentences

    dictionary = Dictionary()
    words = [dictionary.add_symbol(f"shard{index}") for index in range(3)]
    shards = []
    for index, word in enumerate(words):
        (tmp_path / f"s{index}").mkdir()
        binarize(tmp_path / f"s{index}" / "train", [[word]], dictionary)
        shards.append(str(tmp_path / f"s{index}"))
    read = [load_sentences(":".join(shards), "train", epoch, dictionary)[0][0].item() for epoch in range(1, 8)]
    assert read == [words[(epoch - 1) % 3] for epoch in range(1, 8)]


def test_a_split_binarized_in_parts_is_read_whole_when_combined(tmp_path):
    """fairseq-train loads its training split with combine=True: train, train1, train2 ... of one directory (a
    corpus binarized in parts, fairseq's convention) are read as one split, in that order; a split loaded without
    combine (validation) is its first part only."""
    from fairseq.data import Dictionary

    from palm_plugin.data.monolingual import load_sentences

    dictionary = Dictionary()
    parts = [[[dictionary.add_symbol(f"p{part}l{line}")] for line in range(lines)]
             for part, lines in enumerate((2, 3, 1))]
    for part, lines in enumerate(parts):
        binarize(tmp_path / f"train{part or ''}", lines, dictionary)
    parts = [[[*line, dictionary.eos()] for line in lines] for lines in parts]  # as read: each line ends with [EOS]
    combined = load_sentences(str(tmp_path), "train", 1, dictionary, combine=True)
    assert [combined[i].tolist() for i in range(len(combined))] == [line for lines in parts for line in lines]
    first = load_sentences(str(tmp_path), "train", 1, dictionary)
    assert [first[i].tolist() for i in range(len(first))] == parts[0]
    # the pmlm task passes combine on: its blocks hold every line of the three parts, or of the first only
    dictionary.save(str(tmp_path / "dict.txt"))
    task = PseudoMaskedLMTask.setup_task(PseudoMaskedLMConfig(data=str(tmp_path), tokens_per_sample=24, seed=1))
    for combine, lines in ((True, [line for lines in parts for line in lines]), (False, parts[0])):
        task.load_dataset("train", combine=combine)
        blocks = task.dataset("train").dataset
        assert [t for i in range(len(blocks)) for t in blocks[i].tolist()] == [t for line in lines for t in line]


def test_a_split_as_raw_text_is_encoded_with_the_tasks_dictionary(data_dir, tmp_path):
    """A text file at the split's own path (train, no .bin / .idx: fairseq's load_indexed_dataset reads it as its raw
    dataset implementation, encoding each line with the dictionary it is given) gives the blocks of the same text
    binarized by fairseq-preprocess."""
    (tmp_path / "dict.txt").write_text((data_dir / "dict.txt").read_text())
    (tmp_path / "train").write_text((data_dir.parent / "train.txt").read_text())
    blocks = [load(folder, "ae_par")[1].dataset for folder in (tmp_path, data_dir)]
    raw, binarized = ([b[i].tolist() for i in range(len(b))] for b in blocks)
    assert raw == binarized and len(raw) > 1


def test_blocks_of_single_lines_batch(data_dir):
    """--sample-break-mode eos: fairseq 0.12's TokenBlockDataset reads ``np.compat.long``, which numpy 2 removed
    (AttributeError: module 'numpy' has no attribute 'compat'); the plugin provides it
    (:mod:`palm_plugin.fixes.numpy_compat`)."""
    task, dataset = load(data_dir, "ae_par", sample_break_mode="eos", tokens_per_sample=40)
    assert len(dataset) == 48  # one block a line: 36 lines and the 12 blank lines between documents
    batch = dataset.collater([dataset[i] for i in range(4)])
    assert batch["net_input"]["src_tokens"].size(0) == 4 and batch["target"].ne(task.dictionary.pad()).any()
