"""UniLMv2 attention masks, cell by cell: the paper's Figure 5, random factorizations, the fine-tuning layout."""
import numpy as np
import torch

from palm_plugin.modules.attention_masks import (
    PseudoMaskKind as K,
    pmlm_mask,
    pseudo_seq2seq_layout,
    pseudo_seq2seq_mask,
)

# Figure 4/5 of the paper: x1..x6, x2, x4, x5 masked, factorization order {x4, x5} -> {x2}. Input:
#   x1 [M] x3 [M] [M] x6 | [P]4 [P]5 x4 x5 | [P]2 x2     (positions 1 2 3 4 5 6 | 4 5 4 5 | 2 2)
FIGURE_5_TOKENS = ["x1", "M2", "x3", "M4", "M5", "x6", "P4", "P5", "x4", "x5", "P2", "x2"]
FIGURE_5_STEPS = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
FIGURE_5_KINDS = [K.CONTEXT] * 6 + [K.PSEUDO, K.PSEUDO, K.ORIGINAL, K.ORIGINAL, K.PSEUDO, K.ORIGINAL]
# Figure 5, typed from the figure (1 = may attend). Columns in the order of FIGURE_5_TOKENS.
FIGURE_5 = [
    #x1 M2 x3 M4 M5 x6 P4 P5 x4 x5 P2 x2
    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # x1
    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # [M] of x2
    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # x3
    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # [M] of x4
    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # [M] of x5
    [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # x6
    [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0],  # [P] of x4: context, [M]s, the pseudo masks of its own step
    [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0],  # [P] of x5
    [1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0],  # x4: context, [M]s, the original tokens of its own step
    [1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0],  # x5
    [1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0],  # [P] of x2: ... + x4, x5 (step 1) + itself
    [1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1],  # x2: ... + x4, x5 + itself
]


def test_figure_5_cell_by_cell():
    steps = torch.tensor([FIGURE_5_STEPS])
    kinds = torch.tensor([[int(k) for k in FIGURE_5_KINDS]])
    mask = pmlm_mask(steps, kinds, torch.zeros(1, 12, dtype=torch.bool))
    assert mask.dtype == torch.bool and mask.shape == (1, 12, 12)
    expected = torch.tensor(FIGURE_5, dtype=torch.bool)
    for i, row in enumerate(FIGURE_5_TOKENS):
        for j, column in enumerate(FIGURE_5_TOKENS):
            assert mask[0, i, j] == expected[i, j], f"row {row}, column {column}"


def reference_pmlm_mask(steps, kinds):
    """The rules of DESIGN.md section 3 / the paper, one cell at a time."""
    n = len(steps)
    mask = np.zeros((n, n), bool)
    for i in range(n):
        for j in range(n):
            if kinds[j] == K.CONTEXT:
                mask[i, j] = True  # [M] and unmasked context: visible to every row
            elif kinds[i] == K.CONTEXT:
                mask[i, j] = False  # context rows never see appended tokens
            elif kinds[j] == K.ORIGINAL:
                earlier = steps[j] < steps[i]
                own_span = kinds[i] == K.ORIGINAL and steps[j] == steps[i]
                mask[i, j] = earlier or own_span
            else:  # a pseudo key: only the pseudo rows of its own step
                mask[i, j] = kinds[i] == K.PSEUDO and steps[j] == steps[i]
    return mask


def random_layout(rng, length):
    """A random PMLM layout: context, then per step a run of [P] and a run of originals of the same size."""
    context = rng.integers(1, length)
    steps, kinds = [0] * context, [K.CONTEXT] * context
    step = 0
    while len(steps) < length:
        size = int(rng.integers(1, 4))
        steps += [step] * (2 * size)
        kinds += [K.PSEUDO] * size + [K.ORIGINAL] * size
        step += 1
    return steps[:length], kinds[:length]


def test_random_layouts_match_the_rules_and_padding_is_hidden():
    rng = np.random.default_rng(0)
    batch, length = 6, 23
    layouts = [random_layout(rng, length) for _ in range(batch)]
    steps = torch.tensor([s for s, _ in layouts])
    kinds = torch.tensor([[int(k) for k in ks] for _, ks in layouts])
    lengths = torch.tensor([23, 20, 17, 23, 9, 12])
    padding = torch.arange(length).unsqueeze(0) >= lengths.unsqueeze(1)
    mask = pmlm_mask(steps, kinds, padding)
    for b, (s, k) in enumerate(layouts):
        n = int(lengths[b])
        assert np.array_equal(mask[b, :n, :n].numpy(), reference_pmlm_mask(s[:n], k[:n]))
        assert not mask[b, :, n:][:n].any()  # no real row sees padding
        assert torch.equal(mask[b, n:, :], torch.eye(length, dtype=torch.bool)[n:])  # padding rows see themselves


def test_no_attention_path_leaks_a_target_to_its_pseudo_token():
    """The leakage property stated as reachability: over any number of layers (transitive closure of the mask),
    a pseudo token of step i can never reach an original token of a step >= i."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        steps, kinds = random_layout(rng, 30)
        mask = pmlm_mask(torch.tensor([steps]), torch.tensor([[int(k) for k in kinds]]), torch.zeros(1, 30, dtype=torch.bool))[0]
        reach = mask.clone()
        for _ in range(5):  # paths of up to 2**5 hops
            reach = reach | ((reach.float() @ reach.float()) > 0)
        for i in range(30):
            for j in range(30):
                if kinds[i] == K.PSEUDO and kinds[j] == K.ORIGINAL and steps[j] >= steps[i]:
                    assert not reach[i, j], (i, j)
                if kinds[i] == K.CONTEXT and kinds[j] != K.CONTEXT:
                    assert not reach[i, j], (i, j)


def test_seq2seq_layout_cell_by_cell():
    """Packed rows [source | target | pseudo | padding]: (source, target) lengths (3, 3), (2, 1), (4, 2)."""
    source_lengths, target_lengths = torch.tensor([3, 2, 4]), torch.tensor([3, 1, 2])
    width = 9
    padding = torch.arange(width).unsqueeze(0) >= (source_lengths + 2 * target_lengths).unsqueeze(1)
    mask = pseudo_seq2seq_mask(source_lengths, target_lengths, padding)

    def block(b, column):
        s, t = int(source_lengths[b]), int(target_lengths[b])
        if column < s:
            return "source", column
        if column < s + t:
            return "target", column - s
        if column < s + 2 * t:
            return "pseudo", column - s - t
        return "padding", None

    for b in range(3):
        for i in range(width):
            for j in range(width):
                (row_block, row_index), (col_block, col_index) = block(b, i), block(b, j)
                if row_block == "padding":
                    expected = i == j
                elif col_block == "padding":
                    expected = False
                elif col_block == "source":
                    expected = True  # every row sees the source
                elif row_block == "source":
                    expected = False  # source rows see the source only
                elif row_block == "target":
                    expected = col_block == "target" and col_index <= row_index
                else:  # pseudo row i: target < i and itself
                    expected = (col_block == "target" and col_index < row_index) or (
                        col_block == "pseudo" and col_index == row_index
                    )
                assert bool(mask[b, i, j]) == expected, (b, i, j)


def test_seq2seq_layout_steps_and_kinds():
    steps, kinds = pseudo_seq2seq_layout(torch.tensor([2]), torch.tensor([3]), 10)
    assert steps.tolist() == [[0, 0, 0, 1, 2, 0, 1, 2, 0, 0]]
    assert kinds.tolist() == [[K.CONTEXT] * 2 + [K.ORIGINAL] * 3 + [K.PSEUDO] * 3 + [K.CONTEXT] * 2]
