"""UniLM's self-attention masks (Dong et al. 2019, section 2.2-2.3, Figure 1), checked cell by cell.

Matrices are written row by row: row i = query token i, column j = key token j, 1 = may attend.
"""
import torch

from palm_plugin.modules.attention_masks import (
    Objective,
    bidirectional_mask,
    left_to_right_mask,
    right_to_left_mask,
    seq2seq_decoding_mask,
    seq2seq_mask,
    unilm_mask,
)


def matrix(text):
    return torch.tensor([[c == "1" for c in row.split()] for row in text.strip().splitlines()])


def test_seq2seq_mask_is_the_papers_example():
    # "[SOS] t1 t2 [EOS] t3 t4 t5 [EOS]": t1 and t2 see the first four tokens; t4 sees the first six.
    expected = matrix("""
        1 1 1 1 0 0 0 0
        1 1 1 1 0 0 0 0
        1 1 1 1 0 0 0 0
        1 1 1 1 0 0 0 0
        1 1 1 1 1 0 0 0
        1 1 1 1 1 1 0 0
        1 1 1 1 1 1 1 0
        1 1 1 1 1 1 1 1
    """)
    mask = seq2seq_mask(torch.tensor([4]), 8)[0]
    assert torch.equal(mask, expected)
    assert mask[1, :4].all() and mask[2, :4].all() and not mask[1, 4:].any()  # t1, t2
    assert mask[5].sum() == 6 and mask[5, :6].all()  # t4


def test_unidirectional_and_bidirectional_masks():
    assert torch.equal(left_to_right_mask(4), matrix("""
        1 0 0 0
        1 1 0 0
        1 1 1 0
        1 1 1 1
    """))
    assert torch.equal(right_to_left_mask(4), matrix("""
        1 1 1 1
        0 1 1 1
        0 0 1 1
        0 0 0 1
    """))
    assert torch.equal(bidirectional_mask(3), torch.ones(3, 3, dtype=torch.bool))
    # "x1 x2 [MASK] x4" under left-to-right: the mask token sees x1, x2 and itself (section 2.3).
    assert left_to_right_mask(4)[2].tolist() == [True, True, True, False]


def test_mixed_batch_one_objective_per_row_with_padding():
    padding = torch.tensor([
        [0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1],
        [0, 0, 0, 0, 1],
        [0, 0, 0, 1, 1],
    ], dtype=torch.bool)
    objectives = torch.tensor([Objective.BIDIRECTIONAL, Objective.LEFT_TO_RIGHT, Objective.SEQ2SEQ, Objective.RIGHT_TO_LEFT])
    mask = unilm_mask(objectives, torch.tensor([0, 0, 2, 0]), padding)
    expected = [
        matrix("""
            1 1 1 1 1
            1 1 1 1 1
            1 1 1 1 1
            1 1 1 1 1
            1 1 1 1 1
        """),
        matrix("""
            1 0 0 0 0
            1 1 0 0 0
            1 1 1 0 0
            0 0 0 1 0
            0 0 0 0 1
        """),
        matrix("""
            1 1 0 0 0
            1 1 0 0 0
            1 1 1 0 0
            1 1 1 1 0
            0 0 0 0 1
        """),
        matrix("""
            1 1 1 0 0
            0 1 1 0 0
            0 0 1 0 0
            0 0 0 1 0
            0 0 0 0 1
        """),
    ]
    for row in range(4):
        assert torch.equal(mask[row], expected[row]), f"row {row} ({Objective(int(objectives[row])).name})"


def test_decoding_mask_is_the_last_rows_of_the_seq2seq_mask():
    # Source "[SOS] a [EOS] <pad>" (3 real tokens), 2 decoded tokens cached, new rows [y_1, placeholder].
    mask = seq2seq_decoding_mask(torch.tensor([[False, False, False, True]]), cached=2, new=2)[0]
    assert torch.equal(mask, matrix("""
        1 1 1 0 1 1 1 0
        1 1 1 0 1 1 1 1
    """))
    # Without padding it equals the bottom rows of the full seq2seq mask over [source | target].
    full = seq2seq_mask(torch.tensor([3]), 3 + 3 + 2)[0]
    incremental = seq2seq_decoding_mask(torch.zeros(1, 3, dtype=torch.bool), cached=3, new=2)[0]
    assert torch.equal(incremental, full[-2:])
