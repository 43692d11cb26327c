"""``palm-bench --sweep`` results: issue 24's targets, the markdown tables, the PNG chart (the JSON record is the one
:mod:`palm_tools.bench.cli` writes)."""
from typing import Dict, List, Optional

from palm_tools.bench.report import _fmt, _run_header

MFU_TARGET = 0.40  # issue 24: at the best batch that fits, for each plugin configuration below
MFU_TARGETED = ("unilm_pretraining", "unilm_seq2seq", "pmlm_ae_par", "palm")
MFU_BASELINE = {"palm": "transformer", "unilm_pretraining": "roberta", "unilm_seq2seq": "roberta",
                "pmlm_ae_par": "roberta"}  # fmt: skip
COPY_TARGET = 1.05  # palm's step cost against --no-copy
DECODE_TARGET = 0.9  # cached decoding time at batch 1 against fairseq's transformer


def _ok(rows: List[dict]) -> List[dict]:
    return [row for row in rows if row.get("status") == "ok"]


def _find(rows, **where) -> Optional[dict]:
    return next((row for row in rows if all(row.get(k) == v for k, v in where.items())), None)


def finish(result: Dict):
    """Each row's ratio to its baseline (sweep rows: the baseline configuration at the same length and sequences per
    update; lever rows: the plain row of the same point; decoding: the transformer), and the targets."""
    rows = _ok(result["sweep"])
    for row in rows:
        if row["stage"] == "lever":
            plain = _find(rows, stage="lever", variant="plain", key=row["key"], length=row["length"],
                          sequences=row["sequences"])  # fmt: skip
            row["vs_plain"] = row["tokens_per_s"] / plain["tokens_per_s"] if plain else None
        elif row.get("baseline"):
            base = _find(rows, stage="sweep", key=row["baseline"], length=row["length"], sequences=row["sequences"],
                         how=row["how"]) if row["how"] == "requested" else None  # fmt: skip
            row["vs_baseline"] = row["tokens_per_s"] / base["tokens_per_s"] if base else None
    decoding = result.get("decoding", [])
    for row in decoding:
        base = _find(decoding, key="transformer", sentences=row["sentences"], target_tokens=row["target_tokens"])
        row["time_vs_transformer"] = base["sentences_per_s"] / row["sentences_per_s"] if base else None
    result["targets"] = targets(rows, decoding, result["settings"])


def _target(name, value, threshold, passed, note):
    status = "NOT MEASURED" if value is None else "PASS" if passed else "MISS"
    return {"target": name, "value": value, "threshold": threshold, "status": status, "note": note}


def targets(rows: List[dict], decoding: List[dict], settings: Dict) -> List[dict]:
    found = []
    for key in MFU_TARGETED:
        mine = [row for row in rows if row["key"] == key]
        best = max(mine, key=lambda row: row["mfu"], default=None)
        note, passed = "no row", False
        if best is not None:
            base = [row for row in rows if row["key"] == MFU_BASELINE[key] and row["length"] == best["length"]
                    and row["sequences"] == best["sequences"] and row["variant"] == best["variant"]]  # fmt: skip
            base_mfu = base[0]["mfu"] if base else None
            matched = base_mfu is not None and best["mfu"] >= 0.95 * base_mfu
            passed = best["mfu"] >= MFU_TARGET or matched
            note = (f"best row: length {best['length']}, {best['sequences']} sequences per update "
                    f"({best['micro_batch']} x {best['update_freq']}), {best['variant']}; {MFU_BASELINE[key]} at the "
                    f"same point: {_fmt(None if base_mfu is None else 100 * base_mfu, 1)}%"
                    + (" (matched: within 5% of the baseline's MFU)" if matched and best["mfu"] < MFU_TARGET else ""))
        found.append(_target(f"{key} MFU >= {MFU_TARGET:.0%} at the best batch (or the baseline's)",
                             best and best["mfu"], MFU_TARGET, passed, note))  # fmt: skip
    for length in settings.get("lengths", []):
        pairs = [(row, _find(rows, stage="sweep", key="palm_nocopy", length=length, sequences=row["sequences"],
                             how=row["how"])) for row in rows
                 if row["key"] == "palm" and row["stage"] == "sweep" and row["length"] == length]  # fmt: skip
        pairs = [(copy, nocopy) for copy, nocopy in pairs if nocopy]
        copy, nocopy = max(pairs, key=lambda pair: pair[0]["sequences"], default=(None, None))
        value = nocopy["tokens_per_s"] / copy["tokens_per_s"] if copy else None
        found.append(_target(f"palm step cost <= {COPY_TARGET}x --no-copy, length {length}", value, COPY_TARGET,
                             value is not None and value <= COPY_TARGET,
                             f"the most sequences per update both ran ({copy['sequences'] if copy else '-'}): "
                             "palm_nocopy tokens/s / palm tokens/s"))  # fmt: skip
    if "compile_copy" in settings.get("levers", []):
        found.append(_copy_cost_with_lever(rows, settings))
    for version in ("unilm", "unilm2"):
        mine = [row for row in decoding if row["key"].startswith(version) and row["sentences"] == 1
                and "recompute" not in row["key"] and row.get("time_vs_transformer")]  # fmt: skip
        mine = [row for row in mine if row["key"] in (version, f"{version}_graph")]
        best = min(mine, key=lambda row: row["time_vs_transformer"], default=None)
        value = best and best["time_vs_transformer"]
        found.append(_target(f"{version} cached decoding at batch 1 <= {DECODE_TARGET}x fairseq transformer's time",
                             value, DECODE_TARGET, value is not None and value <= DECODE_TARGET,
                             f"best of {', '.join(row['key'] for row in mine) or '-'}: time / transformer's time, "
                             f"beam {settings.get('beam')}"))  # fmt: skip
    return found


def _copy_cost_with_lever(rows: List[dict], settings: Dict) -> dict:
    """palm with --compile-copy-attention against --no-copy, at the lever point: palm's cost over --no-copy in the
    sweep (both plain) times the lever's cost over plain palm in the lever stage. Each factor compares two rows of
    one stage; rows of different stages of one run may differ more than that (8% on the CPU)."""
    point = dict(length=settings.get("lever_length"), sequences=settings.get("lever_sequences"))
    palm, nocopy = (_find(rows, stage="sweep", key=key, how="requested", **point) for key in ("palm", "palm_nocopy"))
    plain, lever = (_find(rows, stage="lever", key="palm", variant=variant, **point)
                    for variant in ("plain", "compile_copy"))  # fmt: skip
    value = None
    if palm and nocopy and plain and lever:
        value = nocopy["tokens_per_s"] / palm["tokens_per_s"] * plain["tokens_per_s"] / lever["tokens_per_s"]
    return _target(f"palm --compile-copy-attention step cost <= {COPY_TARGET}x --no-copy, length {point['length']}",
                   value, COPY_TARGET, value is not None and value <= COPY_TARGET,
                   f"{point['sequences']} sequences per update: (palm_nocopy / palm tokens/s, sweep) x (palm plain / "
                   "palm compile_copy tokens/s, levers)")


METHOD = """### How the sweep is measured

- **Updates.** Each configuration is built as `fairseq-train` builds it (`palm_tools/bench/models.py`), batches by
  the task's own dataset and collater on synthetic tokens. An update of S sequences runs S / m micro-batches of m
  sequences (fairseq's `--update-freq`: forward and backward each, gradients summed, one optimizer step); m = S unless
  that ran out of device memory (then halved). One untimed warm-up update (its peak memory), then `repeats` timed
  updates, median; on CUDA the clock is read after `torch.cuda.synchronize()`.
- **Largest** rows: the largest micro-batch found to fit, as one update: a line through the two largest measured
  peaks predicts it, it is tried and lowered by a fifth on out-of-memory.
- **tokens/s** counts the text of an update's batches (source + target tokens; for UniLMv2 the original sequence);
  **MFU** = analytic matrix-product FLOPs per update (`palm_tools/bench/flops.py`, checked against torch's FLOP
  counter) / median update time / the measured matmul rate in the training dtype (header), the datasheet peak beside.
- **Levers**: each configuration at one point, plain and with each lever (its own model, built with the lever's
  command-line option; for fairseq's baselines the benchmark compiles their layers itself); the ratio is to that
  plain row. `loader` rows draw each update's batches from fairseq's own iterator (its DataLoader pins memory;
  `loader_workers` adds worker processes), so their time includes waiting for data.
- **Decoding**: fairseq's beam search, every hypothesis exactly `target_tokens` long, as in the main table of
  `palm-bench`; the ratio is the time per sentence over the transformer's.
"""


def markdown(result: Dict) -> str:
    s, rows = result["settings"], result["sweep"]
    datasheet = " | MFU vs datasheet" if s.get("peak_tflops") else ""
    lines = _run_header(result) + [
        f"### Training sweep (size {s['size']}, {s.get('precision')}, median of {s['repeats']} updates)", "",
        f"| length | configuration | sequences / update | micro x freq | s / update | tokens/s | vs baseline | peak MB "
        f"| MFU{datasheet} |", "|---:|---|---:|---:|---:|---:|---|---:|---:|" + ("---:|" if datasheet else "")]  # fmt: skip
    for row in _ok(rows):
        if row["stage"] != "sweep":
            continue
        versus = "-" if row.get("vs_baseline") is None else f"{row['vs_baseline']:.2f}x {row['baseline']}"
        largest = " (largest)" if row["how"] == "largest" else ""
        mfu = f"{100 * row['mfu']:.1f}%" + (f" | {100 * row['mfu_datasheet']:.1f}%" if datasheet else "")
        lines.append(f"| {row['length']} | {row['label']} | {row['sequences']}{largest} | {row['micro_batch']} x "
                     f"{row['update_freq']} | {row['median_s']:.3f} | {row['tokens_per_s']:.0f} | {versus} | "
                     f"{row['peak_memory_mb']:.0f} | {mfu} |")  # fmt: skip
    lever_rows = [row for row in _ok(rows) if row["stage"] == "lever"]
    if lever_rows:
        lines += ["", f"### Levers (length {s.get('lever_length')}, {s.get('lever_sequences')} sequences per update)",
                  "", "| configuration | lever | micro x freq | tokens/s | vs plain | peak MB | MFU |",
                  "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for row in lever_rows:
            lines.append(f"| {row['key']} | {row['variant']} | {row['micro_batch']} x {row['update_freq']} | "
                         f"{row['tokens_per_s']:.0f} | {_fmt(row.get('vs_plain'))}x | {row['peak_memory_mb']:.0f} | "
                         f"{100 * row['mfu']:.1f}% |")  # fmt: skip
    if result.get("decoding"):
        lines += ["", f"### Decoding (beam {s.get('beam')}, sources of {s.get('source_tokens')} tokens)", "",
                  "| sentences per batch | target tokens | configuration | sentences/s | time vs transformer |",
                  "|---:|---:|---|---:|---:|"]  # fmt: skip
        for row in result["decoding"]:
            lines.append(f"| {row['sentences']} | {row['target_tokens']} | {row['label']} | "
                         f"{row['sentences_per_s']:.3f} | {_fmt(row.get('time_vs_transformer'))}x |")
    lines += ["", "### Targets (issue 24)", "", "| target | measured | threshold | result | how |", "|---|---:|---:|---|---|"]
    for t in result["targets"]:
        lines.append(f"| {t['target']} | {_fmt(t['value'], 3)} | {t['threshold']} | {t['status']} | {t['note']} |")
    if s["size"] == "tiny":
        lines += ["", "Tiny archs: these numbers show that the harness runs; the targets are judged on base-size runs."]
    skipped = [row for row in rows if row.get("status") == "skipped"]
    if result["missing"] or skipped:
        lines += ["", "### Left out", ""] + [f"- {m['key']}: {m['reason']}" for m in result["missing"]]
        lines += [f"- {row['key']} [{row['variant']}] length {row['length']}, {row['sequences']} sequences: "
                  f"{row['reason']}" for row in skipped]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(result: Dict, path: str):
    """MFU, tokens/s and peak memory against sequences per update (one line per configuration and length), and the
    levers' speed-ups."""
    from palm_tools.charts import pyplot

    plt = pyplot()

    rows = [row for row in _ok(result["sweep"]) if row["stage"] == "sweep"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    lengths = sorted({row["length"] for row in rows})
    styles = ["-", "--", ":", "-."]
    for ax, (field, title) in zip(axes.flat, [("mfu", "MFU (vs measured matmul)"), ("tokens_per_s", "tokens/s"),
                                              ("peak_memory_mb", "peak tensor memory (MB)")]):  # fmt: skip
        for key in dict.fromkeys(row["key"] for row in rows):
            for length, style in zip(lengths, styles):
                points = sorted((row["sequences"], row[field]) for row in rows
                                if row["key"] == key and row["length"] == length)  # fmt: skip
                if points:
                    ax.plot(*zip(*points), marker="o", linestyle=style, label=f"{key} {length}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequences per update")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes.flat[0].axhline(MFU_TARGET, color="grey", linestyle=":")
    axes.flat[0].legend(fontsize=7, ncol=2)
    ax = axes.flat[3]
    levers = [row for row in _ok(result["sweep"]) if row["stage"] == "lever" and row["variant"] != "plain"
              and row.get("vs_plain")]  # fmt: skip
    ax.barh([f"{row['key']}: {row['variant']}" for row in levers], [row["vs_plain"] for row in levers])
    ax.axvline(1.0, color="grey")
    ax.set_title("levers: tokens/s vs plain at the lever point")
    ax.tick_params(axis="y", labelsize=7)
    s = result["settings"]
    fig.suptitle(f"palm-bench --sweep ({s['size']}, {s.get('device')}, {s.get('precision')}), {result['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
