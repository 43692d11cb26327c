"""UniLMv2 sequence-to-sequence fine-tuning data (Bao et al. 2020, section 3.4): ``unilm_seq2seq --pseudo-masks``.

Each pair becomes one packed row ``[source | target | pseudo target]``::

    tokens     [SOS] S1 [EOS] | y_0 y_1 ... y_{n-1} | [P] [P] ... [P]      (y_{n-1} = [EOS])
    positions  0 ....... s-1  | s   s+1 ... s+n-1   | s   s+1 ... s+n-1
    segments   source         | target              | target

Target token i and its pseudo token [P] share position ``s + i``. Pseudo row i predicts ``y_i`` from the source,
the target tokens before i and itself (:func:`palm_plugin.modules.attention_masks.pseudo_seq2seq_mask`): all
target tokens are predicted in one pass, each exactly as the decoder predicts it from a [P] placeholder at the next
position (the model's cached decoder with ``decoding_placeholder = <pseudo>``). Loss on the pseudo rows only.

Noise on the target tokens (the history the pseudo rows condition on): the task's masking policy picks
``ceil(target_mask_prob * n)`` of the target tokens and corrupts them 80/10/10 ([MASK] / random / unchanged), so the
model learns to tolerate errors in what it decoded before; the pseudo tokens are always [P] (as in pre-training
and decoding) and the labels are the clean tokens. ``--mask-token-prob 0 --random-token-prob 0`` gives a clean
target. (Microsoft's s2s-ft puts [MASK] 80% / a random token 10% / the true token 10% in the pseudo slots
instead; the paper only says that a [P] is appended for each target token.)

The generation view (``net_input``, ``target``) is the parent class's: the decoder needs the source only.
The packing (:func:`pack_pseudo_seq2seq`) also serves ``fairseq-generate --score-reference``, with the reference
as history (:mod:`palm_plugin.reference_scorer`).
"""
import torch
from fairseq.data import data_utils

from palm_plugin.data.pmlm_dataset import PSEUDO_SYMBOL
from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset
from palm_plugin.modules.attention_masks import pseudo_seq2seq_mask


class PseudoSeq2SeqDataset(UniLMSeq2SeqDataset):
    """Same constructor as :class:`UniLMSeq2SeqDataset`; ``policy`` is the noise on the target tokens (above).

    Batches: ``cloze_input`` holds the packed tokens ``(B, L)``, ``segment_ids`` and ``position_ids`` ``(B, L)``
    and the boolean ``attention_mask`` ``(B, L, L)``; ``cloze_target`` ``(B, L)`` holds ``y_i`` at pseudo row i,
    padding elsewhere (the ``unilm_cloze`` criterion reads both).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pseudo_index = self.dictionary.index(PSEUDO_SYMBOL)
        if self.pseudo_index == self.dictionary.unk():
            raise ValueError(
                f"the dictionary has no {PSEUDO_SYMBOL} symbol: the unilm_seq2seq task adds it with --pseudo-masks"
            )
        self.sizes = self.source_sizes + 2 * self.target_sizes  # the pseudo block doubles the target

    def cloze_view(self, samples):
        cloze_input, labels = pack_pseudo_seq2seq(
            [s["source"] for s in samples],
            [s["noised_target"] for s in samples],
            [s["target"] for s in samples],
            self.pseudo_index,
            self.dictionary.pad(),
            self.source_segment,
            self.target_segment,
        )
        ntokens = sum(len(s["source"]) + 2 * len(s["target"]) for s in samples)
        return {"ntokens": ntokens, "cloze_input": cloze_input, "cloze_target": labels}


def pack_pseudo_seq2seq(sources, histories, targets, placeholder, pad, source_segment, target_segment):
    """Pack pairs into rows ``[source | history | placeholder x n]`` (module docstring), right-padded.

    Args:
        sources: 1-D tensors ``[SOS] S1 [EOS]``.
        histories: 1-D tensors, one token per target token: what pseudo row i sees of target tokens < i (the
            noised target in training, the reference itself when scoring it).
        targets: 1-D tensors ``y_0 .. y_{n-1}``, the labels of the pseudo rows.
        placeholder: the token of the pseudo rows (``<pseudo>``, or the model's decoding placeholder).
    Returns:
        ``cloze_input`` (model keyword arguments: ``src_tokens``, ``segment_ids``, ``position_ids`` ``(B, L)`` and
        the boolean ``attention_mask`` ``(B, L, L)``) and the labels ``(B, L)`` (``y_i`` at pseudo row i, ``pad``
        elsewhere).
    """
    source_lengths = torch.tensor([len(s) for s in sources])
    target_lengths = torch.tensor([len(t) for t in targets])
    packed, positions, segments, labels = [], [], [], []
    for source, history, target in zip(sources, histories, targets):
        s, n = len(source), len(target)
        target_positions = torch.arange(s, s + n)
        packed.append(torch.cat([source, history, torch.full_like(target, placeholder)]))
        positions.append(torch.cat([torch.arange(s), target_positions, target_positions]))
        segments.append(torch.cat([torch.full((s,), source_segment), torch.full((2 * n,), target_segment)]))
        labels.append(torch.cat([torch.full((s + n,), pad), target]))
    tokens = data_utils.collate_tokens(packed, pad)
    cloze_input = {
        "src_tokens": tokens,
        "segment_ids": data_utils.collate_tokens(segments, source_segment),
        "position_ids": data_utils.collate_tokens(positions, 0),
        "attention_mask": pseudo_seq2seq_mask(source_lengths, target_lengths, tokens.eq(pad)),
    }
    return cloze_input, data_utils.collate_tokens(labels, pad)
