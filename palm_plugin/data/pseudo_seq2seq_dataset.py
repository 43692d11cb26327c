"""UniLMv2 sequence-to-sequence fine-tuning data (Bao et al. 2020, section 3.4): ``unilm_seq2seq --pseudo-masks``.

Each pair becomes one packed row ``[source | target | pseudo target]``::

    tokens     [SOS] S1 [EOS] | y_0 y_1 ... y_{n-1} | [P] [P] ... [P]      (y_{n-1} = [EOS])
    positions  0 ....... s-1  | s   s+1 ... s+n-1   | s   s+1 ... s+n-1
    segments   source         | target              | target

Target token i and its pseudo token [P] share position ``s + i``. Pseudo row i predicts ``y_i`` from the source,
the target tokens before i and itself (:func:`palm_plugin.modules.attention_masks.pseudo_seq2seq_mask`, which the
model builds from the source and target lengths in ``net_input``): all target tokens are predicted in one pass,
each exactly as the decoder predicts it from a [P] placeholder at the next position (the model's cached decoder
with ``decoding_placeholder = <pseudo>``). Loss on the pseudo rows only.

Noise on the target tokens (the history the pseudo rows condition on), two schemes (``noise``):

* ``exact`` (the default): the masking policy picks exactly ``ceil(target_mask_prob * n)`` of the target tokens and
  corrupts them 80/10/10 ([MASK] / random / unchanged); the pseudo slots are always [P], the symbol the decoder
  feeds, so training and decoding see the same placeholder;
* ``s2s_ft`` (Microsoft's s2s-ft, ``mask_way v2``): each pseudo slot gets [MASK] 80% / a random token 10% / the
  true token 10%, and each target token independently, with probability ``target_mask_prob``, is replaced by the
  token of its own pseudo slot; decoding then feeds [MASK] as placeholder.

The generation view is the parent class's: the decoder needs the source only. The packing
(:func:`pack_pseudo_seq2seq`) also serves ``fairseq-generate --score-reference``, with the reference as history
(:mod:`palm_plugin.models.unilm_reference_scorer`).
"""
import numpy as np
import torch

from palm_plugin.data.symbols import PSEUDO_SYMBOL
from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset, segment_rows
from palm_plugin.errors import InputValueError

NOISE_SCHEMES = ("exact", "s2s_ft")


class PseudoSeq2SeqDataset(UniLMSeq2SeqDataset):
    """Same constructor as :class:`UniLMSeq2SeqDataset` plus ``noise`` (:data:`NOISE_SCHEMES`); ``masking`` is the
    noise on the target tokens (module docstring: ``mask_prob`` is ``target_mask_prob``).

    Training batches: ``net_input`` holds the packed tokens, ``segment_ids`` and ``position_ids`` ``(B, L)`` and
    ``source_lengths`` / ``target_lengths`` ``(B,)`` (the model builds the mask from them); ``target`` ``(B, L)``
    holds ``y_i`` at pseudo row i, padding elsewhere.
    """

    def __init__(self, *args, noise="exact", **kwargs):
        super().__init__(*args, **kwargs)
        if noise not in NOISE_SCHEMES:
            raise ValueError(f"unknown pseudo-mask noise {noise!r}; expected one of {NOISE_SCHEMES}")
        self.noise = noise
        self.pseudo_idx = self.dictionary.index(PSEUDO_SYMBOL)
        if self.pseudo_idx == self.dictionary.unk():
            raise InputValueError(
                f"the dictionary has no {PSEUDO_SYMBOL} symbol: the unilm_seq2seq task adds it with --pseudo-masks"
            )
        if not self.generation:
            self.sizes = self.source_sizes + 2 * self.target_sizes  # the pseudo block doubles the target

    def training_item(self, source, target, rng):
        if self.noise == "exact":
            noised = self._corrupt(target, self.masking.select(np.ones(len(target), dtype=bool), rng), rng)
            slots = np.full(len(target), self.pseudo_idx, dtype=np.int64)
        else:
            slots = self._corrupt(target, np.ones(len(target), dtype=bool), rng)
            noised = np.where(rng.random(len(target)) < self.masking.mask_prob, slots, target)
        return {"noised_target": torch.from_numpy(noised), "pseudo_slots": torch.from_numpy(slots)}

    def training_batch(self, samples):
        net_input, labels = pack_pseudo_seq2seq(
            [s["source"] for s in samples],
            [s["noised_target"] for s in samples],
            [s["target"] for s in samples],
            [s["pseudo_slots"] for s in samples],
            self.dictionary.pad(),
            self.source_segment,
            self.target_segment,
        )
        return {"ntokens": int(net_input["source_lengths"].sum() + 2 * net_input["target_lengths"].sum()),
                "net_input": net_input, "target": labels}


def pack_pseudo_seq2seq(sources, histories, targets, slots, pad, source_segment, target_segment):
    """Pack pairs into rows ``[source | history | slots]`` (module docstring), right-padded.

    Args:
        sources: 1-D tensors ``[SOS] S1 [EOS]``.
        histories: 1-D tensors, one token per target token: what pseudo row i sees of target tokens < i (the
            noised target in training, the reference itself when scoring it).
        targets: 1-D tensors ``y_0 .. y_{n-1}``, the labels of the pseudo rows.
        slots: 1-D tensors, the tokens of the pseudo rows (``<pseudo>``, the model's decoding placeholder, or
            s2s-ft's noise), or one int for all of them.
    Returns:
        ``net_input`` (model keyword arguments: ``src_tokens``, ``segment_ids``, ``position_ids`` ``(B, L)``,
        ``source_lengths`` and ``target_lengths`` ``(B,)``) and the labels ``(B, L)`` (``y_i`` at pseudo row i,
        ``pad`` elsewhere).
    """
    source_lengths = np.array([len(s) for s in sources])
    target_lengths = np.array([len(t) for t in targets])
    width = int((source_lengths + 2 * target_lengths).max())
    tokens = np.full((len(sources), width), pad, dtype=np.int64)
    labels = np.full((len(sources), width), pad, dtype=np.int64)
    for row, (source, history, target) in enumerate(zip(sources, histories, targets)):
        s, n = len(source), len(target)
        tokens[row, :s], tokens[row, s : s + n] = source, history
        tokens[row, s + n : s + 2 * n] = slots if isinstance(slots, int) else slots[row]
        labels[row, s + n : s + 2 * n] = target
    # Pseudo token i reuses the position of target token i; padding gets position 0, as fairseq's collaters pad.
    column = np.arange(width)[None, :]
    ends = (source_lengths + target_lengths)[:, None]
    positions = np.where(column < ends, column, column - target_lengths[:, None])
    positions = np.where(column < ends + target_lengths[:, None], positions, 0)
    net_input = {
        "src_tokens": torch.from_numpy(tokens),
        "segment_ids": segment_rows(source_lengths, source_lengths + 2 * target_lengths, source_segment,
                                    target_segment),
        "position_ids": torch.from_numpy(positions),
        "source_lengths": torch.from_numpy(source_lengths),
        "target_lengths": torch.from_numpy(target_lengths),
    }
    return net_input, torch.from_numpy(labels)
