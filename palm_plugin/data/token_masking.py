"""BERT-style token masking, shared by PALM's encoder MLM, UniLM pre-training and fine-tuning.

A policy does two separate things, so that each caller can pick its own positions and reuse the replacement:

* :meth:`TokenMaskingPolicy.select` chooses which positions are predicted: ``mask_prob`` of the maskable
  positions (at least one), drawn as n-gram spans whose lengths follow ``span_length_probs``
  (BERT: ``(1.0,)``; UniLM: 80% single tokens, 20% bigrams or trigrams = ``(0.8, 0.1, 0.1)``);
* :meth:`TokenMaskingPolicy.corrupt` replaces the chosen tokens: ``mask_token_prob`` of them by the mask symbol,
  ``random_token_prob`` by a random non-special token, the rest left unchanged (BERT's 80/10/10).

Randomness comes only from the ``numpy.random.Generator`` passed in; datasets seed it with
``(seed, epoch, index)`` so a sample's noise does not depend on worker count or on resuming.
"""
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from fairseq.dataclass import FairseqDataclass


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator a dataset uses for item ``index`` in ``epoch`` (fairseq's seeding convention)."""
    return np.random.default_rng((seed, epoch, index))


@dataclass
class BertReplacementConfig(FairseqDataclass):
    """A task config's replacement options, named as fairseq's ``masked_lm`` names them."""

    leave_unmasked_prob: float = field(
        default=0.1, metadata={"help": "of the masked tokens, the fraction left unchanged (BERT: 0.1)"}
    )
    random_token_prob: float = field(
        default=0.1, metadata={"help": "of the masked tokens, the fraction replaced by a random token (BERT: 0.1)"}
    )


@dataclass(frozen=True)
class TokenMaskingPolicy:
    mask_prob: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    span_length_probs: Sequence[float] = (1.0,)

    @classmethod
    def from_config(cls, mask_prob: float, cfg: BertReplacementConfig, **options) -> "TokenMaskingPolicy":
        """The policy of ``mask_prob`` and a :class:`BertReplacementConfig` (the rest of the masked tokens: [MASK]);
        ``options``: further fields (``span_length_probs``)."""
        return cls(
            mask_prob=mask_prob,
            mask_token_prob=1.0 - cfg.leave_unmasked_prob - cfg.random_token_prob,
            random_token_prob=cfg.random_token_prob,
            **options,
        )

    def __post_init__(self):
        if not 0.0 < self.mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1], got {self.mask_prob}")
        if self.mask_token_prob < 0 or self.random_token_prob < 0 or self.mask_token_prob + self.random_token_prob > 1:
            raise ValueError("mask_token_prob and random_token_prob must be >= 0 and sum to at most 1")
        if abs(sum(self.span_length_probs) - 1.0) > 1e-6:
            raise ValueError(f"span_length_probs must sum to 1, got {tuple(self.span_length_probs)}")

    def select(self, maskable: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Choose the positions to predict.

        Args:
            maskable: bool array ``(T,)``, True where a token may be masked (not BOS/EOS/padding).
        Returns:
            bool array ``(T,)``: the selected positions, a subset of ``maskable``; ``ceil(mask_prob * n)`` of
            them for ``n`` maskable positions (0 when there are none).
        """
        candidates = np.flatnonzero(maskable)
        selected = np.zeros(len(maskable), dtype=bool)
        if len(candidates) == 0:
            return selected
        # The epsilon absorbs float error: 0.15 * 100 is 15.000000000000002, whose ceil would be 16.
        budget = max(1, int(np.ceil(self.mask_prob * len(candidates) - 1e-9)))
        if len(self.span_length_probs) == 1:
            selected[rng.choice(candidates, size=budget, replace=False)] = True
            return selected
        # Spans start at candidates in a random order; a span covers the next maskable positions only, and stops
        # at the budget, so the count is exact and spans never cross a non-maskable token.
        span_lengths = rng.choice(
            np.arange(1, len(self.span_length_probs) + 1), size=len(candidates), p=self.span_length_probs
        )
        # Python lists: the loop touches one position at a time, where numpy indexing would cost more than the work.
        allowed, chosen, length = maskable.tolist(), selected.tolist(), len(maskable)
        count = 0
        for start, span_length in zip(rng.permutation(candidates).tolist(), span_lengths.tolist()):
            for position in range(start, min(start + span_length, length)):
                if count == budget or not allowed[position]:
                    break
                if not chosen[position]:
                    chosen[position] = True
                    count += 1
            if count == budget:
                break
        return np.array(chosen, dtype=bool)

    def corrupt(
        self,
        tokens: np.ndarray,
        selected: np.ndarray,
        rng: np.random.Generator,
        mask_idx: int,
        first_regular_index: int,
        vocab_size: int,
        excluded: Sequence[int] = (),
    ) -> np.ndarray:
        """Return a copy of ``tokens`` with the selected positions replaced 80/10/10.

        Args:
            tokens: int array ``(T,)``.
            selected: bool array ``(T,)`` from :meth:`select`.
            mask_idx: the dictionary index of the mask symbol.
            first_regular_index / vocab_size: random replacements are drawn uniformly from
                ``[first_regular_index, vocab_size)`` minus ``mask_idx`` (no special symbols).
            excluded: further indices never drawn as random replacements (UniLMv2's pseudo mask symbol).
        """
        noised = tokens.copy()
        positions = np.flatnonzero(selected)
        if len(positions) == 0:
            return noised
        draw = rng.random(len(positions))
        to_mask = positions[draw < self.mask_token_prob]
        to_random = positions[(draw >= self.mask_token_prob) & (draw < self.mask_token_prob + self.random_token_prob)]
        noised[to_mask] = mask_idx
        if len(to_random):
            noised[to_random] = uniform_regular_tokens(
                rng, len(to_random), first_regular_index, vocab_size, (mask_idx, *excluded)
            )
        return noised


def uniform_regular_tokens(rng, count, first_regular_index, vocab_size, excluded) -> np.ndarray:
    """``count`` tokens drawn uniformly from ``[first_regular_index, vocab_size)`` minus ``excluded``.

    The same draws as ``rng.choice`` over the array of allowed indices, without building that array (it has the
    size of the vocabulary, and a data worker draws for every example): index ``i`` of the allowed ones is
    ``first_regular_index + i`` shifted past each excluded index at or below it.
    """
    skipped = np.unique([e for e in excluded if first_regular_index <= e < vocab_size])
    draws = rng.integers(0, vocab_size - first_regular_index - len(skipped), size=count) + first_regular_index
    for index in skipped.tolist():  # ascending, so each shift sees the indices already skipped
        draws += draws >= index
    return draws
