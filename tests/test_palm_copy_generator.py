"""PALM's pointer-generator (equations (2)-(8)) against a direct, loop-by-loop computation in float64."""
import importlib.util
import math
import re

import pytest
import torch

from palm_plugin.modules import compiled_layers, copy_generator
from palm_plugin.modules.copy_generator import PointerGenerator, check_copy_attention_impl
from tests.conftest import mutmut_stats_pass
from tests.test_palm_model import build

DIM, VOCAB, MARKERS, PAD = 8, 12, 3, 1


def make_generator(copy=True, seed=0):
    torch.manual_seed(seed)
    embedding = torch.nn.Parameter(torch.randn(VOCAB, DIM))
    generator = PointerGenerator(DIM, DIM, embedding, num_types=VOCAB + MARKERS, copy=copy, attention_dim=5)
    for parameter in generator.parameters():
        torch.nn.init.normal_(parameter, std=0.7)  # far from uniform distributions, so the test can tell
    return generator


def make_inputs(seed=1, steps=4):
    """Two sentences: the first right-padded, holding a repeated token and a position marker (index VOCAB + 1)."""
    torch.manual_seed(seed)
    src_tokens = torch.tensor([[5, 7, 5, VOCAB + 1, 2, PAD], [4, 9, 10, 6, 8, 2]])
    encoder_states = torch.randn(2, 6, DIM)
    padding = src_tokens.eq(PAD)
    encoder_out = {
        "encoder_out": [encoder_states.transpose(0, 1)],
        "encoder_padding_mask": [padding],
        "src_tokens": [src_tokens],
    }
    states = torch.randn(2, steps, DIM)
    return states, encoder_out


def reference_probs(generator, states, encoder_out):
    """P(y) of equations (2)-(8), one decoder step and one source position at a time, in float64."""
    g = {name: p.detach().double() for name, p in generator.named_parameters()}
    src_tokens = encoder_out["src_tokens"][0]
    padding = encoder_out["encoder_padding_mask"][0]
    h_all = encoder_out["encoder_out"][0].transpose(0, 1).double()
    batch, steps, _ = states.shape
    probs = torch.zeros(batch, steps, VOCAB + MARKERS, dtype=torch.float64)
    for b in range(batch):
        positions = [l for l in range(src_tokens.size(1)) if not padding[b, l]]
        for t in range(steps):
            s = states[b, t].double()
            logits = g["output_embedding"] @ (g["vocab_projection.weight"] @ s + g["vocab_projection.bias"])
            p_vocab = torch.exp(logits - logits.max())
            p_vocab = p_vocab / p_vocab.sum()  # (2)
            if not generator.copy:
                probs[b, t, :VOCAB] = p_vocab
                continue
            scores = []
            for l in positions:
                hidden = g["memory_projection.weight"] @ h_all[b, l] + g["query_projection.weight"] @ s
                scores.append(float(g["attention_vector.weight"][0] @ torch.tanh(hidden + g["query_projection.bias"])))  # (3)
            top = max(scores)
            weights = [math.exp(e - top) for e in scores]
            alpha = [w / sum(weights) for w in weights]  # (4)
            z = sum(a * h_all[b, l] for a, l in zip(alpha, positions))  # (5)
            p_copy = torch.zeros(VOCAB + MARKERS, dtype=torch.float64)
            for a, l in zip(alpha, positions):
                p_copy[src_tokens[b, l]] += a  # (6)
            gate = g["gate.weight"][0] @ torch.cat((z, s)) + g["gate.bias"][0]
            lam = 1.0 / (1.0 + math.exp(-float(gate)))  # (8)
            probs[b, t] = lam * torch.cat((p_vocab, torch.zeros(MARKERS, dtype=torch.float64))) + (1 - lam) * p_copy  # (7)
    return probs


@pytest.mark.parametrize("copy", [True, False])
def test_equals_direct_computation(copy):
    generator = make_generator(copy)
    states, encoder_out = make_inputs()
    log_probs = generator(states, encoder_out)
    assert log_probs.dtype == torch.float32 and log_probs.shape == (2, 4, VOCAB + MARKERS)
    expected = reference_probs(generator, states, encoder_out)
    torch.testing.assert_close(log_probs.exp().double(), expected, atol=1e-6, rtol=1e-5)
    possible = expected > 1e-20
    torch.testing.assert_close(log_probs.double()[possible], expected[possible].log(), atol=1e-5, rtol=1e-5)


def test_an_encoder_output_without_a_padding_mask_attends_to_every_source_position():
    """fairseq's encoder output may hold ``encoder_padding_mask`` as ``[]`` (no padding): every source position is
    attended and copied from, as with a mask that hides nothing (the unpadded second sentence of make_inputs)."""
    generator = make_generator()
    states, padded = make_inputs()
    encoder_out = {"encoder_out": [padded["encoder_out"][0][:, 1:]], "encoder_padding_mask": [],
                   "src_tokens": [padded["src_tokens"][0][1:]]}
    expected = reference_probs(generator, states[1:], {**encoder_out, "encoder_padding_mask": [
        torch.zeros_like(encoder_out["src_tokens"][0], dtype=torch.bool)]})
    torch.testing.assert_close(generator(states[1:], encoder_out).exp().double(), expected, atol=1e-6, rtol=1e-5)


def test_sums_to_one_over_extended_vocabulary():
    generator = make_generator()
    states, encoder_out = make_inputs()
    totals = generator(states, encoder_out).double().exp().sum(-1)
    torch.testing.assert_close(totals, torch.ones_like(totals), atol=1e-6, rtol=0)
    # The marker held by the first source sentence gets copy mass; markers absent from the source get none.
    probs = generator(states, encoder_out).exp()
    assert (probs[0, :, VOCAB + 1] > 1e-4).all()
    assert (probs[:, :, VOCAB] < 1e-30).all() and (probs[1, :, VOCAB + 1] < 1e-30).all()


def test_closed_gate_puts_all_mass_on_source_tokens():
    generator = make_generator()
    with torch.no_grad():
        generator.gate.weight.zero_()
        generator.gate.bias.fill_(-1e4)  # lambda = sigmoid(-1e4) = 0 in float32
    states, encoder_out = make_inputs()
    probs = generator(states, encoder_out).double().exp()
    for b, source in enumerate(encoder_out["src_tokens"][0].tolist()):
        in_source = sorted(set(source) - {PAD})
        on_source = probs[b, :, in_source].sum(-1)
        torch.testing.assert_close(on_source, torch.ones_like(on_source), atol=1e-6, rtol=0)
        others = [y for y in range(VOCAB + MARKERS) if y not in in_source]
        assert (probs[b, :, others] < 1e-30).all()
    # Sentence 0 holds token 5 twice: its copy probability is the sum of both attention weights (equation (6)).
    alpha, _ = generator.copy_attention(states, encoder_out["encoder_out"][0].transpose(0, 1),
                                         encoder_out["encoder_padding_mask"][0], None)
    torch.testing.assert_close(probs[0, :, 5].float(), alpha[0, :, 0] + alpha[0, :, 2], atol=1e-6, rtol=1e-5)


def test_gradients_reach_every_copy_parameter():
    generator = make_generator()
    states, encoder_out = make_inputs()
    states.requires_grad_(True)
    targets = torch.tensor([[5, 7, VOCAB + 1, 2], [9, 3, 8, 0]])  # source tokens, a marker, words not in source
    log_probs = generator(states, encoder_out)
    loss = -log_probs.gather(-1, targets.unsqueeze(-1)).sum()
    assert torch.isfinite(loss)
    loss.backward()
    for name, parameter in generator.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name
    assert torch.isfinite(states.grad).all()


def test_label_smoothing_over_extended_vocabulary_stays_finite():
    """fairseq's label smoothing sums log P over every type, including markers no source token holds."""
    generator = make_generator()
    states, encoder_out = make_inputs()
    log_probs = generator(states, encoder_out)
    smooth = -log_probs.sum(-1).mean()
    smooth.backward()
    assert torch.isfinite(smooth)
    assert all(torch.isfinite(p.grad).all() for p in generator.parameters())


def dense_probs(generator, states, encoder_out):
    """Equations (2)-(8) with dense tensors in float64 (P formed explicitly): a differentiable reference for the
    log-space, sparse-mixture implementation."""
    p = {name: param.double() for name, param in generator.named_parameters()}
    s = states.double()
    h = encoder_out["encoder_out"][0].transpose(0, 1).double()
    src_tokens, padding = encoder_out["src_tokens"][0], encoder_out["encoder_padding_mask"][0]
    p_vocab = torch.softmax((s @ p["vocab_projection.weight"].T + p["vocab_projection.bias"]) @ p["output_embedding"].T, -1)
    p_vocab = torch.cat((p_vocab, p_vocab.new_zeros(*p_vocab.shape[:2], MARKERS)), -1)
    hidden = (h @ p["memory_projection.weight"].T).unsqueeze(1) + (s @ p["query_projection.weight"].T + p["query_projection.bias"]).unsqueeze(2)
    scores = (torch.tanh(hidden) @ p["attention_vector.weight"].T).squeeze(-1).masked_fill(padding.unsqueeze(1), float("-inf"))
    alpha = torch.softmax(scores, -1)
    z = alpha @ h
    one_hot = torch.nn.functional.one_hot(src_tokens, VOCAB + MARKERS).double()  # (B, S, V)
    p_copy = alpha @ one_hot
    lam = torch.sigmoid(torch.cat((z, s), -1) @ p["gate.weight"].T + p["gate.bias"])
    return lam * p_vocab + (1 - lam) * p_copy


# Equation (3) is computed in blocks of (sentence, target step) rows and recomputed in the backward pass. S x A is
# 6 x 5 here: 2**18 elements hold the whole batch (the default), 1 gives one row at a time, 90 three of a
# sentence's four rows and then the last, 150 one sentence at a time.
# The memory gradient is summed row by row (the CPU's way) or per block (accelerators'), here both on the CPU.
@pytest.mark.parametrize("row_by_row", [True, False], ids=["row-by-row", "per-block"])
@pytest.mark.parametrize("block_elements", [2**18, 1, 90, 150])
@pytest.mark.filterwarnings("error")
def test_gradients_equal_dense_reference(monkeypatch, block_elements, row_by_row):
    """Each block's activations are written into the leading part of one workspace, a partial last block (90) too:
    an ``out=`` of another shape would be resized, which torch warns about (an error here)."""
    monkeypatch.setitem(copy_generator.BLOCK_ELEMENTS, "cpu", block_elements)
    monkeypatch.setattr(copy_generator, "ROW_BY_ROW", {"cpu"} if row_by_row else set())
    assert_gradients_equal_dense_reference("blocked")


def test_compiled_scores_equal_dense_reference_and_never_write_the_activations(monkeypatch):
    """--copy-attention-impl compiled: equation (3) compiled by inductor (C++ here, Triton on a GPU: tests/test_gpu.py). The
    code it generates allocates nothing that spans B, T, S and A (the activations stay inside its kernels; sizes are
    symbols there, distinct because the sizes differ). Other batch shapes reuse the dynamic-shape code, and a batch of
    one sentence takes the blocked path rather than compiling again."""
    # imported here, not at the top: inductor takes seconds to import, and the interpreter's process of
    # tests/test_copy_triton.py imports this module
    from torch._inductor.utils import run_and_get_code

    if mutmut_stats_pass():
        pytest.skip("mutmut's stats pass runs compiled functions eagerly: no generated code to read")
    monkeypatch.setattr(compiled_layers, "BACKEND", "inductor")
    _, codes = run_and_get_code(assert_gradients_equal_dense_reference, "compiled")
    assert len(codes) == 4, codes  # the forward pass and the backward's three sums
    allocations = [_first_argument(code[match.end():]) for code in codes
                   for match in re.finditer(r"empty_strided_\w+\(", code)]
    sizes = [set(re.findall(r"\bs\d+\b", shape)) for shape in allocations]
    assert len(allocations) >= 4 and all(sizes), allocations
    assert all(len(symbols) <= 3 for symbols in sizes), allocations
    with torch.compiler.set_stance("fail_on_recompile"):
        assert_gradients_equal_dense_reference("compiled", inputs=make_inputs(seed=2, steps=3))
        states, encoder_out = make_inputs(seed=3)
        one = {key: [value[0][:, :1] if key == "encoder_out" else value[0][:1]] for key, value in encoder_out.items()}
        assert_gradients_equal_dense_reference("compiled", inputs=(states[:1], one))


def _first_argument(call: str) -> str:
    """The text of a call's first argument, from just after its opening parenthesis (nested parentheses kept)."""
    depth = 0
    for end, char in enumerate(call):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0 or (char == "," and depth == 0):
            return call[:end]
    return call


def assert_gradients_equal_dense_reference(impl, inputs=None):
    """The loss and gradients of the module with equation (3) evaluated by ``impl`` (--copy-attention-impl) equal the
    dense float64 reference's. Token 5 is held twice by sentence 0: its copy mass, and its gradient, must be counted once per type."""
    states, encoder_out = inputs or make_inputs()
    states.requires_grad_(True)
    targets = torch.tensor([[5, 7, VOCAB + 1, 0], [9, 3, 8, 2]])[: states.size(0), : states.size(1)]
    losses = []
    for implementation in ("module", "dense"):
        generator = make_generator()
        if implementation == "module":
            generator.scores_impl = impl
            target_log_probs = generator(states, encoder_out).double().gather(-1, targets.unsqueeze(-1))
        else:
            target_log_probs = dense_probs(generator, states, encoder_out).gather(-1, targets.unsqueeze(-1)).log()
        loss = -target_log_probs.sum()
        states.grad = None
        loss.backward()
        grads = {name: p.grad.double() for name, p in generator.named_parameters()}
        grads["states"] = states.grad.double()
        losses.append((loss.detach(), grads))
    (module_loss, module_grads), (dense_loss, dense_grads) = losses
    torch.testing.assert_close(module_loss, dense_loss, atol=1e-4, rtol=1e-5)
    for name, grad in dense_grads.items():
        torch.testing.assert_close(module_grads[name], grad, atol=1e-4, rtol=1e-4, msg=name)


def test_extended_vocabulary_smaller_than_the_embedding_is_refused():
    """The message gives both sizes: num_types and the embedding's number of rows (V, not its width)."""
    embedding = torch.nn.Parameter(torch.randn(VOCAB, DIM))
    with pytest.raises(ValueError, match=re.escape(f"num_types ({VOCAB - 1}) is smaller than the embedding ({VOCAB} "
                                                   "rows)")):
        PointerGenerator(DIM, DIM, embedding, num_types=VOCAB - 1)


def test_incremental_decoding_projects_the_memory_once_per_sentence():
    """Step by step (T = 1 each), W_m h is computed at the first step only, and each step equals the full pass."""
    generator = make_generator()
    states, encoder_out = make_inputs()
    calls = []
    handle = generator.memory_projection.register_forward_hook(lambda *args: calls.append(1))
    try:
        full = generator(states, encoder_out)
        assert len(calls) == 1
        calls.clear()
        incremental_state = {}
        steps = [generator(states[:, t : t + 1], encoder_out, incremental_state) for t in range(states.size(1))]
    finally:
        handle.remove()
    assert len(calls) == 1, len(calls)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=1e-5)


def test_blocks_hold_one_row_when_a_row_exceeds_the_budget(monkeypatch):
    """A row of S x A above the budget: each block is one (sentence, step) row, so the workspace is one row."""
    monkeypatch.setitem(copy_generator.BLOCK_ELEMENTS, "cpu", 10)
    memory = torch.zeros(2, 6, 5)  # a row holds 30 elements
    blocks, workspace = copy_generator._blocks(memory, steps=3)
    assert workspace.shape == (1, 1, 6, 5)
    assert [(b.start, b.stop, t.start, t.stop) for b, t in blocks] == [
        (b, b + 1, t, t + 1) for b in range(2) for t in range(3)
    ]



def test_blocks_on_an_accelerator_take_its_budget():
    """A device without an entry in BLOCK_ELEMENTS (a GPU; here the meta device, which allocates nothing) takes
    ACCELERATOR_BLOCK_ELEMENTS: rows of 256 x 256 elements, 4 to a block on a CPU, all 2 x 8 in one block there."""
    memory = torch.zeros(2, 256, 256)
    assert copy_generator._blocks(memory, steps=8)[1].shape == (1, 4, 256, 256)  # 2**18 elements
    blocks, workspace = copy_generator._blocks(memory.to("meta"), steps=8)
    assert workspace.shape == (2, 8, 256, 256) and workspace.device.type == "meta"
    assert [(b.start, t.start, t.stop) for b, t in blocks] == [(0, 0, 8)]


def test_each_copy_attention_impl_takes_its_own_evaluation(monkeypatch):
    """Equation (3)'s evaluation by --copy-attention-impl: compiled through torch.compile's function (for batches whose
    sides all exceed 1: torch specialises sizes of 1, so those take the blocks), blocked by blocks, and auto, on CPU
    tensors, blocked."""
    from palm_plugin.modules import copy_generator

    monkeypatch.setattr(copy_generator, "compiled", lambda function: ("compiled", function))
    memory, query = torch.zeros(2, 3, 4), torch.zeros(2, 5, 4)
    scores, _ = copy_generator._evaluation("compiled", memory, query)
    assert scores.args[0] == ("compiled", copy_generator._weighted_sums)
    for impl, rows in (("blocked", 2), ("auto", 2), ("compiled", 1)):
        scores, _ = copy_generator._evaluation(impl, memory[:rows], query[:rows])
        assert scores.args[0] is copy_generator._blocked_weighted_sums, impl


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the build without CUDA")
def test_model_build_refuses_triton_without_cuda_or_package(monkeypatch):
    if importlib.util.find_spec("triton") is not None:
        with pytest.raises(SystemExit, match=re.escape(
                "--copy-attention-impl triton runs its kernels on CUDA, and no CUDA device is available: use "
                "--copy-attention-impl blocked (the CPU's fastest)")):
            build(copy_attention_impl="triton")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "triton" else find_spec(name))
    with pytest.raises(SystemExit, match="needs the triton package .*use --copy-attention-impl compiled"):
        check_copy_attention_impl("triton")
    check_copy_attention_impl("blocked")
    check_copy_attention_impl("compiled")
