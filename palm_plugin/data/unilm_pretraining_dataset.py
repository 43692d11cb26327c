"""Pre-training data of UniLM (Dong et al. 2019, sections 2.1, 2.3 and 2.4).

Source: fairseq binarized monolingual text, one sentence a line and an empty line between documents (an item that
is only [EOS]). At construction the sentences are grouped into chunks of consecutive sentences of one document
(greedily, up to the length budget), from index arrays only: the tokens stay on disk (mmap) until an item is read.

Each item draws its objective (bidirectional 1/3, seq2seq 1/3, left-to-right 1/6, right-to-left 1/6, section 2.4)
and its noise from ``sample_rng(seed, epoch, index)``:

* bidirectional and seq2seq: ``[SOS] A [EOS] B [EOS]``, the chunk cut at a random sentence boundary; for
  bidirectional rows, half of the time B is replaced by text of another document (next sentence prediction,
  label 1 = "random", BERT's convention);
* left-to-right and right-to-left: one segment ``[SOS] text [EOS]``.

Segment ids mark the objective (section 2.1: "different segment embeddings for different LM objectives"; the ids
of the UniLM v1 code): bidirectional 0 / 1, left-to-right 2, right-to-left 3, seq2seq 4 / 5. 15% of the text
tokens are predicted, 80% as single tokens and 20% as bigrams or trigrams, corrupted 80/10/10.
"""
import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from palm_plugin.data.symbols import replacement_exclusions
from palm_plugin.data.token_masking import sample_rng
from palm_plugin.errors import InputValueError
from palm_plugin.modules.attention_masks import Objective

OBJECTIVES = (Objective.BIDIRECTIONAL, Objective.SEQ2SEQ, Objective.LEFT_TO_RIGHT, Objective.RIGHT_TO_LEFT)
OBJECTIVE_PROBS = (1 / 3, 1 / 3, 1 / 6, 1 / 6)
# (segment of [SOS] A [EOS], segment of B [EOS]) per objective.
OBJECTIVE_SEGMENTS = {
    Objective.BIDIRECTIONAL: (0, 1),
    Objective.LEFT_TO_RIGHT: (2, 2),
    Objective.RIGHT_TO_LEFT: (3, 3),
    Objective.SEQ2SEQ: (4, 5),
}
NUM_OBJECTIVE_SEGMENTS = 6
NOT_NEXT = 1


def sentence_chunks(sizes: np.ndarray, budget: int):
    """Group sentences into chunks of one document.

    Args:
        sizes: ``(N,)`` item lengths including the trailing [EOS]; an item of length 1 separates documents.
        budget: most text tokens per chunk (a longer single sentence forms a chunk alone and is cut later).
    Returns:
        ``starts``, ``ends`` (sentence index ranges ``[start, end)``), ``lengths`` (text tokens, capped at
        ``budget``) and ``documents`` (document number) of the chunks holding at least two text tokens.
    """
    starts, ends, lengths, documents = [], [], [], []
    document, start, length = 0, 0, 0

    def close(end):
        if end > start and length >= 2:
            starts.append(start), ends.append(end), lengths.append(min(length, budget)), documents.append(document)

    for index, size in enumerate(np.asarray(sizes).tolist()):
        text = size - 1
        if text == 0:
            close(index)
            document, start, length = document + 1, index + 1, 0
            continue
        if length > 0 and length + text > budget:
            close(index)
            start, length = index, 0
        length += text
    close(len(sizes))
    return (np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), np.array(lengths, dtype=np.int64),
            np.array(documents, dtype=np.int64))


class UniLMPretrainingDataset(FairseqDataset):
    """
    Args:
        sentences: fairseq indexed dataset, one sentence per item (ending with [EOS]).
        dictionary: ``bos()`` is [SOS], ``eos()`` [EOS].
        tokens_per_sample: the longest packed sequence, special tokens included.
        masking: selection and corruption (UniLM: ``TokenMaskingPolicy(0.15, span_length_probs=(0.8, 0.1, 0.1))``).
        mask_idx: the [MASK] symbol.
        seed: with the epoch and the index, seeds each item.
        objective_probs: probabilities of (bidirectional, seq2seq, left-to-right, right-to-left).
    """

    def __init__(self, sentences, dictionary, tokens_per_sample, masking, mask_idx, seed,
                 objective_probs=OBJECTIVE_PROBS):
        if tokens_per_sample < 5:
            raise InputValueError("--tokens-per-sample must be at least 5 ([SOS] A [EOS] B [EOS])")
        self.sentences = sentences
        self.dictionary = dictionary
        self.budget = tokens_per_sample - 3
        self.masking = masking
        self.mask_idx = mask_idx
        self.excluded_replacements = replacement_exclusions(dictionary)
        self.seed = seed
        self.objective_probs = np.asarray(objective_probs, dtype=np.float64)
        self.epoch = 1
        self.starts, self.ends, self.lengths, self.documents = sentence_chunks(sentences.sizes, self.budget)
        # Chunks hold only text lines; a line in none of them is a one-token sentence that formed a chunk alone.
        self.dropped_sentences = int((np.asarray(sentences.sizes) > 1).sum() - (self.ends - self.starts).sum())
        self.sizes = self.lengths + 3

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return len(self.starts)

    def _sentences(self, chunk):
        """The chunk's sentences without their [EOS], as numpy arrays."""
        return [self.sentences[i].numpy()[:-1] for i in range(self.starts[chunk], self.ends[chunk])]

    def _other_document_text(self, chunk, length, rng):
        """``length`` tokens (or fewer) from the start of a random chunk of another document (NSP negatives)."""
        # Chunks are numbered document by document: the other documents' chunks are all but one contiguous range,
        # so the draw needs no scan of the corpus (the r-th chunk outside [first, last) in index order).
        first, last = np.searchsorted(self.documents, self.documents[chunk], side="left"), np.searchsorted(
            self.documents, self.documents[chunk], side="right"
        )
        others = len(self.documents) - (last - first)
        if others == 0:
            return None
        other = int(rng.integers(others))
        other += (last - first) if other >= first else 0
        return np.concatenate(self._sentences(other))[:length]

    def __getitem__(self, index):
        rng = sample_rng(self.seed, self.epoch, index)
        objective = OBJECTIVES[rng.choice(len(OBJECTIVES), p=self.objective_probs)]
        sentences = self._sentences(index)
        text = np.concatenate(sentences)[: self.budget]
        bos, eos = self.dictionary.bos(), self.dictionary.eos()
        next_sentence = -1
        first_segment, second_segment = OBJECTIVE_SEGMENTS[objective]
        if objective in (Objective.LEFT_TO_RIGHT, Objective.RIGHT_TO_LEFT):
            tokens = np.concatenate([[bos], text, [eos]])
            source_length = len(tokens)
            segments = np.full(len(tokens), first_segment)
        else:
            # Cut at a sentence boundary when there are several sentences, else inside the sentence.
            boundaries = np.cumsum([len(s) for s in sentences])[:-1]
            boundaries = boundaries[boundaries < len(text)]
            cut = int(rng.choice(boundaries)) if len(boundaries) else int(rng.integers(1, len(text)))
            first, second = text[:cut], text[cut:]
            if objective == Objective.BIDIRECTIONAL:
                next_sentence = 0
                if rng.random() < 0.5:
                    other = self._other_document_text(index, len(second), rng)
                    if other is not None and len(other) > 0:
                        second, next_sentence = other, NOT_NEXT
            tokens = np.concatenate([[bos], first, [eos], second, [eos]])
            source_length = len(first) + 2
            segments = np.concatenate([np.full(source_length, first_segment), np.full(len(second) + 1, second_segment)])
        tokens = tokens.astype(np.int64)
        maskable = (tokens != bos) & (tokens != eos)
        selected = self.masking.select(maskable, rng)
        noised = self.masking.corrupt(
            tokens, selected, rng, self.mask_idx, self.dictionary.nspecial, len(self.dictionary),
            excluded=self.excluded_replacements,
        )
        return {
            "id": index,
            "tokens": torch.from_numpy(noised),
            "target": torch.from_numpy(np.where(selected, tokens, self.dictionary.pad())),
            "segments": torch.from_numpy(segments.astype(np.int64)),
            "objective": int(objective),
            "source_length": source_length,
            "next_sentence": next_sentence,
        }

    def collater(self, samples):
        if not samples:
            return {}
        pad = self.dictionary.pad()
        return {
            "id": torch.tensor([s["id"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": sum(len(s["tokens"]) for s in samples),
            "net_input": {
                "src_tokens": data_utils.collate_tokens([s["tokens"] for s in samples], pad),
                "segment_ids": data_utils.collate_tokens([s["segments"] for s in samples], 0),
                "objectives": torch.tensor([s["objective"] for s in samples]),
                "source_lengths": torch.tensor([s["source_length"] for s in samples]),
            },
            "target": data_utils.collate_tokens([s["target"] for s in samples], pad),
            "next_sentence_target": torch.tensor([s["next_sentence"] for s in samples]),
        }

    def num_tokens(self, index):
        return int(self.sizes[index])

    def num_tokens_vec(self, indices):
        return self.sizes[indices]

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        order = np.random.permutation(len(self))
        return order[np.argsort(self.sizes[order], kind="mergesort")]

    @property
    def supports_prefetch(self):
        return False
