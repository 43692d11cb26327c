"""Token embedding for a dictionary that ends with source position markers (``<unk-0>``, ``<unk-1>``, ...).

fairseq's examples/pointer_generator copies out-of-vocabulary words by replacing each ``<unk>`` of the source
with a marker naming its position, appending those markers to the dictionary; its postprocess.py restores the
words after decoding. The markers need no embeddings of their own: they all read the ``<unk>`` row, so the table
has ``len(dictionary) - markers`` rows and stays compatible with a checkpoint trained without markers.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MarkerEmbedding(nn.Embedding):
    """``nn.Embedding`` whose indices ``>= num_embeddings`` (position markers) are looked up as ``unk_idx``."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int, unk_idx: int):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        self.unk_idx = unk_idx

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.masked_fill(tokens >= self.num_embeddings, self.unk_idx)
        return F.embedding(tokens, self.weight, self.padding_idx)
