"""Values of UniLMv2's seq2seq fine-tuning layout (palm_plugin/modules/attention_masks.py) against a per-row
construction in plain Python of its documented contract: ``[source | target | pseudo target | padding]``, the
source and the padding CONTEXT (step 0), target token i the ORIGINAL token of step i, pseudo token i the PSEUDO
token of step i. A batch mixes lengths, an empty target included, so that no row's layout relies on another's. And
every mask of the family as that layout's rule, and that rule as two comparisons of ranks (what the Triton attention
evaluates)."""
import torch

from palm_plugin.modules.attention_masks import PseudoMaskKind as K
from palm_plugin.modules.attention_masks import pseudo_seq2seq_layout


def _row(source, target, seq_len):
    steps = [0] * source + list(range(target)) + list(range(target))
    kinds = [K.CONTEXT] * source + [K.ORIGINAL] * target + [K.PSEUDO] * target
    padding = seq_len - len(steps)
    return steps + [0] * padding, [int(k) for k in kinds] + [int(K.CONTEXT)] * padding


def test_layout_of_a_mixed_batch_equals_the_per_row_construction():
    sources, targets, seq_len = [3, 1, 4, 2], [2, 4, 0, 1], 10
    steps, kinds = pseudo_seq2seq_layout(torch.tensor(sources), torch.tensor(targets), seq_len)
    for row, (source, target) in enumerate(zip(sources, targets)):
        expected_steps, expected_kinds = _row(source, target, seq_len)
        assert steps[row].tolist() == expected_steps, (source, target)
        assert kinds[row].tolist() == expected_kinds, (source, target)


def shown_by_ranks(steps, kinds, padding):
    from palm_plugin.modules.attention_masks import visibility_ranks

    rank, reach = visibility_ranks(steps, kinds, padding)
    return (rank.unsqueeze(1) <= rank.unsqueeze(2)) & (rank.unsqueeze(2) <= reach.unsqueeze(1))


def test_one_rule_covers_every_mask_of_the_family():
    """The Triton attention evaluates every mask by the pseudo-masked LM's rule, as two comparisons of ranks: UniLM's
    four objectives, the mix, bidirectional with padding and UniLMv2's layouts laid out as its steps and kinds
    (as_pmlm_layout) give the masks of attention_masks.py, cell by cell (the batches of tests/test_attention_triton.py,
    of unequal lengths), and so do their ranks."""
    from palm_plugin.modules.attention_masks import as_pmlm_layout, mask_from_fields, pmlm_mask
    from tests.test_attention_triton import CASES

    for name, (fields, _, _) in CASES.items():
        padding = fields["padding_mask"]
        layout = as_pmlm_layout(**fields)
        assert torch.equal(pmlm_mask(*layout, padding), mask_from_fields(**fields)), name
        assert torch.equal(shown_by_ranks(*layout, padding), mask_from_fields(**fields)), name


def test_ranks_are_on_the_device_of_the_layout():
    """The Triton attention builds the ranks from a batch on the GPU: padding's ranks (one per column) are made on the
    batch's device too, or torch.where refuses the mix. The meta device stands in for CUDA on a machine without one
    (tests/test_gpu.py runs the kernels on CUDA)."""
    from palm_plugin.modules.attention_masks import visibility_ranks

    steps = torch.zeros(2, 5, dtype=torch.long, device="meta")
    kinds = torch.full((2, 5), int(K.CONTEXT), device="meta")
    padding = torch.zeros(2, 5, dtype=torch.bool, device="meta")
    rank, reach = visibility_ranks(steps, kinds, padding)
    assert rank.device == reach.device == torch.device("meta") and rank.shape == reach.shape == (2, 5)


def test_ranks_give_the_pseudo_masked_rule_for_any_steps_and_kinds():
    """Random layouts the family never builds: steps from -40 to 40 (right-to-left's are negative), kinds mixed in
    any order, steps with several tokens of a kind and steps with none, padding anywhere (500 rows of 37 tokens)."""
    from palm_plugin.modules.attention_masks import pmlm_mask

    generator = torch.Generator().manual_seed(3)
    steps = torch.randint(-40, 41, (500, 37), generator=generator)
    steps[:250] //= 8  # few steps: many tokens share one
    kinds = torch.randint(0, 3, (500, 37), generator=generator)
    padding = torch.rand(500, 37, generator=generator) < 0.15
    expected = pmlm_mask(steps, kinds, padding)
    assert 0.2 < float(expected.float().mean()) < 0.8
    assert torch.equal(shown_by_ranks(steps, kinds, padding), expected)


def test_every_mask_is_built_on_the_device_of_its_batch():
    """The (B, T, T) mask is built where the batch's fields are (the model's device), for every layout, padding
    hidden. The meta device stands in for a GPU: a tensor made on the CPU is another device to it, as to CUDA, so an
    operation mixing the two fails, as it would there (meta tensors hold no values: shape and dtype are checked)."""
    from palm_plugin.modules.attention_masks import Objective, mask_from_fields

    def on_meta(values):
        return torch.tensor(values, device="meta")

    padding = torch.zeros(2, 6, dtype=torch.bool, device="meta")
    layouts = {
        "bidirectional": {},
        "unilm": dict(objectives=on_meta([Objective.RIGHT_TO_LEFT, Objective.SEQ2SEQ]),
                      source_lengths=on_meta([3, 4])),
        "pseudo seq2seq": dict(source_lengths=on_meta([2, 2]), target_lengths=on_meta([2, 1])),
        "pmlm": dict(steps=torch.zeros(2, 6, dtype=torch.long, device="meta"),
                     kinds=torch.zeros(2, 6, dtype=torch.long, device="meta")),
    }
    for name, fields in layouts.items():
        mask = mask_from_fields(padding, **fields)
        assert (mask.device.type, tuple(mask.shape), mask.dtype) == ("meta", (2, 6, 6), torch.bool), name
