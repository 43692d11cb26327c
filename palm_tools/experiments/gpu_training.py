"""palm-gpu-check's training check: each configuration in fp32, fp16 and bf16 through real fairseq-train processes
(palm-experiments' commands), the logs read back, each half-precision curve judged against fp32's (tolerances in
palm_tools/experiments/gpu_check.py's docstring)."""
import concurrent.futures
import dataclasses
import json
import math
import re
from pathlib import Path

from palm_tools.experiments.logged_run import run_logged
from palm_tools.experiments.plan import Plan
from palm_tools.experiments.rows import GEN, Row
from palm_tools.experiments.scale import PRESETS, Scale


FP16_TOLERANCE = 0.02
BF16_TOLERANCE = 0.03
TOLERANCE = {"fp16": FP16_TOLERANCE, "bf16": BF16_TOLERANCE}
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}
# issue 24 (PALM base in fp16 ended 3.05% above fp32): a precision run again with other flags, judged against the
# fp32 run: fp32 with a second seed (how far two fp32 runs drift apart: not judged itself, it widens the half
# precisions' tolerance when larger) and fp16 from a loss scale of 16 (without the early overflow skips); the flags
# go last, so they override the command's own
VARIANTS = {"fp32-seed2": ("fp32", ["--seed", "2"]), "fp16-scale16": ("fp16", ["--fp16-init-scale", "16"]),
            "bf16-kernels": ("bf16", "kernels")}
# issue 38: bf16-kernels trains with each family's own kernels (the Triton attention for the UniLM family, since
# session 22, FlexAttention before; the Triton copy layer for PALM) and is judged against the bf16 run of today's
# path: same precision, seed and data, so the curves differ only by the kernels' order of arithmetic (every check run
# has dropout off, as the attention kernels need)
KERNEL_FLAGS = {"palm": ["--copy-attention-impl", "triton"], "unilm": ["--attention-impl", "triton"],
                "unilm2": ["--attention-impl", "triton"]}
# every other run names today's path, which PALM's default no longer is on CUDA (auto takes triton there)
REFERENCE_FLAGS = {"palm": ["--copy-attention-impl", "blocked"], "unilm": ["--attention-impl", "sdpa"],
                   "unilm2": ["--attention-impl", "sdpa"]}
COMPARED_WITH = {"bf16-kernels": "bf16"}  # the precision a variant's curve is judged against (otherwise fp32)
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
    precision, variant_flags = VARIANTS.get(precision, (precision, []))
    family = config.split("_")[0]
    variant_flags = KERNEL_FLAGS[family] if variant_flags == "kernels" else REFERENCE_FLAGS[family] + variant_flags
    return [str(a) for a in args] + PRECISION_FLAGS[precision] + [
        "--max-update", str(updates), "--warmup-updates", str(warmup), "--lr", str(lr), "--log-format", "json", "--log-interval", str(log_interval),
        "--dropout", "0", "--attention-dropout", "0", "--no-save", "--seed", "1"] + variant_flags


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


def judge(run, reference, drift=None):
    """PASS/FAIL of one run, with the measured values; ``reference`` is the run of the same configuration its curve
    is compared with (fp32's, or the precision of :data:`COMPARED_WITH`).

    ``drift``: how far a second fp32 seed's curve is from ``reference`` (its mean relative difference), when one ran.
    A half-precision curve is held to the larger of its tolerance and that: it cannot be asked to follow fp32 more
    closely than fp32 follows itself (PALM base: 3.3% between two seeds in 150 updates, docs/benchmarks-gpu.md)."""
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
    precision = VARIANTS.get(run["precision"], (run["precision"],))[0]
    tolerance = TOLERANCE.get(precision)
    if tolerance is not None and drift is not None and drift > tolerance:
        tolerance = drift
    result = {"max_rel_diff": None, "mean_rel_diff": None, "tolerance": tolerance, "fp32_seed_drift": drift,
              "overflows": len(run["overflows"])}
    if run["precision"] != "fp32":
        ours = {p["update"]: p["loss"] for p in points}
        theirs = {p["update"]: p["loss"] for p in (reference or {}).get("points", [])}
        common = sorted(set(ours) & set(theirs))
        compared = common[len(common) // 2:]
        against = (reference or {}).get("precision", "fp32")
        if not compared:
            reasons.append(f"no {against} curve to compare with")
        else:
            result["max_rel_diff"] = max(abs(ours[u] - theirs[u]) / abs(theirs[u]) for u in compared)
            # The verdict compares the mean over the last half: a single interval's spike (seen at base size in
            # every precision, one precision a few updates before another) says nothing about the precision.
            mean_ours, mean_theirs = (sum(c[u] for u in compared) / len(compared) for c in (ours, theirs))
            diff = result["mean_rel_diff"] = abs(mean_ours - mean_theirs) / abs(mean_theirs)
            if result["tolerance"] is not None and not diff <= result["tolerance"]:  # NaN fails too
                held = f"; a second fp32 seed: {drift:.1%}" if drift is not None else ""
                reasons.append(f"mean loss {diff:.1%} from {against} (tolerance {TOLERANCE[precision]:.0%}{held})")
    if precision == "fp16":
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


def fp32_seed_drift(second, reference):
    """How far the second fp32 seed's curve is from the first (mean relative difference over the last half), or None
    when that run failed, stopped early or diverged: such a run measures nothing."""
    verdict = judge(second, reference)
    return verdict["mean_rel_diff"] if verdict["status"] == "PASS" else None


# ------------------------------------------------------------------------------------------------ training
def training(args, work, log):
    sizes = {"tiny": QUICK_SIZE} if args.quick else {size: SIZES[size] for size in args.sizes}
    if args.updates and not args.quick:
        sizes = {size: (scale, args.updates, lr) for size, (scale, _, lr) in sizes.items()}
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

    def same(run, precision):
        return next((r for r in runs if (r["config"], r["size"], r["precision"]) == (run["config"], run["size"],
                                                                                       precision)), None)

    # one drift per configuration and size, for its half-precision runs
    drifts = {(run["config"], run["size"]): fp32_seed_drift(run, same(run, "fp32"))
              for run in runs if run["precision"] == "fp32-seed2" and same(run, "fp32")}
    rows = []
    for run in runs:
        reference = same(run, COMPARED_WITH.get(run["precision"], "fp32"))
        drift = None if run["precision"] in ("fp32", "fp32-seed2") else drifts.get((run["config"], run["size"]))
        row = {k: run[k] for k in ("name", "config", "size", "precision", "updates", "status", "seconds", "points",
                                   "overflows")}
        row["exit"] = row.pop("status")
        row["log"] = str(run["log"].relative_to(work.parent))
        row["final_loss"] = run["points"][-1]["loss"] if run["points"] else None
        row["against"] = reference["precision"] if reference and run["precision"] != "fp32" else None
        row.update(judge(run, reference, drift))
        rows.append(row)
    return rows
