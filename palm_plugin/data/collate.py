"""Batching helpers shared by the datasets' collaters."""
import numpy as np
import torch


def pad_rows(rows, pad: int) -> torch.Tensor:
    """Right-pad 1-D integer rows (numpy arrays or tensors) into one ``(B, L)`` long tensor (what fairseq's
    ``collate_tokens`` does, in one numpy buffer instead of a tensor copy per row)."""
    rows = [row.numpy() if isinstance(row, torch.Tensor) else row for row in rows]
    out = np.full((len(rows), max(len(r) for r in rows)), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return torch.from_numpy(out)
