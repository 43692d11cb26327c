"""Pseudo-masked LM examples of UniLMv2 (Bao et al. 2020, section 3.2, Figure 4).

For a text ``x`` whose masked positions are split into factorization steps ``M_1 .. M_K`` (Algorithm 1,
:class:`palm_plugin.data.blockwise_masking.BlockwiseMaskingPolicy`), the input is::

    [ x with the masked tokens replaced 80/10/10 by [M] | for each step k = 1..K: |M_k| [P] tokens, then the
      |M_k| original tokens x_{M_k} ]

The text is UniLMv2's pre-training input ``[SOS] S1 [EOS] S2 [EOS]`` (section 2.2, :func:`sentence_pair`): two
contiguous pieces of a block, segment ids 0 and 1, positions running on through both. Every appended token
carries the position id (and the segment id) of the token it stands for, so the Transformer sees it at that
position wherever it lies in the input. For the paper's example (x_1..x_6, steps {4, 5} -> {2})::

    tokens     x1 [M] x3 [M] [M] x6  [P] [P] x4 x5  [P] x2
    positions   0  1  2   3   4  5    3   4  3  4    1  1
    step        .  .  .   .   .  .    0   0  0  0    1  1
    kind        C  C  C   C   C  C    P   P  O  O    P  O      (C context, P pseudo, O original)

The attention mask is built from ``steps`` and ``kinds`` on the device, at the model's input
(:func:`palm_plugin.modules.attention_masks.pmlm_mask`). Targets: the original token at each [M] slot (the
autoencoding loss L_AE, kind CONTEXT) and at each [P] token (the partially autoregressive loss L_PAR, kind
PSEUDO); padding everywhere else.

Objectives of the paper's Table 6: ``predict_masked_slots`` switches L_AE, ``append_pseudo`` switches L_PAR (and
the appended part: without it the input is a plain BERT MLM example and costs nothing more); AR instead of PAR
is a masking policy with ``block_prob=0``.
"""
import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from palm_plugin.data.blockwise_masking import BlockwiseMaskingPolicy
from palm_plugin.data.collate import pad_rows
from palm_plugin.data.token_masking import TokenMaskingPolicy, sample_rng
from palm_plugin.modules.attention_masks import PseudoMaskKind


def sentence_pair(text, bos, eos, rng):
    """UniLMv2's pre-training input ``[SOS] S1 [EOS] S2 [EOS]`` (section 2.2) from a block of contiguous text.

    Args:
        text: int ``(T,)`` a block of fairseq's ``TokenBlockDataset``: whole sentences, each ending with [EOS] (with
            ``--sample-break-mode none`` the last one may be cut, without its [EOS]).
        rng: draws the cut: one of the sentence boundaries inside the block, uniformly; a block of one sentence is
            cut between two of its tokens, uniformly. S1 and S2 are the two sides (each may hold several sentences).
    Returns:
        ``tokens`` ``(L,)`` with ``L <= T + 3`` and ``segments`` ``(L,)``, both int64: 0 on ``[SOS] S1 [EOS]``, 1
        on ``S2 [EOS]`` (BERT's segment ids; positions run on through both).
    """
    body = text[:-1] if len(text) and text[-1] == eos else text
    inner = np.flatnonzero(body == eos)
    inner = inner[(inner > 0) & (inner < len(body) - 1)]  # both sides keep a token
    if len(inner):
        cut = int(inner[rng.integers(len(inner))])
        first, second = body[:cut], body[cut + 1 :]
    else:
        cut = int(rng.integers(1, len(body))) if len(body) > 1 else len(body)
        first, second = body[:cut], body[cut:]
    tokens = np.concatenate([[bos], first, [eos], second, [eos]]).astype(np.int64)
    segments = np.zeros(len(tokens), dtype=np.int64)
    segments[len(first) + 2 :] = 1
    return tokens, segments


def pseudo_masked_example(tokens, steps, noised, pseudo_idx, append_pseudo=True, predict_masked_slots=True,
                          segments=None):
    """Lay out one example (numpy, no Python loop over tokens).

    Args:
        tokens: int ``(T,)`` the original text.
        steps: int ``(T,)`` factorization step of each token, -1 where not masked.
        noised: int ``(T,)`` ``tokens`` with the masked positions replaced 80/10/10.
        pseudo_idx: dictionary index of [P].
        segments: int ``(T,)`` segment ids of the text (default 0); appended tokens take their token's.
    Returns:
        dict of int64 arrays of length ``L = T + 2 * (number of masked tokens)`` (``T`` without
        ``append_pseudo``): ``source``, ``positions``, ``segments``, ``steps``, ``kinds``, and ``target`` (-1 where
        nothing is predicted; the dataset turns it into padding).
    """
    length = len(tokens)
    masked = np.flatnonzero(steps >= 0)
    masked = masked[np.argsort(steps[masked], kind="stable")]  # by step, then by position inside the span
    target = np.full(length, -1, dtype=np.int64)
    if predict_masked_slots:
        target[masked] = tokens[masked]
    example = {
        "source": noised.astype(np.int64),
        "positions": np.arange(length, dtype=np.int64),
        "segments": np.zeros(length, dtype=np.int64) if segments is None else np.asarray(segments, dtype=np.int64),
        "steps": np.zeros(length, dtype=np.int64),
        "kinds": np.full(length, PseudoMaskKind.CONTEXT, dtype=np.int64),
        "target": target,
    }
    if not append_pseudo or len(masked) == 0:
        return example

    # Step k occupies 2 * |M_k| slots starting at 2 * (|M_0| + ... + |M_{k-1}|): its [P] tokens, then its
    # original tokens; a token of rank r inside its step goes to slot start + r and start + |M_k| + r.
    masked_steps = steps[masked]
    counts = np.bincount(masked_steps)
    before = np.cumsum(counts) - counts
    rank = np.arange(len(masked)) - before[masked_steps]
    pseudo_slot = 2 * before[masked_steps] + rank
    original_slot = pseudo_slot + counts[masked_steps]

    appended = {key: np.zeros(2 * len(masked), dtype=np.int64) for key in example}
    appended["source"][pseudo_slot] = pseudo_idx
    appended["source"][original_slot] = tokens[masked]
    appended["positions"][pseudo_slot] = masked
    appended["positions"][original_slot] = masked
    appended["segments"][pseudo_slot] = example["segments"][masked]
    appended["segments"][original_slot] = example["segments"][masked]
    appended["steps"][pseudo_slot] = masked_steps
    appended["steps"][original_slot] = masked_steps
    appended["kinds"][pseudo_slot] = PseudoMaskKind.PSEUDO
    appended["kinds"][original_slot] = PseudoMaskKind.ORIGINAL
    appended["target"][:] = -1
    appended["target"][pseudo_slot] = tokens[masked]
    return {key: np.concatenate([example[key], appended[key]]) for key in example}


class PseudoMaskedLMDataset(FairseqDataset):
    """Pseudo-masked LM examples over blocks of text.

    With ``sentence_pairs`` (the ``pmlm`` task) the items of ``dataset`` are blocks of contiguous text (fairseq's
    ``TokenBlockDataset``), laid out as ``[SOS] S1 [EOS] S2 [EOS]`` (:func:`sentence_pair`); without, each item is
    used as it is (``[BOS] tokens ... [EOS]``, one segment).

    Randomness: ``sample_rng(seed, epoch, index)`` per item, so masks do not depend on workers or resuming.

    Sizes: :meth:`size` is the text length (the positions the model must have: appended tokens reuse them);
    :meth:`num_tokens` is an upper bound of the input length, text + 2 * (budget + longest span - 1), which
    ``--max-tokens`` batching uses.
    """

    def __init__(
        self,
        dataset,
        dictionary,
        mask_idx: int,
        pseudo_idx: int,
        masking: BlockwiseMaskingPolicy,
        replacement: TokenMaskingPolicy,
        seed: int,
        append_pseudo: bool = True,
        predict_masked_slots: bool = True,
        shuffle: bool = True,
        sentence_pairs: bool = False,
    ):
        if not (append_pseudo or predict_masked_slots):
            raise ValueError("a pseudo-masked LM needs at least one loss: autoencoding or (partially) autoregressive")
        self.dataset = dataset
        self.dictionary = dictionary
        self.mask_idx = mask_idx
        self.pseudo_idx = pseudo_idx
        self.masking = masking
        self.replacement = replacement
        self.seed = seed
        self.append_pseudo = append_pseudo
        self.predict_masked_slots = predict_masked_slots
        self.shuffle = shuffle
        self.epoch = 1
        self.sentence_pairs = sentence_pairs
        # With sentence pairs a block of T tokens becomes at most T + 3 ([SOS], an [EOS] at the cut and at the end).
        self.sizes = np.asarray(dataset.sizes, dtype=np.int64) + (3 if sentence_pairs else 0)
        self._num_tokens = self.sizes.copy()
        if append_pseudo:
            self._num_tokens += 2 * (masking.budget(self.sizes) + masking.max_block_length - 1)
        # BOS, EOS (also the separator inside blocks that span sentences) and padding are never masked.
        self._unmaskable = np.array([dictionary.bos(), dictionary.eos(), dictionary.pad()])

    def __len__(self):
        return len(self.dataset)

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True  # batches depend on sizes only; the masks change with the epoch through set_epoch

    def set_epoch(self, epoch):
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __getitem__(self, index):
        tokens = self.dataset[index].numpy().astype(np.int64)
        rng = sample_rng(self.seed, self.epoch, index)
        segments = None
        if self.sentence_pairs:
            tokens, segments = sentence_pair(tokens, self.dictionary.bos(), self.dictionary.eos(), rng)
        maskable = (tokens != self._unmaskable[0]) & (tokens != self._unmaskable[1]) & (tokens != self._unmaskable[2])
        steps = self.masking.factorization_steps(maskable, rng)
        noised = self.replacement.corrupt(
            tokens,
            steps >= 0,
            rng,
            mask_idx=self.mask_idx,
            first_regular_index=self.dictionary.nspecial,
            vocab_size=len(self.dictionary),
            excluded=(self.pseudo_idx,),
        )
        example = pseudo_masked_example(
            tokens, steps, noised, self.pseudo_idx, self.append_pseudo, self.predict_masked_slots, segments
        )
        example["target"][example["target"] < 0] = self.dictionary.pad()
        item = {key: torch.from_numpy(value) for key, value in example.items()}
        item["id"] = index
        return item

    def collater(self, samples):
        """Right-pad every field; returns fairseq's batch dict.

        ``net_input`` (the model's keyword arguments): ``src_tokens``, ``position_ids``, ``segment_ids``,
        ``steps``, ``kinds`` ``(B, L)``, from which the model builds the mask; ``target`` ``(B, L)`` (pad where
        nothing is predicted); ``ntokens`` counts input tokens, ``nsentences`` texts.
        """
        if len(samples) == 0:
            return {}
        pad = self.dictionary.pad()

        def merge(key, value):
            return pad_rows([s[key] for s in samples], value)

        src_tokens = merge("source", pad)
        return {
            "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
            "nsentences": len(samples),
            "ntokens": int(src_tokens.ne(pad).sum()),
            "net_input": {
                "src_tokens": src_tokens,
                "position_ids": merge("positions", 0),
                "segment_ids": merge("segments", 0),
                "steps": merge("steps", 0),
                "kinds": merge("kinds", int(PseudoMaskKind.CONTEXT)),
            },
            "target": merge("target", pad),
        }

    def num_tokens(self, index):
        return int(self._num_tokens[index])

    def num_tokens_vec(self, indices):
        return self._num_tokens[indices]

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        """Shuffled (fixed by the seed), then sorted by length: batches of similar lengths in random order."""
        if not self.shuffle:
            return np.argsort(self.sizes, kind="stable")
        with data_utils.numpy_seed(self.seed):
            shuffled = np.random.permutation(len(self))
        return shuffled[np.argsort(self.sizes[shuffled], kind="stable")]

    @property
    def supports_prefetch(self):
        return getattr(self.dataset, "supports_prefetch", False)

    def prefetch(self, indices):
        self.dataset.prefetch(indices)
