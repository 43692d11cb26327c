"""Blockwise masking and factorization order of UniLMv2 (Bao et al. 2020, section 3.1.2, Algorithm 1).

Algorithm 1, over the maskable positions of a sequence::

    repeat
        p <- a uniformly random position
        l <- uniform in {2, ..., 6} with probability 0.4, else 1
        if none of x_p .. x_{p+l-1} is masked yet: mask them, as ONE factorization step
    until at least 15% of the tokens are masked

The accepted spans are then put in a uniformly random order: that order is the factorization order
``M = <M_1, ..., M_|M|>`` of the partially autoregressive objective (equation 5): the tokens of step i are
predicted from the unmasked context and the tokens of the steps before i.

Consequences of the algorithm that callers (and the tests) rely on:

* the masked share is at least ``mask_prob`` and overshoots it by at most ``max_block_length - 1`` tokens (the
  loop stops only after a whole span is accepted);
* a drawn span is accepted only if it lies inside the maskable region and overlaps no masked token, so long
  spans are rejected more often than single tokens as the sequence fills up: accepted spans are single tokens
  somewhat more often than the 60% of the draws;
* spans never overlap and never cover a non-maskable token (BOS/EOS, a document separator, padding).

``block_prob=0`` gives the paper's "- blockwise factorization" ablation (every step a single token: the
autoregressive MLM of Table 6). The [M] / random / unchanged replacement of the masked tokens is not part of this
policy: it is :meth:`palm_plugin.data.token_masking.TokenMaskingPolicy.corrupt`.
"""
from dataclasses import dataclass

import numpy as np

NOT_MASKED = -1


@dataclass(frozen=True)
class BlockwiseMaskingPolicy:
    mask_prob: float = 0.15
    block_prob: float = 0.4
    min_block_length: int = 2
    max_block_length: int = 6

    def __post_init__(self):
        if not 0.0 < self.mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1], got {self.mask_prob}")
        # block_prob < 1 keeps single-token draws possible, so the loop always reaches the budget even when the
        # free positions are fragmented into gaps shorter than min_block_length.
        if not 0.0 <= self.block_prob < 1.0:
            raise ValueError(f"block_prob must be in [0, 1), got {self.block_prob}")
        if not 2 <= self.min_block_length <= self.max_block_length:
            raise ValueError(
                f"block lengths must satisfy 2 <= min <= max, got {self.min_block_length}..{self.max_block_length}"
            )

    def budget(self, num_maskable):
        """The number of tokens Algorithm 1 must reach: the smallest count >= ``mask_prob * num_maskable``
        (elementwise for an array of counts)."""
        # The epsilon absorbs float error: 0.15 * 100 is 15.000000000000002, whose ceil would be 16.
        return np.ceil(self.mask_prob * np.asarray(num_maskable) - 1e-9).astype(np.int64)

    def factorization_steps(self, maskable: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Run Algorithm 1 and draw the factorization order.

        Args:
            maskable: bool array ``(T,)``, True where a token may be masked.
            rng: the only source of randomness (datasets pass ``sample_rng(seed, epoch, index)``).
        Returns:
            int64 array ``(T,)``: :data:`NOT_MASKED` (-1) for unmasked tokens, else the 0-based index of the
            factorization step that predicts the token. Each step is one contiguous span; steps are numbered
            ``0 .. num_steps - 1`` in factorization order.
        """
        length = len(maskable)
        steps = np.full(length, NOT_MASKED, dtype=np.int64)
        candidates = np.flatnonzero(maskable)
        budget = int(self.budget(len(candidates)))
        # maskable and not masked yet; a Python list, because each draw checks a span of at most 6 entries and numpy's
        # per-call overhead would dominate
        free = np.asarray(maskable, dtype=bool).tolist()
        span_starts, span_lengths = [], []
        masked = 0
        while masked < budget:
            # Draws come in vectors (one Python-level check per draw, no per-draw generator call); a chunk of
            # twice the missing count is usually enough, a rejected chunk just leads to another one.
            chunk = 2 * (budget - masked) + 8
            starts = rng.choice(candidates, size=chunk)
            is_block = rng.random(chunk) < self.block_prob
            lengths = np.where(is_block, rng.integers(self.min_block_length, self.max_block_length + 1, chunk), 1)
            for start, span_length in zip(starts.tolist(), lengths.tolist()):
                end = start + span_length
                if end <= length and all(free[start:end]):
                    free[start:end] = [False] * span_length
                    span_starts.append(start)
                    span_lengths.append(span_length)
                    masked += span_length
                    if masked >= budget:
                        break
        # the factorization order: span order[k] is step k
        order = rng.permutation(len(span_starts))
        step_of_span = np.empty(len(span_starts), dtype=np.int64)
        step_of_span[order] = np.arange(len(span_starts))
        span_starts, span_lengths = np.array(span_starts, dtype=np.int64), np.array(span_lengths, dtype=np.int64)
        offsets = np.arange(int(span_lengths.sum())) - np.repeat(np.cumsum(span_lengths) - span_lengths, span_lengths)
        steps[np.repeat(span_starts, span_lengths) + offsets] = np.repeat(step_of_span, span_lengths)
        return steps
