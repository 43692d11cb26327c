"""``palm-plot``: training curves of one or several fairseq-train runs on one chart.

Each RUN is what fairseq-train wrote: its log (stdout/stderr or ``--log-file``, in ``--log-format json`` or
``simple``) or its ``--tensorboard-logdir`` directory. The chart has two panels against the number of updates:
the loss and the perplexity, training (``train_inner`` records, or per-epoch ``train`` records when the log has
none) as solid lines and each validation subset as dashed lines with markers. The perplexity is the one fairseq logs
(``ppl``: ``2 ** nll_loss`` for label-smoothed criteria), else ``2 ** loss`` (the plugin's losses are base 2).

    palm-plot runs/unilm/train.log runs/palm/tensorboard --labels unilm palm -o curves.png
"""
import argparse
import json
import os
import re
import sys
from collections import defaultdict
from typing import Dict, List, Tuple

Curves = Dict[str, Dict[str, List[Tuple[float, float]]]]  # record kind ("train" or a valid subset) -> metric -> points

PREFIX = re.compile(r"^.*?\| INFO \| \S+ \| ")  # the console's "date | INFO | tag | "; --log-file has none
INNER = re.compile(r"(\w+)=([^,\s]+)")
SUBSET = re.compile(r"^epoch \d+ \| valid on '([^']+)' subset")
TRAIN_KINDS = ("train_inner", "train")


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _record(body: str):
    """``(kind, numbers)`` of one progress record of fairseq's json or simple format, or None for other lines.
    Kinds: ``train_inner`` (every --log-interval), ``train`` (epoch summary) or the validation subset's name."""
    if body.startswith('{"'):
        stats = json.loads(body)
        if "num_updates" in stats:
            kind = "train_inner"
        else:
            kind = next((k[: -len("_num_updates")] for k in stats if k.endswith("_num_updates")), None)
            if kind is None:
                return None
            stats = {k[len(kind) + 1 :]: v for k, v in stats.items() if k.startswith(kind + "_")}
    elif re.match(r"epoch \d+: ", body):  # epoch 001:      5 / 9 loss=5.271, ppl=38.6, ...
        kind, stats = "train_inner", dict(INNER.findall(body))
    elif body.startswith("epoch "):  # epoch 001 | valid on 'valid' subset | loss 4.929 | ppl 30.46 | ...
        subset = SUBSET.match(body)
        kind = subset.group(1) if subset else "train"
        stats = dict(part.split(" ", 1) for part in body.split(" | ") if " " in part.strip())
    else:
        return None
    return kind, {k: n for k, n in ((k, _number(v)) for k, v in stats.items()) if n is not None}


def read_log(path: str, metric: str) -> Curves:
    """Curves from a fairseq-train log: its console output or ``--log-file``, json or simple format."""
    curves: Curves = defaultdict(lambda: defaultdict(list))
    with open(path, encoding="utf-8", errors="replace") as log:
        for line in log:
            record = _record(PREFIX.sub("", line.rstrip("\n"), count=1))
            if record is None:
                continue
            kind, stats = record
            if metric in stats and "num_updates" in stats:
                for name in (metric, "ppl"):
                    if name in stats:
                        curves[kind][name].append((stats["num_updates"], stats[name]))
    return _with_train(curves)


def read_tensorboard(directory: str, metric: str) -> Curves:
    """Curves from a ``--tensorboard-logdir`` directory (one subdirectory per record kind)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curves: Curves = defaultdict(lambda: defaultdict(list))
    for kind in sorted(os.listdir(directory)):
        if not os.path.isdir(os.path.join(directory, kind)):
            continue
        events = EventAccumulator(os.path.join(directory, kind), size_guidance={"scalars": 0})
        events.Reload()
        for name in (metric, "ppl"):
            if name in events.Tags()["scalars"]:
                curves[kind][name] = [(e.step, e.value) for e in events.Scalars(name)]
    return _with_train(curves)


def _with_train(curves: Curves) -> Curves:
    """Name the training records "train" (``train_inner`` when present), keep the validation subsets, and keep one
    point per update, the last: fairseq's --log-file repeats records after the first epoch, a resumed run rewrites
    the updates it had logged before the checkpoint it resumed from."""
    train = curves.get("train_inner") or curves.get("train") or {}
    kinds = {kind: points for kind, points in curves.items() if kind not in TRAIN_KINDS}
    if train:
        kinds["train"] = train
    return {kind: {name: sorted(dict(series).items()) for name, series in points.items()} for kind, points in kinds.items()}


def read_run(path: str, metric: str = "loss") -> Curves:
    curves = read_tensorboard(path, metric) if os.path.isdir(path) else read_log(path, metric)
    if not any(metric in points for points in curves.values()):
        raise ValueError(
            f"{path}: no {metric!r} records found; give fairseq-train's log (--log-format json or simple) or its "
            f"--tensorboard-logdir directory"
        )
    return curves


def perplexity(points: Dict[str, List[Tuple[float, float]]], metric: str) -> List[Tuple[float, float]]:
    if metric == "loss" and points.get("ppl"):
        return points["ppl"]
    return [(x, 2.0 ** y) for x, y in points.get(metric, [])]


def plot(runs: Dict[str, Curves], output: str, metric: str = "loss", title: str = None) -> None:
    from palm_tools.charts import pyplot

    plt = pyplot()

    figure, (loss_axis, ppl_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, curves) in enumerate(runs.items()):
        color = colors[index % len(colors)]
        for kind, points in sorted(curves.items(), key=lambda item: item[0] != "train"):
            style = {"linestyle": "-"} if kind == "train" else {"linestyle": "--", "marker": "o", "markersize": 3}
            name = f"{label} {kind}"
            for axis, series in ((loss_axis, points.get(metric, [])), (ppl_axis, perplexity(points, metric))):
                if series:
                    axis.plot(*zip(*series), color=color, label=name, **style)
    loss_axis.set_ylabel(f"{metric} (base 2)")
    ppl_axis.set_ylabel("perplexity")
    ppl_axis.set_yscale("log")
    for axis in (loss_axis, ppl_axis):
        axis.set_xlabel("updates")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="palm-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="fairseq-train logs (json or simple format) or tensorboard log dirs")
    parser.add_argument("-o", "--output", default="curves.png", help="image to write (format from the extension)")
    parser.add_argument("--labels", nargs="+", action="extend",
                        help="one legend name per run (default: the file or directory name)")
    parser.add_argument("--metric", default="loss",
                        help="the logged loss to draw, e.g. lm_loss or par_loss (default: loss)")
    parser.add_argument("--title", help="chart title")
    args = parser.parse_args(argv)
    labels = args.labels or [os.path.basename(os.path.normpath(run)) for run in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--labels: {len(labels)} names for {len(args.runs)} runs")
    try:
        runs = {label: read_run(run, args.metric) for label, run in zip(labels, args.runs)}
    except FileNotFoundError as error:
        sys.exit(f"palm-plot: {error.filename}: no such file or folder; give the log fairseq-train wrote (its output, "
                 f"e.g. fairseq-train ... 2>&1 | tee train.log, or --log-file FILE) or its --tensorboard-logdir folder")
    except (OSError, ValueError) as error:
        sys.exit(f"palm-plot: {error}")
    plot(runs, args.output, args.metric, args.title)
    points = sum(len(series) for curves in runs.values() for kinds in curves.values() for series in kinds.values())
    print(f"palm-plot: {len(runs)} run(s), {points} points -> {args.output}")


if __name__ == "__main__":
    main()
