"""palm-gpu-check: its log reading and verdicts on fairseq's own message texts, and a real --device cpu --quick run."""
import json
import math
import sys

import pytest

from palm_tools.experiments.gpu_training import (BF16_TOLERANCE, CONFIGS, SIZES, fp32_seed_drift, judge, read_log,
                                                 train_command)
from tests.conftest import REPO, run_cli


def inner(update, loss, scale=None):
    record = {"epoch": 1, "loss": f"{loss:.3f}", "num_updates": str(update)}
    if scale is not None:
        record["loss_scale"] = str(scale)
    return f"2026-11-22 10:00:00 | INFO | train_inner | {json.dumps(record)}"


def overflow(scale):
    """The line fairseq's trainer writes (its f-string around DynamicLossScaler's OverflowError text)."""
    from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(init_scale=scale * 2, tolerance=0.0)
    with pytest.raises(OverflowError) as error:
        scaler.check_overflow(float("inf"))
    return f"2026-11-22 10:00:00 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, {error.value}"


def run_of(lines, precision, updates=100):
    points, overflows = read_log("\n".join(lines))
    return {"points": points, "overflows": overflows, "precision": precision, "updates": updates, "status": 0,
            "last_line": ""}


FP32 = run_of([inner(u, 10 - u / 20) for u in range(10, 101, 10)], "fp32")


def test_read_log_attributes_overflows_to_the_last_logged_update():
    lines = [overflow(64), inner(10, 9.5, 64), inner(20, 9.0, 64), overflow(32), inner(30, 8.5, 32)]
    points, overflows = read_log("\n".join(lines))
    assert [p["update"] for p in points] == [10, 20, 30] and points[2]["loss_scale"] == 32
    assert overflows == [{"after_update": 0, "loss_scale": 64.0}, {"after_update": 20, "loss_scale": 32.0}]


def test_judge_passes_a_close_stable_fp16_run_and_names_each_failure():
    close = [inner(u, (10 - u / 20) * 1.01, 128) for u in range(10, 101, 10)]
    assert judge(run_of([overflow(64)] + close, "fp16"), FP32)["status"] == "PASS"  # early skip allowed

    far = [inner(u, (10 - u / 20) * (1.05 if u > 60 else 1.0), 128) for u in range(10, 101, 10)]
    verdict = judge(run_of(far, "fp16"), FP32)
    assert verdict["status"] == "FAIL" and math.isclose(verdict["max_rel_diff"], 0.05, rel_tol=1e-2)
    assert judge(run_of(far, "bf16"), FP32)["status"] == "FAIL"  # 4% (mean of the last half) > 3%
    spike = [inner(u, (10 - u / 20) * (1.05 if u == 90 else 1.0), 128) for u in range(10, 101, 10)]
    verdict = judge(run_of(spike, "fp16"), FP32)  # one interval 5% off: the mean of the last half is 1%
    assert verdict["status"] == "PASS" and math.isclose(verdict["mean_rel_diff"], 0.01, rel_tol=0.1)

    late = [inner(u, 10 - u / 20, 128 if u < 70 else 32) for u in range(10, 101, 10)]
    late.insert(7, overflow(32))  # after update 60
    reasons = judge(run_of(late, "fp16"), FP32)["reasons"]
    assert any("overflow skips after update 50" in r for r in reasons)
    assert any("loss scale fell from 128 (update 50) to 32" in r for r in reasons)

    diverged = [inner(u, float("nan") if u == 100 else 10 - u / 20, 128) for u in range(10, 101, 10)]
    assert "non-finite loss" in judge(run_of(diverged, "fp16"), FP32)["reasons"]
    short = run_of([inner(u, 10 - u / 20) for u in range(10, 51, 10)], "bf16")
    assert any("stopped at update 50 of 100" in r for r in judge(short, FP32)["reasons"])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_configuration_builds_the_experiments_command_at_each_size(precision, tmp_path):
    """Each check trains what palm-experiments trains (same task, criterion, model options), at each size, with
    fairseq's precision flag and without a stage-ae checkpoint to start from."""
    for size, (scale, updates, lr) in SIZES.items():
        for config, (kind, *_) in CONFIGS.items():
            command = [str(a) for a in train_command(config, scale, updates, lr, tmp_path, precision, "cuda",
                                                               4, tmp_path)]
            assert "--finetune-from-model" not in command, config
            assert command[command.index("--encoder-embed-dim") + 1] == str(scale.dim), (size, config)
            assert ("--bf16" in command) == (precision == "bf16") and "--cpu" not in command
            if config in ("palm_ae", "palm_joint"):
                assert command[command.index("--stage") + 1] == config.split("_")[1]
            # the reference runs name today's path (PALM's default, auto, takes triton on CUDA); bf16-kernels the
            # kernels, last, so that they override nothing the comparison needs
            option, reference, kernel = (("--copy-attention-impl", "blocked", "triton") if config.startswith("palm")
                                         else ("--attention-impl", "sdpa", "triton"))
            assert command[len(command) - 1 - command[::-1].index(option) + 1] == reference, config
            kernels = [str(a) for a in train_command(config, scale, updates, lr, tmp_path, "bf16-kernels", "cuda", 4,
                                                     tmp_path)]
            assert kernels[-2:] == [option, kernel] and reference not in kernels[-2:], config


def test_precision_variants_override_the_command_last_and_are_judged_as_their_precision():
    """Issue 24's variants: fp32 with a second seed (its distance to fp32 not judged itself, but widening the half precisions' tolerance) and fp16 from a loss
    scale of 16 (fp16's tolerance and loss-scale rules); the flags come after the command's own --seed 1."""
    scale, updates, lr = SIZES["base"]
    seed2, scale16 = (train_command("palm_ft", scale, updates, lr, "data", p, "cuda", 4, "work")
                      for p in ("fp32-seed2", "fp16-scale16"))  # fmt: skip
    assert seed2[-2:] == ["--seed", "2"] and "--fp16" not in seed2 and "--bf16" not in seed2
    assert scale16[-2:] == ["--fp16-init-scale", "16"] and "--fp16" in scale16
    drifted = run_of([inner(u, (10 - u / 20) * 1.05) for u in range(10, 101, 10)], "fp32-seed2")
    verdict = judge(drifted, FP32)
    assert verdict["status"] == "PASS" and verdict["tolerance"] is None
    assert verdict["mean_rel_diff"] == pytest.approx(0.05)
    fp16 = run_of([inner(u, (10 - u / 20) * 1.05, 16 if u < 60 else 4) for u in range(10, 101, 10)], "fp16-scale16")
    reasons = judge(fp16, FP32)["reasons"]
    assert any("mean loss 5.0% from fp32 (tolerance 2%)" in r for r in reasons)
    assert any("loss scale fell from 16 (update 50) to 4" in r for r in reasons)
    # A second fp32 seed 6% away: a half-precision curve 5% away is within what fp32 varies by itself; a drift below
    # the tolerance changes nothing; a curve beyond both names both.
    bf16 = run_of([inner(u, (10 - u / 20) * 1.05) for u in range(10, 101, 10)], "bf16")
    assert judge(bf16, FP32)["status"] == "FAIL"
    held = judge(bf16, FP32, drift=0.06)
    assert held["status"] == "PASS" and held["tolerance"] == 0.06 and held["fp32_seed_drift"] == 0.06
    assert judge(bf16, FP32, drift=0.01)["tolerance"] == BF16_TOLERANCE
    beyond = run_of([inner(u, (10 - u / 20) * 1.10) for u in range(10, 101, 10)], "bf16")
    assert judge(beyond, FP32, drift=0.06)["reasons"] == ["mean loss 10.0% from fp32 (tolerance 3%; a second fp32 "
                                                          "seed: 6.0%)"]
    # the drift comes from a second seed that ran whole; one that diverged or stopped widens nothing
    assert fp32_seed_drift(drifted, FP32) == pytest.approx(0.05)
    diverged = run_of([inner(u, float("nan") if u > 50 else 10 - u / 20) for u in range(10, 101, 10)], "fp32-seed2")
    stopped = run_of([inner(u, 10 - u / 20) for u in range(10, 51, 10)], "fp32-seed2")
    assert fp32_seed_drift(diverged, FP32) is None and fp32_seed_drift(stopped, FP32) is None


def test_card_run_selection_of_sizes_and_precisions(tmp_path):
    """The card run's selection: PALM base only, the variants beside the three precisions; on the CPU (the quick
    path) the fp16 runs are left out, fairseq having no fp16 there."""
    from palm_tools.experiments.gpu_check import parse_args

    for corpus in ("chitchat10k", "sotu"):  # what parse_args looks for
        (tmp_path / "bin" / corpus).mkdir(parents=True)
    argv = ["--out", "check", "--data", str(tmp_path), "--configs", "palm_ft", "--sizes", "base",
            "--precisions", "fp32,fp32-seed2,fp16,fp16-scale16,bf16"]  # fmt: skip
    args = parse_args(argv + ["--device", "cpu"])
    assert (args.configs, args.sizes, args.precisions) == (["palm_ft"], ["base"], ["fp32", "fp32-seed2", "bf16"])
    with pytest.raises(SystemExit):
        parse_args(argv[:-1] + ["fp32,fp64"])


def test_kernels_variant_needs_its_reference_and_a_slow_test_run_still_gives_the_report(tmp_path, capsys):
    """bf16-kernels is judged against bf16: asked for without it, the command stops naming what to add; tests/test_gpu.py
    past --tests-timeout gives a timeout row that points at its log, and the other parts are kept."""
    from palm_tools.experiments.gpu_check import numerics, parse_args

    for corpus in ("chitchat10k", "sotu"):
        (tmp_path / "bin" / corpus).mkdir(parents=True)
    argv = ["--out", str(tmp_path / "check"), "--data", str(tmp_path), "--device", "cpu"]
    with pytest.raises(SystemExit):
        parse_args(argv + ["--precisions", "fp32,bf16-kernels"])
    assert capsys.readouterr().err.rstrip().splitlines()[-1].endswith(
        "error: --precisions bf16-kernels is judged against bf16: add bf16 to --precisions")
    args = parse_args(argv + ["--precisions", "fp32,bf16,bf16-kernels", "--tests-timeout", "1"])
    (args.out / "work" / "logs").mkdir(parents=True)
    logged = []
    rows = numerics(args, args.out / "work", logged.append)
    assert rows == [{"test": "tests/test_gpu.py", "outcome": "timeout", "detail": "stopped after 1 s (--tests-timeout); "
                     "how far it got: work/logs/pytest-test_gpu.log"}]
    assert logged == ["tests/test_gpu.py: stopped after --tests-timeout 1 s"]


def test_a_failed_test_runs_again_alone_and_its_row_says_whether_an_earlier_test_broke_it(tmp_path, monkeypatch):
    """Section 11 of docs/benchmarks-gpu.md: 15 of 17 CUDA tests failed in one process and passed one group a process
    (section 12). Here a test leaves its process broken, as a CUDA error does; the test after it fails in the shared
    run and passes alone, and its row says so; a test that fails alone too keeps its own message; the log counts."""
    from palm_tools.experiments.gpu_check import TEST_FILE, markdown, numerics, parse_args

    (tmp_path / "tests").mkdir()
    (tmp_path / TEST_FILE).write_text(
        "import os\n\n\n"
        "def test_leaves_the_process_broken():\n    os.environ['CARD_STATE'] = 'broken'\n\n\n"
        "def test_after_it():\n    assert os.environ.get('CARD_STATE') != 'broken', 'illegal memory access'\n\n\n"
        "def test_wrong_values():\n    assert 1 + 1 == 3, 'values differ'\n")
    monkeypatch.delenv("CARD_STATE", raising=False)
    monkeypatch.chdir(tmp_path)  # the tests of the working directory come first
    for corpus in ("chitchat10k", "sotu"):
        (tmp_path / "bin" / corpus).mkdir(parents=True)
    args = parse_args(["--out", str(tmp_path / "check"), "--data", str(tmp_path), "--device", "cpu"])
    (args.out / "work" / "logs").mkdir(parents=True)
    logged = []
    rows = {row["test"]: row for row in numerics(args, args.out / "work", logged.append)}
    assert rows["test_leaves_the_process_broken"] == {"test": "test_leaves_the_process_broken", "outcome": "passed",
                                                      "detail": ""}
    after, wrong = rows["test_after_it"], rows["test_wrong_values"]
    assert (after["outcome"], after["alone"], wrong["outcome"], wrong["alone"]) == ("failed", "passed", "failed",
                                                                                  "failed")
    assert after["detail"].startswith("passes alone: an earlier test in the same process broke it")
    assert "illegal memory access" in after["detail"]
    assert wrong["detail"].startswith("alone: failed; ") and "values differ" in wrong["detail"]
    assert logged == ["tests/test_gpu.py: 1 passed, 2 failed, 0 error, 0 skipped; 1 of the 2 failures pass alone"]
    report = {"environment": {"device": "cpu", "torch": "-", "cuda": None, "fairseq": "-", "python": "-"},
              "command": "palm-gpu-check", "seconds": 1, "profile": [], "tests": list(rows.values()), "training": []}
    assert "| test_after_it | failed | passes alone: " in markdown(report)


@pytest.mark.slow
def test_quick_cpu_run_writes_the_report_with_pass_rows(tmp_path, small_palm_data):
    """A real harness run: fairseq-train in fp32 and bf16, the profiler, pytest on tests/test_gpu.py (skipped here)."""
    data = small_palm_data
    out = tmp_path / "check"
    result = run_cli(sys.executable, "-m", "palm_tools.experiments.gpu_check", "--out", out, "--data", data, "--device", "cpu",
                     "--quick", "--configs", "unilm_s2s", "--precisions", "fp32,fp32-seed2,bf16", cwd=REPO)
    report = json.loads((out / "gpu_check.json").read_text())
    rows = {(r["config"], r["precision"]): r for r in report["training"]}
    assert set(rows) == {("unilm_s2s", "fp32"), ("unilm_s2s", "fp32-seed2"), ("unilm_s2s", "bf16")}
    # bf16 is judged with the second seed's distance from fp32 beside its own tolerance
    assert rows["unilm_s2s", "bf16"]["fp32_seed_drift"] == rows["unilm_s2s", "fp32-seed2"]["mean_rel_diff"] > 0
    assert rows["unilm_s2s", "fp32-seed2"]["fp32_seed_drift"] is None
    assert all(r["status"] == "PASS" and r["exit"] == 0 for r in rows.values()), rows
    assert rows["unilm_s2s", "bf16"]["max_rel_diff"] < BF16_TOLERANCE
    assert len(rows["unilm_s2s", "fp32"]["points"]) == 5  # 20 updates logged every 4
    for precision in ("fp32", "bf16"):  # the variant runs at fp32's speed: not profiled again
        profile = (out / f"profile_{precision}.txt").read_text()
        assert "aten::mm" in profile and "top 25 by self CPU time" in profile
    assert report["profile"][0]["ms_per_update"] > 0
    # no CUDA here: only the half-precision copy-layer cases on the CPU run
    assert report["tests"] and all(t["outcome"] == ("passed" if t["test"].endswith("-cpu]") else "skipped")
                                   for t in report["tests"])
    assert sum(t["outcome"] == "passed" for t in report["tests"]) == 4
    # the report files at the top, every log below: the top two levels hold no log
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "gpu_check.json", "gpu_check.md", "junit.xml", "logs.tar.gz", "profile_bf16.txt", "profile_fp32.txt"]
    assert not [p for p in (out / "work").iterdir() if p.is_file()]
    assert result.stdout.rstrip().endswith((out / "gpu_check.md").read_text().rstrip().splitlines()[-1])


@pytest.mark.parametrize("argv, folders, message", [
    (["--device", "cuda"], ["chitchat10k", "sotu"], "--device cuda: torch sees no CUDA device here (use --device cpu)"),
    (["--device", "cpu"], ["sotu"], "{data}/bin/chitchat10k: not found; make it with: palm-data --out {data}"),
    (["--device", "cpu"], ["chitchat10k"], "{data}/bin/sotu: not found; make it with: palm-data --out {data}"),
], ids=["no-cuda", "no-chitchat", "no-sotu"])
def test_gpu_check_without_its_device_or_data_stops_before_the_report_folder(tmp_path, capsys, monkeypatch, argv,
                                                                            folders, message):
    import torch

    from palm_tools.experiments import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    data = tmp_path / "data"
    for corpus in folders:
        (data / "bin" / corpus).mkdir(parents=True)
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--out", str(tmp_path / "check"), "--data", str(data), "--parts", "training", "--configs",
                        "palm_ft", "--sizes", "tiny", "--precisions", "fp32", "--run-timeout", "1", *argv])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(" error: " + message.format(data=data))
    assert not (tmp_path / "check").exists()


def test_gpu_check_prints_its_plan_and_bound_before_the_first_run(tmp_path, capsys, monkeypatch):
    """8 runs, 3 at once: 3 rounds of at most --run-timeout 100 s each, 5 minutes."""
    from palm_tools.experiments import gpu_check

    class FirstRun(Exception):
        pass

    def training(args, work, log):
        raise FirstRun(capsys.readouterr().out)

    monkeypatch.setattr(gpu_check, "training", training)
    for corpus in ("chitchat10k", "sotu"):
        (tmp_path / "bin" / corpus).mkdir(parents=True)
    with pytest.raises(FirstRun) as printed:
        gpu_check.main(["--out", str(tmp_path / "check"), "--data", str(tmp_path), "--device", "cpu", "--configs",
                        "palm_ft,unilm_s2s", "--sizes", "tiny,base", "--precisions", "fp32,bf16", "--parts",
                        "training", "--jobs", "3", "--run-timeout", "100"])
    assert str(printed.value).splitlines() == [
        "[    0 s] plan: training; training: 8 fairseq-train runs (palm_ft, unilm_s2s x tiny, base x fp32, bf16; the "
        "size's updates), 3 at once; tests/test_gpu.py: not run; estimate: at most 5 min of training (--run-timeout "
        "100 s a run)"]
