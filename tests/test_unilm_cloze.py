"""``unilm_cloze`` against an independent computation of its loss, on a real pre-training batch.

The reference runs each example alone and unpadded, with a mask written out from the definitions of section 2.2
(not :mod:`palm_plugin.modules.attention_masks`), and computes in base 2 per predicted token: the cross-entropy
against the label-smoothed target distribution (gold token 1 - eps, every other token eps / (V - 1), the
distribution of fairseq's ``label_smoothed_nll_loss``), plus, in pre-training, the next sentence prediction
cross-entropy per bidirectional row (section 2.3).
"""
import argparse
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fairseq.logging import metrics
from fairseq.tasks import FairseqTask

from palm_plugin.criterions.unilm_cloze import UniLMClozeCriterion
from palm_plugin.models.unilm import UniLMConfig, UniLMModel
from palm_plugin.data.token_masking import TokenMaskingPolicy
from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset
from palm_plugin.modules.attention_masks import Objective
from tests.test_unilm_leakage import dictionary as small_dictionary
from tests.test_unilm_leakage import indexed
from tests.test_unilm_pretraining import build as build_pretraining_dataset


def forward_one(model, tokens, segments, mask):
    """LM logits ``(T, V)`` and next-sentence logits ``(2,)`` of one unpadded example under an explicit ``(T, T)``
    mask. The only place the test touches the model's inputs."""
    logits, extra = model(tokens[None], segment_ids=segments[None], attention_mask=mask[None], next_sentence=True)
    return logits[0], extra["next_sentence_logits"][0]


def mask_of(objective, length, source_length):
    """Section 2.2, entry by entry: may query i attend to key j?"""
    def visible(i, j):
        if objective == Objective.BIDIRECTIONAL:
            return True
        if objective == Objective.LEFT_TO_RIGHT:
            return j <= i
        if objective == Objective.RIGHT_TO_LEFT:
            return j >= i
        # seq2seq: the source ([SOS] S1 [EOS]) to everyone; the target to later target tokens and itself
        return j < source_length or (i >= source_length and j <= i)

    return torch.tensor([[visible(i, j) for j in range(length)] for i in range(length)])


def peaked_model(dictionary, seed=0):
    """unilm_tiny with weights large enough for peaked predictions: near the uniform distribution of a fresh
    BERT initialisation, label smoothing would hardly change the loss."""
    torch.manual_seed(seed)
    cfg = UniLMConfig(encoder_layers=2, encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4,
                      dropout=0.0, attention_dropout=0.0, max_positions=64, num_segments=6)
    model = UniLMModel(cfg, dictionary)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
        model.lm_head.bias.normal_(0, 3.0)
    return model.eval()


def logged(criterion_class, logging_output):
    """What fairseq prints: the criterion's reduce_metrics over one logging output."""
    with metrics.aggregate() as aggregator:
        criterion_class.reduce_metrics([logging_output])
        return aggregator.get_smoothed_values()


def reference_losses(model, examples, pad, eps):
    """(cloze bits per predicted token with label smoothing eps, nll bits per predicted token, NSP bits per
    bidirectional row or None, NSP rows whose most probable class is the label), from ``examples``
    (:func:`pretraining_example`, :func:`seq2seq_example`) one by one."""
    cloze = nll = next_sentence = 0.0
    predicted = bidirectional = correct = 0
    for example in examples:
        tokens, target = example["tokens"], example["target"]
        mask = mask_of(example["objective"], len(tokens), example["source_length"])
        with torch.no_grad():
            logits, next_logits = forward_one(model, tokens, example["segments"], mask)
        vocabulary = logits.size(-1)
        for t in range(len(tokens)):
            gold = int(target[t])
            if gold == pad:
                continue
            smoothed = torch.full((vocabulary,), eps / (vocabulary - 1), dtype=torch.float64)
            smoothed[gold] = 1 - eps
            log_probs = F.log_softmax(logits[t].double(), -1)
            cloze -= float((smoothed * log_probs).sum())
            nll -= float(log_probs[gold])
            predicted += 1
        if example["next_sentence"] != -1:
            next_sentence -= float(F.log_softmax(next_logits.double(), -1)[example["next_sentence"]])
            bidirectional += 1
            correct += int(next_logits.argmax()) == example["next_sentence"]
    bits = math.log(2)
    next_sentence = next_sentence / bidirectional / bits if bidirectional else None
    return cloze / predicted / bits, nll / predicted / bits, next_sentence, correct


def pretraining_example(item):
    return dict(item, objective=Objective(item["objective"]))


def seq2seq_example(item, pad):
    """``[SOS] S1 [EOS]`` then the corrupted ``S2 [EOS]``, segments 4 / 5, the chosen target tokens to predict."""
    source, target = item["source"], item["target"]
    return {
        "tokens": torch.cat([source, item["noised_target"]]),
        "segments": torch.cat([torch.full_like(source, 4), torch.full_like(target, 5)]),
        "objective": Objective.SEQ2SEQ,
        "source_length": len(source),
        "target": torch.cat([torch.full_like(source, pad), target.masked_fill(~item["selected"], pad)]),
        "next_sentence": -1,
    }


class _Task:
    def __init__(self, dictionary):
        self.target_dictionary = dictionary


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_pretraining_loss_equals_an_independent_computation(eps):
    dictionary, dataset = build_pretraining_dataset()
    dataset.set_epoch(2)
    indices = list(range(12))
    items = [dataset[i] for i in indices]
    # The batch mixes the four objectives, both NSP labels and padding.
    assert {item["objective"] for item in items} == set(Objective)
    assert {item["next_sentence"] for item in items} == {-1, 0, 1}
    assert len({len(item["tokens"]) for item in items}) > 1
    sample = dataset.collater(items)
    model = peaked_model(dictionary)
    criterion = UniLMClozeCriterion(_Task(dictionary), label_smoothing=eps)
    with torch.no_grad():
        loss, sample_size, logging_output = criterion(model, sample)
    values = logged(UniLMClozeCriterion, logging_output)

    cloze, nll, next_sentence, correct = reference_losses(model, map(pretraining_example, items), dictionary.pad(), eps)
    assert sample_size == sum(int(item["target"].ne(dictionary.pad()).sum()) for item in items)
    assert values["nll_loss"] == pytest.approx(nll, abs=2e-3)  # logged values are rounded to 3 decimals
    assert values["next_sentence_loss"] == pytest.approx(next_sentence, abs=2e-3)
    assert logging_output["next_sentence_correct"] == correct != logging_output["next_sentence_rows"] - correct
    assert logging_output["ntokens"] == sample["ntokens"]  # fairseq's words-per-batch
    # fairseq's task logs the batch size (bsz) from the criterion's nsentences: the 12 rows of the batch
    with metrics.aggregate() as aggregator:
        FairseqTask(None).reduce_metrics([logging_output], criterion)
        assert aggregator.get_smoothed_values()["bsz"] == len(indices)
    assert values["loss"] == pytest.approx(cloze + next_sentence, abs=2e-3)
    # unrounded: the loss the optimiser sees is the sum of both means, times the number of predicted tokens
    assert float(loss) / sample_size / math.log(2) == pytest.approx(cloze + next_sentence, rel=1e-5)
    # The test can tell the terms apart: each changes the loss by ten times the tolerance or more.
    assert next_sentence > 0.02
    if eps:
        assert abs(cloze - nll) > 0.02


def test_fine_tuning_loss_equals_an_independent_computation():
    """Seq2seq fine-tuning (section 2.5, label smoothing 0.1): no next sentence term; the source is never predicted."""
    d = small_dictionary()
    rng = np.random.default_rng(0)
    sources = indexed([rng.integers(d.nspecial, len(d) - 1, size=n) for n in (3, 7, 5, 9)], d)
    targets = indexed([rng.integers(d.nspecial, len(d) - 1, size=n) for n in (6, 2, 8, 4)], d)
    dataset = UniLMSeq2SeqDataset(
        sources, targets, d, max_source_positions=16, max_target_positions=16,
        masking=TokenMaskingPolicy(mask_prob=0.7), mask_idx=d.index("<mask>"), source_segment=4, target_segment=5,
        seed=1,
    )
    items = [dataset[i] for i in range(4)]
    sample = dataset.collater(items)
    model = peaked_model(d)
    criterion = UniLMClozeCriterion(_Task(d), label_smoothing=0.1)
    with torch.no_grad():
        loss, sample_size, logging_output = criterion(model, sample)
    values = logged(UniLMClozeCriterion, logging_output)

    cloze, nll, next_sentence, _ = reference_losses(model, [seq2seq_example(i, d.pad()) for i in items], d.pad(), 0.1)
    assert next_sentence is None and "next_sentence_loss" not in values
    assert sample_size == sum(int(item["selected"].sum()) for item in items)
    assert values["nll_loss"] == pytest.approx(nll, abs=2e-3)
    assert values["loss"] == pytest.approx(cloze, abs=2e-3)
    assert float(loss) / sample_size / math.log(2) == pytest.approx(cloze, rel=1e-5)
    assert abs(cloze - nll) > 0.02


@pytest.mark.parametrize("eps", [-0.1, 1.0, 1.5])
def test_label_smoothing_outside_0_1_is_refused_naming_the_value(eps):
    """A Python caller gets the command line's check: eps must be in [0, 1) (at 1 or more the smoothed target gives the
    gold token no weight: the loss rewards wrong tokens), and the error names the value and the range. Values just
    inside the range build."""
    d = small_dictionary()
    with pytest.raises(ValueError, match=rf"--label-smoothing {eps}: outside \[0, 1\)"):
        UniLMClozeCriterion(_Task(d), label_smoothing=eps)
    for allowed in (0.0, 0.999):
        assert UniLMClozeCriterion(_Task(d), label_smoothing=allowed).eps == allowed
