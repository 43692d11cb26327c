"""--attention-impl triton: the UniLM family's attention as Triton kernels (palm_plugin/modules/attention_triton.py),
run by Triton's interpreter, against the attention as section 2 of UniLM and section 4.1 of UniLMv2 write it, in
float64 (softmax over q k^T / sqrt(d) + mask + the relative position bias of every pair bucketed); the tile lists
against a count of the dense mask; the option's refusals where the kernels cannot run. The CUDA twins, at a
realistic size, are in tests/test_gpu.py.

Triton decides whether it interprets when it is imported, so the kernel tests (marked ``interpreted``) run in a
process of their own: this file again, started by :func:`test_kernels_under_the_interpreter`. The interpreter runs
each program in numpy, so the batches are small: 5 sequences of 45 to 70 tokens, padded to 70, heads of 24 (held in
tiles of 32). The masks are checked with tiles of 16 x 16 (and 16 x 32) that leave partial tiles at every edge and
whole ones between; what is not the tiling, with the module's own tiles, which leave the interpreter fewer programs to
run. The interpreter runs with the fix and speed-ups of tests/triton_interpreter.py."""
import importlib.util
import json
import logging
import os
import random
import subprocess

import numpy as np
import pytest
import torch

from palm_plugin.modules.attention_masks import Objective, mask_from_fields, to_additive
from palm_plugin.modules.flex_attention import MaskFields
from palm_plugin.modules.relative_position import RelativePositionBias
from palm_tools.bench.kernel_instructions import compile_attention, costs_of, module_tiles, sass_loops
from tests.conftest import run_interpreted
from tests.test_flex_attention import build, pmlm_fields

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")
IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in test_kernels_under_the_interpreter's process")
BATCH, LENGTH, HEADS, HEAD_DIM, POSITIONS = 5, 70, 2, 24, 128
LENGTHS = torch.tensor([70, 61, 45, 53, 66])  # unequal, odd and even, across tile edges
INTERPRETED_TESTS = 21

if IN_INTERPRETER:
    from tests.triton_interpreter import install

    install()


@needs_triton
@pytest.mark.skipif(IN_INTERPRETER, reason="this is that process")
def test_kernels_under_the_interpreter():
    """The tests marked ``interpreted``, in a process that imports triton with TRITON_INTERPRET=1."""
    run_interpreted(__file__, INTERPRETED_TESTS)


@needs_triton
@pytest.mark.skipif(IN_INTERPRETER, reason="starts its own processes")
def test_fairseq_train_with_the_kernels_trains_as_sdpa(cli, tmp_path):
    """fairseq-train --task pmlm --arch unilm2_tiny --attention-impl triton, the kernels under Triton's interpreter (a
    real fairseq process on real binarized data, in batches of 4 sentences: the interpreter's time goes by them): the
    pseudo-masked LM's masks built from the task's batch fields, UniLMv2's bias and its gradient through the optimizer.
    After 2 SGD updates (the second through the weights and bias the first moved) every weight equals that of the same
    run with sdpa within 1e-6 (SGD moves each weight by its gradient: a mask that lets a pseudo token see its own
    original token, or a bias read one cell off, moves them by 1e-5 and more; Adam would amplify the rounding of
    gradients that are 0 in exact arithmetic, and so does a third update at this rate: up to 4e-6 in runs of other
    sizes and seeds, where two left at most 7e-7); the logged losses agree as printed."""
    from tests.test_pmlm_train import write_corpus

    rnd = random.Random(0)
    write_corpus(tmp_path / "train.txt", 60, rnd)
    cli("fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "train.txt", "--destdir", tmp_path / "data",
        "--workers", "1")
    logged, weights = {}, {}
    for impl in ("sdpa", "triton"):
        result = cli("fairseq-train", tmp_path / "data", "--user-dir", "palm_plugin", "--task", "pmlm", "--criterion",
                     "pmlm_ae_par", "--arch", "unilm2_tiny", "--tokens-per-sample", "64", "--dropout", "0",
                     "--attention-dropout", "0", "--optimizer", "sgd", "--lr", "1.0", "--max-update", "2",
                     "--batch-size", "4", "--seed", "1", "--log-format", "json", "--log-interval", "1", "--cpu",
                     "--disable-validation", "--no-epoch-checkpoints", "--no-save-optimizer-state", "--save-dir",
                     tmp_path / impl, "--attention-impl", impl, env_extra={"TRITON_INTERPRET": "1"})
        lines = [line.split("| train_inner |", 1)[1] for line in (result.stdout + result.stderr).splitlines()
                 if "| train_inner |" in line]
        logged[impl] = [(float(s["ae_loss"]), float(s["par_loss"])) for s in map(json.loads, lines)]
        weights[impl] = torch.load(tmp_path / impl / "checkpoint_last.pt", weights_only=False)["model"]
    assert len(logged["sdpa"]) == 2
    for (ae, par), (expected_ae, expected_par) in zip(logged["triton"], logged["sdpa"], strict=True):
        assert abs(ae - expected_ae) <= 2e-3 and abs(par - expected_par) <= 2e-3  # printed with 3 decimals
    assert weights["triton"].keys() == weights["sdpa"].keys()
    for name, expected in weights["sdpa"].items():
        assert float((weights["triton"][name].double() - expected.double()).abs().max()) <= 1e-6, name


@pytest.fixture
def module_kernels():
    """The kernels with the module's own tiles (the card's), for the tests of what is not the tiling: the
    interpreter's time goes by the programs and tiles it runs, which these larger tiles make fewer, still two or more
    along a side of 70 (the last partial)."""
    from palm_plugin.modules import attention_triton as kernels

    assert kernels.INTERPRETED
    tiles = kernels.FORWARD, kernels.QUERY_GRADIENT, kernels.QUERY_GRADIENT_WITHOUT_BIAS, kernels.KEY_GRADIENT
    assert all(max(t.rows, t.keys) < LENGTH for t in tiles), tiles
    return kernels


@pytest.fixture
def kernels(module_kernels, monkeypatch):
    """Tiles small enough to leave partial ones at these sizes."""
    for kernel in ("FORWARD", "QUERY_GRADIENT", "QUERY_GRADIENT_WITHOUT_BIAS", "KEY_GRADIENT"):
        monkeypatch.setattr(module_kernels, kernel, module_kernels.Tiles(16, 16, 4))
    return module_kernels


# ------------------------------------------------------------------------------------------------ the batches
def padding_of(lengths):
    return torch.arange(LENGTH).unsqueeze(0) >= lengths.unsqueeze(1)


def unilm_fields(objectives):
    return dict(padding_mask=padding_of(LENGTHS), objectives=torch.tensor([int(o) for o in objectives]),
                source_lengths=torch.tensor([30, 17, 44, 20, 33]))


def pseudo_seq2seq_fields():
    """UniLMv2's fine-tuning layout [source | target | pseudo target]: target token i and its pseudo token share a
    position."""
    source, target = torch.tensor([40, 31, 17, 23, 9]), torch.tensor([15, 12, 14, 9, 21])
    column = torch.arange(LENGTH).unsqueeze(0)
    s, t = source.unsqueeze(1), target.unsqueeze(1)
    positions = torch.where(column >= s + t, column - t, column).where(column < s + 2 * t, 0)
    return dict(padding_mask=column >= s + 2 * t, source_lengths=source, target_lengths=target), positions


def default_positions():
    return torch.arange(LENGTH).expand(BATCH, -1).contiguous()


O = Objective
TEXTS = (50, 41, 33, 38, 47)  # pmlm: the text, then about 15% of it appended twice
CASES = {  # name: (fields, positions, with UniLMv2's bias)
    "bidirectional": (dict(padding_mask=padding_of(LENGTHS)), default_positions(), False),
    "bidirectional, relative bias": (dict(padding_mask=padding_of(LENGTHS)), default_positions(), True),
    "left-to-right": (unilm_fields([O.LEFT_TO_RIGHT] * BATCH), default_positions(), False),
    "right-to-left": (unilm_fields([O.RIGHT_TO_LEFT] * BATCH), default_positions(), False),
    "seq2seq": (unilm_fields([O.SEQ2SEQ] * BATCH), default_positions(), False),
    "unilm pre-training mix": (unilm_fields([O.BIDIRECTIONAL, O.SEQ2SEQ, O.LEFT_TO_RIGHT, O.RIGHT_TO_LEFT,
                                             O.SEQ2SEQ]), default_positions(), False),
    "pmlm AE": (*pmlm_fields(append_pseudo=False, text_lengths=TEXTS, length=LENGTH), True),
    "pmlm AE+PAR": (*pmlm_fields(text_lengths=TEXTS, length=LENGTH), True),
    "pmlm PAR": (*pmlm_fields(predict_masked_slots=False, text_lengths=TEXTS, length=LENGTH), True),
    "pseudo-mask seq2seq": (*pseudo_seq2seq_fields(), True),
}


BUCKETS = 32  # UniLMv2's


def bias_module(seed=0):
    torch.manual_seed(seed)
    module = RelativePositionBias(HEADS, BUCKETS, 128)
    with torch.no_grad():
        module.weight.normal_(0, 1.0)  # large enough that a bias read from the wrong cell shows
    return module


def attention_inputs(dtype, seed=1):
    """q, k, v ``(B, h, T, d)`` as the layers make them: views of ``(B, T, h d)`` projections."""
    generator = torch.Generator().manual_seed(seed)
    return [(2 * torch.randn(BATCH, LENGTH, HEADS, HEAD_DIM, generator=generator)).to(dtype).transpose(1, 2)
            for _ in range(3)]


def reference(q, k, v, mask, positions, weight):
    """The attention as the papers write it, in float64, every (query, key) pair's bias bucketed
    (:meth:`RelativePositionBias.forward`, the definition): outputs and autograd's gradients."""
    module = bias_module()
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    weight = weight.double() if weight is not None else None
    scores = leaves[0] @ leaves[1].transpose(-1, -2) / HEAD_DIM**0.5 + to_additive(mask, torch.float64).unsqueeze(1)
    if weight is not None:
        module.weight = weight = torch.nn.Parameter(weight.detach())
        scores = scores + module(positions, positions)
    out = torch.softmax(scores, -1) @ leaves[2]
    return out, leaves, weight


def run_case(kernels, name, dtype=torch.float32, positions=None, table_positions=POSITIONS, packed=False):
    """The errors of the kernels against :func:`reference` on ``CASES[name]`` (``positions``: other position ids, below
    ``table_positions``, the size of the bias table; ``packed``: q, k, v slices of one ``(B, T, 3, h, d)`` tensor)."""
    fields, case_positions, with_bias = CASES[name]
    positions = case_positions if positions is None else positions
    mask = mask_from_fields(**fields)
    q, k, v = attention_inputs(dtype)
    if packed:
        packed = torch.stack([t.transpose(1, 2) for t in (q, k, v)], dim=2)  # (B, T, 3, h, d)
        q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
        assert not (q.is_contiguous() or q.transpose(1, 2).is_contiguous())
    weight = bias_module().weight.detach().to(dtype) if with_bias else None
    expected, leaves, weight64 = reference(q, k, v, mask, positions, weight)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grad = grad.masked_fill(fields["padding_mask"].view(BATCH, 1, LENGTH, 1), 0)  # losses ignore padding rows
    expected.backward(grad)
    own = [t.detach().requires_grad_() for t in (q, k, v)]
    own_weight = weight.clone().requires_grad_() if with_bias else None
    buckets = bias_module().offset_buckets(table_positions) if with_bias else None
    plan = kernels.TritonMask(MaskFields(**fields), positions if with_bias else None, own_weight, buckets)
    out = plan.attend(*own)
    out.backward(grad.to(dtype))
    pairs = {"output": (out, expected), **{f"d{n}": (a.grad, b.grad) for n, a, b in zip("qkv", own, leaves)}}
    if with_bias:
        pairs["bucket weights"] = (own_weight.grad, weight64.grad)
    return {key: float((a.detach().double() - b.detach()).abs().max() / b.detach().abs().max())
            for key, (a, b) in pairs.items()}


@interpreted
@pytest.mark.parametrize("case", list(CASES))
def test_outputs_and_gradients_equal_the_papers_attention_in_float64(kernels, case):
    """Every mask of the family, UniLMv2's with its relative position bias: the kernels' outputs and the gradients of
    q, k, v and of the bucket weights, within float32 rounding of float64 autograd's."""
    errors = run_case(kernels, case)
    assert max(errors.values()) < 2e-6, errors


@interpreted
def test_offsets_at_the_tables_ends_and_slices_of_a_packed_projection(module_kernels):
    """Position ids running down from the table's last (offsets reaching +-(P - 1), the first and last cells of the
    bias of every offset), with q, k, v that are slices of one packed projection (strides the gradients cannot share:
    copied to a layout whose gradients they can): one run, as neither touches what the other reads."""
    descending = torch.arange(LENGTH - 1, -1, -1).expand(BATCH, -1).contiguous()
    errors = run_case(module_kernels, "bidirectional, relative bias", positions=descending, table_positions=LENGTH,
                      packed=True)
    assert max(errors.values()) < 2e-6, errors


@interpreted
def test_a_bucket_count_that_is_not_a_power_of_two(module_kernels, monkeypatch):
    """20 buckets: the dQ kernel sums into slots of a power of two (32), whose last 12 no offset reaches and which
    are cut off; the bucket weights' gradient equals float64 autograd's."""
    monkeypatch.setitem(globals(), "BUCKETS", 20)
    assert bias_module().weight.shape == (HEADS, 20)
    errors = run_case(module_kernels, "pmlm AE+PAR")
    assert max(errors.values()) < 2e-6, errors


@interpreted
def test_a_nan_gradient_reaches_the_bucket_weights(module_kernels):
    """A NaN in the incoming gradient makes the bucket weights' gradient NaN, as autograd's sum does, so that no
    check of that gradient misses it."""
    fields, positions, _ = CASES["pmlm AE+PAR"]
    q, k, v = (t.requires_grad_() for t in attention_inputs(torch.float32))
    weight = bias_module().weight.detach().clone().requires_grad_()
    plan = module_kernels.TritonMask(MaskFields(**fields), positions, weight, bias_module().offset_buckets(POSITIONS))
    grad = torch.zeros(BATCH, HEADS, LENGTH, HEAD_DIM)
    grad[0, 0, 3, 0] = float("nan")
    plan.attend(q, k, v).backward(grad)
    assert torch.isnan(weight.grad).any() and torch.isnan(q.grad).any()


@interpreted
def test_tiles_of_unequal_sides(kernels, monkeypatch):
    """Tiles of unequal sides, each kernel's its own (as the card's are): rows and keys of one tile list are not the
    next kernel's."""
    monkeypatch.setattr(kernels, "FORWARD", kernels.Tiles(16, 32, 4))
    monkeypatch.setattr(kernels, "QUERY_GRADIENT", kernels.Tiles(32, 16, 4))
    monkeypatch.setattr(kernels, "QUERY_GRADIENT_WITHOUT_BIAS", kernels.Tiles(16, 32, 4))
    monkeypatch.setattr(kernels, "KEY_GRADIENT", kernels.Tiles(16, 32, 4))
    for case in ("pmlm AE+PAR", "unilm pre-training mix"):  # with the bias and without: dQ's tiles differ
        errors = run_case(kernels, case)
        assert max(errors.values()) < 4e-6, (case, errors)  # float32 sums in the tiles' order (2.1e-6 seen)


@interpreted
def test_half_precision_within_its_rounding(module_kernels):
    """Inputs in fp16 (the float64 reference of the same rounded inputs): sums in float32, probabilities and score
    gradients rounded to fp16 before their products, as FlashAttention rounds them. (Not bf16: Triton 3.6's
    interpreter multiplies bf16 tiles as if their bits were integers; tests/test_gpu.py checks bf16 on a card.)"""
    errors = run_case(module_kernels, "pmlm AE+PAR", torch.float16)
    assert max(errors.values()) < 3e-3, errors


# ------------------------------------------------------------------------------------------------ the stack
def stacks(buckets):
    """Two tiny stacks with the same weights, sdpa and triton."""
    from palm_plugin.modules.unilm_transformer import UniLMTransformer

    built = []
    for impl in ("sdpa", "triton"):
        torch.manual_seed(0)
        stack = UniLMTransformer(vocab_size=40, padding_idx=1, dim=HEADS * HEAD_DIM, ffn_dim=64, layers=2,
                                 num_heads=HEADS, max_positions=POSITIONS, num_segments=2, dropout=0.0,
                                 attention_dropout=0.0, relative_position_buckets=buckets, attention_impl=impl)
        built.append(stack.train())
    return built


def tokens_of(padding):
    tokens = torch.randint(6, 40, padding.shape, generator=torch.Generator().manual_seed(3))
    return tokens.masked_fill(padding, 1)


@interpreted
@pytest.mark.parametrize("case, buckets", [("pmlm AE+PAR", 32), ("unilm pre-training mix", 0)])
def test_a_stack_trains_as_the_sdpa_stack(module_kernels, case, buckets):
    """Two layers sharing one TritonMask built from the batch's fields: the loss and every parameter's gradient
    (the bucket weights' summed over both layers) equal the sdpa stack's; an explicit tensor mask as well."""
    fields, positions, _ = CASES[case]
    tokens = tokens_of(fields["padding_mask"])
    # a random projection of the top states (a sum of squares of LayerNorm outputs would be a constant)
    projection = torch.randn(BATCH, LENGTH, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(4))
    projection = projection.masked_fill(fields["padding_mask"].unsqueeze(-1), 0)
    results = []
    for stack in stacks(buckets):
        loss = (stack(tokens, MaskFields(**fields), positions) * projection).sum()
        loss.backward()
        results.append((loss, {name: p.grad for name, p in stack.named_parameters() if p.grad is not None}))
    (expected, expected_grads), (actual, grads) = results
    assert abs(float(actual - expected)) <= 1e-5 * abs(float(expected.detach()))
    assert grads.keys() == expected_grads.keys()
    if buckets:
        assert "relative_position.weight" in grads
    # k_proj.bias's gradient is 0 in exact arithmetic (a constant added to a row's scores): rounding alone, both sides
    floor = 1e-6 * max(float(grad.abs().max()) for grad in expected_grads.values())
    for name, grad in expected_grads.items():
        assert float((grads[name] - grad).abs().max()) <= 1e-5 * float(grad.abs().max()) + floor, name
    from palm_plugin.modules import unilm_transformer

    with torch.no_grad():  # a caller's own (B, T, T) mask has no fields for the kernels: sdpa reads it, said once
        sdpa, triton_stack = stacks(buckets)
        dense = mask_from_fields(**fields)
        unilm_transformer._warn_explicit_mask.cache_clear()
        with pytest.warns(UserWarning, match="--attention-impl triton: a mask given as a tensor .* goes through the "
                                             "sdpa path"):
            assert torch.equal(triton_stack(tokens, dense, positions), sdpa(tokens, dense, positions))


@interpreted
def test_compiled_layers_compile_around_the_kernels(module_kernels):
    """--compile-layers with the kernels: each layer compiled (aot_eager, the suite's backend) runs its attention
    through the kernels uncompiled and gives the loss and the gradients of the plain stack."""
    from palm_plugin.modules.flex_attention import MaskFields

    fields, positions, _ = CASES["pmlm AE+PAR"]
    fields, positions = {key: value[:2] for key, value in fields.items()}, positions[:2]  # two rows: the interpreter
    tokens = tokens_of(fields["padding_mask"])
    projection = torch.randn(2, LENGTH, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(4))
    results = []
    for compile_layers in (False, True):
        stack = stacks(32)[1]
        if compile_layers:
            for layer in stack.layers:
                layer.compile(backend="aot_eager")
        loss = (stack(tokens, MaskFields(**fields), positions) * projection).sum()
        loss.backward()
        results.append((loss, stack.relative_position.weight.grad, stack.layers[0].q_proj.weight.grad))
    for plain, compiled in zip(*results):
        assert float((compiled - plain).abs().max()) <= 1e-5 * float(plain.abs().max())


@interpreted
def test_the_model_trains_with_the_recipes_attention_dropout(module_kernels):
    """A unilm2 model built to train with the kernels (here: under the interpreter), with BERT's attention dropout 0.1
    as the recipes train: its layers hand the kernels their dropout, drawn from torch's generator (the same seed,
    the same output; another seed, another), and none in evaluation."""
    from tests.test_unilm_decoding import tiny_dictionary

    dictionary = tiny_dictionary()
    model = build("unilm2_tiny", dictionary, for_training=True, attention_impl="triton", dropout=0.0)
    assert model.stack.attention_impl == "triton" and model.cfg.attention_dropout == 0.1
    fields, positions, _ = CASES["pmlm AE+PAR"]
    fields, positions = {key: value[:2] for key, value in fields.items()}, positions[:2]  # two rows: the interpreter
    net_input = {key: value for key, value in fields.items() if key != "padding_mask"}
    net_input.update(src_tokens=tokens_of(fields["padding_mask"]).clamp(max=len(dictionary) - 1),
                     position_ids=positions, features_only=True)

    def features(seed):
        torch.manual_seed(seed)
        return model(**net_input)[0]

    first = features(0)
    first.sum().backward()
    assert torch.isfinite(model.stack.relative_position.weight.grad).all()
    assert torch.equal(features(0), first.detach()) and not torch.equal(features(1), first.detach())
    model.eval()
    with torch.no_grad():
        assert torch.equal(features(0), features(1))


@interpreted
@pytest.mark.parametrize("case, rate", [("pmlm AE+PAR", 0.25), ("unilm pre-training mix", 0.1)])
def test_attention_dropout_keeps_the_pairs_it_draws_forward_and_backward(module_kernels, case, rate):
    """Dropout 0.25 and BERT's 0.1: the output and every gradient equal float64 autograd of the papers' attention with
    the kept pairs the kernels draw (:func:`kept_pairs` under the call's seed) scaled by the inverse of the
    probability of keeping one (:func:`keep_probability`: 0.9 is kept as 58982 / 65536), so the backward kernels
    drew the forward's pairs; about that share of the pairs kept; another seed, other pairs; the pairs one draw keeps,
    and their neighbours, independent. The kernels draw in the module's tiles (each kernel's its own) and
    :func:`kept_pairs` in tiles of 16 x 16: a pair's draw does not depend on the tile that draws it."""
    keep = module_kernels.keep_probability(rate)
    assert keep == (0.75 if rate == 0.25 else 58982 / 65536)
    fields, positions, with_bias = CASES[case]
    mask = mask_from_fields(**fields)
    torch.manual_seed(5)
    seed = module_kernels.draw_seed()
    kept = module_kernels.kept_pairs(seed, rate, BATCH, HEADS, LENGTH, "cpu")
    share = float(kept.float().mean())
    assert abs(share - keep) < 4 * ((keep * (1 - keep)) / kept.numel()) ** 0.5, share
    # another seed, other pairs: one sentence's show it (a fifth of the draws; the interpreter runs each)
    assert not torch.equal(kept[:1], module_kernels.kept_pairs(seed + 1, rate, 1, HEADS, LENGTH, "cpu"))
    # every (sentence, head) draws its own pairs: two of them agree as often as independent draws would
    independent = keep ** 2 + (1 - keep) ** 2
    spread = 5 * (independent * (1 - independent) / LENGTH ** 2) ** 0.5
    for a, b in (((0, 0), (0, 1)), ((0, 0), (1, 0)), ((1, 1), (BATCH - 1, 1))):
        agree = float((kept[a] == kept[b]).float().mean())
        assert abs(agree - independent) < spread, (a, b, agree)
    # one Philox draw keeps eight pairs, (i, j), (i, j + 8), (i + 8, j), (i + 8, j + 8) for i and j below 8 in their
    # 16 and j even, each by an output of its own, and the same with j + 1 by the outputs' other halves: pairs at those
    # distances agree as often as independent draws, whether they share a draw or not, and so do neighbours
    for axis, distance in ((-1, 1), (-1, 8), (-1, 16), (-2, 1), (-2, 8)):
        first = torch.arange(LENGTH - distance)
        shares = (first % 16 < 8) if distance == 8 else (first % 2 == 0) if (axis, distance) == (-1, 1) \
            else torch.zeros_like(first, dtype=torch.bool)
        for shared in (True, False):
            chosen = first[shares == shared]
            if len(chosen) == 0:
                continue
            pairs = kept.index_select(axis, chosen) == kept.index_select(axis, chosen + distance)
            agree = float(pairs.float().mean())
            samples = BATCH * HEADS * LENGTH * len(chosen)
            assert abs(agree - independent) < 5 * (independent * (1 - independent) / samples) ** 0.5, (axis, distance)

    q, k, v = attention_inputs(torch.float32)
    weight = bias_module().weight.detach() if with_bias else None
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    weight64 = torch.nn.Parameter(weight.double()) if with_bias else None
    scores = leaves[0] @ leaves[1].transpose(-1, -2) / HEAD_DIM**0.5 + to_additive(mask, torch.float64).unsqueeze(1)
    if with_bias:
        module = bias_module()
        module.weight = weight64
        scores = scores + module(positions, positions)
    expected = (torch.softmax(scores, -1) * kept / keep) @ leaves[2]
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    expected.backward(grad)

    own = [t.detach().requires_grad_() for t in (q, k, v)]
    own_weight = weight.clone().requires_grad_() if with_bias else None
    plan = module_kernels.TritonMask(MaskFields(**fields), positions if with_bias else None, own_weight,
                                     bias_module().offset_buckets(POSITIONS) if with_bias else None)
    torch.manual_seed(5)  # the call draws the seed drawn above
    out = plan.attend(*own, rate)
    out.backward(grad.float())
    pairs = {"output": (out, expected), **{f"d{n}": (a.grad, b.grad) for n, a, b in zip("qkv", own, leaves)}}
    if with_bias:
        pairs["bucket weights"] = (own_weight.grad, weight64.grad)
    for name, (actual, reference) in pairs.items():
        error = float((actual.detach().double() - reference.detach()).abs().max() / reference.abs().max())
        assert error < 2e-6, (name, error)


# ------------------------------------------------------------------------------------------------ without the kernels
@needs_triton
@pytest.mark.skipif(IN_INTERPRETER, reason="compiles for the card, which the interpreter does not")
def test_kernels_compile_for_the_h100_without_spills_in_their_loops(tmp_path):
    """The interpreter accepts code the compiler may refuse: the three kernels compiled here, without a GPU, for the
    card's architecture (sm_90) at base size (heads of 64) in bf16, with and without UniLMv2's bias and attention
    dropout, down to the binary by the ptxas Triton ships, with the module's tiles and warps. No register spilled
    inside the loops over tiles (a few bytes before or after them, once a program, cost nothing); the products on
    Hopper's warp-group MMA; the loads of the loop over tiles pipelined (asynchronous copies); and no score tile
    moved between layouts through shared memory inside the loops (a mask read as a (rows, keys) tile made the
    compiler carry the softmax in a second layout and convert every tile's scores).

    And what the loops cost, in the card's instructions per score a thread computes, compiled as a launch compiles them
    (palm_tools/bench/kernel_instructions.py; the kernels issue more instructions than their products need, so this is
    their cost; docs/benchmarks-gpu.md sections 13 and 14): attention dropout adds at most 11 where the queries are the
    rows and 16 in the dK/dV kernel (a Philox draw per pair added 56 to 62, one draw of 10 rounds for four pairs about
    20: now 7 rounds, and eight pairs a draw by the outputs' halves where a thread holds neighbouring keys); UniLMv2's
    bias adds at most 10 in the forward and dK/dV kernels (12 when the table held the bias unscaled and the position ids
    were read masked); without the bias, a tile the mask shows partly costs at most 22 more than a whole one (evaluating
    the pseudo-masked rule from each token's step and kind cost 24 to 26 more in the forward and dQ kernels: two
    comparisons of ranks now); the bucket sums of UniLMv2's bias stay within a warp: 16 buckets more add fewer than 16
    barriers (a sum over the whole tile waited on every warp once per bucket)."""
    import re
    from triton.backends.nvidia.compiler import get_ptxas

    from palm_plugin.modules import attention_triton as kernels

    for name in (*module_tiles(), "_kept_pairs_kernel"):  # a seed of 1 would arrive as a constant, and not compile
        assert next(p for p in getattr(kernels, name).params if p.name == "seed").do_not_specialize, name

    costs = {}
    for has_bias, dropout in ((True, True), (True, False), (False, True), (False, False)):
        for name, tiles in module_tiles(has_bias).items():
            compiled = compile_attention(name, HAS_BIAS=has_bias, DROPOUT=dropout)
            ptx_file = tmp_path / f"{name}.ptx"
            ptx_file.write_text(compiled.asm["ptx"])
            report = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", ptx_file, "-o", os.devnull],
                                    capture_output=True, text=True, check=True).stderr
            spilled = re.search(r"(\d+) bytes spill stores", report)
            assert spilled and int(spilled.group(1)) <= 128, (name, has_bias, dropout, report)
            loops = sass_loops(compiled, tmp_path)
            assert len(loops) == 2, (name, len(loops))  # the whole tiles', then the partly shown tiles'
            spills = [line for loop in loops for line in loop if re.search(r"\b(STL|LDL)\b", line)]
            assert not spills, (name, has_bias, dropout, spills)
            costs[name, has_bias, dropout] = costs_of(loops, tiles)
            ir = compiled.asm["ttgir"]
            assert "ttng.warp_group_dot " in ir, (name, has_bias, dropout)
            assert "ttg.async_copy_global_to_local" in ir, (name, has_bias, dropout)  # loads pipelined
            score_tile = rf"convert_layout %\S+ : tensor<{tiles.rows}x{tiles.keys}xf32"
            assert not any(re.search(score_tile, body) for body in loop_bodies(ir)), (name, has_bias, dropout)
            if has_bias and name == "_query_gradient_kernel":
                fewer = compile_attention(name, HAS_BIAS=True, DROPOUT=dropout, NUM_BUCKETS=16)
                added = compiled.asm["ptx"].count("bar.sync") - fewer.asm["ptx"].count("bar.sync")
                assert added < 16, (dropout, added)
    for name in module_tiles():
        for has_bias in (True, False):
            whole, partial = costs[name, has_bias, False]
            with_dropout = costs[name, has_bias, True][0]
            assert with_dropout - whole <= (16 if name == "_key_gradient_kernel" else 11), (name, has_bias, whole,
                                                                                           with_dropout)
            assert has_bias or partial - whole <= 22, (name, whole, partial)
        if name != "_query_gradient_kernel":  # whose tiles differ with the bias, and which sums its buckets
            assert costs[name, True, False][0] - costs[name, False, False][0] <= 10, (name, costs)


def loop_bodies(ir):
    """The bodies of the ``scf.for`` loops of a TritonGPU module (the loops over tiles), each as one text."""
    lines, bodies = ir.splitlines(), []
    for at, line in enumerate(lines):
        if " = scf.for " in line:
            indent = line[:len(line) - len(line.lstrip())]
            end = next(i for i in range(at + 1, len(lines)) if lines[i].startswith(indent + "}"))
            bodies.append("\n".join(lines[at + 1:end]))
    assert bodies, "no loop found: the module's text changed form"
    return bodies


def brute_force_tiles(mask, rows, columns):
    """Each tile's kind by looking at it: 0 partly shown, 1 wholly shown, 2 hidden (out-of-bounds cells hidden)."""
    batch, queries, keys = mask.shape
    kinds = np.full((batch, -(-queries // rows), -(-keys // columns)), 2)
    for b in range(batch):
        for i in range(kinds.shape[1]):
            for j in range(kinds.shape[2]):
                tile = np.zeros((rows, columns), dtype=bool)
                part = mask[b, i * rows:(i + 1) * rows, j * columns:(j + 1) * columns].numpy()
                tile[:part.shape[0], :part.shape[1]] = part
                kinds[b, i, j] = 1 if tile.all() else 0 if tile.any() else 2
    return kinds


@needs_triton
@pytest.mark.skipif(IN_INTERPRETER, reason="no kernel runs here")
@pytest.mark.parametrize("case", ["unilm pre-training mix", "pmlm AE+PAR", "pseudo-mask seq2seq"])
@pytest.mark.parametrize("rows, columns", [(16, 16), (16, 32)])
def test_tile_lists_name_the_partial_then_the_whole_tiles(case, rows, columns):
    """For each row of tiles, the counts of partly and wholly shown tiles and their indices in order (partial
    first), against a look at every tile; by rows and, transposed, by columns."""
    from palm_plugin.modules.attention_triton import tile_lists

    mask = mask_from_fields(**CASES[case][0])
    for lists_of, block in ((mask, (rows, columns)), (mask.transpose(1, 2), (columns, rows))):
        counts, order = tile_lists(lists_of, *block)
        kinds = brute_force_tiles(lists_of, *block)
        for b in range(BATCH):
            for i in range(kinds.shape[1]):
                partial, whole = np.flatnonzero(kinds[b, i] == 0), np.flatnonzero(kinds[b, i] == 1)
                assert counts[b, i].tolist() == [len(partial), len(whole)]
                assert order[b, i, :len(partial) + len(whole)].tolist() == [*partial, *whole]
    assert (kinds == 2).any() and (kinds == 1).any()  # hidden and whole tiles both occur in these masks


@pytest.mark.skipif(IN_INTERPRETER, reason="checks the build where the kernels cannot run")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the build without CUDA")
def test_where_the_kernels_cannot_run_the_build_stops_or_a_checkpoint_attends_with_sdpa(monkeypatch, caplog):
    """Without CUDA (or without the triton package), building to train stops with one line naming the option to
    use; a checkpoint trained with the kernels, loaded here for use, attends with sdpa (the same values) and says so;
    the kernels handed CPU tensors outside the interpreter stop the same way."""
    from palm_plugin.modules import attention_impl
    from tests.test_unilm_decoding import tiny_dictionary

    dictionary = tiny_dictionary()
    if importlib.util.find_spec("triton") is not None:
        with pytest.raises(SystemExit) as stopped:
            build("unilm2_tiny", dictionary, for_training=True, attention_impl="triton", attention_dropout=0.0)
        assert stopped.value.code == (f"error: --attention-impl triton: its kernels run on CUDA, and no CUDA device "
                                      f"is available (torch {torch.__version__}); use --attention-impl sdpa")
        from palm_plugin.modules.attention_triton import TritonMask

        fields = MaskFields(torch.zeros(1, 3, dtype=torch.bool))
        with pytest.raises(SystemExit, match="its kernels run on CUDA tensors, and these are on cpu .*; use "
                                             "--attention-impl sdpa$"):
            TritonMask(fields).attend(*torch.randn(3, 1, 1, 3, 16))
    with caplog.at_level(logging.WARNING):
        model = build("unilm2_tiny", dictionary, for_training=False, attention_impl="triton")
    assert model.stack.attention_impl == "sdpa" and model.cfg.attention_impl == "triton"
    assert any("trained with --attention-impl triton" in r.getMessage() for r in caplog.records)

    monkeypatch.setattr(attention_impl, "triton_installed", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        build("unilm_tiny", dictionary, for_training=True, attention_impl="triton", attention_dropout=0.0)
    assert stopped.value.code == ("error: --attention-impl triton: its kernels need the triton package (pip install "
                                  "triton), which is not installed; use --attention-impl sdpa")
