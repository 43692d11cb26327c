"""Growing the position and segment tables of a pre-trained checkpoint to a model that has more rows.

The papers fine-tune at 768 positions (UniLM v1 CNN/DM; UniLMv2 CNN/DM and XSum) while the released models have
512. The authors' fine-tuning code (s2s-ft, ``s2s_ft/modeling.py`` ``from_pretrained`` with
``reuse_position_embedding=True``, as ``run_seq2seq.py`` calls it) fills the new position rows by copying the
pre-trained table again from its start: row ``i`` becomes row ``i mod old``. New segment (token type) rows start as
copies of type 0, the type every pre-trained token had. A smaller model keeps the first rows (s2s-ft truncates too).
"""
import torch

POSITIONS = "encoder.stack.embeddings.positions.weight"
SEGMENTS = "encoder.stack.embeddings.segments.weight"


def resize_positions(table: torch.Tensor, rows: int) -> torch.Tensor:
    """``table`` (old, dim) -> (rows, dim): tiled copies of the pre-trained rows, or its first ``rows``."""
    old = table.size(0)
    return table[torch.arange(rows) % old].clone() if rows > old else table[:rows].clone()


def resize_segments(table: torch.Tensor, rows: int) -> torch.Tensor:
    """``table`` (old, dim) -> (rows, dim): new rows copied from type 0, or the first ``rows``."""
    old = table.size(0)
    if rows <= old:
        return table[:rows].clone()
    return torch.cat([table, table[:1].expand(rows - old, -1)])


def fit_tables(state_dict, prefix, positions: int, segments: int):
    """Resize a unilm state dict's position and segment tables (keys under ``prefix``) in place to the model's
    sizes; returns a description of each change (empty when the sizes agree)."""
    changes = []
    for key, rows, resize in ((POSITIONS, positions, resize_positions), (SEGMENTS, segments, resize_segments)):
        table = state_dict.get(prefix + key)
        if table is not None and table.size(0) != rows:
            changes.append(f"{key.split('.')[-2]} {table.size(0)} -> {rows}")
            state_dict[prefix + key] = resize(table, rows)
    return changes
