"""BERT replacement draws: random tokens come from the regular vocabulary minus the excluded symbols, uniformly,
with exactly the draws ``rng.choice`` over the allowed indices makes (so seeded noise is what it was)."""
import numpy as np
import pytest

from palm_plugin.data.token_masking import TokenMaskingPolicy, uniform_regular_tokens


@pytest.mark.parametrize("excluded", [(), (7,), (9, 7), (4, 5, 999), (2, 2000)])
def test_uniform_regular_tokens_equal_choice_over_the_allowed_indices(excluded):
    allowed = np.arange(4, 1000)
    allowed = allowed[~np.isin(allowed, excluded)]
    expected = np.random.default_rng(5).choice(allowed, size=5000)
    drawn = uniform_regular_tokens(np.random.default_rng(5), 5000, 4, 1000, excluded)
    assert np.array_equal(drawn, expected)


def test_uniform_regular_tokens_cover_every_allowed_index_and_nothing_else():
    drawn = uniform_regular_tokens(np.random.default_rng(0), 20000, 4, 12, (6, 9))
    assert sorted(set(drawn.tolist())) == [4, 5, 7, 8, 10, 11]
    counts = np.bincount(drawn)[[4, 5, 7, 8, 10, 11]]
    assert counts.min() > 0.9 * 20000 / 6


@pytest.mark.parametrize("settings, message", [
    ({"mask_prob": 0.0}, r"mask_prob must be in \(0, 1\], got 0.0"),
    ({"mask_prob": 1.5}, r"mask_prob must be in \(0, 1\], got 1.5"),
    ({"mask_token_prob": 0.8, "random_token_prob": 0.3}, "mask_token_prob and random_token_prob must be >= 0 and sum"),
    ({"random_token_prob": -0.1}, "mask_token_prob and random_token_prob must be >= 0 and sum"),
    ({"span_length_probs": (0.5, 0.4)}, r"span_length_probs must sum to 1, got \(0.5, 0.4\)"),
])
def test_impossible_policies_are_refused_with_the_rule(settings, message):
    with pytest.raises(ValueError, match=message):
        TokenMaskingPolicy(**settings)


def test_random_replacements_are_drawn_one_per_position():
    policy = TokenMaskingPolicy(mask_prob=1.0, mask_token_prob=0.0, random_token_prob=1.0)
    tokens = np.full(400, 7)
    noised = policy.corrupt(tokens, np.ones(400, dtype=bool), np.random.default_rng(0), 3, 4, 104)
    assert len(set(noised.tolist())) > 90 and 3 not in noised  # about 98 of the 99 allowed ids, never <mask>


@pytest.mark.parametrize("leave_unmasked, random_token", [(0.1, 0.1), (0.3, 0.2), (0.0, 0.0)])
def test_a_task_configs_fractions_are_the_fractions_drawn(leave_unmasked, random_token):
    """fairseq's masked_lm options name what is left and what is randomised; the rest becomes the mask symbol."""
    from palm_plugin.data.token_masking import BertReplacementConfig

    policy = TokenMaskingPolicy.from_config(0.15, BertReplacementConfig(leave_unmasked_prob=leave_unmasked,
                                                                        random_token_prob=random_token))
    tokens = np.full(20000, 7)  # random replacements come from 10004 other ids: one in 10^4 draws the original back
    noised = policy.corrupt(tokens, np.ones(20000, dtype=bool), np.random.default_rng(1), 3, 4, 10008)
    fractions = np.array([(noised == 3).mean(), (noised == 7).mean(), ((noised != 3) & (noised != 7)).mean()])
    expected = np.array([1 - leave_unmasked - random_token, leave_unmasked, random_token])
    assert policy.mask_prob == 0.15
    assert np.abs(fractions - expected).max() < 0.015, fractions  # 3.5 standard deviations at 20000 draws


@pytest.mark.parametrize("span_length_probs", [(0.8, 0.1, 0.1), (0.3, 0.7)])
def test_span_lengths_follow_the_given_distribution(span_length_probs):
    """Masked n-grams have the lengths ``span_length_probs`` gives (UniLM: 80% unigrams, 10% bigrams, 10% trigrams),
    with two lengths as with three. Long sequences at a 1% masking rate: spans rarely touch, so each run of
    selected positions is one span (the last of a sequence may be cut by the budget: 1 in about 150)."""
    policy = TokenMaskingPolicy(mask_prob=0.01, span_length_probs=span_length_probs)
    rng = np.random.default_rng(0)
    runs = []
    for _ in range(40):
        selected = policy.select(np.ones(20000, dtype=bool), rng)
        assert selected.sum() == 200
        edges = np.diff(np.concatenate([[0], selected.astype(int), [0]]))
        runs += (np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).tolist()
    fractions = np.bincount(runs, minlength=len(span_length_probs) + 1)[1:] / len(runs)
    # about 5000 runs: one standard deviation is under 0.007; merged spans make the few longer runs
    assert np.abs(fractions[:len(span_length_probs)] - span_length_probs).max() < 0.03, fractions
    assert fractions[len(span_length_probs):].sum() < 0.02, fractions
