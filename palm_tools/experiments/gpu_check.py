#!/usr/bin/env python
"""Mixed-precision checks of every family on an accelerator (`palm-gpu-check`), one command, one report.

1. Training: each configuration below, tiny and base, in fp32, --fp16 and --bf16 through real fairseq-train processes
   (same seed, data, options; dropout off so the precisions differ only by arithmetic). Per run: every logged loss
   finite; the fp16/bf16 curve against fp32 (|difference| of the mean train_inner loss over the last half of the
   logged intervals, relative to fp32's; the largest single-interval difference is reported too); fp16 only: no overflow skip after update 50, final loss scale at least
   half its value at update 50. ``--sizes`` and ``--precisions`` select; the precisions include two variants run
   beside fp32 (issue 24): ``fp32-seed2`` (a second seed: how far two fp32 runs drift; not judged itself, but when it
   ran, a half-precision run of the same configuration is held to the larger of its tolerance and that drift) and
   ``fp16-scale16`` (``--fp16-init-scale 16``, judged as fp16); and, for issue 38, ``bf16-kernels`` (each family's
   own kernels, ``--attention-impl triton`` or ``--copy-attention-impl triton``, judged against the bf16 run).
2. Numerics: tests/test_gpu.py (copy layer, attention masks, cached decoding, GPU against CPU generation) under
   pytest; pass/fail per test, and each failed test once more in a process of its own (does it pass alone?).
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
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from palm_tools.experiments.gpu_profile import PROFILE_COUNTED, profile_worker, profiling
from palm_tools.experiments.gpu_training import (BF16_TOLERANCE, COMPARED_WITH, CONFIGS, FP16_TOLERANCE,
                                                 PRECISION_FLAGS, SIZES, TOLERANCE, VARIANTS, training)
from palm_tools.arguments import whole_number
from palm_tools.atomic_files import atomic_open
from palm_tools.experiments.logged_run import REPO

PARTS = ["training", "tests", "profile"]


TEST_FILE = "tests/test_gpu.py"
# failed tests run again one process each, at most this many: a CUDA error (an illegal address, say) stays with the
# process that met it and fails every later test there (docs/benchmarks-gpu.md: 15 of 17 tests failed in one process
# in section 11, and passed in processes of their own in section 12)
ALONE_AT_MOST = 20


def _junit_rows(junit):
    rows = []
    for case in ElementTree.parse(junit).iter("testcase"):
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                detail = (element.get("message") or "").splitlines()[0][:200] if element.get("message") else ""
        rows.append({"test": case.get("name"), "outcome": outcome, "detail": detail})
    return rows


def numerics(args, work, log):
    """tests/test_gpu.py under pytest (from the repository, or the working directory when the package is installed
    elsewhere); one row per test from its JUnit XML. Each test that fails runs again alone (:data:`ALONE_AT_MOST`,
    within --tests-timeout), and its row says whether it passes so: a failure that goes away alone was caused by an
    earlier test of the same process."""
    root = next((r for r in (Path.cwd(), REPO) if (r / TEST_FILE).exists()), None)
    if root is None:
        return [{"test": TEST_FILE, "outcome": "not found", "detail": f"looked in {Path.cwd()} and {REPO}"}]
    deadline = time.monotonic() + args.tests_timeout
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))

    def pytest(selection, junit, log_path):
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection, "--junitxml", str(junit)]
        with open(log_path, "w") as output:
            subprocess.run(command, cwd=root, stdout=output, stderr=subprocess.STDOUT, env=env,
                           timeout=max(1.0, deadline - time.monotonic()))

    junit = args.out / "junit.xml"
    log_path = work / "logs" / "pytest-test_gpu.log"
    try:
        pytest([TEST_FILE] + (["-k", args.tests] if args.tests else []), junit, log_path)
    except subprocess.TimeoutExpired:  # the report still comes: the tests' log says how far they got
        log(f"{TEST_FILE}: stopped after --tests-timeout {args.tests_timeout} s")
        return [{"test": TEST_FILE, "outcome": "timeout",
                 "detail": f"stopped after {args.tests_timeout} s (--tests-timeout); how far it got: "
                           f"{log_path.relative_to(args.out)}"}]
    if not junit.exists():
        return [{"test": TEST_FILE, "outcome": "error", "detail": "pytest wrote no report"}]
    rows = _junit_rows(junit)
    failed = [row for row in rows if row["outcome"] in ("failed", "error")]
    for index, row in enumerate(failed[:ALONE_AT_MOST]):
        alone = work / f"alone-{index}.xml"
        try:
            pytest([f"{TEST_FILE}::{row['test']}"], alone, work / "logs" / f"pytest-alone-{index}.log")
            outcome = _junit_rows(alone)[0]["outcome"] if alone.exists() else "error"
        except subprocess.TimeoutExpired:
            outcome = "not run (--tests-timeout reached)"
        row["alone"] = outcome
        if outcome == "passed":
            row["detail"] = ("passes alone: an earlier test in the same process broke it (a CUDA error stays with "
                             "the process); " + row["detail"])
        else:
            row["detail"] = f"alone: {outcome}; " + row["detail"]
    log(f"{TEST_FILE}: " + ", ".join(f"{sum(r['outcome'] == o for r in rows)} {o}"
                                      for o in ("passed", "failed", "error", "skipped"))
        + (f"; {sum(r.get('alone') == 'passed' for r in failed)} of the {len(failed)} failures pass alone"
           if failed else ""))
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
                         (" |" if row["exit"] == 0 else f" | (exit {row['exit']})"))
        lines.append("")
    lines += ["## Numerics: tests/test_gpu.py", "", "| test | outcome | detail |", "|---|---|---|"]
    lines += [f"| {r['test']} | {r['outcome']} | {r['detail']} |" for r in report["tests"]]
    lines += ["", f"## Training: fairseq-train, curves against fp32 (mean loss over the last half of the logged intervals; tolerance fp16 "
                  f"{FP16_TOLERANCE:.0%}, bf16 {BF16_TOLERANCE:.0%}; a second fp32 seed's distance when larger)",
              "",
              "| config | size | precision | against | updates | final loss | mean rel diff | max rel diff | "
              "overflows (after 50) | loss scale 50 -> end | s | result |",
              "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in report["training"]:
        scale = (f"{_number(r.get('loss_scale_50'), 'g')} -> {_number(r.get('loss_scale_end'), 'g')}"
                 if r["precision"].startswith("fp16") else "")
        late = f" ({r['overflows_after_50']})" if "overflows_after_50" in r else ""
        verdict = r["status"] + (": " + "; ".join(r["reasons"]) if r["reasons"] else "")
        lines.append(f"| {r['config']} | {r['size']} | {r['precision']} | {r.get('against') or ''} | {r['updates']} | "
                     f"{_number(r['final_loss'], '.3f')} | {_number(r.get('mean_rel_diff'), '.2%')} | "
                     f"{_number(r['max_rel_diff'], '.2%')} | "
                     f"{r['overflows']}{late} | {scale} | {r['seconds']:.0f} | {verdict} |")
    passed = sum(r["status"] == "PASS" for r in report["training"])
    lines += ["", f"{passed} of {len(report['training'])} training rows PASS; tests: "
              + ", ".join(f"{sum(t['outcome'] == o for t in report['tests'])} {o}"
                          for o in ("passed", "failed", "error", "skipped", "timeout")
                          if o != "timeout" or any(t["outcome"] == o for t in report["tests"]))]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    import torch

    parser = argparse.ArgumentParser(prog="palm-gpu-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="report folder (created)")
    parser.add_argument("--data", type=Path, default=Path("data"),
                        help="palm-data output folder: bin/chitchat10k and bin/sotu are read")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--jobs", type=whole_number(1),
                        help="fairseq-train processes at once (default: 6 on cuda, 2 on cpu)")
    parser.add_argument("--quick", action="store_true", help="tiny models, a few updates (the harness's own test)")
    # comma-separated lists; a repeated option adds to the list
    parser.add_argument("--configs", action="append", help="comma-separated, of: " + ", ".join(CONFIGS))
    parser.add_argument("--parts", action="append", help="comma-separated, of: " + ", ".join(PARTS))
    parser.add_argument("--sizes", action="append", help="comma-separated, of: " + ", ".join(SIZES))
    parser.add_argument("--precisions", action="append",
                        help="comma-separated, of: " + ", ".join(list(PRECISION_FLAGS) + list(VARIANTS))
                        + " (default: fp32, fp16 and bf16 on cuda; fp32 and bf16 on the CPU, where fairseq has no "
                        "fp16, whose runs are left out)")
    parser.add_argument("--run-timeout", type=whole_number(1), default=400,
                        help="seconds before one process is stopped")
    parser.add_argument("--updates", type=whole_number(1),
                        help="updates of every training run (default: the size's, " + ", ".join(
                            f"{size} {updates}" for size, (_, updates, _) in SIZES.items()) + "; --quick keeps its few)")
    parser.add_argument("--tests-timeout", type=whole_number(1), default=600,
                        help="seconds before tests/test_gpu.py is stopped (the report keeps the other parts)")
    parser.add_argument("--tests", metavar="EXPRESSION",
                        help="run only the tests of tests/test_gpu.py that pytest's -k EXPRESSION selects")
    parser.add_argument("--plan-only", action="store_true",
                        help="print what the command would run and its estimate, and stop (no device or data needed)")
    args = parser.parse_args(argv)
    for name, default in (("configs", list(CONFIGS)), ("parts", PARTS), ("sizes", list(SIZES)), ("precisions", [])):
        given = getattr(args, name)
        setattr(args, name, [entry for value in given for entry in value.split(",")] if given else list(default))
    precisions = args.precisions
    unknown = [c for c in args.configs if c not in CONFIGS] + [s for s in args.sizes if s not in SIZES] + [
        p for p in precisions if p not in PRECISION_FLAGS and p not in VARIANTS] + [
        p for p in args.parts if p not in PARTS]
    if unknown:
        choices = {"--configs": CONFIGS, "--sizes": SIZES, "--precisions": list(PRECISION_FLAGS) + list(VARIANTS),
                   "--parts": PARTS}
        parser.error(f"unknown --configs/--sizes/--precisions/--parts entry {unknown[0]!r}; the choices: " +
                     "; ".join(f"{option} {', '.join(values)}" for option, values in choices.items()))
    for variant, reference in COMPARED_WITH.items():
        if variant in precisions and reference not in precisions:
            parser.error(f"--precisions {variant} is judged against {reference}: add {reference} to --precisions")
    if args.device == "cuda" and not torch.cuda.is_available() and not args.plan_only:
        parser.error("--device cuda: torch sees no CUDA device here (use --device cpu)")
    args.jobs = args.jobs or (6 if args.device == "cuda" else 2)
    # fairseq trains in fp16 only on an accelerator
    half = args.device == "cuda" and not args.quick
    args.precisions = [p for p in precisions or ["fp32", "fp16", "bf16"] if half or not p.startswith("fp16")]
    for corpus in ("chitchat10k", "sotu"):
        if not (args.data / "bin" / corpus).is_dir() and not args.plan_only:
            parser.error(f"{args.data / 'bin' / corpus}: not found; make it with: palm-data --out {args.data}")
    args.data = args.data.resolve()
    return args


def plan(args) -> str:
    """What the command runs and its bound in time, printed before anything runs."""
    runs = len(args.configs) * (1 if args.quick else len(args.sizes)) * len(args.precisions) * (
        "training" in args.parts)
    updates = f"{args.updates} updates each" if args.updates and not args.quick else "the size's updates"
    tests = f"pytest -k {args.tests!r}" if args.tests else "every test"
    return (f"{', '.join(args.parts)}; training: {runs} fairseq-train runs ({', '.join(args.configs)} x "
            f"{'tiny (--quick)' if args.quick else ', '.join(args.sizes)} x {', '.join(args.precisions)}; "
            f"{updates}), {args.jobs} at once; tests/test_gpu.py: {tests if 'tests' in args.parts else 'not run'}; "
            f"estimate: at most {-(-runs // args.jobs) * args.run_timeout / 60:.0f} min of training (--run-timeout "
            f"{args.run_timeout} s a run)" + "".join(f", plus the {part}" for part in ("tests", "profile")
                                                      if part in args.parts))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--profile-worker"]:
        return profile_worker(argv[1:])
    args = parse_args(argv)
    started = time.time()

    def log(message):
        print(f"[{time.time() - started:5.0f} s] {message}", flush=True)

    log("plan: " + plan(args))
    if args.plan_only:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"  # logs two levels down: the top levels hold only the report files
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
    text = markdown(report)
    for name, content in (("gpu_check.json", json.dumps(report, indent=1)), ("gpu_check.md", text)):
        with atomic_open(args.out / name) as output:
            output.write(content)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
