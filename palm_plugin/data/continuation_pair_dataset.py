"""PALM's pre-training pairs (Bi et al. 2020, sections 2.2 and 3.1): a context and the text that follows it.

The corpus is fairseq binarized monolingual data, one sentence per item, documents separated by blank lines
(fairseq-preprocess stores a blank line as an item holding only EOS). Pairs never cross a document boundary.

* ``sentence`` mode (section 3.1): for every sentence ``i`` that has a successor in its document, the source is
  sentences ``i, i+1, ...`` as many as fit in ``max_source_tokens`` (at least one, keeping at least one sentence
  for the target), the target the sentences after it as many as fit in ``max_target_tokens`` (at least one): a
  sliding window with a stride of one sentence.
* ``fraction`` mode (section 2.2): for every sentence ``i``, a fragment of the sentences from ``i`` that fit in
  ``max_source_tokens + max_target_tokens`` (at least one) is cut in the ratio of the two limits (80% / 20% with
  400 / 100): source = its beginning, target = the rest.

A single sentence longer than its limit is truncated to the limit; :func:`build_pair_index` counts those pairs, and
the documents too short for any pair (one sentence in ``sentence`` mode, one token in ``fraction`` mode), and the
task logs the counts. Pairs live only as index arrays (token offsets into the corpus read as one stream, and
lengths), computed once with numpy; tokens are read from the memory-mapped corpus when an item is requested.

Items (``objective``; randomness seeded by ``(seed, epoch, index)``), each followed by EOS:

* ``continuation`` (PALM): the source BERT-masked (``mask_prob`` of its tokens selected, 80/10/10), the MLM
  targets (original tokens at the selected positions, padding elsewhere), the target = the continuation;
* ``masked_span`` (a MASS-like baseline, Song et al. 2019): the source is the whole fragment (pair source + target)
  with one contiguous span, as long as the pair's target and at a random place, selected and replaced 80/10/10;
  the target is that span. The decoder predicts as many tokens as PALM's, from the text on both sides of them;
* ``unconditional`` (a BERT+LM-like baseline, PALM Table 5): no source (EOS alone), the target the continuation:
  the decoder learns it as a language model; the encoder learns only in PALM's stage ``ae`` before.

Batches use fairseq's translation layout (``prev_output_tokens`` = EOS + target[:-1]), so the same
model fine-tunes with fairseq's ``translation`` task.
"""
from dataclasses import dataclass

import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from palm_plugin.data.token_masking import TokenMaskingPolicy, sample_rng


@dataclass(frozen=True)
class PairIndex:
    """Pair ``p`` has source tokens ``stream[source_start[p] : source_start[p] + source_length[p]]`` and target
    tokens ``stream[target_start[p] : target_start[p] + target_length[p]]``, where ``stream`` is the corpus's
    sentences (without their EOS) one after another."""

    source_start: np.ndarray  # int64 (P,)
    source_length: np.ndarray  # int32 (P,)
    target_start: np.ndarray  # int64 (P,)
    target_length: np.ndarray  # int32 (P,)
    truncated_sources: int
    truncated_targets: int
    documents: int  # documents with text (blank lines in a row make no document)
    documents_without_pairs: int  # of those, the ones too short for a pair, whose text is not used

    def __len__(self):
        return len(self.source_start)


def sentence_layout(item_sizes: np.ndarray):
    """Sentences of the corpus from its item sizes (tokens + EOS per item; a blank line has size 1).

    Returns:
        ``sentence_items`` (S,) the corpus item of each sentence, ``offsets`` (S + 1,) the start of each sentence
        in the token stream (``offsets[-1]`` = its length) and ``document_end`` (S,) the index one past the last
        sentence of each sentence's document.
    """
    item_sizes = np.asarray(item_sizes, dtype=np.int64)
    blank = item_sizes <= 1
    sentence_items = np.flatnonzero(~blank)
    offsets = np.concatenate(([0], np.cumsum(item_sizes[sentence_items] - 1)))
    document = np.cumsum(blank)[sentence_items]
    document_end = np.searchsorted(document, document, side="right")
    return sentence_items, offsets, document_end


def _last_fitting(offsets: np.ndarray, start: np.ndarray, budget: int) -> np.ndarray:
    """For each sentence index ``start``, the largest ``j`` with ``offsets[j] - offsets[start] <= budget``."""
    return np.searchsorted(offsets, offsets[start] + budget, side="right") - 1


def build_pair_index(item_sizes, max_source_tokens: int, max_target_tokens: int, split_mode: str) -> PairIndex:
    """All pairs of the corpus, vectorised over sentences (see the module docstring for the two modes)."""
    _, offsets, document_end = sentence_layout(item_sizes)
    first = np.arange(len(document_end))
    if split_mode == "sentence":
        first = first[first + 1 < document_end]
        split = np.clip(_last_fitting(offsets, first, max_source_tokens), first + 1, document_end[first] - 1)
        end = np.clip(_last_fitting(offsets, split, max_target_tokens), split + 1, document_end[first])
        source_tokens = offsets[split] - offsets[first]
        target_tokens = offsets[end] - offsets[split]
        source_length = np.minimum(source_tokens, max_source_tokens)
        target_length = np.minimum(target_tokens, max_target_tokens)
        target_start = offsets[split]
        truncated_sources = int((source_tokens > max_source_tokens).sum())
        truncated_targets = int((target_tokens > max_target_tokens).sum())
    elif split_mode == "fraction":
        budget = max_source_tokens + max_target_tokens
        end = np.clip(_last_fitting(offsets, first, budget), first + 1, document_end)
        fragment_tokens = offsets[end] - offsets[first]
        keep = fragment_tokens >= 2
        first, fragment_tokens = first[keep], fragment_tokens[keep]
        fragment = np.minimum(fragment_tokens, budget)
        source_length = np.clip(np.rint(fragment * max_source_tokens / budget).astype(np.int64), 1, fragment - 1)
        target_length = fragment - source_length
        target_start = offsets[first] + source_length
        truncated_sources = 0
        truncated_targets = int((fragment_tokens > budget).sum())
    else:
        raise ValueError(f"unknown split mode {split_mode!r}: expected 'sentence' or 'fraction'")
    # A document is identified by its end; the pairs' first sentences say which documents are used.
    documents = len(np.unique(document_end))
    return PairIndex(
        source_start=offsets[first].astype(np.int64),
        source_length=source_length.astype(np.int32),
        target_start=target_start.astype(np.int64),
        target_length=target_length.astype(np.int32),
        truncated_sources=truncated_sources,
        truncated_targets=truncated_targets,
        documents=documents,
        documents_without_pairs=documents - len(np.unique(document_end[first])),
    )


class ContinuationPairDataset(FairseqDataset):
    """(masked context, continuation) pairs read lazily from a sentence-per-item corpus.

    Args:
        sentences: fairseq indexed dataset, one sentence (tokens + EOS) or blank line (EOS) per item.
        pairs: :class:`PairIndex` built from ``sentences.sizes``.
        dictionary: the fairseq dictionary (pad, eos, special symbols).
        mask_idx: index of ``<mask>``.
        masking: the BERT masking policy for the source.
        seed: with the epoch and the item index, seeds each item's masking.
    """

    OBJECTIVES = ("continuation", "masked_span", "unconditional")

    def __init__(
        self,
        sentences,
        pairs: PairIndex,
        dictionary,
        mask_idx: int,
        masking: TokenMaskingPolicy,
        seed: int,
        objective: str = "continuation",
    ):
        if objective not in self.OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}: expected one of {', '.join(self.OBJECTIVES)}")
        self.objective = objective
        self.sentences = sentences
        self.pairs = pairs
        self.dictionary = dictionary
        self.mask_idx = mask_idx
        self.masking = masking
        self.seed = seed
        self.epoch = 1
        self.sentence_items, self.offsets, _ = sentence_layout(sentences.sizes)

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True  # the batches do not change between epochs, only the masks (read at __getitem__ time)

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        self.epoch = epoch

    def _stream(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` of the corpus's sentence stream (EOS of each sentence removed)."""
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        last = int(np.searchsorted(self.offsets, start + length, side="left"))
        pieces = [self.sentences[int(self.sentence_items[s])][:-1].numpy() for s in range(first, last)]
        tokens = np.concatenate(pieces)
        begin = start - int(self.offsets[first])
        return tokens[begin:begin + length]

    def __getitem__(self, index):
        eos = self.dictionary.eos()
        source_length, target_length = int(self.pairs.source_length[index]), int(self.pairs.target_length[index])
        source = self._stream(int(self.pairs.source_start[index]), source_length)
        target = self._stream(int(self.pairs.target_start[index]), target_length)
        rng = sample_rng(self.seed, self.epoch, index)
        if self.objective == "masked_span":
            # the target follows the source in the stream in both split modes: together they are the fragment
            source = np.concatenate([source, target])
            start = int(rng.integers(0, len(source) - target_length + 1))
            target = source[start:start + target_length]
            selected = np.zeros(len(source), dtype=bool)
            selected[start:start + target_length] = True
        elif self.objective == "unconditional":
            source = source[:0]
            selected = np.zeros(0, dtype=bool)
        else:
            selected = self.masking.select(np.ones(len(source), dtype=bool), rng)
        noised = self.masking.corrupt(
            source, selected, rng, self.mask_idx, self.dictionary.nspecial, len(self.dictionary)
        )
        mlm_target = np.where(selected, source, self.dictionary.pad())
        return {
            "id": index,
            "source": torch.from_numpy(np.append(noised, eos)).long(),
            "mlm_target": torch.from_numpy(np.append(mlm_target, self.dictionary.pad())).long(),
            "target": torch.from_numpy(np.append(target, eos)).long(),
        }

    def __len__(self):
        return len(self.pairs)

    def collater(self, samples):
        """Batch with fairseq's translation keys plus ``mlm_target`` ``(B, S)`` (padding where not predicted)."""
        if not samples:
            return {}
        pad, eos = self.dictionary.pad(), self.dictionary.eos()

        def merge(key, move_eos_to_beginning=False):
            return data_utils.collate_tokens(
                [s[key] for s in samples], pad, eos, left_pad=False, move_eos_to_beginning=move_eos_to_beginning
            )

        target = merge("target")
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": int(target.ne(pad).sum()),
            "net_input": {
                "src_tokens": merge("source"),
                "src_lengths": torch.LongTensor([len(s["source"]) for s in samples]),
                "prev_output_tokens": merge("target", move_eos_to_beginning=True),
            },
            "target": target,
            "mlm_target": merge("mlm_target"),
        }

    # Sizes count the EOS; they are derived from the pair index when asked for, not stored per pair.
    def source_sizes(self, indices=slice(None)):
        return self.pairs.source_length[indices].astype(np.int64) + 1

    def target_sizes(self, indices=slice(None)):
        return self.pairs.target_length[indices].astype(np.int64) + 1

    def num_tokens(self, index):
        return max(int(self.pairs.source_length[index]), int(self.pairs.target_length[index])) + 1

    def num_tokens_vec(self, indices):
        return np.maximum(self.source_sizes(indices), self.target_sizes(indices))

    def size(self, index):
        return int(self.pairs.source_length[index]) + 1, int(self.pairs.target_length[index]) + 1

    def ordered_indices(self):
        """Shuffled, then sorted by target and source length (as fairseq's LanguagePairDataset) for tight batches."""
        indices = np.random.permutation(len(self))
        indices = indices[np.argsort(self.target_sizes(indices), kind="mergesort")]
        return indices[np.argsort(self.source_sizes(indices), kind="mergesort")]

    def filter_indices_by_size(self, indices, max_sizes):
        return data_utils.filter_paired_dataset_indices_by_size(
            self.source_sizes(), self.target_sizes(), indices, max_sizes
        )

    @property
    def supports_prefetch(self):
        return False
