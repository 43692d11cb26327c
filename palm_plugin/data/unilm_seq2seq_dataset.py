"""Sequence-to-sequence fine-tuning data of UniLM (Dong et al. 2019, section 2.5).

Each pair becomes ``[SOS] S1 [EOS] S2 [EOS]``; ``mask_prob`` of the target tokens ``S2 [EOS]`` (the final [EOS]
included, so the model learns when to stop) are chosen and corrupted 80/10/10, and the model recovers them under
the seq2seq mask.

A batch carries two views of the same pairs:

* ``cloze_input`` / ``cloze_target``: the packed, corrupted sequence and the tokens to recover (what the
  ``unilm_cloze`` criterion trains on);
* ``net_input`` / ``target``: the source ``[SOS] S1 [EOS]`` alone and the whole reference ``S2 [EOS]``, not
  truncated (what ``fairseq-generate`` feeds the generator and scores against).
"""
import logging

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from palm_plugin.data.pmlm_dataset import pseudo_symbol_exclusion
from palm_plugin.data.token_masking import TokenMaskingPolicy, sample_rng
from palm_plugin.modules.attention_masks import Objective

logger = logging.getLogger(__name__)


class UniLMSeq2SeqDataset(FairseqDataset):
    """
    Args:
        source, target: fairseq indexed datasets of token ids, each item ending with [EOS] (as binarized).
        dictionary: the shared dictionary (``bos()`` is [SOS], ``eos()`` [EOS]).
        max_source_positions: the longest ``[SOS] S1 [EOS]``; longer sources lose their end.
        max_target_positions: the longest ``S2 [EOS]``; longer targets lose their end (the final [EOS] stays).
        policy: which target tokens are predicted and how they are corrupted.
        mask_index: the [MASK] symbol.
        source_segment, target_segment: segment ids of the two parts.
        seed: with the epoch and the index, seeds each sample's masking.
    """

    def __init__(
        self,
        source,
        target,
        dictionary,
        max_source_positions,
        max_target_positions,
        policy: TokenMaskingPolicy,
        mask_index,
        source_segment,
        target_segment,
        seed,
    ):
        if len(source) != len(target):
            raise ValueError(f"source has {len(source)} sentences, target {len(target)}: the files are not parallel")
        if max_source_positions < 3 or max_target_positions < 2:
            raise ValueError("--max-source-positions must be >= 3 and --max-target-positions >= 2")
        self.source, self.target = source, target
        self.dictionary = dictionary
        self.max_source_positions, self.max_target_positions = max_source_positions, max_target_positions
        self.policy = policy
        self.mask_index = mask_index
        self.source_segment, self.target_segment = source_segment, target_segment
        self.seed = seed
        self.epoch = 1
        self.excluded_replacements = pseudo_symbol_exclusion(dictionary)
        # Binarized items end with [EOS]; the packed source adds [SOS].
        self.source_sizes = np.minimum(np.asarray(source.sizes) + 1, max_source_positions)
        self.target_sizes = np.minimum(np.asarray(target.sizes), max_target_positions)
        self.truncated_sources = int((np.asarray(source.sizes) + 1 > max_source_positions).sum())
        self.truncated_targets = int((np.asarray(target.sizes) > max_target_positions).sum())
        # Empty lines are kept (an empty source still has [SOS] [EOS], an empty target its [EOS]); counted for the log.
        self.empty_sources = int((np.asarray(source.sizes) <= 1).sum())
        self.empty_targets = int((np.asarray(target.sizes) <= 1).sum())
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
        target_body = self.target[index].numpy()[:-1][: self.max_target_positions - 1]
        source = np.concatenate([[bos], source_body, [eos]]).astype(np.int64)
        target = np.concatenate([target_body, [eos]]).astype(np.int64)
        rng = sample_rng(self.seed, self.epoch, index)
        selected = self.policy.select(np.ones(len(target), dtype=bool), rng)
        noised = self.policy.corrupt(
            target,
            selected,
            rng,
            self.mask_index,
            self.dictionary.nspecial,
            len(self.dictionary),
            excluded=self.excluded_replacements,
        )
        return {
            "id": index,
            "source": torch.from_numpy(source),
            "target": torch.from_numpy(target),
            "noised_target": torch.from_numpy(noised),
            "reference": self.target[index],
            "selected": torch.from_numpy(selected),
        }

    def collater(self, samples):
        if not samples:
            return {}
        pad = self.dictionary.pad()
        sources = [s["source"] for s in samples]
        src_tokens = data_utils.collate_tokens(sources, pad)
        batch = len(samples)
        return {
            "id": torch.tensor([s["id"] for s in samples]),
            "nsentences": batch,
            "net_input": {
                "src_tokens": src_tokens,
                "src_lengths": torch.tensor([len(s) for s in sources]),
                "source_segments": torch.full_like(src_tokens, self.source_segment),
                "target_segment": torch.full((batch,), self.target_segment, dtype=torch.long),
            },
            "target": data_utils.collate_tokens([s["reference"] for s in samples], pad),
            **self.cloze_view(samples),
        }

    def cloze_view(self, samples):
        """The training view of a batch: ``ntokens``, ``cloze_input`` and ``cloze_target``."""
        pad = self.dictionary.pad()
        sources = [s["source"] for s in samples]
        packed = [torch.cat([s["source"], s["noised_target"]]) for s in samples]
        labels = [
            torch.cat([torch.full_like(s["source"], pad), s["target"].masked_fill(~s["selected"], pad)])
            for s in samples
        ]
        segments = [
            torch.cat(
                [torch.full_like(s["source"], self.source_segment), torch.full_like(s["target"], self.target_segment)]
            )
            for s in samples
        ]
        return {
            "ntokens": sum(len(p) for p in packed),
            "cloze_input": {
                "src_tokens": data_utils.collate_tokens(packed, pad),
                "segment_ids": data_utils.collate_tokens(segments, self.source_segment),
                "objectives": torch.full((len(samples),), int(Objective.SEQ2SEQ), dtype=torch.long),
                "source_lengths": torch.tensor([len(s) for s in sources]),
            },
            "cloze_target": data_utils.collate_tokens(labels, pad),
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

        The pseudo target of UniLMv2's layout reuses the target's positions, so this holds for both layouts.
        """
        positions = self.source_sizes[indices] + self.target_sizes[indices]
        return indices[positions <= max_sizes], indices[positions > max_sizes].tolist()

    def ordered_indices(self):
        order = np.random.permutation(len(self))
        return order[np.argsort(self.sizes[order], kind="mergesort")]

    @property
    def supports_prefetch(self):
        return False
