"""``palm-bench``: speed and memory of every model of the plugin next to the fairseq baseline of the same shape.

One process, one run: the ratios in the table come from measurements taken side by side (repeats of the
configurations of a group interleaved, medians reported), which is what makes them comparable on a shared or
noisy machine. It measures

* training tokens/s, peak tensor memory and model-FLOPs utilisation (MFU) at each ``--lengths``:
  ``palm`` vs fairseq ``transformer``; UniLMv2's ``pmlm_ae_par`` vs plain MLM on the same ``unilm2`` model vs a
  naive per-step PAR baseline; ``unilm_pretraining`` and ``unilm_seq2seq`` vs fairseq ``roberta_base``;
* decoding sentences/s with beam search at each ``--target-tokens`` and ``--sentences`` (sentences per batch):
  ``unilm`` / ``unilm2`` cached vs full recomputation vs fairseq ``transformer``, and ``palm``;
* the device's matmul throughput in the training precision (the denominator of MFU; ``--peak-tflops`` gives a
  second one, a datasheet figure),
* the data pipeline: examples/s and tokens/s per core of each task's own dataset + collater at ``--data-length``
  (every task of the plugin beside fairseq's ``masked_lm`` and ``translation``; :mod:`palm_tools.bench.pipeline`),

then prints a markdown table with PASS/MISS for the targets (issue #7's on the CPU, issue #15's on a GPU), and
writes JSON and a PNG chart. Models are built in-process through fairseq's APIs on synthetic data of the measured
shapes (:mod:`palm_tools.bench.data`), on ``--device`` in ``--precision`` the way fairseq-train and
fairseq-generate run with ``--bf16`` / ``--fp16`` (:mod:`palm_tools.bench.models`); see
:mod:`~palm_tools.bench.flops` for how FLOPs are counted and :mod:`~palm_tools.bench.train` for how memory is
measured. ``--profile-dir`` writes a profile of one update of each training configuration.

Presets: ``cpu`` (the default without a GPU; about 12 minutes on 2 cores), ``gpu`` (the default on CUDA: base
size, lengths 512 and 768, 16 sequences per update, bf16), ``quick`` (``--quick``: tiny archs, well under a minute;
the test suite runs it). ``--merge-into`` re-measures some configurations (``--only``, ``--lengths``) and replaces
their rows in a saved record, keeping the rest.

``--sweep`` (``--preset gpu-sweep`` on a card) measures instead training against sequences per update and the speed
levers on and off, then batch-1 decoding (:mod:`palm_tools.bench.sweep`, :mod:`palm_tools.bench.sweep_report`),
written as ``sweep.{md,json,png}``.
"""
import argparse
import datetime
import json
import logging
import math
import os
import platform
import shlex
import sys
import tempfile
import time
import warnings

import fairseq
import torch

from palm_plugin.modules import compiled_layers
from palm_tools.arguments import number_between, whole_number
from palm_tools.atomic_files import atomic_open
from palm_tools.bench import report as bench_report
from palm_tools.bench import sweep_report
from palm_tools.bench.data import SyntheticCorpus
from palm_tools.bench.decode import DECODE_SPECS, measure_decoding
from palm_tools.bench.flops import measure_matmul
from palm_tools.bench.models import PRECISIONS, TRAIN_SPECS
from palm_tools.bench.pipeline import DATA_SPECS, measure_data_pipeline
from palm_tools.bench.runlog import log, wanted
from palm_tools.bench.sweep import LEVERS, describe_plan, measure_sweep
from palm_tools.bench.train import measure_training

# quick: a smoke run of the tiny archs.
# cpu: about 12 minutes on 2 CPU cores: one sequence per update, the naive PAR baseline (one pass per factorization
# step) up to length 256, the recomputation baselines only at the longest target.
# gpu: a few minutes on one H100 in bf16. 16 sequences per update keep the card busy (about 8k tokens at 512, 12k at
# 768); at ~6 * 110M params * tokens FLOPs an update is ~6-9 TFLOP, tens of ms at a few hundred TFLOP/s, so 10 timed
# updates per configuration cost seconds. The naive PAR baseline (~0.07 * length passes of that size) takes about
# 1-3 s per update at 512-768: 3 timed updates of it fit. Decoding at 1 and 32 sentences per batch.
PRESETS = {
    "quick": dict(size="tiny", lengths=[32, 64], batch_sequences=2, repeats=2, naive_repeats=1, naive_max_length=64,
                  target_tokens=[8, 16], recompute_target_tokens=[8, 16], source_tokens=16, sentences=[2],
                  decode_repeats=2, recompute_repeats=1, vocab_size=1000, gemm_size=512, data_length=64,
                  data_examples=32, data_batch=8, data_repeats=1),
    "cpu": dict(size="base", lengths=[128, 256, 512, 768], batch_sequences=1, repeats=2, naive_repeats=1,
                naive_max_length=256, target_tokens=[64, 128], recompute_target_tokens=[128], source_tokens=32,
                sentences=[1], decode_repeats=1, recompute_repeats=1, vocab_size=32000, gemm_size=2048,
                data_length=512, data_examples=512, data_batch=16, data_repeats=3),
    "gpu": dict(size="base", lengths=[512, 768], batch_sequences=16, repeats=10, naive_repeats=3,
                naive_max_length=768, target_tokens=[64, 128], recompute_target_tokens=[128], source_tokens=32,
                sentences=[1, 32], decode_repeats=3, recompute_repeats=2, vocab_size=32000, gemm_size=8192,
                data_length=512, data_examples=512, data_batch=16, data_repeats=3),
}  # fmt: skip
# --sweep (palm_tools/bench/sweep.py), over the preset's settings. quick: the test suite's (tiny archs, one length, two
# sizes, a few levers; compiled with aot_eager: the graphs without inductor's code generation). cpu: the levers on 2
# cores at base size. gpu (--preset gpu-sweep): the card run, about 17 minutes of one H100 with its decoding rows
# (the estimate in docs/benchmarks-gpu.md, "Planned card run"); --time-budget-min keeps it inside its slot.
SWEEP_PRESETS = {
    "quick": dict(lengths=[32], sequences=[2, 4], find_max=False, repeats=1, lever_length=32, lever_sequences=4,
                  levers=["torch_adamw", "compile", "syncs_at_start", "drop_full_masks", "loader_workers"],
                  lever_configs=["pmlm_ae_par", "unilm_bidirectional"], loader_workers=1,
                  profile_sequences=4, compile_backend="aot_eager", sentences=[1], target_tokens=[8],
                  recompute_target_tokens=[], decode_repeats=1),
    "cpu": dict(lengths=[256], sequences=[1, 2], find_max=False, repeats=2, lever_length=256, lever_sequences=2,
                levers=["torch_adamw", "compile", "compile_copy", "syncs_at_start", "drop_full_masks", "loader", "all"],
                lever_configs=None, loader_workers=1, profile_sequences=2, compile_backend="inductor", sentences=[1],
                target_tokens=[64], recompute_target_tokens=[], decode_repeats=2),
    "gpu": dict(lengths=[512, 768], sequences=[16, 64, 256], find_max=True, repeats=3, lever_length=512,
                lever_sequences=256, loader_workers=8, profile_sequences=64,
                levers=["fairseq_loops", "torch_adamw", "syncs_at_start", "compile", "compile_copy", "all",
                        "loader_workers", "loader", "drop_full_masks", "no_attention_dropout", "flex", "flex_static",
                        "triton_attention", "triton_copy", "blocked_copy", "all_kernels", "all_triton",
                        "unaligned_vocabulary", "checkpoint_activations"],
                lever_configs=["palm", "unilm_pretraining", "unilm_seq2seq", "pmlm_ae_par", "transformer", "roberta",
                               "unilm_bidirectional"],
                compile_backend="inductor", sentences=[1], target_tokens=[128], recompute_target_tokens=[],
                decode_repeats=3, time_budget_min=17.0),
}  # fmt: skip
H100_SXM_BF16_DENSE_TFLOPS = 989.4  # NVIDIA's H100 SXM datasheet, dense (no sparsity) BF16 / FP16 Tensor Core


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="palm-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="where models, optimizer state and batches live (default: cuda if available)")
    parser.add_argument("--precision", choices=list(PRECISIONS),
                        help="training and decoding precision, as fairseq's --bf16 / --fp16 (default: bf16 on cuda, "
                        "fp32 on the CPU; fp16 needs cuda)")
    parser.add_argument("--preset", choices=list(PRESETS) + ["gpu-sweep"],
                        help="default settings (default: gpu on cuda, cpu otherwise); options given override them; "
                        "gpu-sweep: gpu with --sweep (the card run of docs/benchmarks-gpu.md)")
    parser.add_argument("--quick", action="store_true", help="--preset quick: tiny archs, short sequences (< 1 min)")
    parser.add_argument("--peak-tflops", type=number_between(0, math.inf, "a positive amount"),
                        help="a datasheet peak (TFLOP/s) for a second MFU column (default on cuda: "
                        f"{H100_SXM_BF16_DENSE_TFLOPS}, the H100 SXM dense bf16 figure; none on the CPU)")
    parser.add_argument("--profile-dir", metavar="DIR",
                        help="write DIR/<configuration>.txt: the profiler's operator table of one extra update of "
                        "each training configuration at the reference length, and its timeline in "
                        "DIR/traces/<configuration>.json.gz")
    parser.add_argument("--size", choices=["tiny", "base"], help="model size (default: base; --quick: tiny)")
    parser.add_argument("--lengths", type=whole_number(1), nargs="+", action="extend",
                        help="training sequence lengths (cpu: 128 256 512 768)")
    parser.add_argument("--reference-length", type=whole_number(1),
                        help="training length the targets are judged at (default: 512 if measured, else the longest)")
    parser.add_argument("--batch-sequences", type=whole_number(1),
                        help="sequences per training batch (cpu: 1, gpu: 16)")
    parser.add_argument("--repeats", type=whole_number(1),
                        help="timed training updates per configuration and length (median)")
    parser.add_argument("--naive-repeats", type=whole_number(1),
                        help="timed updates of the naive per-step PAR baseline")
    parser.add_argument("--naive-max-length", type=whole_number(1),
                        help="skip the naive PAR baseline above this length: it costs one pass per factorization "
                        "step, ~0.07 * length passes (cpu: 256)")
    parser.add_argument("--target-tokens", type=whole_number(1), nargs="+", action="extend",
                        help="decoded tokens per hypothesis (default 64 128)")
    parser.add_argument("--recompute-target-tokens", type=whole_number(1), nargs="+", action="extend",
                        help="target lengths at which the recomputation baselines run (default 128)")
    parser.add_argument("--source-tokens", type=whole_number(1), help="source length for decoding (default 32)")
    parser.add_argument("--sentences", type=whole_number(1), nargs="+", action="extend",
                        help="sentences per decoding batch, one measurement each (cpu: 1, gpu: 1 32)")
    parser.add_argument("--beam", type=whole_number(1), default=5, help="beam size")
    parser.add_argument("--decode-repeats", type=whole_number(1), help="timed generations per decoder and length")
    parser.add_argument("--recompute-repeats", type=whole_number(1),
                        help="timed generations of the recomputation baselines")
    parser.add_argument("--vocab-size", type=whole_number(1),
                        help="dictionary size of the synthetic data (default 32000)")
    parser.add_argument("--gemm-size", type=whole_number(1),
                        help="square GEMM size for the machine limit (cpu: 2048, gpu: 8192)")
    parser.add_argument("--only", nargs="+", action="extend", metavar="KEY",
                        help="measure only these configurations (keys: "
                        + ", ".join([s.key for s in TRAIN_SPECS] + [s.key for s in DECODE_SPECS[1:]]
                                    + [f"data_{s.key}" for s in DATA_SPECS]) + ")")
    parser.add_argument("--data-length", type=whole_number(1),
                        help="tokens per example of the data-pipeline table (default 512)")
    parser.add_argument("--data-examples", type=whole_number(1),
                        help="examples per timed data-pipeline pass (default 512)")
    parser.add_argument("--data-batch", type=whole_number(1),
                        help="examples per collated batch in the data pipeline (default 16)")
    parser.add_argument("--data-repeats", type=whole_number(1),
                        help="timed passes per data-pipeline row (median; default 3)")
    parser.add_argument("--no-data", action="store_true", help="skip the data-pipeline measurements")
    parser.add_argument("--no-training", action="store_true", help="skip the training measurements")
    parser.add_argument("--no-decoding", action="store_true", help="skip the decoding measurements")
    parser.add_argument("--output-dir", default="bench-results", help="where benchmark.{json,png,md} are written")
    parser.add_argument("--name", help="file name stem of the outputs (default: benchmark; with --sweep: sweep)")
    parser.add_argument("--plan-only", action="store_true",
                        help="print what the run would measure and its estimate, and stop (no device needed: a card "
                        "command checked before the card is lent)")
    parser.add_argument("--from-json", metavar="PATH",
                        help="measure nothing: render the table and chart of a saved record (a run cut short too)")
    parser.add_argument("--merge-into", metavar="PATH",
                        help="measure what is selected (--only, --lengths, --no-training, --no-decoding) and replace "
                        "the rows of the same configurations and lengths in the saved record PATH; the outputs "
                        "render the merged record, re-measured rows marked with their run. Re-measure a row's "
                        "baseline with it: ratios are only taken between rows of one run")
    sweep = parser.add_argument_group("sweep (--sweep): speed, memory and MFU against sequences per update, and the "
                                      "speed levers on and off (palm_tools/bench/sweep.py)")
    sweep.add_argument("--sweep", action="store_true", help="run the sweep (and decoding) instead of the tables above")
    sweep.add_argument("--sequences", type=whole_number(1), nargs="+", action="extend",
                       help="sequences per update (gpu-sweep: 16 64 256)")
    sweep.add_argument("--find-max", action=argparse.BooleanOptionalAction,
                       help="also search the largest micro-batch that fits (gpu-sweep: on)")
    sweep.add_argument("--memory-limit-mb", type=number_between(0, math.inf, "a positive amount"),
                       help="device memory to fit micro-batches in; a warm-up peak above it counts as out-of-memory "
                       "(default: the card's memory; none on the CPU)")
    sweep.add_argument("--levers", nargs="*", action="extend", choices=list(LEVERS), help="levers measured on and off")
    sweep.add_argument("--lever-configs", nargs="+", action="extend", metavar="KEY",
                       help="configurations the levers are measured on, in this order (default: all, and "
                       "unilm_bidirectional)")
    sweep.add_argument("--lever-length", type=whole_number(1),
                       help="sequence length of the lever rows (gpu-sweep: 512)")
    sweep.add_argument("--lever-sequences", type=whole_number(1),
                       help="sequences per update of the lever rows (gpu-sweep: 256)")
    sweep.add_argument("--loader-workers", type=whole_number(0), help="data-loader workers of the loader_workers lever")
    sweep.add_argument("--profile-sequences", type=whole_number(1),
                       help="with --profile-dir: profile the plain update at --lever-length and this many sequences")
    sweep.add_argument("--profile-levers", nargs="+", action="extend", metavar="LEVER", choices=sorted(LEVERS),
                       default=[],
                       help="with --profile-dir: profile these levers' rows too, DIR/<configuration>_<lever>.txt "
                       "(what a lever changes in the operators' times)")
    sweep.add_argument("--compile-backend", help="torch.compile backend of the compile lever (default inductor)")
    sweep.add_argument("--time-budget-min", type=number_between(0, math.inf, "a positive amount"),
                       help="skip the sweep rows not started after this many minutes (gpu-sweep: 17)")
    args = parser.parse_args(argv)
    if args.preset == "gpu-sweep":
        args.preset, args.sweep = "gpu", True
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available() and not args.plan_only:
        parser.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    if args.precision is None:
        args.precision = "bf16" if args.device == "cuda" else "fp32"
    if args.precision == "fp16" and args.device == "cpu":
        parser.error("--precision fp16 needs --device cuda (fairseq's FP16Optimizer keeps its fp32 copy on a GPU); "
                     "use bf16 or fp32 on the CPU")
    if args.quick:
        args.preset = "quick"
    args.preset = args.preset or ("gpu" if args.device == "cuda" else "cpu")
    defaults = dict(PRESETS[args.preset], **(SWEEP_PRESETS[args.preset] if args.sweep else {}))
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.peak_tflops is None and args.device == "cuda":
        args.peak_tflops = H100_SXM_BF16_DENSE_TFLOPS
    if args.reference_length is None:
        args.reference_length = 512 if 512 in args.lengths else max(args.lengths)
    unmeasured = sorted(set(args.profile_levers) - set(args.levers or ()))
    if unmeasured or (args.profile_levers and not args.profile_dir):
        parser.error(f"--profile-levers {' '.join(args.profile_levers)}: " + (
            f"{', '.join(unmeasured)} not among --levers; name them in --levers too" if unmeasured
            else "the profiles need a folder; give --profile-dir DIR"))
    return args  # fmt: skip


def machine(device: str = "cpu") -> dict:
    model = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    info = {"cpu": model, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "fairseq": fairseq.__version__, "python": platform.python_version(),
            "load_average_start": os.getloadavg()[0]}  # fmt: skip
    if device == "cuda":
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(gpu=properties.name, gpu_memory_gb=round(properties.total_memory / 2**30, 1),
                    gpu_capability=f"{properties.major}.{properties.minor}", cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version())  # fmt: skip
    return info


def run(argv=None) -> dict:
    """Measure (or read ``--from-json``), print the tables, write the outputs; returns the JSON record."""
    args = parse_args(argv)
    if args.plan_only:
        for line in plan(args):
            log("plan: " + line)
        return {"plan": plan(args)}
    warnings.filterwarnings("ignore")  # hydra's deprecation notices from fairseq's config conversion
    logging.disable(logging.INFO)  # fairseq's and the tasks' per-dataset info lines
    os.makedirs(args.output_dir, exist_ok=True)
    stem = os.path.join(args.output_dir, args.name or ("sweep" if args.sweep else "benchmark"))
    if args.from_json:
        result = read_record(args.from_json, "--from-json")
    else:
        record = None
        if args.merge_into:
            record = read_record(args.merge_into, "--merge-into")
            try:  # before measuring, not after
                bench_report.check_comparable(record["settings"], settings(args))
            except ValueError as error:
                sys.exit(f"palm-bench: --merge-into {args.merge_into}: {error}")
        result = measure(args, argv, stem + ".json", record)
        if record is not None:
            result = bench_report.merge(record, result)
    report = sweep_report if "sweep" in result else bench_report
    report.finish(result)
    table = report.markdown(result)
    print(table)
    bench_report.write_json(result, stem + ".json")
    with atomic_open(stem + ".md") as f:
        f.write(table + "\n" + report.METHOD)
    written = [stem + ".json", stem + ".md"]
    try:
        report.plot(result, stem + ".png")
        written.append(stem + ".png")
    except ImportError as error:  # matplotlib is not among the plugin's install requirements (a bare GPU machine)
        log(f"no chart: {error} (pip install matplotlib; then palm-bench --from-json {stem}.json)")
    log("wrote " + ", ".join(written))
    return result


def read_record(path, option) -> dict:
    """A record palm-bench wrote (its .json); anything else stops the command with what it is and what to give."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except OSError as error:
        sys.exit(f"palm-bench: {option} {path}: cannot read: {error.strerror}; give the .json a palm-bench run wrote")
    except (ValueError, UnicodeDecodeError) as error:
        sys.exit(f"palm-bench: {option} {path}: not JSON ({error}); give the .json a palm-bench run wrote "
                 f"(--output-dir/--name), not its .md or .png")
    if not isinstance(record, dict) or not {"settings", "machine", "training", "decoding"} <= set(record):
        sys.exit(f"palm-bench: {option} {path}: not a palm-bench record (it lacks settings, machine, training and "
                 f"decoding); give the .json a palm-bench run wrote (--output-dir/--name)")
    return record


def settings(args) -> dict:
    """The run's settings, as its record keeps them."""
    keys = list(PRESETS["cpu"]) + ["beam", "reference_length", "device", "precision", "preset", "peak_tflops"]
    if args.sweep:
        keys += ["sweep"] + list(SWEEP_PRESETS["gpu"]) + ["memory_limit_mb"]
    return {key: getattr(args, key, None) for key in dict.fromkeys(keys)}


def plan(args) -> list:
    """What this run will measure and its size, printed before anything is measured (--only bounds every part)."""
    decoders = [spec.key for spec in DECODE_SPECS[1:] if wanted(args, spec.key)]
    decoding = ("decoding: none (--no-decoding)" if args.no_decoding else
                "decoding: none (--only names no decoder)" if not decoders else
                f"decoding: {', '.join(['transformer'] + decoders)} at {' '.join(map(str, args.target_tokens))} "
                f"target tokens and {' '.join(map(str, args.sentences))} sentences per batch, {args.decode_repeats} "
                f"timed generations each")
    if args.sweep:
        return describe_plan(args) + [decoding]
    training = [spec.key for spec in TRAIN_SPECS if wanted(args, spec.key)]
    data = [spec.key for spec in DATA_SPECS if wanted(args, f"data_{spec.key}")]
    return [("training: none (--no-training)" if args.no_training else
             f"training: {', '.join(training) or 'none (--only names no configuration)'} at lengths "
             f"{' '.join(map(str, args.lengths))}: {len(training) * len(args.lengths)} rows of {args.repeats} timed "
             f"updates"),
            decoding,
            "data pipeline: none" if args.no_data or not data else f"data pipeline: {', '.join(data)}"]


def measure(args, argv, json_path, record=None) -> dict:
    """All measurements; the record so far (merged into ``record`` if given) is saved to ``json_path`` after each
    step of the run (a run cut short leaves its measurements there, ``--from-json`` renders them). Returns this
    run's record."""
    started = datetime.datetime.now(datetime.timezone.utc)
    args.started = time.monotonic()
    for line in plan(args):
        log("plan: " + line)
    log(f"{args.device}, {args.precision}: matmul throughput ({args.gemm_size}^3 and feed-forward shapes)")
    feed_forward = (args.batch_sequences * args.reference_length, 768, 3072)  # a base-size layer on a whole batch
    gemm = measure_matmul(args.gemm_size, (feed_forward,), repeats=20 if args.device == "cuda" else 5,
                          dtype=PRECISIONS[args.precision], device=args.device)  # fmt: skip
    args.peak_gflops = gemm["peak_gflops"]
    if args.profile_dir:
        os.makedirs(args.profile_dir, exist_ok=True)
    result = {
        "command": "palm-bench " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"), "elapsed_s": 0.0, "complete": False,
        "machine": machine(args.device), "settings": settings(args), "gemm": gemm,
        "training": [], "decoding": [], "data": [], "missing": [],
    }  # fmt: skip
    if args.sweep:
        result["sweep"] = []
        compiled_layers.BACKEND = args.compile_backend

    def checkpoint():
        result["elapsed_s"] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
        result["machine"]["load_average_end"] = os.getloadavg()[0]
        bench_report.write_json(result if record is None else bench_report.merge(record, result), json_path)

    with tempfile.TemporaryDirectory() as root:
        corpus = SyntheticCorpus(root, args.vocab_size)
        if args.sweep:  # decoding first: the shortest part, not to be cut by the time budget
            if not args.no_decoding:
                measure_decoding(args, corpus, result, checkpoint)
            measure_sweep(args, corpus, result, checkpoint)
            args.no_data = args.no_training = args.no_decoding = True
        if not args.no_data:
            log(f"data pipeline, length {args.data_length}")
            result["data"] = measure_data_pipeline(corpus, args.data_length, args.data_examples, args.data_batch,
                                                   args.data_repeats, wanted=lambda key: wanted(args, f"data_{key}"))
            checkpoint()
        if not args.no_training:
            measure_training(args, corpus, result, checkpoint)
        if not args.no_decoding:
            measure_decoding(args, corpus, result, checkpoint)
    result["complete"] = True
    checkpoint()
    return result


def main(argv=None):
    run(argv)


if __name__ == "__main__":
    main()
