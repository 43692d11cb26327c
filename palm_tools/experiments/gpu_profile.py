"""palm-gpu-check's profile: a few training updates of one configuration under torch.profiler, in a fairseq-train
run inside this process (``palm-gpu-check --profile-worker``), per precision; tables and a summary per update."""
import json
import sys
import time
from pathlib import Path

from palm_tools.experiments.gpu_training import (LOG_INTERVAL, PRECISION_FLAGS, PROFILED, QUICK_SIZE, SIZES, run_tool,
                                                 train_command)


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
    # half precision on CUDA again without cuDNN's attention (fp32 never uses it): the suspect of the fp16 slowdown;
    # the training check's variants (a second seed, another loss scale) run at the speed of their precision
    precisions = [p for p in args.precisions if p in PRECISION_FLAGS]
    variants = [(p, "on") for p in precisions] + [
        (p, "off") for p in precisions if p != "fp32" and args.device == "cuda"]
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
