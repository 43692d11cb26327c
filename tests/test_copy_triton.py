"""--copy-attention-impl triton: PALM's equation (3) in Triton kernels (palm_plugin/modules/copy_attention_triton.py),
run by Triton's interpreter, against torch autograd of the plain formula in float64; the option's checks at model
build. The CUDA twins, at a realistic size, are in tests/test_gpu.py.

Triton decides whether it interprets when it is imported (TRITON_INTERPRET=1 then), for its own library functions
too, so the kernel tests (marked ``interpreted``) run in a process of their own: this file again, started by
:func:`test_kernels_under_the_interpreter` with the variable set. The interpreter runs each program of the grid in
numpy, so the shapes are small, but odd: tiles of 2 target rows x 4 source positions x 16 attention features leave a
partial tile in every dimension (T = 5, S = 7, A = 24)."""
import importlib.util
import logging
import os
import re
import subprocess

import pytest
import torch

from palm_plugin.fixes import saved_model_build
from palm_plugin.modules.copy_generator import AdditiveAttentionScores
from palm_tools.bench.kernel_instructions import COPY_KERNELS, compile_copy
from tests.conftest import run_interpreted
from tests.test_palm_copy_generator import assert_gradients_equal_dense_reference, make_generator, make_inputs
from tests.test_palm_model import build

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")
IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in test_kernels_under_the_interpreter's process")
BATCH, STEPS, SOURCES, DIM = 2, 5, 7, 24


@needs_triton
@pytest.mark.skipif(IN_INTERPRETER, reason="this is that process")
def test_kernels_under_the_interpreter():
    """The tests marked ``interpreted``, in a process that imports triton with TRITON_INTERPRET=1."""
    # the interpreted tests: three dtypes of the kernels, the pointer-generator, the model build
    run_interpreted(__file__, 5)


@pytest.fixture
def interpreter(monkeypatch):
    """Tiles small enough to leave partial ones at these sizes."""
    from palm_plugin.modules import copy_attention_triton

    assert copy_attention_triton.INTERPRETED
    monkeypatch.setattr(copy_attention_triton, "TILE", (2, 4, 16))
    return copy_attention_triton


def reference_scores(memory, query, weight):
    """Equation (3) as written, (B, T, S, A) activations and all, in float64."""
    return (torch.tanh(memory.unsqueeze(1) + query.unsqueeze(2)) * weight.view(-1)).sum(-1)


def inputs(dtype, seed=0):
    torch.manual_seed(seed)
    memory = torch.randn(BATCH, SOURCES, DIM + 3)[..., 3:]  # in float32 a view with strides of its own
    query = torch.randn(BATCH, STEPS, DIM)
    weight = 0.5 * torch.randn(1, DIM)
    return [x.to(dtype) for x in (memory, query, weight)]


@interpreted
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 8e-3), (torch.float16, 1e-3)])
def test_scores_and_gradients_equal_float64_autograd(interpreter, dtype, tolerance):
    """Scores in float32 whatever the inputs (sums in float32: within float32 rounding of the float64 values of the
    same half-precision inputs); gradients in the inputs' dtype, so within its rounding. Padding's -inf scores give
    those positions a gradient of 0, as softmax does."""
    memory, query, weight = inputs(dtype)
    grad = torch.randn(BATCH, STEPS, SOURCES)
    grad[1, :, -2:] = 0  # sentence 1 ends in two padding positions
    leaves = [x.double().requires_grad_() for x in (memory, query, weight)]
    expected = reference_scores(*leaves)
    expected.backward(grad.double())
    expected = expected.detach()
    own = [x.detach().requires_grad_() for x in (memory, query, weight)]
    assert own[0].is_contiguous() == (dtype != torch.float32)
    scores = AdditiveAttentionScores.apply(*own, "triton")
    scores.backward(grad)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores.double(), expected, rtol=0, atol=2e-6 * float(expected.abs().max()))
    for name, got, leaf in zip(("memory", "query", "weight"), own, leaves):
        assert got.grad.dtype == dtype and got.grad.shape == leaf.shape, name
        scale = float(leaf.grad.abs().max())
        torch.testing.assert_close(got.grad.double(), leaf.grad, rtol=tolerance, atol=tolerance * scale, msg=name)


@interpreted
def test_pointer_generator_with_triton_equals_blocked_and_dense_reference(interpreter):
    """The whole copy layer (padding, a type held twice, a position marker): log-probabilities and every gradient (of a
    loss that weighs every log-probability) as with the blocked evaluation, and the loss and gradients of the dense
    float64 formulation."""
    states, encoder_out = make_inputs()
    weights = torch.randn(states.shape[:2] + (make_generator().num_types,), generator=torch.Generator().manual_seed(0))
    results = {}
    for impl in ("blocked", "triton"):
        generator = make_generator()
        generator.scores_impl = impl
        leaf = states.clone().requires_grad_()
        log_probs = generator(leaf, encoder_out)
        (log_probs * weights).sum().backward()
        grads = {name: p.grad for name, p in generator.named_parameters()}
        results[impl] = log_probs.detach(), dict(grads, states=leaf.grad)
    torch.testing.assert_close(results["triton"][0], results["blocked"][0], rtol=1e-5, atol=1e-5)
    for name, grad in results["blocked"][1].items():
        torch.testing.assert_close(results["triton"][1][name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert_gradients_equal_dense_reference("triton")


@needs_triton
@pytest.mark.skipif(IN_INTERPRETER, reason="compiles for the card, which the interpreter does not")
def test_kernels_compile_for_the_h100_without_spills_or_reductions_in_their_loops(tmp_path):
    """The interpreter accepts code the compiler may refuse: the kernels compiled here, without a GPU, for the card's
    architecture (sm_90) at palm_base's attention size in bfloat16, down to the binary by the ptxas Triton ships, as
    a launch compiles them (the tensors at 16 bytes and the padded lengths at multiples of 16, as the launcher tells the
    compiler: palm_tools/bench/kernel_instructions.py). No register spills; two special-function instructions a tanh (an
    ``ex2`` and a ``div.full``, not an IEEE division); and, as the module says, no step of a loop reduces across threads
    or moves a tile between layouts: in Triton's GPU IR no reduction or shared-memory buffer inside a loop, and no
    layout conversion there but of a step's row or column (the first kernels reduced and converted at every step: 192
    shuffles and 6 barriers in the forward kernel alone, and they ran slower than torch's blocked path on an H100;
    compiled as launched, the backward kernels moved the whole broadcast tile every step)."""
    from triton.backends.nvidia.compiler import get_ptxas

    for name in COPY_KERNELS:
        compiled, elements = compile_copy(name)
        ptx = compiled.asm["ptx"]
        ptx_file = tmp_path / f"{name}.ptx"
        ptx_file.write_text(ptx)
        report = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", ptx_file, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
        assert " 0 bytes spill stores, 0 bytes spill loads" in report, (name, report)
        assert ptx.count("ex2.approx") == ptx.count("div.full.f32") == elements, name  # one tanh per element a step
        assert "div.rn.f32" not in ptx, name
        loops = loop_regions(compiled.asm["ttgir"])
        assert len(loops) == 1, name
        for operation in ("tt.reduce", "ttg.local_alloc"):
            assert operation not in loops[0], (name, operation)
        tiles = re.findall(r"ttg\.convert_layout %\S+ : tensor<(\d+)x(\d+)x", loops[0])
        assert all("1" in shape for shape in tiles), (name, tiles)


def loop_regions(ir):
    """The text of each outermost ``scf.for`` / ``scf.while`` of an MLIR module, its regions included."""
    regions, depth = [], 0
    for line in ir.splitlines():
        if not depth:
            if not re.search(r"\bscf\.(for|while)\b", line):
                continue
            regions.append([])
        regions[-1].append(line)
        depth += line.count("{") - line.count("}")
    return ["\n".join(region) for region in regions]


@needs_triton
@pytest.mark.skipif(IN_INTERPRETER, reason="the interpreter runs CPU tensors")
def test_cpu_tensors_outside_the_interpreter_name_the_option_to_use():
    with pytest.raises(ValueError, match="run on CUDA .*use --copy-attention-impl blocked"):
        AdditiveAttentionScores.apply(*inputs(torch.float32), "triton")


@interpreted
def test_model_build_sets_the_impl(interpreter):
    """Built to train, here or on CUDA: the copy layer gets the chosen evaluation; by default auto (triton on CUDA
    tensors, blocked elsewhere), which --no-copy takes as it takes blocked."""
    assert build(copy_attention_impl="triton").decoder.pointer_generator.scores_impl == "triton"
    assert build(copy_attention_impl="blocked").decoder.pointer_generator.scores_impl == "blocked"
    assert build().decoder.pointer_generator.scores_impl == "auto"
    build(no_copy=True)  # auto beside --no-copy: nothing to choose, and not refused as triton is
    with pytest.raises(SystemExit, match="--copy-attention-impl triton computes the copy layer, which --no-copy"):
        build(copy_attention_impl="triton", no_copy=True)


@pytest.mark.skipif(IN_INTERPRETER, reason="runs in the suite's process")
def test_auto_takes_triton_on_cuda_and_blocked_elsewhere_saying_so_where_triton_is_missing(monkeypatch, caplog):
    """The default, auto: on CPU tensors the blocked path (the same scores and gradients to the bit as asking for
    blocked); on CUDA tensors triton's kernels (tests/test_gpu.py runs them), or, without the triton package, the
    blocked path with one warning that names the package and the options, not one a batch."""
    from types import SimpleNamespace

    from palm_plugin.modules import copy_generator

    memory, query = (torch.randn(2, n, 12, dtype=torch.float64, requires_grad=True) for n in (7, 5))
    weight = torch.randn(1, 12, dtype=torch.float64, requires_grad=True)
    results = []
    for impl in ("auto", "blocked"):
        scores = AdditiveAttentionScores.apply(memory, query, weight, impl)
        results.append((scores, *torch.autograd.grad(scores.square().sum(), (memory, query, weight))))
    for auto, blocked in zip(*results):
        assert torch.equal(auto, blocked)

    on_cuda = SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(copy_generator, "triton_installed", lambda: True)
    assert copy_generator._auto_impl(on_cuda) == "triton"
    monkeypatch.setattr(copy_generator, "triton_installed", lambda: False)
    copy_generator._warn_blocked_on_cuda.cache_clear()
    with caplog.at_level(logging.WARNING):
        assert [copy_generator._auto_impl(on_cuda) for _ in range(3)] == ["blocked"] * 3
    warnings = [r.getMessage() for r in caplog.records if "--copy-attention-impl auto" in r.getMessage()]
    assert len(warnings) == 1 and "pip install triton" in warnings[0] and "compiled or blocked" in warnings[0]


@pytest.mark.skipif(IN_INTERPRETER, reason="checks a build outside the interpreter")
def test_checkpoint_builds_take_blocked():
    """Built from a checkpoint's configuration to decode (fairseq-generate), on whatever device, with or without
    triton or CUDA: blocked, with no check (here a check would refuse triton: no CUDA, no interpreter)."""
    token = saved_model_build._SAVED.set(True)
    try:
        for options in ({"copy_attention_impl": "triton"}, {"compile_copy_attention": True}):
            assert build(**options).decoder.pointer_generator.scores_impl == "blocked", options
    finally:
        saved_model_build._SAVED.reset(token)


@pytest.mark.skipif(IN_INTERPRETER, reason="runs in the suite's process")
def test_deprecated_compile_copy_attention_means_compiled(caplog):
    """--compile-copy-attention, and configurations saved with it, still work: as --copy-attention-impl compiled,
    with a warning that names the new option; together with another impl it is refused."""
    with caplog.at_level(logging.WARNING):
        model = build(compile_copy_attention=True)
    assert model.decoder.pointer_generator.scores_impl == "compiled"
    assert "use --copy-attention-impl compiled" in caplog.text
    with pytest.raises(SystemExit, match="contradicts --copy-attention-impl triton: leave out --compile-copy-att"):
        build(compile_copy_attention=True, copy_attention_impl="triton")
