"""BERT replacement draws: random tokens come from the regular vocabulary minus the excluded symbols, uniformly,
with exactly the draws ``rng.choice`` over the allowed indices makes (so seeded noise is what it was)."""
import numpy as np
import pytest

from palm_plugin.data.token_masking import uniform_regular_tokens


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
