"""Values of the position / segment table resizing (palm_plugin/modules/table_extension.py) against a hand-written
loop of s2s-ft's rule (``s2s_ft/modeling.py`` ``from_pretrained(reuse_position_embedding=True)``): new position row
``i`` is pre-trained row ``i mod old``; new segment rows are copies of type 0; a smaller model keeps the first rows.
Tables are deliberately not square, so that rows and columns cannot be confused."""
import torch

from palm_plugin.modules.table_extension import POSITIONS, SEGMENTS, fit_tables, resize_positions, resize_segments


def _table(rows, dim):
    return torch.arange(rows * dim, dtype=torch.float64).view(rows, dim)


def test_positions_are_tiled_from_the_start_of_the_pretrained_table():
    table = _table(5, 3)
    grown = resize_positions(table, 12)
    expected = torch.stack([table[i % 5] for i in range(12)])
    assert torch.equal(grown, expected)
    assert torch.equal(resize_positions(table, 4), table[:4])
    assert torch.equal(resize_positions(table, 5), table)


def test_new_segment_rows_copy_type_zero():
    table = _table(2, 4)
    grown = resize_segments(table, 6)
    expected = torch.stack([table[0], table[1]] + [table[0]] * 4)
    assert torch.equal(grown, expected)
    assert torch.equal(resize_segments(_table(6, 4), 3), _table(6, 4)[:3])
    assert torch.equal(resize_segments(table, 2), table)


def test_resized_tables_are_copies_not_views():
    table = _table(5, 3)
    for resized in (resize_positions(table, 3), resize_positions(table, 5), resize_segments(table, 3)):
        resized.add_(1)
    assert torch.equal(table, _table(5, 3))


def test_fit_tables_resizes_both_tables_in_place_and_describes_the_changes():
    prefix = "encoder."
    state = {prefix + POSITIONS: _table(4, 3), prefix + SEGMENTS: _table(2, 3), "other": torch.zeros(1)}
    changes = fit_tables(state, prefix, positions=10, segments=2)
    assert changes == ["positions 4 -> 10"]
    assert torch.equal(state[prefix + POSITIONS], torch.stack([_table(4, 3)[i % 4] for i in range(10)]))
    assert torch.equal(state[prefix + SEGMENTS], _table(2, 3))
    changes = fit_tables(state, prefix, positions=10, segments=6)
    assert changes == ["segments 2 -> 6"]
    assert torch.equal(state[prefix + SEGMENTS][2:], _table(2, 3)[0].expand(4, 3))
    assert fit_tables({}, prefix, positions=10, segments=6) == []
