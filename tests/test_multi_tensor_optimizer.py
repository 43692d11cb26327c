"""palm_plugin/fixes/multi_tensor_optimizer.py: fairseq's mixed-precision wrapper and gradient norm as multi-tensor
operations give the updates of fairseq's per-parameter loops, bit for bit on the CPU, in one operation each."""
import contextlib
import copy
import types

import pytest
import torch
from fairseq import optim, utils
from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer
from torch.utils._python_dispatch import TorchDispatchMode

from palm_plugin.fixes import multi_tensor_optimizer
from palm_tools.bench.models import TRAIN_SPECS, build, load_batch

LENGTH = 32
SPEC = {spec.key: spec for spec in TRAIN_SPECS}["unilm_seq2seq"]


@pytest.fixture(scope="module")
def built(synthetic_corpus):
    """A tiny UniLM in bf16 with fairseq's FP16Optimizer (fairseq's Adam) and two batches of unequal sizes."""
    built = build(synthetic_corpus.path(SPEC.layout, LENGTH, 12), SPEC.args("tiny", LENGTH) + [
        "--dropout", "0", "--attention-dropout", "0"], precision="bf16", device="cpu")
    return built, [load_batch(built, 12), load_batch(built, 5)]


class Calls(TorchDispatchMode):
    """The operators called, each once however it runs inside (the mode is off while an operator runs), and the
    shape of each one's result (None where it is not one tensor)."""

    def __init__(self):
        super().__init__()
        self.names, self.shapes = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.names.append(func.overloadpacket.__name__)
        self.shapes.append(tuple(out.shape) if torch.is_tensor(out) else None)
        return out


def _optimizer(built, params, flat):
    if not flat or params[0].is_cuda:  # fairseq's own: one master tensor a parameter under --bf16, flat under --fp16
        return FP16Optimizer.build_optimizer(built.cfg, params)
    # --fp16's one flat master tensor; fairseq builds it on the current CUDA device only, so here by hand, keyed by
    # the CPU's device index (None) as fairseq keys it by the GPU's
    flat_params = torch.nn.Parameter(torch.cat([p.data.float().view(-1) for p in params]))
    flat_params.grad = flat_params.data.new_zeros(flat_params.numel())
    fp32_params = {None: flat_params}
    return FP16Optimizer(built.cfg, params, optim.build_optimizer(built.cfg.optimizer, [flat_params]), fp32_params)


def train(built, batches, loops, flat=False, recorder=Calls):
    """Three updates as fairseq's trainer makes them, gradients clipped, with a parameter that gets no gradient
    (fairseq copies zeros for it); the norms, master and model weights, and the recorder of the last update's
    optimizer calls."""
    model, criterion = built.model, built.criterion
    params = [p for p in model.parameters() if p.requires_grad]
    # inside the flat copy: the offsets of the parameters after it move
    params.insert(3, torch.nn.Parameter(torch.ones(3, dtype=params[0].dtype, device=params[0].device)))
    optimizer = _optimizer(built, params, flat)
    params[5].requires_grad_(False)  # frozen after the optimizer was built: fairseq skips it from then on
    if loops:
        multi_tensor_optimizer.use_fairseq_loops(optimizer)
    norms, recording = [], recorder()
    for update in range(3):
        batch = batches[update % 2]
        optimizer.zero_grad()
        loss, sample_size, _ = criterion(model, batch)
        optimizer.backward(loss)
        with recording if update == 2 else torch.no_grad():
            optimizer.multiply_grads(1.0 / sample_size)
            norms.append(optimizer.clip_grad_norm(0.05))
            optimizer.step()
    masters = optimizer.fp32_params.values() if optimizer.has_flat_params else optimizer.fp32_params
    params[5].requires_grad_(True)
    return norms, [p.detach().clone() for p in masters], [p.detach().clone() for p in params], recording


@pytest.mark.parametrize("flat", [False, True], ids=["per-parameter (--bf16)", "flat (--fp16)"])
def test_updates_equal_fairseqs_loops_bit_for_bit_in_one_operation_each(built, flat):
    built, batches = built
    initial = copy.deepcopy(built.model.state_dict())
    runs = {}
    for loops in (True, False):
        built.model.load_state_dict(initial)
        runs[loops] = train(built, batches, loops, flat)
    (norms, masters, weights, loop_calls), (fix_norms, fix_masters, fix_weights, fix_calls) = runs[True], runs[False]
    loop_calls, fix_calls = loop_calls.names, fix_calls.names
    assert all(n > 0.05 for n in norms)  # the clipping acted
    assert [float(n) for n in fix_norms] == [float(n) for n in norms]
    assert all(torch.equal(a, b) for a, b in zip(fix_masters + fix_weights, masters + weights))
    assert any(not torch.equal(w, initial_w) for w, initial_w in zip(weights, initial.values()))
    # fairseq: a copy per parameter back to the model, one per gradient to the master copy (and under --bf16 a norm
    # per gradient); here one operation each
    count = len(weights)
    assert loop_calls.count("copy_") > count and fix_calls.count("copy_") == 0
    assert fix_calls.count("_foreach_copy_") == 2
    if not flat:
        assert loop_calls.count("linalg_vector_norm") >= count and fix_calls.count("_foreach_norm") == 1


def test_zero_grad_of_the_per_parameter_master_copy_is_one_operation(built):
    built, _ = built
    params = [p for p in built.model.parameters() if p.requires_grad]
    optimizer = FP16Optimizer.build_optimizer(built.cfg, params)
    for p32 in optimizer.fp32_params:
        p32.grad.fill_(3.0)
    optimizer.scaler = DynamicLossScaler(init_scale=128.0)  # --fp16 --fp16-no-flatten-grads: the loss scale
    with Calls() as calls:
        optimizer.zero_grad()
    assert calls.names == ["_foreach_zero_"]
    assert all(not p32.grad.any() for p32 in optimizer.fp32_params) and all(p.grad is None for p in params)
    assert optimizer._multiply_factor == 1 / 128 and not optimizer._needs_sync


@pytest.mark.parametrize("max_norm, aggregate", [(0.0, None), (0.5, None), (1e3, lambda n: n * 2)],
                         ids=["norm only", "clipped", "aggregated, not clipped"])
def test_clip_grad_norm_equals_fairseqs(max_norm, aggregate):
    generator = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (11,), (3, 4, 2), (1,)]

    def params(dtype):
        result = []
        for shape in shapes:
            p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
            p.grad = torch.randn(shape, generator=generator).to(dtype)
            result.append(p)
        return result + [torch.nn.Parameter(torch.zeros(2))]  # no gradient: left out, as fairseq does

    for dtype in (torch.float32, torch.bfloat16):
        generator.manual_seed(0)
        ours = params(dtype)
        generator.manual_seed(0)
        theirs = params(dtype)
        norm = utils.clip_grad_norm_(ours, max_norm, aggregate)
        expected = multi_tensor_optimizer.ORIGINALS["clip_grad_norm_"](theirs, max_norm, aggregate)
        assert utils.clip_grad_norm_ is multi_tensor_optimizer.clip_grad_norm_
        assert norm.dtype == torch.float32 and torch.equal(norm, expected), (dtype, norm, expected)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours[:-1], theirs[:-1]))


def test_palm_benchs_fairseq_loops_lever_gives_the_built_optimizer_fairseqs_loops(built):
    """The lever that measures this fix (palm-bench --levers fairseq_loops) is fairseq's path on that optimizer
    only."""
    from palm_tools.bench.sweep import LEVERS

    built, batches = built
    LEVERS["fairseq_loops"].after_build(built)
    for optimizer, calls in ((built.optimizer, Calls()),
                             (FP16Optimizer.build_optimizer(built.cfg, built.optimizer.fp16_params), Calls())):
        optimizer.zero_grad()
        optimizer.backward(built.criterion(built.model, batches[1])[0])
        with calls:
            optimizer.clip_grad_norm(0.0)
            optimizer.step()
        loops = optimizer is built.optimizer
        assert (calls.names.count("copy_") > len(optimizer.fp16_params)) == loops
        assert ("_foreach_copy_" in calls.names, "_foreach_norm" in calls.names) == (not loops, not loops)


def _adam_run(step, groups, monkeypatch, chunk):
    """Three updates of fairseq's Adam over ``groups`` (lists of parameter shapes and options) with the same random
    gradients; the parameters, the states and the operators of the last update."""
    from fairseq.optim.adam import Adam

    monkeypatch.setattr(multi_tensor_optimizer, "CHUNK", chunk)
    generator = torch.Generator().manual_seed(1)
    param_groups = []
    for shapes, options in groups:
        params = [torch.nn.Parameter(torch.randn(shape, generator=generator).to(options.pop("dtype", torch.float32)))
                  for shape in shapes]
        param_groups.append({"params": params, **options})
    adam = Adam(param_groups, lr=1e-2, betas=(0.9, 0.98), eps=1e-6)
    adam.step = types.MethodType(step, adam)
    calls = Calls()
    for update in range(3):
        for group in adam.param_groups:
            # the second parameter of each group gets no gradient, the third none in the first update: its step lags
            for i, p in enumerate(group["params"]):
                p.grad = None if i == 1 or (i == 2 and update == 0) else torch.randn(
                    p.shape, generator=generator).to(p.dtype)
        with calls if update == 2 else torch.no_grad():
            adam.step()
    params = [p.detach().clone() for group in adam.param_groups for p in group["params"]]
    states = [{k: v.clone() if torch.is_tensor(v) else v for k, v in adam.state[p].items()}
              for group in adam.param_groups for p in group["params"]]
    return params, states, calls.names


GROUPS = {
    "one group": [([(7, 8), (4,), (30,), (3, 3, 3), (6, 5)], {})],  # the first larger than a pass of 40
    "two groups, weight decay": [([(6, 5), (4,), (30,)], {"weight_decay": 0.01}), ([(7,), (2, 2), (9,)], {"lr": 3e-3})],
    "amsgrad and bf16: fairseq's loop": [([(6, 5), (4,), (30,)], {"amsgrad": True}),
                                         ([(7,), (2, 2)], {"dtype": torch.bfloat16}), ([(5,), (3,), (8,)], {})],
}


@pytest.mark.parametrize("chunk", [1 << 24, 40], ids=["one pass", "passes of 40 elements (one larger)"])
@pytest.mark.parametrize("groups", list(GROUPS))
def test_adam_step_equals_fairseqs_loop_bit_for_bit(groups, chunk, monkeypatch):
    import copy as copying

    ours = _adam_run(multi_tensor_optimizer.adam_step, copying.deepcopy(GROUPS[groups]), monkeypatch, chunk)
    theirs = _adam_run(multi_tensor_optimizer.ORIGINALS["adam_step"], copying.deepcopy(GROUPS[groups]), monkeypatch,
                       chunk)
    assert all(torch.equal(a, b) for a, b in zip(ours[0], theirs[0]))
    assert [s.keys() for s in ours[1]] == [s.keys() for s in theirs[1]]  # no state for the parameter without grads
    assert [a["step"] for a in ours[1] if a] == [b["step"] for b in theirs[1] if b]
    assert {a["step"] for a in ours[1] if a} == {2, 3}
    assert all(torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
               for a, b in zip(ours[1], theirs[1]) if a)
    loop_updates = theirs[2].count("addcdiv_")
    assert loop_updates == sum(len(shapes) - 1 for shapes, _ in GROUPS[groups])  # one per parameter with a gradient
    multi_tensor_groups = sum(1 for _, options in GROUPS[groups] if not options.get("amsgrad") and "dtype" not in options)
    assert ours[2].count("_foreach_addcdiv_") >= 2 * multi_tensor_groups  # a pass per step count
    assert ours[2].count("addcdiv_") == loop_updates - sum(len(shapes) - 1 for shapes, options in GROUPS[groups]
                                                           if not options.get("amsgrad") and "dtype" not in options)


def test_fairseq_loops_on_fp32_adam_restore_its_loop_and_refuse_the_memory_efficient_wrapper(built):
    """The lever on an optimizer fairseq's trainer builds without a wrapper (fp32): Adam's loop, one update per
    parameter, under torch's step label; a wrapper with a gradient norm of its own is refused."""
    from fairseq.optim.adam import FairseqAdam

    built, _ = built
    params = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(5)]
    adam = FairseqAdam(built.cfg.optimizer, params)
    multi_tensor_optimizer.use_fairseq_loops(adam)
    for p in params:
        p.grad = torch.ones_like(p)
    with Calls() as calls, torch.profiler.profile() as profile:
        adam.step()
    assert calls.names.count("addcdiv_") == len(params) and "_foreach_addcdiv_" not in calls.names
    assert any(e.key == "Optimizer.step#Adam.step" for e in profile.key_averages())
    wrapper = MemoryEfficientFP16Optimizer(built.cfg, [p.bfloat16() for p in params], FairseqAdam(
        built.cfg.optimizer, params), allow_unsupported=True)
    with pytest.raises(ValueError, match="neither fairseq's FP16Optimizer nor an optimizer it wraps"):
        multi_tensor_optimizer.use_fairseq_loops(wrapper)


@pytest.mark.parametrize("case", ["a parameter listed twice", "tensor steps of a torch checkpoint"])
def test_groups_the_multi_tensor_update_does_not_take_go_through_fairseqs_loop(case):
    """Two cases _adam_group leaves to fairseq's loop: the same updates (a parameter listed twice is updated twice,
    its step counted twice), and per-parameter operators only."""
    from fairseq.optim.adam import Adam

    def run(step):
        generator = torch.Generator().manual_seed(3)
        params = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in ((7, 8), (4,), (30,))]
        with pytest.warns(UserWarning, match="duplicate") if case == "a parameter listed twice" else \
                contextlib.nullcontext():
            adam = Adam([{"params": params + [params[0]] if case == "a parameter listed twice" else params,
                          "weight_decay": 0.01}], lr=1e-2, betas=(0.9, 0.98), eps=1e-6)
        adam.step = types.MethodType(step, adam)
        calls = Calls()
        for update in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=generator)
            if update == 1 and case == "tensor steps of a torch checkpoint":
                for state in adam.state.values():  # torch's Adam keeps its step as a tensor
                    state["step"] = torch.tensor(float(state["step"]))
            with calls if update == 2 else torch.no_grad():
                adam.step()
        return [p.detach() for p in params], [adam.state[p]["step"] for p in params], calls.names

    ours, theirs = run(multi_tensor_optimizer.adam_step), run(multi_tensor_optimizer.ORIGINALS["adam_step"])
    assert all(torch.equal(a, b) for a, b in zip(ours[0], theirs[0]))
    assert [float(s) for s in ours[1]] == [float(s) for s in theirs[1]] == (
        [6, 3, 3] if case == "a parameter listed twice" else [3, 3, 3])
    assert ours[2] == theirs[2] and ours[2].count("addcdiv_") == (4 if case == "a parameter listed twice" else 3)
