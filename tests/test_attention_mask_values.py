"""Values of UniLMv2's seq2seq fine-tuning layout (palm_plugin/modules/attention_masks.py) against a per-row
construction in plain Python of its documented contract: ``[source | target | pseudo target | padding]``, the
source and the padding CONTEXT (step 0), target token i the ORIGINAL token of step i, pseudo token i the PSEUDO
token of step i. A batch mixes lengths, an empty target included, so that no row's layout relies on another's. And
every mask of the family as that layout's rule (what the Triton attention evaluates from one code per token)."""
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


def test_one_rule_covers_every_mask_of_the_family():
    """The Triton attention evaluates every mask by the pseudo-masked LM's rule from one code per token: UniLM's four
    objectives, the mix, bidirectional with padding and UniLMv2's layouts laid out as its steps and kinds
    (as_pmlm_layout) give the masks of attention_masks.py, cell by cell (the batches of tests/test_attention_triton.py,
    of unequal lengths)."""
    from palm_plugin.modules.attention_masks import as_pmlm_layout, mask_from_fields, pmlm_mask
    from tests.test_attention_triton import CASES

    for name, (fields, _, _) in CASES.items():
        padding = fields["padding_mask"]
        assert torch.equal(pmlm_mask(*as_pmlm_layout(**fields), padding), mask_from_fields(**fields)), name
