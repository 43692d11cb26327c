"""The pseudo-masked LM through the real UniLMv2 model: leakage by perturbation, the AE part's independence of
the appended tokens, and the pmlm_ae_par criterion against an independent computation (the plain MLM for L_AE,
the mask written out from section 3.2 for L_PAR)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fairseq.logging import metrics

from palm_plugin.criterions.pmlm_ae_par import PseudoMaskedLMCriterion
from palm_plugin.data.blockwise_masking import BlockwiseMaskingPolicy
from palm_plugin.data.pmlm_dataset import pseudo_masked_example
from palm_plugin.data.token_masking import TokenMaskingPolicy, sample_rng
from palm_plugin.models.unilm import UniLMConfig, UniLMModel
from palm_plugin.modules.attention_masks import PseudoMaskKind as K
from palm_plugin.modules.attention_masks import pmlm_mask
from tests.test_pmlm_dataset import make_dataset, make_dictionary


def tiny_unilm2(dictionary, seed=0):
    torch.manual_seed(seed)
    cfg = UniLMConfig(
        encoder_layers=2, encoder_embed_dim=32, encoder_ffn_embed_dim=64, encoder_attention_heads=4,
        dropout=0.0, attention_dropout=0.0, max_positions=128, num_segments=2, relative_position_buckets=32,
    )
    return UniLMModel(cfg, dictionary).eval()


def random_example(rng, dictionary, mask, pseudo, length, mask_prob=0.3):
    tokens = np.array([dictionary.bos(), *rng.integers(dictionary.nspecial, mask, length - 2), dictionary.eos()])
    maskable = np.zeros(length, bool)
    maskable[1:-1] = True
    steps = BlockwiseMaskingPolicy(mask_prob=mask_prob).factorization_steps(maskable, rng)
    noised = TokenMaskingPolicy().corrupt(tokens, steps >= 0, rng, mask, dictionary.nspecial, len(dictionary), (pseudo,))
    return pseudo_masked_example(tokens, steps, noised, pseudo)


def logits_of(model, examples, pad):
    """Full-vocabulary logits ``(B, L, V)`` of a batch of equally long examples."""
    stack = {key: torch.from_numpy(np.stack([e[key] for e in examples])) for key in examples[0]}
    tokens = stack["source"]
    mask = pmlm_mask(stack["steps"], stack["kinds"], tokens.eq(pad))
    with torch.no_grad():
        logits, _ = model(tokens, position_ids=stack["positions"], attention_mask=mask)
    return logits


def test_perturbing_original_tokens_changes_only_later_steps():
    """Changing the original token of a step j never changes a prediction of step i <= j (no leakage); changing
    it does change predictions of some steps i > j (the later steps really condition on it)."""
    dictionary, mask, pseudo = make_dictionary()
    model = tiny_unilm2(dictionary)
    rng = np.random.default_rng(0)
    influenced, earlier_pairs = 0, 0
    for trial in range(4):
        example = random_example(rng, dictionary, mask, pseudo, length=40)
        kinds, steps = example["kinds"], example["steps"]
        original_slots = np.flatnonzero(kinds == K.ORIGINAL)
        perturbed = []
        for slot in original_slots:  # one perturbation per batch row
            copy = {key: value.copy() for key, value in example.items()}
            copy["source"][slot] = dictionary.nspecial + (copy["source"][slot] - dictionary.nspecial + 7) % 40
            perturbed.append(copy)
        logits = logits_of(model, [example] + perturbed, dictionary.pad())
        reference, changed = logits[0], logits[1:]
        pseudo_rows = np.flatnonzero(kinds == K.PSEUDO)
        context_rows = np.flatnonzero(kinds == K.CONTEXT)
        for row, slot in enumerate(original_slots):
            difference = (changed[row] - reference).abs().amax(-1)  # (L,)
            assert difference[context_rows].max() == 0, "a context or [M] row saw an original token"
            for p in pseudo_rows:
                if steps[slot] >= steps[p]:
                    assert difference[p] == 0, f"[P] of step {steps[p]} saw the original token of step {steps[slot]}"
                else:
                    earlier_pairs += 1
                    influenced += bool(difference[p] > 1e-6)
    assert earlier_pairs > 100 and influenced == earlier_pairs


def test_ae_predictions_do_not_depend_on_the_appended_part():
    """The context encodings are shared: the AE logits of an AE+PAR input equal those of the plain MLM input."""
    dictionary, mask, pseudo = make_dictionary()
    model = tiny_unilm2(dictionary)
    policy, replacement = BlockwiseMaskingPolicy(), TokenMaskingPolicy()
    tokens = np.array([dictionary.bos(), *np.random.default_rng(1).integers(4, mask, 60), dictionary.eos()])
    maskable = np.r_[False, np.ones(60, bool), False]
    steps = policy.factorization_steps(maskable, sample_rng(0, 1, 0))
    noised = replacement.corrupt(tokens, steps >= 0, sample_rng(0, 1, 1), mask, 4, len(dictionary), (pseudo,))
    full = pseudo_masked_example(tokens, steps, noised, pseudo)
    plain = pseudo_masked_example(tokens, steps, noised, pseudo, append_pseudo=False)
    full_logits = logits_of(model, [full], dictionary.pad())[0, : len(tokens)]
    plain_logits = logits_of(model, [plain], dictionary.pad())[0]
    torch.testing.assert_close(full_logits, plain_logits, rtol=1e-5, atol=1e-5)


class _Task:
    def __init__(self, dictionary):
        self.target_dictionary = dictionary


def forward_one(model, tokens, positions, segments, mask=None):
    """LM logits ``(T, V)`` of one unpadded example; ``mask`` ``(T, T)`` or None (bidirectional). The only place
    the criterion test touches the model's inputs."""
    with torch.no_grad():
        logits, _ = model(
            torch.as_tensor(tokens)[None], position_ids=torch.as_tensor(positions)[None],
            segment_ids=torch.as_tensor(segments)[None], attention_mask=None if mask is None else mask[None],
        )
    return logits[0]


def pseudo_masked_visibility(kinds, steps):
    """Section 3.2 written out entry by entry (not :func:`pmlm_mask`): may query q attend to key k?"""
    kinds, steps = kinds.tolist(), steps.tolist()

    def visible(q, k):
        if kinds[k] == K.CONTEXT:  # unmasked tokens and [M]: everyone
            return True
        if kinds[q] == K.CONTEXT:  # the AE part never sees the appended tokens
            return False
        if kinds[k] == K.ORIGINAL:  # originals of earlier steps; an original row also sees its own step
            return steps[k] < steps[q] or (kinds[q] == K.ORIGINAL and steps[k] == steps[q])
        return kinds[q] == K.PSEUDO and steps[k] == steps[q]  # the [P] tokens of one's own step

    n = len(kinds)
    return torch.tensor([[visible(q, k) for k in range(n)] for q in range(n)])


def test_criterion_equals_an_independent_computation():
    """ae_loss, par_loss and loss as fairseq logs them (bits per predicted token) against: the AE predictions of the
    plain text (no appended part, bidirectional), and the PAR predictions under the mask written from the paper,
    each example alone and unpadded."""
    dataset, items, dictionary, mask, pseudo = make_dataset()
    model = tiny_unilm2(dictionary)
    with torch.no_grad():  # larger weights than BERT's init, so that contexts give clearly different predictions
        for parameter in model.parameters():
            parameter.normal_(0, 1.0)
    samples = [dataset[i] for i in range(len(items))]
    batch = dataset.collater(samples)
    criterion = PseudoMaskedLMCriterion(_Task(dictionary))
    loss, sample_size, logging_output = criterion(model, batch)
    with metrics.aggregate() as aggregator:
        PseudoMaskedLMCriterion.reduce_metrics([logging_output])
        logged = aggregator.get_smoothed_values()

    ae, par, ae_count, par_count = 0.0, 0.0, 0, 0
    for sample, original in zip(samples, items):
        n = len(original)
        kinds, target = sample["kinds"], sample["target"]
        text_logits = forward_one(model, sample["source"][:n], torch.arange(n), sample["segments"][:n])
        visibility = pseudo_masked_visibility(kinds, sample["steps"])
        full_logits = forward_one(model, sample["source"], sample["positions"], sample["segments"], visibility)
        for t in range(len(target)):
            gold = int(target[t])
            if gold == dictionary.pad():
                continue
            if kinds[t] == K.PSEUDO:
                par -= float(F.log_softmax(full_logits[t].double(), -1)[gold])
                par_count += 1
            else:
                assert t < n and sample["source"][t] != pseudo
                ae -= float(F.log_softmax(text_logits[t].double(), -1)[gold])
                ae_count += 1
    masked = sum(int((s["kinds"] == K.PSEUDO).sum()) for s in samples)
    assert ae_count == par_count == masked == sample_size > 0
    # nsentences: fairseq's trainer logs it as the batch size ("bsz")
    assert logging_output["nsentences"] == len(items) and logging_output["ntokens"] == batch["ntokens"]
    bits = math.log(2)
    assert logged["ae_loss"] == pytest.approx(ae / ae_count / bits, abs=2e-3)  # logged values: 3 decimals
    assert logged["par_loss"] == pytest.approx(par / par_count / bits, abs=2e-3)
    assert logged["loss"] == pytest.approx((ae + par) / masked / bits, abs=2e-3)
    # unrounded sums (nats), as the optimiser sees them
    assert float(logging_output["ae_loss"]) == pytest.approx(ae, rel=1e-5)
    assert float(logging_output["par_loss"]) == pytest.approx(par, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(ae + par, rel=1e-5)
    # the two terms differ by far more than the tolerance, so swapping or merging them shows
    assert abs(ae / ae_count - par / par_count) / bits > 0.05
    loss.backward()
    assert model.lm_head.bias.grad is not None and model.stack.relative_position.weight.grad.abs().sum() > 0
