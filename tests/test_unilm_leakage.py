"""End-to-end leakage checks: a tiny UniLM trained through the real datasets, model and criterion.

Texts are built so that a token is predictable only through a copy of it at a known place:

* seq2seq, copy task (target = source): every target token is visible in the source, so the loss falls to ~0;
* seq2seq, "y y" target (i.i.d. tokens y, then the same y again): the first half can only be predicted by
  looking right (leakage), the second half by looking left (allowed): first half at chance, second half learned;
* left-to-right on "y y": same as above; right-to-left on "y y": the other way round.

Predicted tokens are always replaced by [MASK] here (``mask_token_prob=1``), so a token never sees itself; the
i.i.d. tokens are uniform over ``WORDS`` symbols, so chance is ``ln(WORDS)`` nats.
"""
import argparse
import math

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary, ListDataset

from palm_plugin.criterions.unilm_cloze import UniLMClozeCriterion
from palm_plugin.data.token_masking import TokenMaskingPolicy
from palm_plugin.data.unilm_pretraining_dataset import UniLMPretrainingDataset
from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset
from palm_plugin.models.unilm import UniLMConfig, UniLMModel, unilm_tiny
from palm_plugin.modules.attention_masks import Objective

WORDS = 12
HALF = 4
CHANCE = math.log(WORDS)
# A copy is unusable when it is itself masked (about 15% of the time), so a learned copy scores about
# 0.15 * CHANCE, not 0; anything below LEARNED is far from chance.
LEARNED = 1.0


def dictionary():
    d = Dictionary()
    for index in range(WORDS):
        d.add_symbol(f"w{index}")
    d.add_symbol("<mask>")
    return d


def random_words(rng, count, length, d):
    return rng.integers(d.nspecial, d.nspecial + WORDS, size=(count, length))


def indexed(rows, d):
    """Rows of token ids as a fairseq dataset of items ending with [EOS] (what fairseq-preprocess writes)."""
    items = [torch.tensor(list(row) + [d.eos()]) for row in rows]
    return ListDataset(items, np.array([len(item) for item in items]))


def train(dataset, d, steps=400, batch_size=32, seed=0):
    torch.manual_seed(seed)
    namespace = argparse.Namespace(dropout=0.0, attention_dropout=0.0)
    unilm_tiny(namespace)
    model = UniLMModel.build_model(UniLMConfig.from_namespace(namespace), argparse.Namespace(source_dictionary=d))
    criterion = UniLMClozeCriterion(argparse.Namespace(target_dictionary=d), label_smoothing=0.0)
    # 1e-3: at 2e-3 some seeds stay stuck at chance on the within-target copy (checked over seeds 1-4).
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(seed)
    model.train()
    for step in range(steps):
        dataset.set_epoch(step + 1)  # fresh masks every step
        batch = dataset.collater([dataset[int(i)] for i in rng.integers(len(dataset), size=batch_size)])
        loss, sample_size, _ = criterion(model, batch)
        optimizer.zero_grad()
        (loss / sample_size).backward()
        optimizer.step()
    return model.eval()


def losses_by_text_position(model, dataset, text_start, count=400):
    """Mean loss (nats) of the predicted tokens, by position inside the text (``text_start`` = index of its first
    token in the packed row), on ``count`` items of ``dataset`` (items the model never trained on)."""
    dataset.set_epoch(10_000)
    totals, counts = {}, {}
    with torch.no_grad():
        for start in range(0, count, 100):
            batch = dataset.collater([dataset[i] for i in range(start, start + 100)])
            target = batch["target"]
            predicted = target.ne(1)
            logits, _ = model(**batch["net_input"], masked_tokens=predicted)
            nll = torch.nn.functional.cross_entropy(logits, target[predicted], reduction="none")
            rows, columns = predicted.nonzero(as_tuple=True)
            for row, column, value in zip(rows.tolist(), columns.tolist(), nll.tolist()):
                position = column - int(text_start[row])
                totals[position] = totals.get(position, 0.0) + value
                counts[position] = counts.get(position, 0) + 1
    return {position: totals[position] / counts[position] for position in totals}


def mean(losses, positions):
    return float(np.mean([losses[p] for p in positions if p in losses]))


def seq2seq_dataset(sources, targets, d):
    return UniLMSeq2SeqDataset(
        indexed(sources, d), indexed(targets, d), d, max_source_positions=16, max_target_positions=16,
        masking=TokenMaskingPolicy(mask_prob=0.15, mask_token_prob=1.0, random_token_prob=0.0),
        mask_idx=d.index("<mask>"), source_segment=4, target_segment=5, seed=1,
    )


def test_seq2seq_copy_task_is_learned():
    d = dictionary()
    rng = np.random.default_rng(0)
    rows = random_words(rng, 3000, 2 * HALF, d)
    model = train(seq2seq_dataset(rows[:2600], rows[:2600], d), d)
    held_out = seq2seq_dataset(rows[2600:], rows[2600:], d)
    losses = losses_by_text_position(model, held_out, text_start=np.full(400, 2 * HALF + 2))
    assert mean(losses, range(2 * HALF)) < 0.2, losses


def test_seq2seq_target_cannot_see_its_future():
    d = dictionary()
    rng = np.random.default_rng(1)
    halves = random_words(rng, 3000, HALF, d)
    targets = np.concatenate([halves, halves], axis=1)  # y y
    sources = random_words(rng, 3000, HALF, d)  # independent of the target
    model = train(seq2seq_dataset(sources[:2600], targets[:2600], d), d)
    losses = losses_by_text_position(
        model, seq2seq_dataset(sources[2600:], targets[2600:], d), text_start=np.full(400, HALF + 2)
    )
    assert mean(losses, range(HALF)) > CHANCE - 0.1, losses  # i.i.d. tokens whose copy lies to the right
    assert mean(losses, range(HALF, 2 * HALF)) < LEARNED, losses  # copies of tokens to the left


def one_direction_dataset(rows, d, objective_probs):
    # One document per row: an empty item (only [EOS]) separates documents.
    items = []
    for row in rows:
        items += [list(row), []]
    return UniLMPretrainingDataset(
        indexed(items, d), d, tokens_per_sample=2 * HALF + 3,
        masking=TokenMaskingPolicy(mask_prob=0.15, mask_token_prob=1.0, random_token_prob=0.0),
        mask_idx=d.index("<mask>"), seed=1, objective_probs=objective_probs,
    )


@pytest.mark.parametrize("direction", ["left_to_right", "right_to_left"])
def test_unidirectional_objectives_cannot_see_the_other_side(direction):
    d = dictionary()
    rng = np.random.default_rng(2)
    halves = random_words(rng, 3000, HALF, d)
    rows = np.concatenate([halves, halves], axis=1)
    probs = (0, 0, 1, 0) if direction == "left_to_right" else (0, 0, 0, 1)
    model = train(one_direction_dataset(rows[:2600], d, probs), d)
    held_out = one_direction_dataset(rows[2600:], d, probs)
    objective = Objective.LEFT_TO_RIGHT if direction == "left_to_right" else Objective.RIGHT_TO_LEFT
    assert {held_out[i]["objective"] for i in range(20)} == {objective}
    losses = losses_by_text_position(model, held_out, text_start=np.ones(400, dtype=int))
    first, second = mean(losses, range(HALF)), mean(losses, range(HALF, 2 * HALF))
    if direction == "left_to_right":
        assert first > CHANCE - 0.1 and second < LEARNED, losses
    else:
        assert second > CHANCE - 0.1 and first < LEARNED, losses
