#!/usr/bin/env python
"""Mixed-precision checks of every family on an accelerator (`palm-gpu-check`), one command, one report.

1. Training: each configuration below, tiny and base, in fp32, --fp16 and --bf16 through real fairseq-train processes
   (same seed, data, options; dropout off so the precisions differ only by arithmetic). Per run: every logged loss
   finite; the fp16/bf16 curve against fp32 (|difference| of the mean train_inner loss over the last half of the
   logged intervals, relative to fp32's; the largest single-interval difference is reported too); fp16 only: no overflow skip after update 50, final loss scale at least
   half its value at update 50.
2. Numerics: tests/test_gpu.py (copy layer, attention masks, cached decoding, GPU against CPU generation) under
   pytest; pass/fail per test.
3. Profile: unilm_seq2seq tiny in each precision, a few updates under torch.profiler: key_averages tables in
   DIR/profile_<precision>.txt, time per update and host-device synchronisations per update; on CUDA the half
   precisions once more with cuDNN's attention backend off (the suspect of unilm_seq2seq's --fp16 slowdown: fp32
   never uses it, and a cuDNN attention graph is built for every new batch shape, which unilm_seq2seq's
   variable-length batches keep producing while pmlm's fixed-length blocks do not).

Writes DIR/gpu_check.json, DIR/gpu_check.md (printed last), DIR/logs.tar.gz (every run's log; the logs themselves
lie under DIR/work/, out of DIR's top two levels). A failure of one run does not stop the others.

Tolerances of the curve comparison: relative differences of the interval-averaged loss, FP16_TOLERANCE (fp16: 10-bit
mantissa) and BF16_TOLERANCE (bf16: 7-bit mantissa, activations rounded ~8x more coarsely than fp16); both runs keep
fp32 master weights and fp32 losses (fairseq's FP16Optimizer, the criteria's float log_softmax), so the curves may
drift apart only through rounding of activations and gradients, which over a few hundred updates stays within a few
percent of the loss of a healthy run, while a broken mixed-precision path (saturated masks, a loss computed in half,
skipped updates) moves it by far more.

--device cpu --quick: tiny models, a few updates, fp32 and bf16 (fairseq has no --fp16 on a CPU): the harness's own
test (tests/test_gpu_check.py).
"""
import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import platform
import re
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from palm_tools.experiments.cli import GEN, PRESETS, Plan, Row, Scale
from palm_tools.experiments.logged_run import REPO, run_logged


FP16_TOLERANCE = 0.02
BF16_TOLERANCE = 0.03
TOLERANCE = {"fp16": FP16_TOLERANCE, "bf16": BF16_TOLERANCE}
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}
STABLE_FROM = 50  # fp16: no overflow skip after this update, loss scale at the end >= half its value here
LOG_INTERVAL = 10

# configuration -> how experiments.py builds its fairseq-train command: ("pretrain", key of PRETRAININGS, command
# index) or ("finetune", model family)
CONFIGS = {
    "palm_ft": ("finetune", "palm"),
    "palm_ae": ("pretrain", "palm", 0),
    "palm_joint": ("pretrain", "palm", 1),
    "unilm_pre": ("pretrain", "unilm_mix", 0),
    "unilm_s2s": ("finetune", "unilm"),
    "unilm2_pmlm": ("pretrain", "pmlm_ae_par", 0),
    "unilm2_s2s": ("finetune", "unilm2"),
}
PROFILED = "unilm_s2s"

# sizes: scale, pre-training and fine-tuning updates, lr; base = palm_base (12 + 12) / unilm_base (12) shapes
SIZES = {
    "tiny": (Scale(blocks=16, finetune_pairs=32), 300, 1e-3),
    "base": (Scale(dim=768, ffn=3072, heads=12, unilm_layers=12, palm_layers=12, blocks=16, finetune_pairs=32),
             150, 2e-4),
}
QUICK_SIZE = (dataclasses.replace(PRESETS["quick"], tokens_per_sample=64, blocks=8, finetune_pairs=8), 20, 1e-3)
QUICK_LOG_INTERVAL = 4


# ------------------------------------------------------------------------------------------------ the commands
def train_command(config, scale, updates, lr, data, precision, device, log_interval, work):
    """fairseq-train arguments of one run: experiments.py's command for the configuration, then overrides (fairseq's
    parser keeps an option's last value): precision, updates, logging, no dropout, no checkpoints."""
    kind, key, *index = CONFIGS[config]
    warmup = min(50, updates // 4)
    scale = dataclasses.replace(scale, data=str(data), device="cpu", warmup_updates=warmup, pretrain_updates=updates,
                                finetune_updates=updates)
    plan = Plan(scale, work, experiments=())  # its save folders: under WORK/runs (nothing is saved)
    if kind == "pretrain":
        args = list(plan.runs[plan.pretrain_run(key, 1)].commands[index[0]][1])
        if "--finetune-from-model" in args:  # stage joint from scratch: the check needs no stage-ae checkpoint
            at = args.index("--finetune-from-model")
            del args[at: at + 2]
    else:
        args = list(plan.runs[plan.finetune_run(Row(config, config, key, None), GEN, 1)].commands[0][1])
        args[0] = Path(data) / "bin" / "chitchat10k"  # the pairs as palm-data binarized them
    if device != "cpu":
        args.remove("--cpu")
    return [str(a) for a in args] + PRECISION_FLAGS[precision] + [
        "--max-update", str(updates), "--warmup-updates", str(warmup), "--lr", str(lr), "--log-format", "json", "--log-interval", str(log_interval),
        "--dropout", "0", "--attention-dropout", "0", "--no-save", "--seed", "1"]


def run_tool(command, log, timeout):
    """Run ``command`` with two threads, its output in a new ``log``; returns (exit status, seconds); a timeout is
    status 124."""
    Path(log).unlink(missing_ok=True)
    status, seconds, _ = run_logged(command, log, threads=2, timeout=timeout)
    return status, seconds


# ------------------------------------------------------------------------------------------------ reading logs
TRAIN_INNER = re.compile(r"\| train_inner \| (\{.*\})\s*$")
OVERFLOW = re.compile(r"gradient overflow detected, ignoring gradient, setting loss scale to: ([-0-9.e+inf]+)")


def read_log(text):
    """train_inner points (update, loss, loss_scale) and overflow skips (update last logged before it, new scale)."""
    points, overflows, last_update = [], [], 0
    for line in text.splitlines():
        match = TRAIN_INNER.search(line)
        if match:
            record = json.loads(match.group(1))
            last_update = int(record["num_updates"])
            scale = record.get("loss_scale")
            points.append({"update": last_update, "loss": float(record["loss"]),
                           "loss_scale": float(scale) if scale is not None else None})
            continue
        match = OVERFLOW.search(line)
        if match:
            overflows.append({"after_update": last_update, "loss_scale": float(match.group(1))})
    return points, overflows


def judge(run, reference):
    """PASS/FAIL of one run, with the measured values; ``reference`` is the fp32 run of the same configuration."""
    points = run["points"]
    reasons = []
    if run["status"] != 0:
        reasons.append(f"exit {run['status']}: {run['last_line']}")
    if not points:
        reasons.append("no train_inner line logged")
    elif points[-1]["update"] < run["updates"]:
        reasons.append(f"stopped at update {points[-1]['update']} of {run['updates']}")
    if any(not math.isfinite(p["loss"]) for p in points):
        reasons.append("non-finite loss")
    result = {"max_rel_diff": None, "mean_rel_diff": None, "tolerance": TOLERANCE.get(run["precision"]), "overflows": len(run["overflows"])}
    if run["precision"] != "fp32":
        ours = {p["update"]: p["loss"] for p in points}
        theirs = {p["update"]: p["loss"] for p in (reference or {}).get("points", [])}
        common = sorted(set(ours) & set(theirs))
        compared = common[len(common) // 2:]
        if not compared:
            reasons.append("no fp32 curve to compare with")
        else:
            result["max_rel_diff"] = max(abs(ours[u] - theirs[u]) / abs(theirs[u]) for u in compared)
            # The verdict compares the mean over the last half: a single interval's spike (seen at base size in
            # every precision, one precision a few updates before another) says nothing about the precision.
            mean_ours, mean_theirs = (sum(c[u] for u in compared) / len(compared) for c in (ours, theirs))
            diff = result["mean_rel_diff"] = abs(mean_ours - mean_theirs) / abs(mean_theirs)
            if not diff <= result["tolerance"]:  # NaN fails too
                reasons.append(f"mean loss {diff:.1%} from fp32 (tolerance {result['tolerance']:.0%})")
    if run["precision"] == "fp16":
        late = [o for o in run["overflows"] if o["after_update"] >= STABLE_FROM]
        result["overflows_after_50"] = len(late)
        if late:
            reasons.append(f"{len(late)} overflow skips after update {STABLE_FROM}")
        scales = {p["update"]: p["loss_scale"] for p in points if p["loss_scale"] is not None}
        at_50 = scales.get(STABLE_FROM) or next((s for u, s in sorted(scales.items()) if u >= STABLE_FROM), None)
        result["loss_scale_50"], result["loss_scale_end"] = at_50, points[-1]["loss_scale"] if points else None
        if at_50 is None or result["loss_scale_end"] is None:
            reasons.append("no loss scale logged at and after update 50")
        elif result["loss_scale_end"] < at_50 / 2:
            reasons.append(f"loss scale fell from {at_50:g} (update 50) to {result['loss_scale_end']:g}")
    result["status"] = "FAIL" if reasons else "PASS"
    result["reasons"] = reasons
    return result


# ------------------------------------------------------------------------------------------------ training
def training(args, work, log):
    sizes = {"tiny": QUICK_SIZE} if args.quick else SIZES
    interval = QUICK_LOG_INTERVAL if args.quick else LOG_INTERVAL
    runs = []
    for size, (scale, updates, lr) in sizes.items():
        for config in args.configs:
            for precision in args.precisions:
                name = f"{config}-{size}-{precision}"
                runs.append({"name": name, "config": config, "size": size, "precision": precision, "updates": updates,
                             "log": work / "logs" / f"{name}.log",
                             "command": ["fairseq-train"] + train_command(
                                 config, scale, updates, lr, args.data, precision, args.device, interval, work)})
    (work / "logs").mkdir(parents=True, exist_ok=True)

    def execute(run):
        run["status"], run["seconds"] = run_tool(run["command"], run["log"], args.run_timeout)
        text = run["log"].read_text(errors="replace")
        run["points"], run["overflows"] = read_log(text)
        lines = [line for line in text.splitlines() if line.strip()]
        run["last_line"] = lines[-1][:300] if lines else ""
        return run

    # the base runs first: the longest, they should not be the last ones waiting
    order = sorted(runs, key=lambda r: (r["size"] != "base", r["precision"] == "fp32"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for run in pool.map(execute, order):
            log(f"{run['name']}: exit {run['status']}, {run['seconds']:.0f} s, {len(run['points'])} points")
    rows = []
    for run in runs:
        reference = next(r for r in runs if r["config"] == run["config"] and r["size"] == run["size"]
                         and r["precision"] == "fp32") if "fp32" in args.precisions else None
        row = {k: run[k] for k in ("name", "config", "size", "precision", "updates", "status", "seconds", "points",
                                   "overflows")}
        row["exit"] = row.pop("status")
        row["log"] = str(run["log"].relative_to(work.parent))
        row["final_loss"] = run["points"][-1]["loss"] if run["points"] else None
        row.update(judge(run, reference))
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ profile
PROFILE_COUNTED = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "aten::item", "aten::_local_scalar_dense",
                   "cudaMemcpyAsync", "aten::to", "aten::copy_")


def profile_worker(argv):
    """Run fairseq-train in this process with its train_step wrapped: steps SKIP+1 .. SKIP+STEPS are profiled (CPU and
    CUDA), steps 3 .. SKIP timed without the profiler; writes a JSON summary and the tables."""
    out, skip, steps, cudnn_sdpa, fairseq_args = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3], argv[4:]
    import torch
    from torch.profiler import ProfilerActivity, profile

    if cudnn_sdpa == "off":  # the A/B of the suspected cause: cuDNN attention graphs built per new batch shape
        torch.backends.cuda.enable_cudnn_sdp(False)

    from fairseq import trainer as trainer_module
    from fairseq_cli import train as train_cli

    cuda = torch.cuda.is_available() and "--cpu" not in fairseq_args
    original = trainer_module.Trainer.train_step
    state = {"calls": 0, "outside": 0.0, "returned": None, "summary": {}}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def train_step(self, samples, raise_oom=False):
        state["calls"] += 1
        calls = state["calls"]
        if state["returned"] is not None and calls > 3:
            state["outside"] += time.perf_counter() - state["returned"]  # data loading, logging: between steps
        if calls == 3:
            sync()
            state["timed_from"] = time.perf_counter()
        if calls == skip + 1:
            sync()
            state["unprofiled"] = (time.perf_counter() - state["timed_from"]) / (skip - 2)
            state["outside_per_step"] = state["outside"] / (skip - 3) if skip > 3 else 0.0
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            state["profiler"] = profile(activities=activities)
            state["profiler"].__enter__()
            state["profiled_from"] = time.perf_counter()
        result = original(self, samples, raise_oom)
        if calls == skip + steps:
            sync()
            profiled = (time.perf_counter() - state["profiled_from"]) / steps
            state["profiler"].__exit__(None, None, None)
            write_profile(state["profiler"], out, steps, cuda, {
                "ms_per_update": state["unprofiled"] * 1000, "ms_between_updates": state["outside_per_step"] * 1000,
                "ms_per_update_profiled": profiled * 1000})
        state["returned"] = time.perf_counter()
        return result

    trainer_module.Trainer.train_step = train_step
    sys.argv = ["fairseq-train", *fairseq_args]
    train_cli.cli_main()


def write_profile(profiler, out, steps, cuda, timings):
    averages = profiler.key_averages()
    tables = []
    if cuda:
        for key in ("self_device_time_total", "self_cuda_time_total"):  # the name differs between torch versions
            try:
                tables.append(("top 25 by self CUDA time", averages.table(sort_by=key, row_limit=25)))
                break
            except (KeyError, AttributeError, ValueError):
                continue
    tables.append(("top 25 by CPU time (total)", averages.table(sort_by="cpu_time_total", row_limit=25)))
    tables.append(("top 25 by self CPU time", averages.table(sort_by="self_cpu_time_total", row_limit=25)))
    counts = {name: 0 for name in PROFILE_COUNTED}
    for event in averages:
        if event.key in counts:
            counts[event.key] += event.count
    summary = dict(timings, steps=steps, calls_per_update={k: round(v / steps, 2) for k, v in counts.items()})
    text = [f"{steps} training updates profiled; {json.dumps(summary)}"]
    for title, table in tables:
        text += ["", f"== {title}", table]
    out.with_suffix(".txt").write_text("\n".join(text) + "\n")
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))


def profiling(args, work, log):
    scale, updates, lr = QUICK_SIZE if args.quick else SIZES["tiny"]
    skip, steps = (4, 3) if args.quick else (20, 10)
    # half precision on CUDA again without cuDNN's attention (fp32 never uses it): the suspect of the fp16 slowdown
    variants = [(p, "on") for p in args.precisions] + [
        (p, "off") for p in args.precisions if p != "fp32" and args.device == "cuda"]
    results = []
    for precision, cudnn_sdpa in variants:
        name = precision if cudnn_sdpa == "on" else f"{precision}-no-cudnn-sdpa"
        out = work / "profile" / f"profile_{name}"
        out.parent.mkdir(parents=True, exist_ok=True)
        fairseq_args = train_command(PROFILED, scale, skip + steps, lr, args.data, precision, args.device,
                                     LOG_INTERVAL, work)
        command = [sys.executable, "-m", "palm_tools.experiments.gpu_check", "--profile-worker", str(out), str(skip), str(steps),
                   cudnn_sdpa, *fairseq_args]
        status, seconds = run_tool(command, work / "logs" / f"profile-{name}.log", args.run_timeout)
        row = {"precision": name, "exit": status, "seconds": round(seconds, 1)}
        if out.with_suffix(".json").exists():
            row.update(json.loads(out.with_suffix(".json").read_text()))
            if cudnn_sdpa == "on":  # the top level holds the three tables the lead brings back
                (args.out / f"profile_{name}.txt").write_text(out.with_suffix(".txt").read_text())
        log(f"profile {name}: exit {status}, {row.get('ms_per_update', float('nan')):.1f} ms/update")
        results.append(row)
    return results


# ------------------------------------------------------------------------------------------------ numerics tests
def numerics(args, work, log):
    """tests/test_gpu.py under pytest (from the repository, or the working directory when the package is installed
    elsewhere); one row per test from its JUnit XML."""
    root = next((r for r in (Path.cwd(), REPO) if (r / "tests" / "test_gpu.py").exists()), None)
    if root is None:
        return [{"test": "tests/test_gpu.py", "outcome": "not found", "detail": f"looked in {Path.cwd()} and {REPO}"}]
    junit = args.out / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py", "--junitxml",
               str(junit)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    with open(work / "logs" / "pytest-test_gpu.log", "w") as output:
        subprocess.run(command, cwd=root, stdout=output, stderr=subprocess.STDOUT, env=env,
                       timeout=args.run_timeout)
    if not junit.exists():
        return [{"test": "tests/test_gpu.py", "outcome": "error", "detail": "pytest wrote no report"}]
    rows = []
    for case in ElementTree.parse(junit).iter("testcase"):
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                detail = (element.get("message") or "").splitlines()[0][:200] if element.get("message") else ""
        rows.append({"test": case.get("name"), "outcome": outcome, "detail": detail})
    log(f"tests/test_gpu.py: " + ", ".join(f"{sum(r['outcome'] == o for r in rows)} {o}"
                                             for o in ("passed", "failed", "error", "skipped")))
    return rows


# ------------------------------------------------------------------------------------------------ report
def environment(device):
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "device": device,
            "cuda": torch.version.cuda, "machine": platform.node()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        from importlib.metadata import version

        info["fairseq"] = version("fairseq-fixed")
    except Exception:  # another distribution name: the import still works
        import fairseq

        info["fairseq"] = getattr(fairseq, "__version__", "?")
    return info


def _number(value, spec):
    return "" if value is None else format(value, spec)


def markdown(report):
    env = report["environment"]
    lines = [f"# palm-gpu-check: {env.get('gpu', env['device'])}", "",
             f"torch {env['torch']} (CUDA {env['cuda']}), fairseq {env['fairseq']}, Python {env['python']}; "
             f"`{report['command']}`; {report['seconds'] / 60:.1f} min.", ""]
    if report["profile"]:
        lines += ["## Profile: unilm_seq2seq tiny, per training update", "",
                  "| precision | ms/update | ms between updates | " + " | ".join(PROFILE_COUNTED) + " |",
                  "|---|---:|---:|" + "---:|" * len(PROFILE_COUNTED)]
        for row in report["profile"]:
            calls = row.get("calls_per_update", {})
            lines.append(f"| {row['precision']} | {_number(row.get('ms_per_update'), '.1f')} | "
                         f"{_number(row.get('ms_between_updates'), '.1f')} | " +
                         " | ".join(str(calls.get(k, "")) for k in PROFILE_COUNTED) +
                         (f" |" if row["exit"] == 0 else f" | (exit {row['exit']})"))
        lines.append("")
    lines += ["## Numerics: tests/test_gpu.py", "", "| test | outcome | detail |", "|---|---|---|"]
    lines += [f"| {r['test']} | {r['outcome']} | {r['detail']} |" for r in report["tests"]]
    lines += ["", f"## Training: fairseq-train, curves against fp32 (mean loss over the last half of the logged intervals; tolerance fp16 "
                  f"{FP16_TOLERANCE:.0%}, bf16 {BF16_TOLERANCE:.0%})", "",
              "| config | size | precision | updates | final loss | mean rel diff | max rel diff | overflows (after 50) | "
              "loss scale 50 -> end | s | result |",
              "|---|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in report["training"]:
        scale = (f"{_number(r.get('loss_scale_50'), 'g')} -> {_number(r.get('loss_scale_end'), 'g')}"
                 if r["precision"] == "fp16" else "")
        late = f" ({r['overflows_after_50']})" if "overflows_after_50" in r else ""
        verdict = r["status"] + (": " + "; ".join(r["reasons"]) if r["reasons"] else "")
        lines.append(f"| {r['config']} | {r['size']} | {r['precision']} | {r['updates']} | "
                     f"{_number(r['final_loss'], '.3f')} | {_number(r.get('mean_rel_diff'), '.2%')} | "
                     f"{_number(r['max_rel_diff'], '.2%')} | "
                     f"{r['overflows']}{late} | {scale} | {r['seconds']:.0f} | {verdict} |")
    passed = sum(r["status"] == "PASS" for r in report["training"])
    lines += ["", f"{passed} of {len(report['training'])} training rows PASS; tests: "
              + ", ".join(f"{sum(t['outcome'] == o for t in report['tests'])} {o}"
                          for o in ("passed", "failed", "error", "skipped"))]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="report folder (created)")
    parser.add_argument("--data", type=Path, default=Path("data"),
                        help="palm-data output folder: bin/chitchat10k and bin/sotu are read")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--jobs", type=int, help="fairseq-train processes at once (default: 6 on cuda, 2 on cpu)")
    parser.add_argument("--quick", action="store_true", help="tiny models, a few updates (the harness's own test)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    parser.add_argument("--parts", default="training,tests,profile", help="comma-separated, of: training, tests, "
                                                                           "profile")
    parser.add_argument("--run-timeout", type=int, default=400, help="seconds before one process is stopped")
    args = parser.parse_args(argv)
    args.configs = args.configs.split(",")
    unknown = [c for c in args.configs if c not in CONFIGS] + [
        p for p in args.parts.split(",") if p not in ("training", "tests", "profile")]
    if unknown:
        parser.error(f"unknown --configs/--parts entry {unknown[0]!r}")
    args.parts = args.parts.split(",")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here (use --device cpu)")
    args.jobs = args.jobs or (6 if args.device == "cuda" else 2)
    # fairseq trains in fp16 only on an accelerator
    args.precisions = ["fp32", "fp16", "bf16"] if args.device == "cuda" and not args.quick else ["fp32", "bf16"]
    for corpus in ("chitchat10k", "sotu"):
        if not (args.data / "bin" / corpus).is_dir():
            parser.error(f"{args.data / 'bin' / corpus}: not found; make it with: palm-data --out {args.data}")
    args.data = args.data.resolve()
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--profile-worker"]:
        return profile_worker(argv[1:])
    args = parse_args(argv)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"  # logs two levels down: the top levels hold only the report files

    def log(message):
        print(f"[{time.time() - started:5.0f} s] {message}", flush=True)

    (work / "logs").mkdir(parents=True, exist_ok=True)
    report = {"command": "palm-gpu-check " + " ".join(argv), "environment": environment(args.device),
              "tolerance": TOLERANCE, "training": [], "tests": [], "profile": []}
    if "training" in args.parts:
        report["training"] = training(args, work, log)
    if "profile" in args.parts:
        report["profile"] = profiling(args, work, log)
    if "tests" in args.parts:
        report["tests"] = numerics(args, work, log)
    report["seconds"] = time.time() - started
    with tarfile.open(args.out / "logs.tar.gz", "w:gz") as archive:
        archive.add(work, arcname="work")
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (args.out / "gpu_check.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
