"""Synthetic corpora for ``palm-bench``: a dictionary and fairseq-binarized data of exactly the shapes measured.

The benchmark feeds every task through its own ``load_dataset`` and dataset ``collater`` (so batches have the
real layout: pseudo-masked rows, packed UniLM rows, masked RoBERTa blocks, translation pairs), on random tokens
written to a temporary directory in fairseq's mmap format, the format ``fairseq-preprocess`` writes. Speed does
not depend on which tokens are drawn, only on the shapes.

Shapes for a sequence length ``L`` (all layouts hold ``L`` tokens per example, special tokens included):

* ``block``: one ``L - 2`` token sentence per document -> ``[BOS] text [EOS]`` (``pmlm``, fairseq ``masked_lm``);
* ``two_sentences``: documents of two sentences with ``L - 3`` text tokens -> ``[SOS] A [EOS] B [EOS]``
  (``unilm_pretraining``);
* ``continuation``: documents of a ``3L/4 - 1`` and an ``L/4 - 1`` token sentence -> source ``3L/4``, target
  ``L/4`` with their EOS (``continuation_pair`` with those ``--max-source/target-tokens``);
* ``parallel``: pairs of ``3L/4 - 2`` and ``L/4 - 1`` body tokens (translation layout): fairseq ``translation``
  sees ``3L/4 - 1`` + ``L/4`` tokens, ``unilm_seq2seq`` packs ``[SOS] S1 [EOS] S2 [EOS]`` = ``L`` tokens.
"""
import os

import numpy as np
import torch
from fairseq.data import Dictionary, indexed_dataset

from palm_plugin.data.symbols import MASK_SYMBOL

LAYOUTS = ("block", "two_sentences", "continuation", "parallel")


def build_dictionary(size: int) -> Dictionary:
    """fairseq's 4 special symbols, ``<mask>`` as a regular entry (as ``palm-data`` writes it), then
    words up to ``size`` types."""
    dictionary = Dictionary()
    dictionary.add_symbol(MASK_SYMBOL)
    for i in range(size - len(dictionary)):
        dictionary.add_symbol(f"w{i}", n=size - i)
    return dictionary


def target_split(length: int):
    """``(source_body, target_body)`` token counts of the seq2seq layouts for sequence length ``length``."""
    target_body = max(length // 4 - 1, 1)
    return length - 3 - target_body, target_body


class SyntheticCorpus:
    """Writes (once) and returns data directories for ``(layout, length, examples)``.

    Args:
        root: directory to write into (a temporary directory).
        vocab_size: dictionary size (types).
        seed: seeds the random tokens.
    """

    def __init__(self, root: str, vocab_size: int, seed: int = 1):
        self.root = root
        self.dictionary = build_dictionary(vocab_size)
        self.first_word = self.dictionary.index(MASK_SYMBOL) + 1
        self.rng = np.random.default_rng(seed)

    def _words(self, count: int) -> np.ndarray:
        return self.rng.integers(self.first_word, len(self.dictionary), size=count)

    def _write(self, prefix: str, items):
        builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=len(self.dictionary))
        for item in items:
            builder.add_item(torch.IntTensor(np.append(item, self.dictionary.eos())))
        builder.finalize(prefix + ".idx")

    def path(self, layout: str, length: int, examples: int) -> str:
        """Directory with ``dict*.txt`` and the ``train`` split of ``examples`` examples of ``layout``."""
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
        directory = os.path.join(self.root, f"{layout}-{length}-{examples}")
        if os.path.exists(directory):
            return directory
        os.makedirs(directory)
        blank = np.array([], dtype=np.int64)  # a blank line: a document boundary (an item holding only EOS)
        if layout == "parallel":
            source_body, target_body = target_split(length)
            for lang, body in (("src", source_body), ("tgt", target_body)):
                self.dictionary.save(os.path.join(directory, f"dict.{lang}.txt"))
                self._write(
                    os.path.join(directory, f"train.src-tgt.{lang}"), [self._words(body) for _ in range(examples)]
                )
            return directory
        self.dictionary.save(os.path.join(directory, "dict.txt"))
        if layout == "block":
            sentences = [[length - 2]]
        elif layout == "two_sentences":
            first = (length - 3) // 2
            sentences = [[first, length - 3 - first]]
        else:
            source_body, target_body = target_split(length)
            sentences = [[source_body + 1, target_body]]  # continuation_pair adds one EOS to each side
        items = []
        for _ in range(examples + 1):  # one document more: UniLM's next sentence negatives come from another one
            items += [self._words(n) for n in sentences[0]] + [blank]
        self._write(os.path.join(directory, "train"), items)
        return directory
