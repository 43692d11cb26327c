"""Growing the tables of a pre-trained checkpoint to a model that has more rows: positions, segments, the
``<pseudo>`` symbol and UniLMv2's relative position bias.

The papers fine-tune at 768 positions (UniLM v1 CNN/DM; UniLMv2 CNN/DM and XSum) while the released models have
512. The authors' fine-tuning code (s2s-ft, ``s2s_ft/modeling.py`` ``from_pretrained`` with
``reuse_position_embedding=True``, as ``run_seq2seq.py`` calls it) fills the new position rows by copying the
pre-trained table again from its start: row ``i`` becomes row ``i mod old``. New segment (token type) rows start as
copies of type 0, the type every pre-trained token had. A smaller model keeps the first rows (s2s-ft truncates too).

A BERT / UniLM v1 / MiniLM checkpoint has no pseudo mask: its vocabulary ends where its dictionary does, and the
UniLMv2 tasks (``pmlm``, ``unilm_seq2seq --pseudo-masks``) append ``<pseudo>`` after it. The released UniLMv2 code
feeds [MASK] at the pseudo slots (s2s-ft's ``Seq2seqDatasetForBert``); so the new row starts as a copy of the
``<mask>`` row (embedding and output bias): before any update the model reads ``<pseudo>`` as the checkpoint reads
[MASK], while pre-training can still tell [P] from [M]. A checkpoint without a relative position bias gets one of
zeros, so that before any update the model computes what the checkpoint computes.
"""
import torch

POSITIONS = "encoder.stack.embeddings.positions.weight"
SEGMENTS = "encoder.stack.embeddings.segments.weight"
TOKENS = "encoder.stack.embeddings.tokens.weight"
# every table with a row per symbol (the output weight is tied to TOKENS, and saved under its own name too)
VOCABULARY_ROWS = (TOKENS, "lm_head.weight", "lm_head.bias")
RELATIVE = "encoder.stack.relative_position.weight"


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


def add_pseudo_row(state_dict, prefix, dictionary, pseudo_symbol, mask_symbol):
    """Append the ``<pseudo>`` row (a copy of ``<mask>``'s) to a unilm state dict whose vocabulary ends one symbol
    before ``dictionary``, when that last symbol is ``<pseudo>``; True when it did."""
    tokens = state_dict.get(prefix + TOKENS)
    last = len(dictionary) - 1
    if tokens is None or tokens.size(0) != last or dictionary[last] != pseudo_symbol:
        return False
    mask = dictionary.index(mask_symbol)
    if mask >= last:
        return False
    for key in VOCABULARY_ROWS:
        if prefix + key in state_dict:
            table = state_dict[prefix + key]
            state_dict[prefix + key] = torch.cat([table, table[mask : mask + 1]])
    return True


def add_relative_bias(state_dict, prefix, shape):
    """Give a unilm state dict without a relative position bias a zero one of ``shape`` (``[heads, buckets]``);
    True when it did."""
    if prefix + RELATIVE in state_dict or prefix + TOKENS not in state_dict:
        return False
    state_dict[prefix + RELATIVE] = torch.zeros(shape, dtype=state_dict[prefix + TOKENS].dtype)
    return True
