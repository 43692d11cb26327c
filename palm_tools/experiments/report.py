"""Collecting results into tables: values over seeds, mean and spread, our direction against the paper's; the
markdown, the run times and the chart."""
import math
import re

from palm_tools.atomic_files import atomic_path
from palm_tools.experiments.execute import result_of
from palm_tools.experiments.plan import unigram_name
from palm_tools.experiments.rows import GEN, SEL, TASK_TITLES


def _stats(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None, None, 0
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return mean, sd, len(values)


def collect(plan, errors):
    """Per experiment, row and task: the values over seeds, their mean and standard deviation, and why missing."""
    tables = []
    for experiment in plan.experiments:
        rows = []
        for row in experiment.rows:
            entry = {"label": row.label, "model": row.model, "pretraining": row.pretrain or "none",
                     "finetune_options": list(row.finetune_options), "tasks": {}}
            for task in experiment.tasks:
                names = [plan.finetune_name(row, task, seed) for seed in plan.scale.seed_list]
                if names[0] not in plan.runs:
                    entry["tasks"][task] = {"why_missing": "PALM has no classification head (an encoder-decoder; "
                                                           "the selection task needs one)"}
                    continue
                results = [result_of(plan, n) for n in names]
                key = "ppl" if task == GEN else "accuracy"
                values = [r[key] if r else None for r in results]
                mean, sd, n = _stats(values)
                cell = {"values": values, "mean": mean, "sd": sd, "n": n, "seeds": list(plan.scale.seed_list),
                        "params": next((r["params"] for r in results if r), None)}
                missing = [errors.get(name, "not run yet") for name, r in zip(names, results) if r is None]
                if missing:
                    cell["why_missing"] = missing[0]
                entry["tasks"][task] = cell
            rows.append(entry)
        table = {"key": experiment.key, "title": experiment.title, "paper": experiment.paper,
                 "here": {task: direction(experiment, rows, task) for task in experiment.tasks}, "rows": rows}
        if GEN in experiment.tasks:
            table["unigram_ppl"] = (result_of(plan, unigram_name(experiment.vocab)) or {}).get("ppl")
            table["tokens"] = experiment.vocab
        tables.append(table)
    return tables


# what fairseq-train logs that is not a loss: timing, throughput, optimiser state
_NOT_LOSSES = {"wps", "ups", "wpb", "bsz", "lr", "gnorm", "clip", "train_wall", "wall", "num_updates",
               "loss_scale", "accuracy"}


def pretraining_curves(plan):
    """Per finished pre-training run, each stage's (fairseq-train command's) logged losses: a list of stages, each a
    list of ``{"updates": n, metric: value}`` read from the run's log.txt (committed with its result)."""
    curves = {}
    for name, run in plan.runs.items():
        log = plan.run_dir(name) / "log.txt"
        if run.kind != "pretrain" or result_of(plan, name) is None or not log.exists():
            continue
        stages = []
        for line in log.read_text().splitlines():
            if line.startswith("$ "):
                stages.append([])
            elif "| train_inner |" in line and stages:
                values = dict(re.findall(r"(\w+)=([-0-9.e]+)", line))
                stages[-1].append({"updates": int(values["num_updates"]),
                                   **{k: float(v) for k, v in values.items() if k not in _NOT_LOSSES}})
        curves[name] = [stage for stage in stages if stage]
    return curves


def curves_markdown(curves):
    """The curves as tables: one per pre-training, its stages one after the other (updates counted per stage)."""
    lines = ["## Pre-training curves", "", "Training losses as fairseq-train logged them (base 2; perplexities "
             "`*_ppl` = 2 ** loss), by update, for every finished pre-training; PALM's stage ae (encoder MLM) "
             "comes before stage joint.", ""]
    for name, stages in sorted(curves.items()):
        for number, stage in enumerate(stages, 1):
            metrics = [k for k in stage[0] if k != "updates"]
            lines += [f"**{name}**" + (f", stage {number}" if len(stages) > 1 else ""), "",
                      "| updates | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
            lines += ["| " + " | ".join([str(point["updates"])] + [f"{point.get(k, math.nan):g}" for k in metrics])
                      + " |" for point in stage]
            lines.append("")
    return "\n".join(lines)


def direction(experiment, rows, task):
    """Our direction in words: the ranking, and whether the best row's lead exceeds the spread over seeds."""
    scored = [(r["label"], r["tasks"][task]) for r in rows if r["tasks"][task].get("mean") is not None]
    if not scored:
        return "no results"
    scored.sort(key=lambda item: item[1]["mean"], reverse=task == SEL)
    ranking = "".join((" = " if i and cell["mean"] == scored[i - 1][1]["mean"] else " > " if i else "") +
                      f"{label} ({cell['mean']:.2f})" for i, (label, cell) in enumerate(scored))
    text, gap = f"best to worst: {ranking}", None
    if len(scored) > 1:
        (best, first), (_, second) = scored[0], scored[1]
        spreads = [c["sd"] for _, c in scored[:2] if c["sd"] is not None]
        gap = abs(first["mean"] - second["mean"])
        if gap == 0:
            text += f"; {best} and {scored[1][0]} tie"
        elif spreads:
            spread = max(spreads)
            text += (f"; the lead of {best} ({gap:.2f}) is {'larger' if gap > spread else 'not larger'} than the "
                     f"spread over seeds (sd up to {spread:.2f})")
        else:
            text += "; one seed: no spread to compare with"
    if experiment.paper_best and gap != 0:
        text += "; agrees with the paper" if scored[0][0] == experiment.paper_best else "; differs from the paper"
    return text


def _cell(cell, task):
    if cell.get("mean") is None:
        return f"— ({cell.get('why_missing', 'no result')})"
    sd = f" ± {cell['sd']:.2f}" if cell["sd"] is not None else ""
    text = f"{cell['mean']:.2f}{sd} (n={cell['n']})"
    return text + (f" ({cell['why_missing']})" if cell.get("why_missing") else "")


def devices(plan):
    """Which machine ran each seed's finished runs, from their result.json ("device"; runs recorded before it was
    kept have none): a folder can hold seeds run on different cards, and their times differ."""
    by_seed = {}
    for name in plan.runs:
        result = result_of(plan, name)
        seed = re.search(r"-s(\d+)$", name)
        if result and seed:
            by_seed.setdefault(int(seed.group(1)), set()).add(result.get("device", "not recorded"))
    return "; ".join(f"seed {seed}: {', '.join(sorted(names))}" for seed, names in sorted(by_seed.items()))


def run_times(plan):
    """Measured seconds of the finished runs, by kind (what a rerun at this scale costs, on this machine)."""
    kinds = {}
    for name, run in plan.runs.items():
        result = result_of(plan, name)
        if result:
            kind = f"{run.kind} ({'real weights' if '-minilm' in name else 'small models'})"
            if result.get("device"):
                kind += f", {result['device']}"
            kinds.setdefault(kind, []).append((result["seconds"], result.get("cpu_seconds")))
    lines = ["## Run times", "", "Wall time depends on what else the machine runs; CPU time (user + system of the "
             "run's processes, one thread each) does not: on an otherwise idle machine with at least --jobs cores, "
             "the wall time of all runs is about their CPU time divided by --jobs.", "",
             "| kind of run | finished | mean wall seconds | mean CPU seconds | total CPU minutes |",
             "|---|---|---|---|---|"]
    for kind, times in sorted(kinds.items()):
        wall = [w for w, _ in times]
        cpu = [c for _, c in times if c is not None]
        cpu_text = (f"{sum(cpu) / len(cpu):.0f} | {sum(cpu) / 60:.1f}" if cpu else "— | —")
        lines.append(f"| {kind} | {len(times)} | {sum(wall) / len(wall):.0f} | {cpu_text} |")
    return "\n".join(lines) + "\n"


def markdown(tables, header):
    lines = [header, ""]
    for table in tables:
        tasks = list(table["here"])
        lines += [f"## {table['title']}", "",
                  "| row | " + " | ".join(TASK_TITLES[t] for t in tasks) + " | parameters |",
                  "|---|" + "---|" * (len(tasks) + 1)]
        for row in table["rows"]:
            params = next((c.get("params") for c in row["tasks"].values() if c.get("params")), None)
            lines.append(f"| {row['label']} | " + " | ".join(_cell(row["tasks"][t], t) for t in tasks) +
                         f" | {f'{params:,}' if params else '—'} |")
        unigram = table.get("unigram_ppl")
        if unigram:
            tokens = "WordPiece tokens" if table.get("tokens") == "wordpiece" else "palm-data's pieces"
            lines.append(f"| unigram model of the training responses in {tokens} (no context; the baseline) | " +
                         " | ".join(f"{unigram:.2f}" if t == GEN else "—" for t in tasks) + " | — |")
            below = [r["label"] for r in table["rows"] if (r["tasks"][GEN].get("mean") or math.inf) < 0.7 * unigram]
            lines += ["", f"- below 0.7 x the unigram baseline ({0.7 * unigram:.2f}), where the context is used: "
                          f"{', '.join(below) or 'no row'}"]
        lines += ["", f"- paper: {table['paper']}"]
        lines += [f"- here ({TASK_TITLES[t].split(' (')[0]}): {table['here'][t]}" for t in tasks]
        lines.append("")
    return "\n".join(lines)


def chart(tables, path):
    """One panel per experiment (rows) and task (columns): mean over seeds as bars, one standard deviation as error
    bars. Perplexity axes start near the smallest bar, not at 0, so that differences stay visible (labelled)."""
    from palm_tools.charts import pyplot

    plt = pyplot()

    tasks = tuple(task for task in (GEN, SEL) if any(task in table["here"] for table in tables)) or (GEN,)
    figure, axes = plt.subplots(len(tables), len(tasks), figsize=(6.5 * len(tasks), 2.3 * len(tables)),
                                squeeze=False)
    for table, panel_row in zip(tables, axes):
        for task, axis in zip(tasks, panel_row):
            title = f"{table['title']}\n{TASK_TITLES[task]}"
            axis.set_title(title, fontsize=8)
            rows = [r for r in table["rows"] if r["tasks"].get(task, {}).get("mean") is not None]
            if not rows:
                axis.axis("off")
                why = "not measured in this table" if task not in table["here"] else "no results yet"
                axis.text(0.5, 0.5, why, ha="center", va="center", fontsize=8, transform=axis.transAxes)
                continue
            means = [r["tasks"][task]["mean"] for r in rows]
            sds = [r["tasks"][task]["sd"] or 0 for r in rows]
            axis.barh(range(len(rows)), means, xerr=sds, capsize=4, color="#4c72b0")
            axis.set_yticks(range(len(rows)), [f"{r['label']} (n={r['tasks'][task]['n']})" for r in rows], fontsize=7)
            axis.invert_yaxis()
            low, high = min(m - s for m, s in zip(means, sds)), max(m + s for m, s in zip(means, sds))
            if task == GEN:
                unigram = table.get("unigram_ppl")
                if unigram:
                    low, high = min(low, unigram), max(high, unigram)
                    axis.axvline(unigram, color="#c44e52", linestyle="--", linewidth=1)
                axis.set_xlim(max(0.0, low - 0.15 * (high - low + 1)), high + 0.05 * (high - low + 1))
                axis.set_xlabel("perplexity (axis does not start at 0; dashed: unigram baseline)", fontsize=7)
            else:
                axis.set_xlim(min(50.0, low - 2), min(100.0, high + 2))
                axis.axvline(50, color="grey", linestyle=":", linewidth=1)  # chance: half the candidates are real
                axis.set_xlabel("accuracy % (dotted: chance)", fontsize=7)
    figure.tight_layout()
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png", dpi=80)
    plt.close(figure)
