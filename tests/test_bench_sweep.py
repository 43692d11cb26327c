"""palm-bench --sweep: the quick CPU path of the card's sweep writes its files with values that follow from the
batches (tokens, FLOPs, MFU recomputed from the record), accumulation equals one large batch, and the search for the
largest micro-batch backs off on out-of-memory as it should (no timing is judged here)."""
import functools
import json
import logging
import re
import shlex
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

from palm_tools.bench import cli as benchmark
from palm_tools.bench import sweep as bench_sweep
from palm_tools.bench import sweep_report
from palm_tools.bench.data import SyntheticCorpus
from palm_tools.bench.models import build
from palm_tools.bench.sweep import SPECS, AccumulatedStep, Fit, OutOfMemory, Sweep, load_batches
from tests.conftest import REPO, run_cli

LENGTH = 32
# real tokens per sequence of each layout at length L (palm_tools/bench/data.py): translation sees the source and the
# target with their EOS, L - 1; the other layouts fill L. unilm_pretraining's next-sentence negatives take B from
# another document, which may be one token shorter.
TOKENS_PER_SEQUENCE = {"transformer": LENGTH - 1, "palm": LENGTH - 1, "palm_nocopy": LENGTH - 1}


def card_run():
    """The card run as docs/benchmarks-gpu.md documents it ("Planned card run"): ``{tool: arguments}`` of its
    palm-gpu-check and palm-bench parts."""
    text = (REPO / "docs" / "benchmarks-gpu.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("palm-gpu-check --out card/check "))
    parts = [shlex.split(part) for part in line.split(";")]
    return {part[0]: part[1:] for part in parts}


@pytest.fixture(scope="module")
def quick_sweep(tmp_path_factory):
    """The card run's palm-bench part with --quick (tiny archs, one length, two sizes; the outputs moved here)."""
    out = tmp_path_factory.mktemp("sweep")
    argv = card_run()["palm-bench"] + ["--quick", "--output-dir", str(out), "--profile-dir", str(out / "profiles"),
                                       "--profile-levers", "torch_adamw"]
    with warnings.catch_warnings():
        try:
            record = benchmark.run(argv)
        finally:
            logging.disable(logging.NOTSET)
    return out, record


def test_card_run_is_the_sweep_preset_beside_palm_base_precisions():
    """The documented card run: palm-gpu-check trains PALM base in the precisions and variants of the fp16 question
    and runs the CUDA tests; palm-bench runs the gpu-sweep preset, whose settings are issue 24's."""
    card = card_run()
    assert set(card) == {"palm-gpu-check", "palm-bench"}
    check = card["palm-gpu-check"]
    assert check[check.index("--precisions") + 1] == "fp32,fp32-seed2,fp16,fp16-scale16,bf16"
    assert check[check.index("--parts") + 1] == "training,tests"
    args = benchmark.parse_args(card["palm-bench"] + ["--device", "cpu"])
    assert args.sweep and args.size == "base" and args.lengths == [512, 768] and args.sequences == [16, 64, 256]
    assert args.find_max and set(args.levers) == set(bench_sweep.LEVERS) and args.sentences == [1]
    assert args.time_budget_min and args.time_budget_min <= 18


def test_quick_sweep_writes_every_configuration_at_both_sizes(quick_sweep):
    out, record = quick_sweep
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    adamw = {row["key"] for row in record["sweep"] if row["variant"] == "torch_adamw" and row["status"] == "ok"}
    assert adamw and {p.name for p in (out / "profiles").glob("*.txt")} == (
        {f"{key}.txt" for key in SPECS} | {f"{key}_torch_adamw.txt" for key in adamw})
    # a lever's profile is of its own update: fused AdamW's kernels where the plain row has fairseq's Adam loop
    lever_profile = (out / "profiles" / f"{sorted(adamw)[0]}_torch_adamw.txt").read_text()
    assert lever_profile.startswith(f"{sorted(adamw)[0]}_torch_adamw: ") and "_fused_adamw" in lever_profile
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["complete"] and saved["missing"] == [] and len(saved["sweep"]) == len(record["sweep"])
    markdown = (out / "sweep.md").read_text()
    for section in ("### Training sweep", "### Levers", "### Decoding", "### Targets (issue 24)",
                    "### How the sweep is measured"):
        assert section in markdown
    rows = [row for row in saved["sweep"] if row["stage"] == "sweep"]
    assert {(row["key"], row["sequences"]) for row in rows} == {(key, n) for key in SPECS for n in (2, 4)}
    peak = saved["gemm"]["peak_gflops"] * 1e9
    for row in saved["sweep"]:
        assert row["status"] == "ok" and row["length"] == LENGTH and row["peak_memory_mb"] > 0
        assert row["micro_batch"] * row["update_freq"] == row["sequences"] and row["tokens_per_s"] > 0
        assert row["mfu"] == pytest.approx(row["flops_per_update"] / row["median_s"] / peak, rel=1e-9)
        assert row["tokens_per_s"] == pytest.approx(row["text_tokens"] / row["median_s"], rel=1e-9)
        per_sequence = TOKENS_PER_SEQUENCE.get(row["key"], LENGTH)
        if row["key"] in ("unilm_pretraining", "unilm_bidirectional"):
            assert row["sequences"] * (LENGTH - 1) <= row["text_tokens"] <= row["sequences"] * LENGTH
        else:
            assert row["text_tokens"] == row["sequences"] * per_sequence, row["key"]
    for key in SPECS:
        two, four = (next(r for r in rows if r["key"] == key and r["sequences"] == n) for n in (2, 4))
        assert four["text_tokens"] > two["text_tokens"] and four["flops_per_update"] > two["flops_per_update"]


def test_quick_sweep_measures_each_lever_beside_its_plain_row_and_decodes_at_batch_one(quick_sweep):
    _, record = quick_sweep
    levers = {(row["key"], row["variant"]): row for row in record["sweep"] if row["stage"] == "lever"}
    assert set(levers) == {("pmlm_ae_par", v) for v in ("plain", "torch_adamw", "compile", "syncs_at_start",
                                                        "loader_workers")} | {
        ("unilm_bidirectional", "plain"), ("unilm_bidirectional", "drop_full_masks")}
    for (key, variant), row in levers.items():
        plain = levers[key, "plain"]
        assert row["vs_plain"] == pytest.approx(row["tokens_per_s"] / plain["tokens_per_s"])
        assert row["text_tokens"] == plain["text_tokens"] or key == "unilm_bidirectional"
    assert levers["pmlm_ae_par", "loader_workers"]["loader_workers"] == 1
    decoded = {row["key"]: row for row in record["decoding"]}
    assert set(decoded) == {"transformer", "palm", "unilm", "unilm2", "unilm_graph", "unilm2_graph"}
    assert all(row["sentences"] == 1 and row["sentences_per_s"] > 0 for row in decoded.values())
    assert decoded["transformer"]["time_vs_transformer"] == 1.0
    targets = {t["target"]: t for t in record["targets"]}
    assert len(targets) == 7 and {t["status"] for t in targets.values()} <= {"PASS", "MISS"}
    copy = targets[f"palm step cost <= 1.05x --no-copy, length {LENGTH}"]
    palm, nocopy = (next(r for r in record["sweep"] if r["key"] == k and r["sequences"] == 4 and r["stage"] == "sweep")
                    for k in ("palm", "palm_nocopy"))  # fmt: skip
    assert copy["value"] == pytest.approx(nocopy["tokens_per_s"] / palm["tokens_per_s"])


def test_copy_target_with_the_compiled_copy_lever_multiplies_two_ratios_of_one_stage_each():
    """--compile-copy-attention against --no-copy at the lever point: the sweep's palm / --no-copy ratio times the
    lever stage's compile_copy / plain palm ratio (times, so tokens/s inverted); absent rows leave it unmeasured."""
    def row(stage, key, tokens_per_s, variant="plain"):
        return dict(stage=stage, key=key, variant=variant, tokens_per_s=tokens_per_s, length=512, sequences=256,
                    how="requested", mfu=0.1, micro_batch=256, update_freq=1)

    rows = [row("sweep", "palm", 100.0), row("sweep", "palm_nocopy", 145.0), row("lever", "palm", 110.0),
            row("lever", "palm", 150.0, "compile_copy")]
    settings = dict(lengths=[512], lever_length=512, lever_sequences=256, levers=["compile_copy"])
    found = {t["target"]: t for t in sweep_report.targets(rows, [], settings)}
    target = found["palm --compile-copy-attention step cost <= 1.05x --no-copy, length 512"]
    assert target["value"] == pytest.approx(1.45 * 110 / 150) and target["status"] == "MISS"  # 1.063x
    assert found["palm step cost <= 1.05x --no-copy, length 512"]["value"] == pytest.approx(1.45)
    found = {t["target"]: t for t in sweep_report.targets(rows[:3], [], settings)}
    assert found["palm --compile-copy-attention step cost <= 1.05x --no-copy, length 512"]["status"] == "NOT MEASURED"
    assert not any("compile-copy" in t["target"] for t in sweep_report.targets(rows, [], dict(settings, levers=[])))


def test_accumulated_micro_batches_give_the_gradients_of_one_batch(tmp_path):
    """--update-freq: two micro-batches of 2 sequences sum to the gradients and sample size of one batch of 4."""
    logging.disable(logging.INFO)
    corpus = SyntheticCorpus(str(tmp_path), 300)
    spec = SPECS["transformer"]
    built = build(corpus.path(spec.layout, LENGTH, 8), spec.args("tiny", LENGTH) + ["--dropout", "0",
                                                                                      "--attention-dropout", "0"])
    results = []
    for micro, count in ((4, 1), (2, 2)):
        step = AccumulatedStep(spec, built, load_batches(built, micro, count))
        built.optimizer.zero_grad()
        sample_size = step.backward()
        results.append((sample_size, step.text_tokens, step.flops,
                        {n: p.grad.clone() for n, p in built.model.named_parameters() if p.grad is not None}))
    (size, tokens, flops, grads), (size2, tokens2, flops2, grads2) = results
    assert (size, tokens) == (size2, tokens2) and flops == pytest.approx(flops2)
    for name, grad in grads.items():
        torch.testing.assert_close(grads2[name], grad, rtol=1e-5, atol=1e-6, msg=name)


class FakeArgs:
    sequences, lever_sequences, repeats, device, precision = [64], 64, 1, "cpu", "bf16"
    memory_limit_mb, profile_dir, lever_length, profile_sequences = 10_000, None, LENGTH, 4


def test_out_of_memory_halves_the_micro_batch_and_the_largest_is_searched_below_the_limit(monkeypatch):
    """A device that holds 1,000 MB + 300 MB per sequence under a 10,000 MB limit: 64 sequences per update run as
    16 x 4 after 64 and 32 do not fit; the search then tries the line's prediction (24, rounded to a multiple of 8)
    and keeps the largest that fits as one update."""
    tried = []

    def fake_measure(self, spec, built, length, micro, update_freq, loader, workers):
        tried.append(micro)
        peak = (1000 + 300 * micro) * bench_sweep.MB
        if peak > FakeArgs.memory_limit_mb * bench_sweep.MB:
            raise OutOfMemory("peak above the limit")
        return {"micro_batch": micro, "update_freq": update_freq, "peak_memory_mb": peak / bench_sweep.MB}

    monkeypatch.setattr(Sweep, "_measure", fake_measure)
    result = {"sweep": [], "missing": []}
    sweep = Sweep(FakeArgs(), None, result, lambda: None, lambda: False)
    fit = Fit()
    row = sweep.point(SPECS["roberta"], None, LENGTH, 64, fit, "plain")
    assert tried == [64, 32, 16] and (row["micro_batch"], row["update_freq"]) == (16, 4) and fit.fails == 32
    fit.peaks[8] = (1000 + 300 * 8) * bench_sweep.MB  # a second point for the line (the sweep's 8-sequence row)
    sweep.largest(SPECS["roberta"], None, LENGTH, fit)
    largest = result["sweep"][-1]
    assert largest["how"] == "largest" and largest["micro_batch"] == 24 and tried[3:] == [24]
    assert 1000 + 300 * 24 <= 0.92 * FakeArgs.memory_limit_mb < 1000 + 300 * 32


def speed_card_calls():
    """Issue 38's two card calls as docs/benchmarks-gpu.md section 6 writes them: ``{tool: arguments}`` of the
    palm-gpu-check line of the first call and the palm-bench line of the second, each run there as ``python3 -m``
    its module ($OUT left as written)."""
    text = (REPO / "docs" / "benchmarks-gpu.md").read_text()
    section = text[text.index("## 6. Issue 38"):]
    calls = {}
    tools = {"palm_tools.experiments.gpu_check": "palm-gpu-check", "palm_tools.bench.cli": "palm-bench"}
    for line in section.splitlines():
        command = re.match(r"^(?:timeout \d+ )?python3 -m (palm_tools\.\S+) (.*)$", line)
        if command and command.group(1) in tools:
            calls.setdefault(tools[command.group(1)], shlex.split(command.group(2)))
    return calls


def test_speed_card_calls_plan_what_issue_38_measures():
    """Checked before a card is lent: both calls parse, and their plans (--plan-only, --device cuda kept) hold what the
    issue's targets read: the baselines (roberta, palm --no-copy) beside each family at 64 and 256 sequences of 512,
    the kernel levers with pmlm's first, the kernels' training curves beside bf16's, and CUDA tests that exist."""
    from palm_tools.experiments import gpu_check

    calls = speed_card_calls()
    args = benchmark.parse_args(calls["palm-bench"] + ["--plan-only"])
    sweep, levers, estimate, _ = benchmark.plan(args)
    assert benchmark.run(calls["palm-bench"] + ["--plan-only"]) == {"plan": [sweep, levers, estimate, _]}
    assert args.device == "cuda" and args.lengths == [512] and args.sequences == [64, 256] and args.lever_sequences == 64
    assert set(sweep.split(" at ")[0].split(": ")[1].split(", ")) == {
        "roberta", "pmlm_ae_par", "unilm_pretraining", "unilm_seq2seq", "palm", "palm_nocopy", "transformer"}
    per_config = dict(part.split(": ") for part in levers.removeprefix("levers: ").rsplit(": ", 1)[0].split("; "))
    assert list(per_config)[0] == "pmlm_ae_par"
    for config in ("pmlm_ae_par", "unilm_pretraining", "unilm_seq2seq"):
        assert per_config[config].split(", ")[:2] == ["no_attention_dropout", "flex"], config
    assert per_config["palm"].split(", ")[0] == "triton_copy"
    # a row started just before the budget ends (a compiled lever: about a minute) still ends inside the timeout
    timeout = int(re.search(r"timeout (\d+) python3 -m palm_tools.bench.cli",
                            (REPO / "docs" / "benchmarks-gpu.md").read_text()).group(1))
    assert f"after {args.time_budget_min:g} min" in estimate and args.time_budget_min * 60 + 60 <= timeout

    check = calls["palm-gpu-check"]
    assert gpu_check.main(check + ["--plan-only"]) == 0
    args = gpu_check.parse_args(check + ["--plan-only"])
    assert (args.configs, args.sizes, args.updates) == (["unilm2_pmlm", "palm_ft"], ["base"], 200)
    assert {"bf16", "bf16-kernels", "fp32"} <= set(args.precisions)
    rounds = -(-len(args.configs) * len(args.precisions) // args.jobs)  # training, then the tests: 6 minutes at most
    assert args.run_timeout * rounds + args.tests_timeout <= 360
    selected = run_cli(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                       "tests/test_gpu.py", "-k", args.tests, cwd=REPO).stdout
    for test in ("test_flex_attention_backward_on_cuda_equals_sdpa",
                 "test_fused_attention_pmlm_training_step_on_cuda_takes_less_memory_than_sdpa[flex]",
                 "test_triton_copy_attention_on_cuda_equals_float64_reference_in_less_memory",
                 "test_compiled_copy_attention_on_cuda_equals_float64_reference_in_less_memory"):
        assert f"::{test}" in selected, test


@pytest.mark.slow
def test_speed_card_training_check_runs_quick_on_the_cpu(tmp_path, small_palm_data):
    """The first card call's palm-gpu-check with --quick --device cpu: pmlm and PALM fine-tuning in fp32, a second fp32
    seed and bf16, each judged against fp32 (bf16 with the seed's drift beside its tolerance); the bf16-kernels runs
    reach fairseq-train with each family's kernel option, which this CPU refuses in one line naming the option to use
    instead, and are judged against bf16; tests/test_gpu.py's selection runs (skipped here)."""
    out = tmp_path / "check"
    argv = speed_card_calls()["palm-gpu-check"] + ["--out", out, "--data", small_palm_data, "--device", "cpu",
                                                   "--quick", "--jobs", "2"]
    run_cli(sys.executable, "-m", "palm_tools.experiments.gpu_check", *argv, cwd=REPO)
    report = json.loads((out / "gpu_check.json").read_text())
    rows = {(r["config"], r["precision"]): r for r in report["training"]}
    assert set(rows) == {(c, p) for c in ("unilm2_pmlm", "palm_ft") for p in ("fp32", "fp32-seed2", "bf16",
                                                                                "bf16-kernels")}
    for config, refusal in (("unilm2_pmlm", "use --attention-impl sdpa"), ("palm_ft", "--copy-attention-impl")):
        plain = {p: rows[config, p] for p in ("fp32", "fp32-seed2", "bf16")}
        assert all(r["exit"] == 0 and r["status"] == "PASS" for r in plain.values()), plain
        assert plain["bf16"]["against"] == "fp32" and plain["bf16"]["fp32_seed_drift"] is not None
        assert plain["fp32-seed2"]["mean_rel_diff"] is not None and plain["fp32-seed2"]["tolerance"] is None
        kernels = rows[config, "bf16-kernels"]
        assert kernels["against"] == "bf16" and kernels["exit"] == 1 and kernels["status"] == "FAIL"
        assert refusal in kernels["reasons"][0] and "Traceback" not in (out / kernels["log"]).read_text()
        assert kernels["reasons"][-1] == "no bf16 curve to compare with"
    assert report["tests"] and all(t["outcome"] == "skipped" for t in report["tests"])
    assert "| bf16-kernels | bf16 |" in (out / "gpu_check.md").read_text()


def test_kernel_levers_reach_the_models_they_are_for(synthetic_corpus):
    """issue 38's levers: flex (and its fair sdpa baseline without attention dropout) on every UniLM-family
    configuration and only there, triton_copy and blocked_copy on palm only; their options reach the model: on this
    CPU a training build with flex stops with FlexAttention's one-line refusal, and palm's copy layer gets the triton
    impl (refused here, without CUDA), blocked with blocked_copy, auto by default."""
    from palm_tools.bench.models import build

    every = {**SPECS, "unilm_bidirectional": bench_sweep.UNILM_BIDIRECTIONAL}
    unilm_family = {"pmlm_mlm", "pmlm_ae_par", "unilm_pretraining", "unilm_seq2seq", "unilm_bidirectional"}
    for name in ("flex", "flex_static", "no_attention_dropout"):
        assert {k for k, s in every.items() if bench_sweep.LEVERS[name].applies(s)} == unilm_family
    for name in ("triton_copy", "blocked_copy"):
        assert {k for k, s in every.items() if bench_sweep.LEVERS[name].applies(s)} == {"palm"}, name
    spec = SPECS["pmlm_ae_par"]
    with pytest.raises(SystemExit, match="--attention-impl flex: .*use --attention-impl sdpa"):
        build(synthetic_corpus.path(spec.layout, 32, 8), spec.args("tiny", 32)
              + bench_sweep.LEVERS["all_kernels"].args(spec))
    palm = SPECS["palm"]
    args = palm.args("tiny", 32) + bench_sweep.LEVERS["triton_copy"].args(palm)
    assert args[-2:] == ["--copy-attention-impl", "triton"]
    with pytest.raises(SystemExit, match="--copy-attention-impl triton"):  # no CUDA here: refused, naming the option
        build(synthetic_corpus.path(palm.layout, 32, 8), args)
    # the default is auto (triton on CUDA); blocked_copy, its baseline, reaches the copy layer as blocked
    for lever, impl in ((None, "auto"), ("blocked_copy", "blocked")):
        args = palm.args("tiny", 32) + (bench_sweep.LEVERS[lever].args(palm) if lever else [])
        model = build(synthetic_corpus.path(palm.layout, 32, 8), args).model
        assert model.decoder.pointer_generator.scores_impl == impl, lever


def test_flex_levers_choose_how_flexattention_compiles_on_cuda_each_for_its_own_row(monkeypatch):
    """flex_static (issue 38's experiment: inductor's FlexAttention kernels without bound checks, which it generates
    only where it knows the lengths) compiles FlexAttention on CUDA for the batch's shape; flex and all_kernels for
    every shape, as the model does by default; each lever's setting holds for its own row and is set back after it,
    so one row's choice never reaches the next. On the CPU shapes stay static whatever the setting."""
    from palm_plugin.modules import flex_attention

    calls = []
    monkeypatch.setattr(torch, "compile", lambda function, **options: calls.append(options["dynamic"]) or function)
    monkeypatch.setattr(flex_attention, "_COMPILED", {})
    monkeypatch.setattr(flex_attention, "CUDA_SHAPES", "dynamic")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    rows = (("flex_static", False, [False, False]), ("flex", True, [True]), ("flex_static", False, []),
            ("all_kernels", True, []))  # what each row compiles anew: once per device and mode
    for lever, dynamic, compiled in rows:
        calls.clear()
        with bench_sweep.LEVERS[lever].setting():
            flex_attention._compiled(flex_attention.flex_attention, cuda)
            flex_attention._compiled(flex_attention.flex_attention, cpu)
        assert calls == compiled and flex_attention.CUDA_SHAPES == "dynamic", lever
        assert flex_attention._COMPILED[flex_attention.flex_attention, "cuda", dynamic] is flex_attention.flex_attention
    assert len(flex_attention._COMPILED) == 3
    assert (flex_attention.flex_attention, "cpu", False) in flex_attention._COMPILED


def test_unaligned_vocabulary_lever_measures_the_matrix_as_it_is_in_its_own_row_only(monkeypatch):
    """unaligned_vocabulary (the baseline of lm_head's padded vocabulary products) applies to the plugin's models; the
    sweep measures its row with the products on the matrix as it is, the rows before and after it padded; where the
    dictionary needs no padding (the benchmark's 32000 types but for pmlm's pseudo token) it records the row as
    skipped, saying why, instead of measuring the plain row again."""
    from palm_plugin.modules import lm_head

    every = {**SPECS, "unilm_bidirectional": bench_sweep.UNILM_BIDIRECTIONAL}
    lever = bench_sweep.LEVERS["unaligned_vocabulary"]
    assert {k for k, s in every.items() if lever.applies(s)} == {k for k, s in every.items() if s.plugin}
    monkeypatch.setattr(lm_head, "pads_vocabulary", lambda states: True)
    features, weight = torch.randn(5, 8, requires_grad=True), torch.randn(30, 8)
    seen = []

    def fake_point(self, spec, built, length, sequences, fit, variant, **options):
        seen.append((spec.key, variant, lm_head.vocabulary_logits(features, weight).stride(0)))

    types = {"pmlm_ae_par": 32001, "palm": 32000}
    monkeypatch.setattr(Sweep, "_build", lambda self, spec, length, extra=(), reuse=None: SimpleNamespace(
        task=SimpleNamespace(source_dictionary=range(types[spec.key]))))
    monkeypatch.setattr(Sweep, "point", fake_point)
    result = {"sweep": [], "missing": []}
    sweep = Sweep(FakeArgs(), None, result, lambda: None, lambda: False)
    for key in types:
        sweep.levers(SPECS[key], [lever, bench_sweep.LEVERS["torch_adamw"]], Fit())
    assert seen == [("pmlm_ae_par", "plain", 64), ("pmlm_ae_par", "unaligned_vocabulary", 30),
                    ("pmlm_ae_par", "torch_adamw", 64), ("palm", "plain", 64), ("palm", "torch_adamw", 64)]
    assert [(row["key"], row["variant"], row["status"], row["reason"]) for row in result["sweep"]] == [
        ("palm", "unaligned_vocabulary", "skipped", "32000 types, a multiple of 64: nothing to pad")]


def test_the_activation_checkpoint_lever_reaches_every_configurations_layers(synthetic_corpus):
    """checkpoint_activations: --checkpoint-activations on every configuration of the plugin, and the same wrapper
    (palm_plugin/modules/activation_checkpoints.py) on fairseq's baselines' layers by the benchmark (fairseq 0.12's
    RoBERTa has no such option), so the card measures the same trade on both sides."""
    from palm_tools.bench.models import build

    lever = bench_sweep.LEVERS["checkpoint_activations"]
    for key, spec in {**SPECS, "unilm_bidirectional": bench_sweep.UNILM_BIDIRECTIONAL}.items():
        assert lever.applies(spec)
        built = build(synthetic_corpus.path(spec.layout, 32, 8), spec.args("tiny", 32) + lever.args(spec))
        built.spec_plugin = spec.plugin  # as the sweep marks it before a lever's after_build
        lever.after_build(built)
        model = built.model
        layers = [m for m in model.modules() if isinstance(m.__dict__.get("forward"), functools.partial)]
        # the plugin's stacks have two layers at tiny size, PALM's encoder and decoder two each
        assert len(layers) == (4 if key.startswith(("palm", "transformer")) else 2), key
