"""Every task's batches as fairseq trains on them: unequal lengths, a BERT-size dictionary, sources and targets of
different lengths, and counts checked against the raw text.

Each task reads binarized files written here (a 30,522-symbol dictionary, BERT's size, and token ids drawn from all
of it) through its own ``setup_task`` and ``load_dataset``, with its default options, and batches all its examples
at once: ``continuation_pair``, ``pmlm``, ``unilm_pretraining``, ``unilm_seq2seq`` with and without
``--pseudo-masks``, and fairseq's ``translation`` (PALM's fine-tuning, sources padded on the left). For each:

* the batch's counts (``ntokens``, ``nsentences``, the predicted tokens) equal counts made from the raw sentences
  with the papers' rates, and the rows hold those sentences, padded on the side fairseq pads;
* the criterion's summed values (losses, ``sample_size``, counts) over the padded batch equal their sums over the
  examples run one at a time, unpadded: padding, the attention masks built from it and the criterion's selection of
  positions change nothing (models are the tiny archs, in eval mode);
* random replacements (BERT's 10%) are drawn from the whole vocabulary, not from a prefix of it.

A dictionary check that compares only a prefix of the symbols is tested on two such dictionaries too.
"""
import math

import numpy as np
import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterionConfig
from fairseq.data import Dictionary
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import OmegaConf

from palm_plugin.criterions.palm_mlm_lm import PalmMlmLmConfig
from palm_plugin.criterions.pmlm_ae_par import PseudoMaskedLMConfig as PmlmCriterionConfig
from palm_plugin.criterions.unilm_cloze import UniLMClozeConfig
from palm_plugin.data.symbols import MASK_SYMBOL, PSEUDO_SYMBOL
from palm_plugin.models.palm import PalmConfig, palm_tiny
from palm_plugin.models.unilm import UniLMConfig, unilm2_tiny, unilm_tiny
from palm_plugin.modules.attention_masks import Objective, PseudoMaskKind
from palm_plugin.modules.dictionary_check import DictionaryMismatchError, check_symbols, symbol_fingerprint
from palm_plugin.tasks.continuation_pair import ContinuationPairConfig, ContinuationPairTask
from palm_plugin.tasks.pmlm import PseudoMaskedLMConfig, PseudoMaskedLMTask
from palm_plugin.tasks.unilm_pretraining import UniLMPretrainingConfig, UniLMPretrainingTask
from palm_plugin.tasks.unilm_seq2seq import UniLMSeq2SeqConfig, UniLMSeq2SeqTask
from tests.conftest import binarize
from tests.test_learns_to_stop import model_config

VOCABULARY = 30522  # BERT's WordPiece vocabulary
# Six documents of two sentences; the first sentences (sources) and the second ones (targets) differ in length.
FIRST = (3, 17, 8, 25, 5, 12)
SECOND = (9, 2, 14, 4, 21, 6)


def bert_size_dictionary():
    d = Dictionary()
    for index in range(VOCABULARY - d.nspecial):
        d.add_symbol(f"w{index}")
    return d


def sentences(d, lengths, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(d.nspecial, len(d), n) for n in lengths]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The raw sentences, and both layouts on disk: monolingual (documents separated by a blank line) and parallel
    (first sentence -> second sentence)."""
    d = bert_size_dictionary()
    first, second = sentences(d, FIRST, seed=1), sentences(d, SECOND, seed=2)
    mono, pairs = tmp_path_factory.mktemp("monolingual"), tmp_path_factory.mktemp("parallel")
    d.save(str(mono / "dict.txt"))
    lines = []
    for a, b in zip(first, second):
        lines += [a, b, np.array([], dtype=np.int64)]
    binarize(str(mono / "train"), lines, d)
    for lang, side in (("src", first), ("tgt", second)):
        d.save(str(pairs / f"dict.{lang}.txt"))
        binarize(str(pairs / f"train.src-tgt.{lang}"), side, d)
    return {"first": first, "second": second, "monolingual": str(mono), "parallel": str(pairs)}


def criterion_config(config_class, name, **options):
    return OmegaConf.structured(config_class(_name=name, **options))


def build(case, corpus):
    """(task, its train dataset, model, criterion) of ``case``, each from its registered defaults."""
    if case == "continuation_pair":
        task = ContinuationPairTask.setup_task(OmegaConf.structured(ContinuationPairConfig(data=corpus["monolingual"],
                                                                                           seed=1)))
        arch, model_class, criterion = palm_tiny, PalmConfig, criterion_config(PalmMlmLmConfig, "palm_mlm_lm",
                                                                               mlm_weight=1.0)
    elif case == "pmlm":
        task = PseudoMaskedLMTask.setup_task(OmegaConf.structured(PseudoMaskedLMConfig(data=corpus["monolingual"],
                                                                                       seed=1)))
        arch, model_class, criterion = unilm2_tiny, UniLMConfig, criterion_config(PmlmCriterionConfig, "pmlm_ae_par")
    elif case == "unilm_pretraining":
        task = UniLMPretrainingTask.setup_task(OmegaConf.structured(UniLMPretrainingConfig(
            data=corpus["monolingual"], seed=1)))
        arch, model_class = unilm_tiny, UniLMConfig
        criterion = criterion_config(UniLMClozeConfig, "unilm_cloze", label_smoothing=0.1)
    elif case.startswith("unilm_seq2seq"):
        pseudo = case.endswith("pseudo_masks")
        cfg = UniLMSeq2SeqConfig(data=corpus["parallel"], seed=1, pseudo_masks=pseudo)
        if pseudo:
            cfg.source_segment, cfg.target_segment = 0, 1
        task = UniLMSeq2SeqTask.setup_task(OmegaConf.structured(cfg))
        arch, model_class = (unilm2_tiny if pseudo else unilm_tiny), UniLMConfig
        criterion = criterion_config(UniLMClozeConfig, "unilm_cloze", label_smoothing=0.1)
    else:
        task = TranslationTask.setup_task(OmegaConf.structured(TranslationConfig(  # fairseq's dataset defaults
            data=corpus["parallel"], source_lang="src", target_lang="tgt", train_subset="train", dataset_impl=None,
            required_seq_len_multiple=1)))
        arch, model_class = palm_tiny, PalmConfig
        criterion = criterion_config(LabelSmoothedCrossEntropyCriterionConfig, "label_smoothed_cross_entropy",
                                     label_smoothing=0.1, sentence_avg=False)
    task.load_dataset("train")
    torch.manual_seed(0)
    name = "palm" if model_class is PalmConfig else "unilm"
    model = task.build_model(model_config(model_class, arch, name)).eval()
    with torch.no_grad():  # larger weights than BERT's init: each context then gives clearly different predictions
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.15)
    return task, task.dataset("train"), model, task.build_criterion(criterion)


CASES = ["continuation_pair", "pmlm", "unilm_pretraining", "unilm_seq2seq", "unilm_seq2seq_pseudo_masks",
         "translation"]
# What each criterion logs as a sum over examples (a per-batch mean, such as palm_mlm_lm's loss, is not one).
SUMMED = {
    "palm_mlm_lm": ("mlm_loss", "lm_loss", "mlm_tokens", "ntokens", "nsentences"),
    "pmlm_ae_par": ("loss", "ae_loss", "par_loss", "ae_count", "par_count", "sample_size", "ntokens", "nsentences"),
    "unilm_cloze": ("nll_loss", "sample_size", "ntokens", "nsentences", "next_sentence_loss", "next_sentence_rows",
                    "next_sentence_correct"),
    "label_smoothed_cross_entropy": ("loss", "nll_loss", "sample_size", "ntokens", "nsentences"),
}


def share(rate, n):
    """The number of tokens a rate gives: the smallest count that reaches it (15% of 20 tokens is 3)."""
    return math.ceil(rate * n - 1e-9)


CRITERIA = {"continuation_pair": "palm_mlm_lm", "pmlm": "pmlm_ae_par", "translation": "label_smoothed_cross_entropy"}
COUNTED = {"palm_mlm_lm": "mlm_tokens", "pmlm_ae_par": "ae_count"}  # the criterion's count of predicted tokens


def non_padding(tokens, pad):
    return tokens.ne(pad).sum(1).tolist()


def expected_counts(case, corpus, batch, items, d):
    """Check the batch against the raw sentences; return the number of tokens the criterion must predict."""
    first, second = corpus["first"], corpus["second"]
    bos, eos, pad = d.bos(), d.eos(), d.pad()
    tokens = batch["net_input"]["src_tokens"]
    assert batch["nsentences"] == len(items) == len(first)
    if case == "continuation_pair":  # the pair of each document: source = first sentence, target = second
        order = [next(k for k, b in enumerate(second) if np.array_equal(item["target"][:-1].numpy(), b))
                 for item in items]
        assert sorted(order) == list(range(len(first)))
        assert non_padding(tokens, pad) == [len(first[k]) + 1 for k in order]
        assert batch["ntokens"] == sum(len(b) + 1 for b in second)
        for row, k in enumerate(order):  # padded on the right: source, then target and decoder input
            assert tokens[row, len(first[k])] == eos and tokens[row, len(first[k]) + 1:].eq(pad).all()
            kept = batch["mlm_target"][row, : len(first[k])].eq(pad)
            assert torch.equal(tokens[row, : len(first[k])][kept], torch.from_numpy(first[k])[kept])
            assert int((~kept).sum()) == share(0.15, len(first[k]))  # PALM 2.1: 15% of the context
            target = torch.tensor([*second[k], eos])
            assert torch.equal(batch["target"][row, : len(target)], target)
            assert torch.equal(batch["net_input"]["prev_output_tokens"][row, : len(target)],
                               torch.tensor([eos, *second[k]]))
        return sum(share(0.15, len(a)) for a in first)
    if case == "translation":  # fairseq's LanguagePairDataset: sources padded on the left, targets on the right
        order = batch["id"].tolist()
        assert non_padding(tokens, pad) == [len(first[k]) + 1 for k in order]
        for row, k in enumerate(order):
            assert torch.equal(tokens[row, tokens.size(1) - len(first[k]) - 1:], torch.tensor([*first[k], eos]))
            assert torch.equal(batch["target"][row, : len(second[k]) + 1], torch.tensor([*second[k], eos]))
        assert batch["ntokens"] == sum(len(b) + 1 for b in second)
        return sum(len(b) + 1 for b in second)
    if case.startswith("unilm_seq2seq"):
        order = batch["id"].tolist()
        pseudo = case.endswith("pseudo_masks")
        # [SOS] S1 [EOS] S2 [EOS] (+ one pseudo token per target token), padded on the right
        lengths = [len(first[k]) + 2 + (2 if pseudo else 1) * (len(second[k]) + 1) for k in order]
        assert non_padding(tokens, pad) == lengths
        assert batch["ntokens"] == sum(lengths)
        for row, k in enumerate(order):
            source_end, target = len(first[k]) + 2, torch.tensor([*second[k], eos])
            assert torch.equal(tokens[row, :source_end], torch.tensor([bos, *first[k], eos]))  # never noised
            labels = batch["target"][row]
            if pseudo:  # the labels sit on the pseudo tokens, after the target
                assert torch.equal(labels[source_end + len(target): source_end + 2 * len(target)], target)
                assert int(labels.ne(pad).sum()) == len(target)
            else:  # on the chosen target tokens only
                chosen = labels[source_end: source_end + len(target)].ne(pad)
                assert torch.equal(labels[source_end: source_end + len(target)][chosen], target[chosen])
                assert int(labels.ne(pad).sum()) == int(chosen.sum())
        # UniLMv2 predicts every target token from its pseudo token; UniLM 70% of S2 [EOS] (section 3.1)
        return sum(len(b) + 1 if pseudo else share(0.7, len(b) + 1) for b in second)
    words = [len(a) + len(b) for a, b in zip(first, second)]
    if case == "unilm_pretraining":  # one chunk per document: its text and 2 or 3 special tokens
        unidirectional = (Objective.LEFT_TO_RIGHT, Objective.RIGHT_TO_LEFT)
        for item in items:
            specials = 2 if item["objective"] in unidirectional else 3
            if item["next_sentence"] != 1:  # (a second segment taken from another document has its own length)
                assert len(item["tokens"]) == words[item["id"]] + specials
        assert batch["ntokens"] == sum(len(item["tokens"]) for item in items)
        return sum(share(0.15, int(((item["tokens"] != bos) & (item["tokens"] != eos)).sum())) for item in items)
    # pmlm: [SOS] S1 [EOS] S2 [EOS] of each document, then two tokens per masked one ([P] and the original)
    masked = [int((item["kinds"] == PseudoMaskKind.PSEUDO).sum()) for item in items]
    for item, m in zip(items, masked):
        n = words[item["id"]]
        assert 0.15 * n <= m < 0.15 * n + 6  # Algorithm 1: stops once 15% are masked, a span is at most 6
        assert len(item["source"]) == n + 3 + 2 * m
    assert non_padding(tokens, pad) == [len(item["source"]) for item in items]
    assert batch["ntokens"] == sum(len(item["source"]) for item in items)
    return sum(masked)  # each predicted at its [M] slot (AE) and at its [P] token (PAR)


@pytest.mark.parametrize("case", CASES)
def test_batch_counts_and_losses_equal_those_of_the_examples_alone(case, corpus):
    task, dataset, model, criterion = build(case, corpus)
    d = task.source_dictionary
    items = [dataset[i] for i in range(len(dataset))]
    batch = dataset.collater(items)
    assert len(set(non_padding(batch["net_input"]["src_tokens"], d.pad()))) >= 4  # the fixture has unequal rows
    predicted = expected_counts(case, corpus, batch, items, d)
    with torch.no_grad():
        _, _, together = criterion(model, batch)
        alone = [criterion(model, dataset.collater([item]))[2] for item in items]
    key = CRITERIA.get(case, "unilm_cloze")
    assert together[COUNTED.get(key, "sample_size")] == predicted, case
    if key == "pmlm_ae_par":
        assert together["par_count"] == predicted
    for field in SUMMED[key]:
        if field not in together:
            continue
        total = sum(float(log[field]) for log in alone)
        assert float(together[field]) == pytest.approx(total, rel=1e-5), f"{case}: {field}"


def replaced_tokens(case, item, d):
    """The ids that BERT's random replacement put into ``item`` (where a predicted token changed, not to [MASK])."""
    mask = d.index(MASK_SYMBOL)
    if case == "continuation_pair":
        noised, original = item["source"][:-1], item["mlm_target"][:-1]
    elif case == "pmlm":
        context = item["kinds"] == PseudoMaskKind.CONTEXT
        noised, original = item["source"][context], item["target"][context]
    elif case == "unilm_pretraining":
        noised, original = item["tokens"], item["target"]
    else:
        noised, original = item["noised_target"], item["target"]
    changed = original.ne(d.pad()) & noised.ne(original) & noised.ne(mask)
    return noised[changed].tolist()


@pytest.mark.parametrize("case", CASES[:5])
def test_random_replacements_come_from_the_whole_dictionary(case, corpus):
    task, dataset, _, _ = build(case, corpus)
    d = task.source_dictionary
    drawn = []
    for epoch in range(1, 400):
        dataset.set_epoch(epoch)
        drawn += [t for i in range(len(dataset)) for t in replaced_tokens(case, dataset[i], d)]
        if len(drawn) >= 40:
            break
    assert len(drawn) >= 40
    special = {d.index(MASK_SYMBOL), d.index(PSEUDO_SYMBOL)} - {d.unk()}
    assert min(drawn) >= d.nspecial and not special & set(drawn)
    # 40 uniform draws: the largest below 3/4 of the dictionary, or the smallest above 1/4, has odds of 1e-5
    assert max(drawn) > 0.75 * VOCABULARY and min(drawn) < 0.25 * VOCABULARY, (min(drawn), max(drawn))


def test_symbol_check_sees_a_difference_at_the_end_of_a_bert_size_dictionary():
    saved, other = bert_size_dictionary(), bert_size_dictionary()
    last = len(other) - 1
    other.symbols[last - 1], other.symbols[last] = other.symbols[last], other.symbols[last - 1]  # two rows swapped
    check_symbols({"fingerprint": symbol_fingerprint(saved)}, "fingerprint", saved)  # the same dictionary passes
    with pytest.raises(DictionaryMismatchError, match=f"2 of its {VOCABULARY} rows .* rows {last - 1} "):
        check_symbols({"fingerprint": symbol_fingerprint(saved)}, "fingerprint", other)


def test_the_symbol_fingerprint_is_the_one_saved_checkpoints_hold():
    """Checkpoints store the fingerprint and every later load compares it: a change of the hash (its function, its
    byte order, its width) would refuse every checkpoint saved before. The values of a small dictionary, pinned."""
    dictionary = Dictionary()
    for symbol in ("the", "cat", "[MASK]", "<pseudo>", "ü"):
        dictionary.add_symbol(symbol)
    assert symbol_fingerprint(dictionary).tolist() == [629868599, 1897380479, 738443795, 1874546426, 1400053561,
                                                       1569277365, 1071831769, 1159239934, 977442416]
