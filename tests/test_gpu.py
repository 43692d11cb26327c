"""CUDA numerics against CPU float64 references (skipped without a GPU, but for the half-precision copy layer on the
CPU; `palm-gpu-check` runs them on the card).

(a) the copy layer's custom autograd function at the accelerator block size and at a forced small one, compiled
(``--copy-attention-impl compiled``), and in half precision (``triton``: at the end of the file); (b) the UniLM
stack's attention with every boolean mask kind (padding included) in fp32 / bf16 / fp16;
(c) cached decoding equals full recomputation on CUDA for unilm, unilm2 and palm, and so does --decoding-graph's
fixed-shape decoding replayed as CUDA graphs; (d) GPU and CPU generate the same hypotheses; (e) issue 24's training
levers on CUDA (inductor-compiled layers, fused AdamW) against the plain path. The models, inputs and references are
the CPU tests' own (imported, not copied).

Half-precision tolerances are relative errors against the float64 reference: fp16 keeps 11 significant bits (unit
roundoff 4.9e-4), bf16 8 (3.9e-3); a few layers of sums and softmaxes grow that by about an order of magnitude, so
the bounds are 1e-2 (fp16) and 5e-2 (bf16), while an error of the kind the tests look for (a wrong mask, a softmax
over saturated scores, a lost gradient) is of order 1.
"""
import copy

import numpy as np
import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from palm_plugin.modules import copy_generator
from palm_plugin.modules.attention_masks import (
    Objective,
    bidirectional_mask,
    hide_padding,
    pmlm_mask,
    pseudo_seq2seq_mask,
    unilm_mask,
)
from palm_plugin.modules.unilm_transformer import UniLMTransformer
from tests.test_palm_copy_generator import VOCAB, dense_probs, make_generator, make_inputs
from tests.test_palm_model import build as build_palm
from tests.test_unilm2_attention_masks import random_layout
from tests.test_unilm_decoding import net_input, sources, tiny_dictionary
from tests.test_unilm_decoding import tiny_model as tiny_unilm

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (palm-gpu-check runs it)")
CUDA = "cuda"
HALF_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def to_device(value, device):
    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    return value


def relative_error(actual, expected):
    return float((actual.double().cpu() - expected).norm() / expected.norm())


# ------------------------------------------------------------------------------------------------ (a) copy layer
TARGETS = torch.tensor([[5, 7, VOCAB + 1, 0], [9, 3, 8, 2]])  # copied tokens, a marker, words not in the source


def copy_loss_and_grads(generator, states, encoder_out, target_log_probs):
    states = states.detach().clone().requires_grad_(True)
    loss = -target_log_probs(generator, states, encoder_out, TARGETS.to(states.device).unsqueeze(-1)).sum()
    loss.backward()
    grads = {name: p.grad.double().cpu() for name, p in generator.named_parameters()}
    grads["states"] = states.grad.double().cpu()
    return loss.detach().double().cpu(), grads


def module_log_probs(generator, states, encoder_out, targets):
    return generator(states, encoder_out).gather(-1, targets)


def reference_copy():
    """Loss and gradients of the dense float64 formulation on the CPU."""
    generator = make_generator().double()
    states, encoder_out = make_inputs()
    encoder_out["encoder_out"] = [encoder_out["encoder_out"][0].double()]
    return copy_loss_and_grads(generator, states.double(), encoder_out,
                               lambda g, s, e, t: dense_probs(g, s, e).gather(-1, t).log())  # log 0 elsewhere


@needs_cuda
# S x A is 6 x 5 here: the accelerator default holds the whole batch in one block, 90 elements give 3 target rows
# per block (several blocks per sentence), 1 one row per block
@pytest.mark.parametrize("block_elements", [None, 90, 1])
def test_copy_layer_fp32_on_cuda_equals_float64_reference(monkeypatch, block_elements):
    if block_elements is not None:
        monkeypatch.setattr(copy_generator, "ACCELERATOR_BLOCK_ELEMENTS", block_elements)
    assert CUDA not in copy_generator.BLOCK_ELEMENTS  # CUDA takes the accelerator size
    states, encoder_out = make_inputs()
    loss, grads = copy_loss_and_grads(make_generator().to(CUDA), states.to(CUDA), to_device(encoder_out, CUDA),
                                      module_log_probs)
    expected_loss, expected_grads = reference_copy()
    torch.testing.assert_close(loss, expected_loss, atol=1e-4, rtol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-4, rtol=1e-4, msg=name)


@needs_cuda
def test_compiled_copy_attention_on_cuda_equals_float64_reference_in_less_memory(monkeypatch):
    """--copy-attention-impl compiled with inductor's Triton kernels: the loss and gradients of the float64 reference; a
    backward pass at a size where the blocked path holds the whole (B, T, S, A) block (8 x 64 x 256 x 128 float32,
    64 MiB) while the fused one holds only inputs, outputs and gradients; and the blocked path's values at a size
    past 2**31 elements (64-bit indexing), as at 256 sequences of 512 tokens."""
    from palm_plugin.modules import compiled_layers

    monkeypatch.setattr(compiled_layers, "BACKEND", "inductor")
    states, encoder_out = make_inputs()
    generator = make_generator().to(CUDA)
    generator.scores_impl = "compiled"
    loss, grads = copy_loss_and_grads(generator, states.to(CUDA), to_device(encoder_out, CUDA), module_log_probs)
    expected_loss, expected_grads = reference_copy()
    torch.testing.assert_close(loss, expected_loss, atol=1e-4, rtol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-4, rtol=1e-4, msg=name)

    def scores_and_gradients(batch, steps, sources, dim, fused):
        torch.manual_seed(0)
        memory = torch.randn(batch, sources, dim, device=CUDA, requires_grad=True)
        query = torch.randn(batch, steps, dim, device=CUDA, requires_grad=True)
        weight = (0.1 * torch.randn(1, dim, device=CUDA)).requires_grad_()
        scores = copy_generator.AdditiveAttentionScores.apply(memory, query, weight, "compiled" if fused else "blocked")
        scores.backward(torch.randn_like(scores))
        return [scores.detach(), memory.grad, query.grad, weight.grad]

    peaks = {}
    for fused in (True, False, True):  # the fused path measured after compiling
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        scores_and_gradients(8, 64, 256, 128, fused)
        torch.cuda.synchronize()
        peaks[fused] = torch.cuda.max_memory_allocated() - start
    activations = 8 * 64 * 256 * 128 * 4
    assert peaks[False] >= activations and peaks[True] < activations / 8, peaks

    fused, blocked = (scores_and_gradients(64, 256, 256, 768, fused) for fused in (True, False))
    for name, got, expected in zip(("scores", "memory", "query", "weight"), fused, blocked):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()), msg=name)


# Also on the CPU (its autocast has fp16 and bf16 too): fp16 autocast once gave NaN gradients on both devices.
@pytest.mark.parametrize("device", ["cpu", pytest.param(CUDA, marks=needs_cuda)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["half weights", "autocast"])
def test_copy_layer_in_half_precision_is_finite_and_close(dtype, mode, device):
    states, encoder_out = make_inputs()
    generator = make_generator().to(device)
    encoder_out = to_device(encoder_out, device)
    if mode == "half weights":  # what fairseq's --fp16 / --bf16 do: the whole model in half
        generator = generator.to(dtype)
        encoder_out["encoder_out"] = [encoder_out["encoder_out"][0].to(dtype)]
        loss, grads = copy_loss_and_grads(generator, states.to(device, dtype), encoder_out, module_log_probs)
    else:
        with torch.autocast(device, dtype=dtype):
            loss, grads = copy_loss_and_grads(generator, states.to(device), encoder_out, module_log_probs)
    expected_loss, expected_grads = reference_copy()
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
    tolerance = HALF_TOLERANCE[dtype]
    assert relative_error(loss, expected_loss) < tolerance
    for name, grad in expected_grads.items():
        assert relative_error(grads[name], grad) < 2 * tolerance, name  # gradients pass through one more rounding


# ------------------------------------------------------------------------------------------------ (b) masks
LENGTH, BATCH = 19, 4
LENGTHS = torch.tensor([19, 13, 7, 16])  # rows 1-3 padded


def masks():
    """Every mask kind for a (BATCH, LENGTH) batch with padding, as the model builds them."""
    padding = torch.arange(LENGTH).unsqueeze(0) >= LENGTHS.unsqueeze(1)
    rng = np.random.default_rng(0)
    layouts = [random_layout(rng, LENGTH) for _ in range(BATCH)]
    steps = torch.tensor([s for s, _ in layouts])
    kinds = torch.tensor([[int(k) for k in ks] for _, ks in layouts])
    source_lengths = torch.tensor([7, 5, 3, 6])
    return {
        "bidirectional": hide_padding(bidirectional_mask(LENGTH), padding),
        **{objective.name.lower(): unilm_mask(torch.full((BATCH,), int(objective)), source_lengths, padding)
           for objective in Objective},
        "mixed": unilm_mask(torch.tensor([int(o) for o in Objective][:BATCH]), source_lengths, padding),
        "pseudo-masked (pmlm)": pmlm_mask(steps, kinds, padding),
        "pseudo-masked seq2seq": pseudo_seq2seq_mask(source_lengths, (LENGTHS - source_lengths) // 2, padding),
    }


def stack(relative_position_buckets):
    torch.manual_seed(0)
    model = UniLMTransformer(vocab_size=40, padding_idx=1, dim=64, ffn_dim=128, layers=2, num_heads=4,
                             max_positions=64, num_segments=2, dropout=0.0, attention_dropout=0.0,
                             relative_position_buckets=relative_position_buckets)
    with torch.no_grad():  # sharper attention than the default init, so that a wrong mask shows
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.3)
    return model.eval()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("relative_position_buckets", [0, 32], ids=["unilm", "unilm2"])
@pytest.mark.parametrize("kind", list(masks()))
def test_attention_with_boolean_masks_on_cuda_equals_float64_reference(kind, relative_position_buckets, dtype):
    mask = masks()[kind]
    tokens = torch.randint(4, 40, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))
    model = stack(relative_position_buckets)
    with torch.no_grad():
        expected = model.double()(tokens, mask)
        actual = model.to(CUDA, dtype)(tokens.to(CUDA), mask.to(CUDA))
    assert actual.dtype == dtype and torch.isfinite(actual).all()
    tolerance = {torch.float32: 1e-5, **HALF_TOLERANCE}[dtype]
    assert relative_error(actual, expected) < tolerance
    # a wrong mask moves whole rows: the worst row must be close too, not only the average
    rows = (actual.double().cpu() - expected).norm(dim=-1) / expected.norm(dim=-1)
    assert rows.max() < 5 * tolerance


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relative_bias_gradient_on_cuda_equals_float64_reference(dtype):
    """UniLMv2's bias read from the table of every offset (masked_offset_bias) at pmlm's size (8 x 680 tokens, 12
    heads, 512 positions): on CUDA the table's gradient comes from the one-hot products and the diagonal sums, on
    the CPU from index_add_ in float64; values and gradient agree."""
    from tests.test_unilm2_relative_position import _pmlm_like_positions
    from palm_plugin.modules.relative_position import RelativePositionBias, masked_offset_bias

    generator = torch.Generator().manual_seed(5)
    positions = _pmlm_like_positions(generator, batch=8, length=680, appended=168, max_positions=512)
    mask = torch.rand(8, 680, 680, generator=generator) < 0.6
    upstream = torch.randn(8, 12, 680, 680, generator=generator, dtype=torch.float64) * mask.unsqueeze(1)
    bias = RelativePositionBias(12, 32, 128).double()
    (expected,) = torch.autograd.grad((masked_offset_bias(bias.table(512), positions, positions, mask)
                                       * upstream).sum(), bias.weight)
    on_card = bias.to(CUDA)
    values = masked_offset_bias(on_card.table(512).to(dtype), positions.to(CUDA), positions.to(CUDA), mask.to(CUDA))
    assert values.dtype == dtype and values.stride(-1) == 1
    (got,) = torch.autograd.grad((values * upstream.to(CUDA, dtype)).sum(), on_card.weight)
    tolerance = {torch.float32: 1e-5, **HALF_TOLERANCE}[dtype]
    assert relative_error(got, expected) < tolerance


@needs_cuda
def test_relative_bias_reaches_cuda_attention_without_a_padded_copy():
    """torch's SDPA copies an additive mask into a padded one before the memory-efficient kernel, unless every stride
    but the last is a multiple of 8 elements, and copies its gradient back in the backward: at pmlm's odd lengths
    that was a sixth of a step (docs/benchmarks-gpu.md, section 8). The bias of masked_offset_bias, at 683 tokens,
    reaches the kernel without either (no constant_pad_nd or slice_backward of its size), where the same bias made
    contiguous does not: the count sees what it is meant to."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from palm_plugin.modules.relative_position import RelativePositionBias, masked_offset_bias
    from tests.test_multi_tensor_optimizer import Calls

    length, heads = 683, 4
    positions = torch.arange(length, device=CUDA).expand(2, length)
    mask = torch.rand(2, length, length, device=CUDA) < 0.6
    mask |= torch.eye(length, dtype=torch.bool, device=CUDA)
    q, k, v = (torch.randn(2, heads, length, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    table = RelativePositionBias(heads, 32, 128).to(CUDA)
    counts = []
    for layout in (lambda bias: bias, lambda bias: bias.contiguous()):
        bias = layout(masked_offset_bias(table.table(512).to(torch.bfloat16), positions, positions, mask))
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), Calls() as calls:
            torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias).float().square().sum().backward()
        # pads and slice gradients of (B, h, T, S) tensors (the table's gradient pads an (h, P, P) one of its own)
        counts.append(sum(name in ("constant_pad_nd", "slice_backward") and shape is not None and len(shape) == 4
                          and shape[-2] == length for name, shape in zip(calls.names, calls.shapes)))
    assert counts[0] == 0 and counts[1] > 0, counts


@needs_cuda
def test_vocabulary_products_on_cuda_multiply_by_a_padded_matrix_while_training():
    """A training step of the masked-LM head on CUDA with UniLMv2's 32001 types (a 32000-type dictionary and its pseudo
    token): every product has 32064 where it had 32001 (cuBLAS takes its slow kernels for a side that is not a
    multiple of 8: docs/benchmarks-gpu.md, section 10), and the logits and gradients equal the plain product's within
    bf16's tolerance; without gradients (decoding) the matrix is used as it is."""
    from palm_plugin.modules import lm_head
    from tests.test_speed_options import product_widths

    torch.manual_seed(0)
    head = lm_head.MaskedLMHead(768, 32001, torch.nn.Parameter(torch.randn(32001, 768) * 0.02)).double()
    features = torch.randn(1024, 768, dtype=torch.float64)
    results = {}
    for device, precision in (("cpu", torch.float64), (CUDA, torch.bfloat16)):  # the CPU's: the plain product
        model = copy.deepcopy(head).to(device, precision)
        logits = model(features.to(device, precision))
        logits.double().logsumexp(-1).sum().backward()
        results[device] = [logits.detach()] + [p.grad for p in (model.weight, model.bias, model.dense.weight)]
    for got, expected in zip(results[CUDA], results["cpu"]):
        assert relative_error(got, expected) < HALF_TOLERANCE[torch.bfloat16]
    head = head.to(CUDA, torch.bfloat16)
    states = features.to(CUDA, torch.bfloat16)
    widths = product_widths(lambda: head(states).float().logsumexp(-1).sum().backward())
    assert 32064 in widths and 32001 not in widths
    with torch.no_grad():
        assert 32001 in product_widths(lambda: head(states))


# ------------------------------------------------------------------------------------------------ (c), (d) decoding
def unilm_case(arch):
    dictionary = tiny_dictionary()
    model = tiny_unilm(arch, dictionary, seed=3)
    return model, dictionary, {"net_input": net_input(arch, sources(dictionary, [6, 9, 4], seed=4))}


def palm_case(_):
    model = build_palm(seed=3).eval()
    dictionary = model.encoder.dictionary
    torch.manual_seed(0)
    src_tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (3, 7))
    src_tokens[1, :2] = dictionary.pad()  # left padding, as the translation task batches sources
    src_tokens[:, -1] = dictionary.eos()
    return model, dictionary, {"net_input": {"src_tokens": src_tokens, "src_lengths": src_tokens.ne(1).sum(1)}}


FAMILIES = {"unilm": (unilm_case, "unilm_tiny"), "unilm2": (unilm_case, "unilm2_tiny"), "palm": (palm_case, None)}
BEAMS = ({"beam_size": 1}, {"beam_size": 4, "no_repeat_ngram_size": 2, "min_len": 3, "len_penalty": 1.5})


def generate(model, dictionary, sample, device, options, cached=True):
    """``cached``: True (the growing cache), "graph" (--decoding-graph) or False (recomputation)."""
    model = model.to(device)
    if hasattr(model.decoder, "decoding_graph"):
        model.decoder.decoding_graph = cached == "graph"
    generator = SequenceGenerator([model], dictionary, max_len_b=8, **options)
    if not cached:
        generator.model.has_incremental = False  # the generator then re-runs the decoder on the whole prefix
    with torch.no_grad():
        return generator.generate([model], to_device(sample, device))


def assert_same(ours, reference, atol):
    for sentence, expected in zip(ours, reference):
        assert [h["tokens"].tolist() for h in sentence] == [h["tokens"].tolist() for h in expected]
        for a, b in zip(sentence, expected):
            torch.testing.assert_close(a["positional_scores"].cpu(), b["positional_scores"].cpu(), atol=atol, rtol=0)


# (c) cached decoding on CUDA against full recomputation on CUDA; (d) CUDA against the CPU, both cached
AGREEMENTS = {"cuda_cached_equals_recomputation": ((CUDA, True), (CUDA, False)),
              "cuda_equals_cpu": ((CUDA, True), ("cpu", True)),
              "cuda_graph_equals_recomputation": ((CUDA, "graph"), (CUDA, False))}


@needs_cuda
@pytest.mark.parametrize("agreement", list(AGREEMENTS))
@pytest.mark.parametrize("options", BEAMS, ids=["greedy", "beam4"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_decoding_gives_the_same_hypotheses(family, options, agreement, monkeypatch):
    from palm_plugin.modules import fixed_shape_decoding

    if agreement == "cuda_graph_equals_recomputation" and family == "palm":
        pytest.skip("--decoding-graph is UniLM's")
    build, arch = FAMILIES[family]
    model, dictionary, sample = build(arch)
    (device, cached), (reference_device, reference_cached) = AGREEMENTS[agreement]
    captures, capture = [], fixed_shape_decoding.capture
    monkeypatch.setattr(fixed_shape_decoding, "capture", lambda run: captures.append(run) or capture(run))
    ours = generate(model, dictionary, sample, device, options, cached=cached)
    # --decoding-graph replays captured graphs on CUDA (the eager step gives the same values, only slower)
    assert bool(captures) == (cached == "graph")
    reference = generate(model, dictionary, sample, reference_device, options, cached=reference_cached)
    assert_same(ours, reference, atol=1e-4)


# ------------------------------------------------------------------------------------------------ (e) training levers
@needs_cuda
def test_inductor_compiled_layers_on_cuda_train_as_the_plain_ones(tmp_path, monkeypatch):
    """--compile-layers with inductor (the CPU suite compiles with aot_eager): one update's loss and gradients."""
    from palm_plugin.modules import compiled_layers
    from palm_tools.bench.data import SyntheticCorpus
    from tests.test_speed_options import assert_trains_as, built_with

    monkeypatch.setattr(compiled_layers, "BACKEND", "inductor")
    corpus = SyntheticCorpus(str(tmp_path), 300)
    plain, batch = built_with(corpus, "unilm_seq2seq", device=CUDA)
    compiled, _ = built_with(corpus, "unilm_seq2seq", ["--compile-layers"], device=CUDA)
    assert_trains_as(compiled, plain, batch, rtol=1e-4, atol=1e-5)


@needs_cuda
def test_fused_adamw_on_cuda_equals_the_for_loop(tmp_path):
    """--optimizer torch_adamw on CUDA (fused, one kernel per tensor group) against torch's for-loop AdamW."""
    from palm_tools.bench.data import SyntheticCorpus
    from tests.test_speed_options import _adamw, _updated_by, built_with

    corpus = SyntheticCorpus(str(tmp_path), 300)
    built, batch = built_with(corpus, "unilm_seq2seq", ["--optimizer", "torch_adamw"], device=CUDA)
    initial = {name: value.clone() for name, value in built.model.state_dict().items()}
    fused = _updated_by(built, batch, lambda: _adamw(built, "fused"), initial)
    loop = _updated_by(built, batch, lambda: _adamw(built, "for-loop"), initial)
    for name, value in loop.items():
        torch.testing.assert_close(fused[name], value, rtol=1e-5, atol=1e-6, msg=name)


class KernelLaunches(torch.profiler.profile):
    """The CUDA kernels launched inside the block."""

    def __init__(self):
        super().__init__(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])

    @property
    def count(self):
        return sum(e.count for e in self.key_averages() if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                                      "cuLaunchKernelEx", "cudaLaunchKernelExC"))


@needs_cuda
@pytest.mark.parametrize("precision", ["fp16", "bf16"], ids=["flat master copy (--fp16)", "per parameter (--bf16)"])
def test_multi_tensor_optimizer_on_cuda_updates_as_fairseqs_loops_in_fewer_launches(tmp_path, precision):
    """palm_plugin/fixes/multi_tensor_optimizer.py on CUDA: three clipped updates of fairseq's Adam give the weights
    of fairseq's loops (the norms to float32 rounding: the multi-tensor reduction sums in another order), in fewer
    kernel launches than one a parameter."""
    from palm_tools.bench.data import SyntheticCorpus
    from tests.test_multi_tensor_optimizer import train
    from tests.test_speed_options import built_with

    corpus = SyntheticCorpus(str(tmp_path), 300)
    built, batch = built_with(corpus, "unilm_seq2seq", precision=precision, device=CUDA)
    initial = {name: value.clone() for name, value in built.model.state_dict().items()}
    runs = {}
    for loops in (True, False):
        built.model.load_state_dict(initial)
        runs[loops] = train(built, [batch, batch], loops, recorder=KernelLaunches)
    (norms, masters, weights, loop_launches), (fix_norms, fix_masters, fix_weights, fix_launches) = runs[True], runs[
        False]
    torch.testing.assert_close(torch.stack(fix_norms), torch.stack(norms), rtol=1e-5, atol=0)
    for ours, theirs in zip(fix_masters + fix_weights, masters + weights):
        torch.testing.assert_close(ours, theirs)  # torch's tolerances of the dtype: a half-precision weight may round
        # the other way
    assert fix_launches.count + len(weights) < loop_launches.count, (fix_launches.count, loop_launches.count)


# ----------------------------------------------------------------------------------------------- (f) copy layer, Triton
@needs_cuda
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_triton_copy_attention_on_cuda_equals_float64_reference_in_less_memory(dtype, tolerance):
    """--copy-attention-impl triton compiled for the card (tests/test_copy_triton.py runs the same kernels in Triton's
    interpreter): at palm_base's size (B=8, T=128, S=512, A=768) the scores and the three gradients of the float64
    formula for the same (rounded) inputs, bitwise the same gradients on a second run (no atomics), a peak memory of
    the inputs' and outputs' size, far below the blocked path's; the whole copy layer's loss and gradients; and the
    blocked path's values at 64 x 256 x 256 x 768, past 2**31 activations."""
    from palm_plugin.modules import copy_attention_triton

    assert not copy_attention_triton.INTERPRETED

    def run(impl, batch, steps, sources, dim):
        torch.manual_seed(0)
        memory = torch.randn(batch, sources, dim, device=CUDA, dtype=dtype, requires_grad=True)
        query = torch.randn(batch, steps, dim, device=CUDA, dtype=dtype, requires_grad=True)
        weight = (0.1 * torch.randn(1, dim, device=CUDA, dtype=dtype)).requires_grad_()
        grad = torch.randn(batch, steps, sources, device=CUDA)
        scores = copy_generator.AdditiveAttentionScores.apply(memory, query, weight, impl)
        scores.backward(grad)
        return [scores.detach(), memory.grad, query.grad, weight.grad], (memory, query, weight, grad)

    size = 8, 128, 512, 768
    got, (memory, query, weight, grad) = run("triton", *size)
    leaves = [x.detach().double().requires_grad_() for x in (memory, query, weight)]
    expected = (torch.tanh(leaves[0].unsqueeze(1) + leaves[1].unsqueeze(2)) * leaves[2].view(-1)).sum(-1)
    expected.backward(grad.double())
    for name, value, reference in zip(("scores", "memory", "query", "weight"), got,
                                      [expected.detach()] + [leaf.grad for leaf in leaves]):
        assert value.dtype == (torch.float32 if name == "scores" else dtype), name
        torch.testing.assert_close(value.double(), reference, rtol=tolerance,
                                   atol=tolerance * float(reference.abs().max()), msg=name)
    del expected, leaves
    again, _ = run("triton", *size)
    assert all(torch.equal(a, b) for a, b in zip(got[1:], again[1:]))

    peaks = {}
    for impl in ("blocked", "triton"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        outputs, inputs = run(impl, *size)
        torch.cuda.synchronize()
        peaks[impl] = torch.cuda.max_memory_allocated() - start
        del outputs, inputs
    batch, steps, sources, dim = size
    element = torch.finfo(dtype).bits // 8
    # inputs and their gradients, scores and the incoming gradient (float32): what any evaluation must hold
    io_bytes = 2 * element * batch * (sources + steps + 1) * dim + 2 * 4 * batch * steps * sources
    assert peaks["triton"] < 2 * io_bytes and peaks["triton"] < peaks["blocked"] / 4, (peaks, io_bytes)

    states, encoder_out = make_inputs()
    generator = make_generator().to(CUDA)
    generator.scores_impl = "triton"
    loss, grads = copy_loss_and_grads(generator, states.to(CUDA), to_device(encoder_out, CUDA), module_log_probs)
    expected_loss, expected_grads = reference_copy()
    torch.testing.assert_close(loss, expected_loss, atol=1e-4, rtol=1e-5)
    for name, value in expected_grads.items():
        torch.testing.assert_close(grads[name], value, atol=1e-4, rtol=1e-4, msg=name)

    if dtype == torch.float32:
        triton_values, blocked_values = (run(impl, 64, 256, 256, 768)[0] for impl in ("triton", "blocked"))
        for name, value, reference in zip(("scores", "memory", "query", "weight"), triton_values, blocked_values):
            torch.testing.assert_close(value, reference, rtol=1e-3, atol=1e-3 * float(reference.abs().max()), msg=name)


@needs_cuda
def test_default_copy_attention_on_cuda_is_tritons():
    """--copy-attention-impl auto, PALM's default: on CUDA tensors the Triton kernels' evaluation, with their values."""
    from palm_plugin.modules import copy_attention_triton
    from palm_plugin.modules.copy_generator import AdditiveAttentionScores, _evaluation

    memory, query = (torch.randn(2, n, 64, device=CUDA) for n in (37, 19))
    weight = torch.randn(1, 64, device=CUDA)
    assert _evaluation("auto", memory, query)[0] is copy_attention_triton.additive_scores
    torch.testing.assert_close(AdditiveAttentionScores.apply(memory, query, weight, "auto"),
                               AdditiveAttentionScores.apply(memory, query, weight, "triton"), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ (f) FlexAttention
FLEX_CASES = ("unilm pre-training mix", "pmlm AE+PAR", "pseudo-mask seq2seq")


def fused_loss_and_grads(case, impl, device, dtype, buckets=32):
    """One attention call (with UniLMv2's relative bias unless ``buckets`` is 0) under ``case``'s mask
    (tests/test_flex_attention.py), through FlexAttention (``flex``), the plugin's Triton kernels (``triton``) or SDPA
    with the dense mask (``sdpa``): the loss and the gradients of q, k, v and of the bucket weights."""
    import torch.nn.functional as F

    from palm_plugin.modules.flex_attention import MaskFields
    from tests.test_flex_attention import BATCH, CASES, LENGTH, make_stack

    stack = make_stack(buckets).to(device, dtype)
    fields, positions = CASES[case]
    fields, positions = to_device(fields, device), positions.to(device)
    generator = torch.Generator().manual_seed(2)
    q, k, v = (3 * torch.randn(BATCH, 4, LENGTH, 16, generator=generator) for _ in range(3))  # sharp softmax
    q, k, v = (t.to(device, dtype).requires_grad_() for t in (q, k, v))
    weights = torch.randn(BATCH, 4, LENGTH, 16, generator=generator).to(device, dtype)
    if impl == "flex":
        context = stack.flex_mask(positions, MaskFields(**fields), dtype).attend(q, k, v)
    elif impl == "triton":
        context = stack.triton_mask(positions, MaskFields(**fields)).attend(q, k, v)
    else:
        additive = stack.attention_bias(positions, positions, MaskFields(**fields).dense(), dtype)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    loss = (context * weights).sum()
    loss.backward()
    grads = {"q": q.grad, "k": k.grad, "v": v.grad}
    if buckets:
        grads["bucket weights"] = stack.relative_position.weight.grad
    return loss.detach().double().cpu(), {name: grad.double().cpu() for name, grad in grads.items()}


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", FLEX_CASES)
def test_flex_attention_backward_on_cuda_equals_sdpa(case, dtype):
    """--attention-impl flex's kernel, forward and backward (the bias as a score_mod, its table's gradient from the
    kernel) against SDPA's dense path in float64 on the CPU."""
    expected_loss, expected_grads = fused_loss_and_grads(case, "sdpa", "cpu", torch.float64)
    loss, grads = fused_loss_and_grads(case, "flex", CUDA, dtype)
    tolerance = {torch.float32: 1e-5, **HALF_TOLERANCE}[dtype]
    assert relative_error(loss, expected_loss) < tolerance
    for name, grad in expected_grads.items():
        assert relative_error(grads[name], grad) < 10 * tolerance, name  # sums over many scores, one more rounding


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case, buckets", [(case, 32) for case in FLEX_CASES] + [("unilm pre-training mix", 0)])
def test_triton_attention_on_cuda_equals_sdpa(case, buckets, dtype):
    """--attention-impl triton's kernels, forward and backward (the mask from each token's code, hidden tiles
    skipped; the bias read and its gradient summed per bucket in the kernels), against SDPA's dense path in float64
    on the CPU: 6 rows of 299 tokens of unequal lengths, heads of 16 (tiles of 128 x 64: partial ones at the ends)."""
    expected_loss, expected_grads = fused_loss_and_grads(case, "sdpa", "cpu", torch.float64, buckets)
    loss, grads = fused_loss_and_grads(case, "triton", CUDA, dtype, buckets)
    tolerance = {torch.float32: 1e-5, **HALF_TOLERANCE}[dtype]
    assert relative_error(loss, expected_loss) < tolerance
    for name, grad in expected_grads.items():
        assert relative_error(grads[name], grad) < 10 * tolerance, name  # sums over many scores, one more rounding


@needs_cuda
@pytest.mark.parametrize("case, buckets", [("pmlm AE+PAR", 32), ("unilm pre-training mix", 0)])
def test_triton_attention_on_cuda_with_dropout_keeps_the_pairs_it_draws(case, buckets):
    """Dropout 0.1 in the compiled kernels (eight pairs a Philox draw by the halves of its outputs, the dK/dV kernel
    in the keys' orientation): the output and the gradients of q, k, v (and of the bucket weights) equal float64
    autograd of the attention with the pairs :func:`kept_pairs` draws under the call's seed, scaled by the inverse of
    :func:`keep_probability` (fp32, 6 rows of 299 tokens)."""
    from palm_plugin.modules.attention_masks import to_additive
    from palm_plugin.modules.attention_triton import draw_seed, keep_probability, kept_pairs
    from palm_plugin.modules.flex_attention import MaskFields
    from tests.test_flex_attention import BATCH, CASES, LENGTH, make_stack

    rate = 0.1
    fields, positions = CASES[case]
    generator = torch.Generator().manual_seed(2)
    inputs = [3 * torch.randn(BATCH, 4, LENGTH, 16, generator=generator) for _ in range(3)]
    weights = torch.randn(BATCH, 4, LENGTH, 16, generator=generator)
    torch.manual_seed(5)
    kept = kept_pairs(draw_seed(), rate, BATCH, 4, LENGTH, CUDA).cpu()
    assert abs(float(kept.float().mean()) - keep_probability(rate)) < 0.01

    stack = make_stack(buckets).double()
    q, k, v = (t.double().requires_grad_() for t in inputs)
    additive = stack.attention_bias(positions, positions, MaskFields(**fields).dense(), torch.float64)
    if additive.dtype == torch.bool:  # without the bias: the boolean mask, as SDPA takes it
        additive = to_additive(additive, torch.float64)
    probs = torch.softmax(q @ k.transpose(-1, -2) / 16 ** 0.5 + additive, -1)
    expected = (probs * kept / keep_probability(rate)) @ v
    (expected * weights.double()).sum().backward()
    references = {"output": expected, "q": q.grad, "k": k.grad, "v": v.grad}
    if buckets:
        references["bucket weights"] = stack.relative_position.weight.grad

    stack = make_stack(buckets).to(CUDA)
    q, k, v = (t.to(CUDA).requires_grad_() for t in inputs)
    torch.manual_seed(5)  # the call draws the seed drawn above
    out = stack.triton_mask(positions.to(CUDA), MaskFields(**to_device(fields, CUDA))).attend(q, k, v, rate)
    (out * weights.to(CUDA)).sum().backward()
    actual = {"output": out, "q": q.grad, "k": k.grad, "v": v.grad}
    if buckets:
        actual["bucket weights"] = stack.relative_position.weight.grad
    for name, reference in references.items():
        assert relative_error(actual[name].detach().double().cpu(), reference.detach()) < 1e-4, name


@needs_cuda
def test_triton_attention_on_cuda_with_more_sentence_heads_than_a_grid_axis_takes():
    """More (sentence, head) pairs than CUDA's second and third grid axes take (65,535): 2,731 short sentences of 24
    heads, their outputs and gradients against SDPA's (fp32, padding hidden)."""
    import torch.nn.functional as F

    from palm_plugin.modules.attention_masks import mask_from_fields
    from palm_plugin.modules.attention_triton import TritonMask
    from palm_plugin.modules.flex_attention import MaskFields

    batch, heads, length = 2731, 24, 16
    padding = torch.arange(length, device=CUDA) >= torch.randint(1, length + 1, (batch, 1), device=CUDA)
    q, k, v = (torch.randn(batch, heads, length, 16, device=CUDA, requires_grad=True) for _ in range(3))
    weights = torch.randn(batch, heads, length, 16, device=CUDA)
    results = []
    for attend in (lambda: TritonMask(MaskFields(padding)).attend(q, k, v),
                   lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask_from_fields(padding).unsqueeze(1))):
        out = attend()
        results.append((out.detach(), *torch.autograd.grad((out * weights).sum(), (q, k, v))))
    for triton_value, sdpa_value in zip(*results):
        assert relative_error(triton_value, sdpa_value.double().cpu()) < 1e-5


@needs_cuda
@pytest.mark.parametrize("impl", ["flex", "triton"])
def test_fused_attention_pmlm_training_step_on_cuda_takes_less_memory_than_sdpa(impl):
    """A UniLMv2 pmlm (AE+PAR) training step, bf16, base width, 8 texts of about 500 tokens: FlexAttention and the
    Triton kernels keep no (B, h, T, T) mask + bias nor its gradient, so their peak memory is below the SDPA path's;
    the loss (a random projection of the top states) and the bucket weights' gradient agree with SDPA's."""
    from palm_plugin.modules.flex_attention import MaskFields
    from tests.test_flex_attention import pmlm_fields, tokens_of

    fields, positions = pmlm_fields(text_lengths=(512, 500, 480, 505, 460, 490, 512, 470), length=680)
    fields, positions = to_device(fields, CUDA), positions.to(CUDA)
    tokens = tokens_of(fields["padding_mask"].cpu()).to(CUDA)
    torch.manual_seed(0)
    stack = UniLMTransformer(vocab_size=40, padding_idx=1, dim=768, ffn_dim=3072, layers=2, num_heads=12,
                             max_positions=512, num_segments=2, dropout=0.0, attention_dropout=0.0,
                             relative_position_buckets=32).to(CUDA, torch.bfloat16).train()
    projection = torch.randn(*tokens.shape, 768, device=CUDA, dtype=torch.bfloat16)

    def step(attention_impl):
        stack.attention_impl = attention_impl
        stack.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = (stack(tokens, MaskFields(**fields), positions).float() * projection).mean()
        loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        return float(loss), stack.relative_position.weight.grad.double().cpu(), peak

    step(impl)  # compiles
    loss, bias_grad, peak = step(impl)
    sdpa_loss, sdpa_bias_grad, sdpa_peak = step("sdpa")
    print(f"pmlm step, 8 x 680 tokens, 2 base layers, bf16: peak above the weights {peak / 2**20:.0f} MiB with "
          f"{impl}, {sdpa_peak / 2**20:.0f} MiB with sdpa")
    assert abs(loss - sdpa_loss) <= HALF_TOLERANCE[torch.bfloat16] * abs(sdpa_loss)
    assert relative_error(bias_grad, sdpa_bias_grad) < 10 * HALF_TOLERANCE[torch.bfloat16]
    assert peak < sdpa_peak
