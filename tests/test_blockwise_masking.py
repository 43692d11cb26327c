"""Blockwise masking (UniLMv2 Algorithm 1): statistics over many draws, structure of the spans, determinism."""
import math
import random
from collections import Counter

import numpy as np
import pytest

from palm_plugin.data.blockwise_masking import NOT_MASKED, BlockwiseMaskingPolicy
from palm_plugin.data.token_masking import sample_rng


def spans_of(steps):
    """{step: sorted positions} of a steps array."""
    return {int(s): np.flatnonzero(steps == s) for s in np.unique(steps) if s != NOT_MASKED}


def literal_algorithm_1(n, rnd, mask_prob=0.15, block_prob=0.4):
    """Algorithm 1 of the paper transcribed line by line (one draw at a time, Python's own generator), on a
    sequence whose positions are all maskable; returns the accepted span lengths."""
    masked = [False] * n
    lengths = []
    while sum(lengths) < mask_prob * n - 1e-9:
        p = rnd.randint(0, n - 1)
        span = rnd.randint(2, 6) if rnd.random() < block_prob else 1
        if p + span <= n and not any(masked[p : p + span]):
            masked[p : p + span] = [True] * span
            lengths.append(span)
    return lengths


def draw_many(policy, maskable, count, seed=1):
    return [policy.factorization_steps(maskable, sample_rng(seed, 1, index)) for index in range(count)]


def test_masked_share_reaches_budget_and_overshoots_by_less_than_a_span():
    policy = BlockwiseMaskingPolicy()
    for n in (1, 2, 7, 20, 100, 512):
        budget = policy.budget(n)
        assert budget == math.ceil(round(0.15 * n, 9))
        counts = [int((steps != NOT_MASKED).sum()) for steps in draw_many(policy, np.ones(n, bool), 300)]
        assert min(counts) >= budget
        assert max(counts) <= budget + 5
    # 100 tokens: budget 15 (not 16, despite 0.15 * 100 = 15.000000000000002 in floating point)
    assert policy.budget(100) == 15
    counts = [int((s != NOT_MASKED).sum()) for s in draw_many(policy, np.ones(512, bool), 500)]
    # close to 15%: the overshoot is the part of the last span past the budget, about one token on average
    assert 0.15 <= np.mean(counts) / 512 < 0.16


def test_spans_are_contiguous_disjoint_and_inside_the_maskable_region():
    policy = BlockwiseMaskingPolicy()
    maskable = np.ones(60, bool)
    maskable[[0, 17, 18, 40, 59]] = False  # BOS, a document separator, EOS ...
    for steps in draw_many(policy, maskable, 400):
        assert not (steps[~maskable] != NOT_MASKED).any()
        spans = spans_of(steps)
        assert sorted(spans) == list(range(len(spans)))  # steps numbered 0..K-1
        for positions in spans.values():
            assert 1 <= len(positions) <= 6
            assert (np.diff(positions) == 1).all()  # one contiguous span per step (disjoint by construction)


def test_span_lengths_before_acceptance_effects():
    """On a long sequence with a tiny budget almost no draw is rejected: accepted lengths follow the draw
    distribution, 60% single tokens and 8% each for lengths 2..6."""
    policy = BlockwiseMaskingPolicy(mask_prob=0.02)
    lengths = Counter()
    for steps in draw_many(policy, np.ones(20000, bool), 40):
        lengths.update(len(p) for p in spans_of(steps).values())
    total = sum(lengths.values())
    assert total > 4000
    assert lengths[1] / total == pytest.approx(0.6, abs=0.025)
    for span in range(2, 7):
        assert lengths[span] / total == pytest.approx(0.08, abs=0.015)


def test_span_lengths_match_the_literal_algorithm_at_15_percent():
    """At 15% of a short sequence, rejections favour short spans; the accepted distribution must be the one of a
    line-by-line transcription of Algorithm 1 (an independent implementation with another generator)."""
    n, draws = 64, 1500
    ours = Counter()
    for steps in draw_many(BlockwiseMaskingPolicy(), np.ones(n, bool), draws):
        ours.update(len(p) for p in spans_of(steps).values())
    rnd = random.Random(0)
    reference = Counter()
    for _ in range(draws):
        reference.update(literal_algorithm_1(n, rnd))
    ours_total, reference_total = sum(ours.values()), sum(reference.values())
    for span in range(1, 7):
        p_ours, p_ref = ours[span] / ours_total, reference[span] / reference_total
        sigma = math.sqrt(p_ref * (1 - p_ref) * (1 / ours_total + 1 / reference_total))
        assert abs(p_ours - p_ref) < 4 * sigma + 1e-3, (span, p_ours, p_ref)
    assert ours[1] / ours_total > 0.6  # the acceptance effect is visible: more singles than drawn


def test_factorization_order_is_a_uniform_permutation_of_the_spans():
    """The step index is independent of where the span lies: the leftmost span is the first step 1/K of the
    time, and the mean step index is the same for the left and right halves of the sequence."""
    first_is_leftmost, expected = 0, 0.0
    left, right = [], []
    for steps in draw_many(BlockwiseMaskingPolicy(), np.ones(100, bool), 2000):
        spans = spans_of(steps)
        leftmost = min(spans, key=lambda s: spans[s][0])
        first_is_leftmost += leftmost == 0
        expected += 1 / len(spans)
        for step, positions in spans.items():
            (left if positions[0] < 50 else right).append(step / (len(spans) - 1))
    assert first_is_leftmost == pytest.approx(expected, rel=0.15)
    assert np.mean(left) == pytest.approx(0.5, abs=0.02)
    assert np.mean(right) == pytest.approx(0.5, abs=0.02)


def test_no_blocks_gives_single_token_steps():
    policy = BlockwiseMaskingPolicy(block_prob=0.0)
    for steps in draw_many(policy, np.ones(100, bool), 100):
        spans = spans_of(steps)
        assert len(spans) == 15 and all(len(p) == 1 for p in spans.values())


def test_deterministic_for_a_seed():
    policy = BlockwiseMaskingPolicy()
    maskable = np.ones(200, bool)
    a = policy.factorization_steps(maskable, sample_rng(7, 3, 11))
    b = policy.factorization_steps(maskable, sample_rng(7, 3, 11))
    assert np.array_equal(a, b)
    others = [policy.factorization_steps(maskable, sample_rng(*key)) for key in [(8, 3, 11), (7, 4, 11), (7, 3, 12)]]
    assert all(not np.array_equal(a, other) for other in others)


def test_nothing_maskable_and_bad_settings():
    policy = BlockwiseMaskingPolicy()
    assert (policy.factorization_steps(np.zeros(5, bool), sample_rng(1, 1, 1)) == NOT_MASKED).all()
    with pytest.raises(ValueError, match="block_prob"):
        BlockwiseMaskingPolicy(block_prob=1.0)
    with pytest.raises(ValueError, match="mask_prob"):
        BlockwiseMaskingPolicy(mask_prob=0.0)
    with pytest.raises(ValueError, match="block lengths"):
        BlockwiseMaskingPolicy(min_block_length=4, max_block_length=3)


def test_a_mask_prob_of_one_masks_every_maskable_token():
    """mask_prob is in (0, 1]: 1 is allowed and masks every maskable position (the loop ends on single tokens when
    the gaps left are shorter than a block), in contiguous spans, and nothing outside the maskable region."""
    maskable = np.ones(40, bool)
    maskable[[0, 17, 39]] = False
    with pytest.raises(ValueError, match=r"^mask_prob must be in \(0, 1\], got 1.01$"):
        BlockwiseMaskingPolicy(mask_prob=1.01)
    policy = BlockwiseMaskingPolicy(mask_prob=1.0)
    for seed in range(20):
        steps = policy.factorization_steps(maskable, sample_rng(seed, 1, 0))
        assert ((steps != NOT_MASKED) == maskable).all()
        assert all((np.diff(positions) == 1).all() for positions in spans_of(steps).values())  # each step one span
