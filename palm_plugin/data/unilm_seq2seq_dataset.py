"""Sequence-to-sequence fine-tuning data of UniLM (Dong et al. 2019, section 2.5).

Each pair becomes ``[SOS] S1 [EOS] S2 [EOS]``; ``mask_prob`` of the target tokens ``S2 [EOS]`` (the final [EOS]
included, so the model learns when to stop) are chosen and corrupted 80/10/10, and the model recovers them under
the seq2seq mask.

One view per use (``generation`` chooses it, once, before batches are drawn):

* training (the default): ``net_input`` holds the packed, corrupted rows and the compact fields the model builds
  the seq2seq mask from (objective, source length); ``target`` the tokens to recover (the ``unilm_cloze``
  criterion calls ``model(**sample["net_input"])``);
* generation (``fairseq-generate``, ``fairseq-interactive``, the task's ``build_dataset_for_inference``):
  ``net_input`` holds the source ``[SOS] S1 [EOS]`` alone with its segments, ``target`` the whole reference
  ``S2 [EOS]``, not truncated (``None`` when there is none). No noise is drawn.

With ``with_generation_view`` a training-view batch also holds the generation view of its pairs, as ``generation``
(a validation split decoded at each validation: ``--eval-bleu``).
"""
import logging

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from palm_plugin.data.collate import pad_rows
from palm_plugin.data.symbols import replacement_exclusions
from palm_plugin.data.token_masking import TokenMaskingPolicy, sample_rng
from palm_plugin.errors import InputValueError
from palm_plugin.modules.attention_masks import Objective

logger = logging.getLogger(__name__)


def segment_rows(source_lengths: np.ndarray, packed_lengths: np.ndarray, source_segment: int, target_segment: int):
    """``(B, L)`` segment ids: ``target_segment`` on columns ``[source, packed)`` of each row, ``source_segment``
    elsewhere (the source and the padding)."""
    column = np.arange(packed_lengths.max())[None, :]
    in_target = (column >= source_lengths[:, None]) & (column < packed_lengths[:, None])
    return torch.from_numpy(np.where(in_target, target_segment, source_segment).astype(np.int64))


class UniLMSeq2SeqDataset(FairseqDataset):
    """
    Args:
        source, target: fairseq indexed datasets of token ids, each item ending with [EOS] (as binarized); ``target``
            may be None (decoding raw sources: generation view only).
        dictionary: the shared dictionary (``bos()`` is [SOS], ``eos()`` [EOS]).
        max_source_positions: the longest ``[SOS] S1 [EOS]``; longer sources lose their end.
        max_target_positions: the longest ``S2 [EOS]``; longer targets lose their end (the final [EOS] stays).
        masking: which target tokens are predicted and how they are corrupted.
        mask_idx: the [MASK] symbol.
        source_segment, target_segment: segment ids of the two parts.
        seed: with the epoch and the index, seeds each sample's masking.
        generation: build the generation view instead of the training view (module docstring).
    """

    def __init__(
        self,
        source,
        target,
        dictionary,
        max_source_positions,
        max_target_positions,
        masking: TokenMaskingPolicy,
        mask_idx,
        source_segment,
        target_segment,
        seed,
        generation=False,
    ):
        if target is not None and len(source) != len(target):
            raise InputValueError(f"source has {len(source)} sentences, target {len(target)}: the files are not "
                                  "parallel")
        if max_source_positions < 3 or max_target_positions < 2:
            raise InputValueError("--max-source-positions must be >= 3 and --max-target-positions >= 2")
        self.source, self.target = source, target
        self.dictionary = dictionary
        self.max_source_positions, self.max_target_positions = max_source_positions, max_target_positions
        self.masking = masking
        self.mask_idx = mask_idx
        self.source_segment, self.target_segment = source_segment, target_segment
        self.seed = seed
        self.generation = generation or target is None
        self.with_generation_view = False
        self.epoch = 1
        self.excluded_replacements = replacement_exclusions(dictionary)
        # Binarized items end with [EOS]; the packed source adds [SOS].
        source_sizes = np.asarray(source.sizes)
        target_sizes = np.asarray(target.sizes) if target is not None else np.ones_like(source_sizes)
        self.source_sizes = np.minimum(source_sizes + 1, max_source_positions)
        self.target_sizes = np.minimum(target_sizes, max_target_positions)
        self.truncated_sources = int((source_sizes + 1 > max_source_positions).sum())
        self.truncated_targets = int((target_sizes > max_target_positions).sum())
        # Empty lines are kept (an empty source still has [SOS] [EOS], an empty target its [EOS]); counted for the log.
        self.empty_sources = int((source_sizes <= 1).sum())
        self.empty_targets = int((target_sizes <= 1).sum()) if target is not None else 0
        self.sizes = self.source_sizes + self.target_sizes

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True  # the batches do not change; only the masks do (seeded by the epoch in __getitem__)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return len(self.source)

    def __getitem__(self, index):
        bos, eos = self.dictionary.bos(), self.dictionary.eos()
        source_body = self.source[index].numpy()[:-1][: self.max_source_positions - 2]
        source = np.concatenate([[bos], source_body, [eos]]).astype(np.int64)
        reference = self.target[index] if self.target is not None else None
        if self.generation:
            return {"id": index, "source": torch.from_numpy(source), "reference": reference}
        target_body = reference.numpy()[:-1][: self.max_target_positions - 1]
        target = np.concatenate([target_body, [eos]]).astype(np.int64)
        item = {"id": index, "source": torch.from_numpy(source), "target": torch.from_numpy(target),
                "reference": reference}
        item.update(self.training_item(source, target, sample_rng(self.seed, self.epoch, index)))
        return item

    def _corrupt(self, target, selected, rng):
        return self.masking.corrupt(
            target, selected, rng, self.mask_idx, self.dictionary.nspecial, len(self.dictionary),
            excluded=self.excluded_replacements,
        )

    def training_item(self, source, target, rng) -> dict:
        """The training fields of one pair: the packed corrupted row and its labels (numpy), and for inspection the
        noised target and the selected positions."""
        selected = self.masking.select(np.ones(len(target), dtype=bool), rng)
        noised = self._corrupt(target, selected, rng)
        pad = self.dictionary.pad()
        return {
            "noised_target": torch.from_numpy(noised),
            "selected": torch.from_numpy(selected),
            "packed": np.concatenate([source, noised]),
            "labels": np.concatenate([np.full(len(source), pad), np.where(selected, target, pad)]),
        }

    def collater(self, samples):
        if not samples:
            return {}
        batch = {"id": torch.tensor([s["id"] for s in samples]), "nsentences": len(samples)}
        batch.update(self.generation_batch(samples) if self.generation else self.training_batch(samples))
        if self.with_generation_view and not self.generation:
            batch["generation"] = {"id": batch["id"], "nsentences": len(samples), **self.generation_batch(samples)}
        return batch

    def generation_batch(self, samples):
        """The source alone, its segments and the target's segment (what the model's encoder reads), and the whole
        reference when there is one."""
        pad = self.dictionary.pad()
        sources = [s["source"] for s in samples]
        src_tokens = data_utils.collate_tokens(sources, pad)
        references = [s["reference"] for s in samples]
        return {
            "ntokens": sum(len(s) for s in sources),
            "net_input": {
                "src_tokens": src_tokens,
                "src_lengths": torch.tensor([len(s) for s in sources]),
                "source_segments": torch.full_like(src_tokens, self.source_segment),
                "target_segment": torch.full((len(samples),), self.target_segment, dtype=torch.long),
            },
            "target": None if references[0] is None else data_utils.collate_tokens(references, pad),
        }

    def training_batch(self, samples):
        """Packed ``[SOS] S1 [EOS] S2' [EOS]`` rows, segments, the seq2seq objective and source lengths (the model
        builds the mask from these), and the labels."""
        pad = self.dictionary.pad()
        source_lengths = np.array([len(s["source"]) for s in samples])
        packed_lengths = np.array([len(s["packed"]) for s in samples])
        return {
            "ntokens": int(packed_lengths.sum()),
            "net_input": {
                "src_tokens": pad_rows([s["packed"] for s in samples], pad),
                "segment_ids": segment_rows(source_lengths, packed_lengths, self.source_segment, self.target_segment),
                "objectives": torch.full((len(samples),), int(Objective.SEQ2SEQ), dtype=torch.long),
                "source_lengths": torch.from_numpy(source_lengths),
            },
            "target": pad_rows([s["labels"] for s in samples], pad),
        }

    def num_tokens(self, index):
        return int(self.sizes[index])

    def num_tokens_vec(self, indices):
        return self.sizes[indices]

    def size(self, index):
        return int(self.source_sizes[index]), int(self.target_sizes[index])

    def filter_indices_by_size(self, indices, max_sizes):
        """Keep the pairs whose packed ``[SOS] S1 [EOS] S2 [EOS]`` (truncated) fits in ``max_sizes`` positions (the
        task's and the model's, resolved by fairseq); returns the kept indices and the list of the others.

        The pseudo target of UniLMv2's layout reuses the target's positions, so this holds for both layouts. Without
        targets (raw sources to decode) the source and one output token must fit.
        """
        positions = self.source_sizes[indices] + self.target_sizes[indices]
        return indices[positions <= max_sizes], indices[positions > max_sizes].tolist()

    def ordered_indices(self):
        if self.generation:
            return np.argsort(self.sizes, kind="mergesort")  # deterministic batches for decoding
        order = np.random.permutation(len(self))
        return order[np.argsort(self.sizes[order], kind="mergesort")]

    @property
    def supports_prefetch(self):
        return False
