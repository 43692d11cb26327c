"""``palm-bench`` results: the targets (issue #7's on the CPU, issue #15's on a GPU), the markdown table, the JSON
record and the PNG chart.

A record is one run; ``palm-bench --merge-into`` replaces some of its rows by those of a later run (run 2, 3, ...:
``record["reruns"]``, each row's ``run``). Ratios are only taken between rows of the same run.
"""
import copy
import json
import statistics
from typing import Dict, List, Optional

from palm_tools.atomic_files import atomic_open

MB = 2**20


def median(values: List[float]) -> float:
    return statistics.median(values)


def _find(rows, key, **where) -> Optional[dict]:
    for row in rows:
        if row["key"] == key and all(row.get(k) == v for k, v in where.items()):
            return row
    return None


def _target(name, value, threshold, higher_is_better, note, *rows):
    """A target's verdict; ``rows``: the rows it is read from, whose run is named when it is a later one."""
    runs = sorted({row["run"] for row in rows if row is not None and row.get("run")})
    note += "".join(f" (run {run})" for run in runs)
    if value is None:
        return {"target": name, "value": None, "threshold": threshold, "status": "NOT MEASURED", "note": note}
    passed = value >= threshold if higher_is_better else value <= threshold
    return {"target": name, "value": value, "threshold": threshold, "status": "PASS" if passed else "MISS", "note": note}


def _ratio(numerator, denominator, field):
    if numerator is None or denominator is None or numerator.get("run") != denominator.get("run"):
        return None
    return numerator[field] / denominator[field]


def _sentence_counts(settings: Dict) -> List[int]:
    """The run's decoding batch sizes (records written before ``--sentences`` took several values hold one)."""
    sentences = settings.get("sentences", 1)
    return list(sentences) if isinstance(sentences, (list, tuple)) else [sentences]


def evaluate_targets(training: List[dict], decoding: List[dict], settings: Dict, data: List[dict] = ()) -> List[dict]:
    """The issues' targets, each from rows of this run: training at ``settings["reference_length"]``, decoding at
    the longest ``settings["target_tokens"]`` and each of ``settings["sentences"]``, ``data``: the data-pipeline
    rows. On a GPU (``settings["device"] == "cuda"``) issue #15's targets, on the CPU issue #7's."""
    length, target_tokens = settings["reference_length"], max(settings["target_tokens"])
    counts = _sentence_counts(settings)
    gpu = settings.get("device", "cpu") == "cuda"

    def train(key):
        return _find(training, key, length=length)

    def decode(key, sentences):
        return _find(decoding, key, target_tokens=target_tokens, sentences=sentences)

    at = f"training, length {length}"
    naive_lengths = [r["length"] for r in training if r["key"] == "naive_par" and r["length"] <= length]
    naive_length = max(naive_lengths) if naive_lengths else length

    def ratio_target(name, numerator, denominator, field, threshold, higher_is_better, note):
        return _target(name, _ratio(numerator, denominator, field), threshold, higher_is_better, note, numerator,
                       denominator)

    targets = [
        ratio_target("PALM (copy layer) step cost <= 1.15x fairseq transformer", train("transformer"), train("palm"),
                     "tokens_per_s", 1.15, False,
                     f"{at}: transformer tokens/s / palm tokens/s (both fine-tuning, translation task; the palm "
                     "--no-copy row separates the copy layer from the rest of PALM)"),
        ratio_target("PMLM AE+PAR <= 1.5x plain MLM", train("pmlm_mlm"), train("pmlm_ae_par"), "tokens_per_s",
                     1.5, False, f"{at}: MLM tokens/s / AE+PAR tokens/s (same unilm2 model and text)"),
    ]
    if gpu:
        for key in ("unilm_pretraining", "unilm_seq2seq"):
            targets.append(ratio_target(f"{key} step cost <= 1.1x fairseq roberta", train("roberta"), train(key),
                                        "tokens_per_s", 1.1, False,
                                        f"{at}: roberta tokens/s / {key} tokens/s (same tokens per update)"))
    else:
        targets.append(ratio_target(
            "PMLM AE+PAR >= 3x faster than naive per-step PAR", _find(training, "pmlm_ae_par", length=naive_length),
            _find(training, "naive_par", length=naive_length), "tokens_per_s", 3.0, True,
            f"training, length {naive_length} (the longest the naive baseline ran): AE+PAR tokens/s / naive tokens/s"))
    for version in ("unilm", "unilm2"):
        for sentences in counts:
            at = f"decoding, beam 5, {target_tokens} target tokens, {sentences} sentence(s) per batch"
            batch = f", batch {sentences}" if len(counts) > 1 else ""
            if gpu:
                targets.append(ratio_target(f"cached {version} decoding no slower than fairseq transformer{batch}",
                                            decode("transformer", sentences), decode(version, sentences),
                                            "sentences_per_s", 1.0, False,
                                            f"{at}: transformer sentences/s / {version} sentences/s"))
                continue
            targets.append(ratio_target(f"cached {version} decoding >= 3x faster than recomputation{batch}",
                                        decode(version, sentences), decode(f"{version}_recompute", sentences),
                                        "sentences_per_s", 3.0, True,
                                        f"{at}: cached sentences/s / recomputation sentences/s"))
            targets.append(ratio_target(f"cached {version} decoding within 1.3x of fairseq transformer{batch}",
                                        decode("transformer", sentences), decode(version, sentences),
                                        "sentences_per_s", 1.3, False,
                                        f"{at}: transformer sentences/s / {version} sentences/s"))
    if gpu:
        return targets
    for row in training:
        if row["length"] == length and row["plugin"] and row["key"] != "palm_nocopy":
            targets.append(_target(f"{row['key']} training >= 50% of measured matmul throughput", row["mfu"], 0.5,
                                   True, f"training, length {length}: model FLOPs utilisation", row))
    for row in data:
        if row["plugin"]:
            targets.append(_target(f"{row['key']} data pipeline >= 1M tokens/s per core", row["tokens_per_s"] / 1e6,
                                   1.0, True, f"dataset + collater, length {row['length']}, one thread: million "
                                   "tokens/s", row))
    return targets  # fmt: skip


METHOD = """### How it is measured

- **Builds.** Every configuration is built in-process the way `fairseq-train` builds it
  (`options.parse_args_and_arch` -> `tasks.setup_task` -> `task.build_model` / `task.build_criterion` -> fairseq's
  Adam), on random tokens written in fairseq's binarized format and batched by each task's own dataset, so the
  batches have the real layouts. Baselines have the plugin model's shape: fairseq `transformer` with PALM's layers,
  sizes, GELU, shared embeddings and dropout (12 + 12 layers, 768 / 3072 / 12 heads at base size); fairseq
  `roberta_base` (12 layers, 768) for UniLM. Vocabulary: the run's `vocab_size` (settings in the JSON).
- **Device and precision** are fairseq's own flags, applied as fairseq-train applies them: `--cpu` on the CPU;
  for `--bf16` / `--fp16` the model and criterion are converted to that dtype (as fairseq's Trainer does), the
  optimizer is fairseq's `FP16Optimizer` around Adam (fp32 master weights; a dynamic loss scale for fp16), and
  batches are moved with `utils.move_to_cuda`. Decoding models are converted to the same dtype and prepared with
  `prepare_for_inference_`, as fairseq-generate does for `--fp16` (fairseq-generate itself leaves a model in fp32
  under `--bf16`).
- **Training update**: `optimizer.zero_grad()`, `task.train_step` (criterion forward, backward), gradients divided
  by the sample size, the gradient norm (fairseq's `clip_grad_norm` with its default `--clip-norm 0`: computed, not
  clipped; the fp16 loss scaler's overflow check) and its finiteness check, `optimizer.step()`, dropout on.
  Wall-clock time of each update (on CUDA read after `torch.cuda.synchronize()`); one untimed warm-up update per
  configuration and length, then the timed updates of a group's configurations interleaved; median.
  **tokens/s** counts the text of the batch: source + target tokens for sequence-to-sequence rows, the original
  sequence for UniLMv2 (the appended pseudo and original tokens are cost, not text).
- **Peak memory**: live torch tensor bytes (parameters, gradients, Adam state, batch, activations, temporaries) over
  the warm-up update; not the Python heap nor memory the allocator keeps cached. On the CPU from the PyTorch
  profiler's memory timeline (`profile_memory=True`, `export_memory_timeline`); on CUDA the bytes the configuration
  holds between updates (parameters, fp32 master weights, gradients, Adam state) plus
  `torch.cuda.max_memory_allocated()` above the level before the update (after `reset_peak_memory_stats()`), so the
  other models of the group, resident on the same card, are not counted. The naive PAR baseline's peak is taken
  over its first two passes (every pass has the same shape).
- **FLOPs and MFU**: analytic count of the matrix products only, 2 FLOPs per multiply-add, 3x the forward pass
  per update: `6 * params * tokens` for every linear layer on the rows it is applied to, plus attention
  `12 * T_q * T_k * d` per layer over the full score matrix, plus output layers on the rows they predict
  (`palm_tools/bench/flops.py`; tests check it equals `torch.utils.flop_counter` on real updates). MFU =
  FLOPs per update / median update time / the machine limit: the best median `torch.mm` throughput in the
  training dtype measured on the device in the same run, on random operands (a square `gemm_size` GEMM and a
  feed-forward GEMM of `batch_sequences * reference_length` x 768 x 3072); on a GPU also against the datasheet peak
  `peak_tflops` (the H100 SXM's dense bf16 989.4 TFLOP/s by default).
- **Naive per-step PAR** (a baseline of this benchmark, not of the plugin): for UniLMv2's factorization steps
  M_1..M_K of the same batch, pass i feeds the text with steps < i restored and steps >= i corrupted, predicts M_i
  (pass 1 also predicts every masked token, the AE loss), backward after each pass, one update: K passes where
  PMLM needs one. It runs at lengths up to `naive_max_length`.
- **Data pipeline**: what a fairseq data-loader worker does, on one thread: `dataset[i]` for each example, then
  the task's `dataset.collater`, over consecutive batches, timed in process CPU seconds (per core, whatever else
  runs on the machine), for each task set up as `fairseq-train` sets it up
  (`load_dataset("train")` on the synthetic binarized data); every layout holds `data_length` tokens per example,
  so tokens/s = `data_length` x examples/s. fairseq's own `masked_lm` and `translation` are measured in the same
  run as reference points (`palm_tools/bench/pipeline.py`).
- **Decoding**: fairseq's `SequenceGenerator` (beam search) with `--min-len T --max-len-a 0 --max-len-b T`, so
  every hypothesis has exactly T tokens; random sources of `source_tokens` tokens, `sentences` per batch (one row
  per batch size). UniLM's *full recomputation*
  baseline is the same model and generator with the generator's incremental path switched off: the decoder then
  re-runs `[source | decoded tokens | placeholder]` every step (tests check both decode the same hypotheses).
- **Profiles** (`--profile-dir DIR`): one extra update of each training configuration at the reference length under
  `torch.profiler` (CPU and CUDA activities on a GPU); `DIR/<configuration>.txt` holds its operator table (top 25
  by self device time, then by self CPU time, on a GPU; by self CPU time on the CPU) and
  `DIR/traces/<configuration>.json.gz` its timeline (chrome://tracing, Perfetto).
"""


# Settings a later run must share with the record it is merged into, so that its rows are comparable with the
# record's (the number of timed repeats may differ: the headings give each run's).
COMPARABLE_SETTINGS = ("size", "batch_sequences", "vocab_size", "beam", "source_tokens", "device", "precision")
# what records written before a setting existed ran with
OLD_DEFAULTS = {"device": "cpu", "precision": "fp32"}


def check_comparable(settings: Dict, later: Dict):
    """Raise ValueError unless a run with the settings ``later`` can be merged into a record with ``settings``."""
    differing = [key for key in COMPARABLE_SETTINGS
                 if settings.get(key, OLD_DEFAULTS.get(key)) != later.get(key, OLD_DEFAULTS.get(key))]  # fmt: skip
    if differing:
        raise ValueError(f"cannot merge runs with different settings: {', '.join(differing)}; rerun with the "
                         "record's settings (its 'settings' entry) or write a new record without --merge-into")


# the fields that, with the key, name a row of each section
ROW_FIELDS = {"training": ("length",), "decoding": ("target_tokens", "sentences"), "data": ("length",)}


def merge(record: Dict, rerun: Dict) -> Dict:
    """``record`` with the rows of ``rerun`` (a later run of some configurations and lengths) in place of its rows
    of the same configuration and length (or target tokens and sentences); the rerun's command, date, machine and
    matmul limit are kept in ``reruns`` and its rows are marked with their run number (the record's own run is
    run 1)."""
    check_comparable(record["settings"], rerun["settings"])
    merged = copy.deepcopy(record)
    merged.setdefault("reruns", []).append(
        {key: rerun[key] for key in ("command", "date", "elapsed_s", "complete", "machine", "settings", "gemm")}
    )
    run = len(merged["reruns"]) + 1
    for section, fields in ROW_FIELDS.items():
        rows = merged.setdefault(section, [])
        for row in rerun.get(section, []):  # records written before a section existed lack it
            old = _find(rows, row["key"], **{field: row[field] for field in fields})
            new = dict(row, run=run)
            if old is None:
                rows.append(new)
            else:
                rows[rows.index(old)] = new
    measured = {row["key"] for row in rerun["training"] + rerun["decoding"] + rerun.get("data", [])}
    merged["missing"] = [m for m in merged["missing"] if m["key"] not in measured] + rerun["missing"]
    return merged


def finish(result: Dict):
    """Speed ratios to each row's baseline (measured in the same run) and the targets."""
    for section, speed in (("training", "tokens_per_s"), ("decoding", "sentences_per_s")):
        rows = result[section]
        for row in rows:
            where = {field: row[field] for field in ROW_FIELDS[section]}
            base = _find(rows, row["baseline"], run=row.get("run"), **where) if row["baseline"] else None
            row["speed_vs_baseline"] = row[speed] / base[speed] if base else None
            if base is None:
                row["baseline"] = None
    for row in result.get("data", []):
        base = _find(result["data"], "masked_lm", length=row["length"], run=row.get("run"))
        row["vs_masked_lm"] = row["tokens_per_s"] / base["tokens_per_s"] if base else None
    result["targets"] = evaluate_targets(result["training"], result["decoding"], result["settings"],
                                         result.get("data", []))


def _fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def _run_header(run: Dict) -> List[str]:
    """Command, machine, device, precision and matmul limit of one run."""
    m, gemm, s = run["machine"], run["gemm"], run["settings"]
    cut_short = "" if run.get("complete", True) else ", **cut short: the rows measured before it stopped**"
    lines = [f"Command: `{run['command']}` ({run['date']}, {run['elapsed_s'] / 60:.1f} min{cut_short})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, fairseq {m['fairseq']}, "
             f"Python {m['python']}; 1-minute load average {m.get('load_average_start', 0):.1f} at the start, "
             f"{m.get('load_average_end', 0):.1f} at the end (other processes share the cores)", ""]  # fmt: skip
    device, precision = s.get("device", "cpu"), s.get("precision", "fp32")
    mixed = "" if precision == "fp32" else f" (fairseq's --{precision}: the model in {precision}, fp32 master weights)"
    if device == "cuda":
        lines += [f"Device: {m['gpu']} ({m['gpu_memory_gb']} GiB, compute capability {m['gpu_capability']}), CUDA "
                  f"{m['cuda']}, cuDNN {m['cudnn']}; precision {precision}{mixed}.", ""]
    elif mixed:
        lines += [f"Precision: {precision} on the CPU{mixed}.", ""]
    threads = "" if device == "cuda" else f", {m['threads']} threads"
    lines += [f"Machine limit: {gemm.get('dtype', 'float32')} matmul on {device}, {gemm['peak_gflops']:.1f} GFLOP/s "
              "(best median of: " + ", ".join(f"{g['m']}x{g['k']}x{g['n']}: {g['gflops']:.1f}" for g in gemm["shapes"])
              + f"){threads}."]  # fmt: skip
    if s.get("peak_tflops"):
        lines[-1] += f" Datasheet peak: {s['peak_tflops']} TFLOP/s (`--peak-tflops`)."
    return lines + [""]


def _repeats(result: Dict, key: str) -> str:
    """The record's setting ``key`` (a number of timed repeats), and that of each later run where it differs."""
    value = result["settings"].get(key)  # records written before a setting existed lack it
    later = [f"run {run}: {rerun['settings'].get(key)}" for run, rerun in enumerate(result.get("reruns", []), start=2)
             if rerun["settings"].get(key) != value]  # fmt: skip
    return f"{value} ({', '.join(later)})" if later else str(value)


def _label(row: Dict) -> str:
    return f"{row['label']} [run {row['run']}]" if row.get("run") else row["label"]


def markdown(result: Dict) -> str:
    """The results as markdown tables."""
    s = result["settings"]
    lines = _run_header(result)
    for run, rerun in enumerate(result.get("reruns", []), start=2):
        lines += [f"**Run {run}**: the rows marked [run {run}] were measured again later, their MFU against that "
                  "run's matmul limit and their ratios against rows of the same run:", ""] + _run_header(rerun)
    datasheet = s.get("peak_tflops")
    gemm_dtype = result["gemm"].get("dtype", "float32")
    mfu_head = f"MFU vs measured {gemm_dtype} matmul" + (f" | MFU vs {datasheet} TFLOP/s datasheet" if datasheet else "")
    lines += [f"### Training: tokens/s, median of {_repeats(result, 'repeats')} updates (size {s['size']}, "
              f"{s['batch_sequences']} sequence(s) per update, {s.get('precision', 'fp32')})", "",
              f"| length | configuration | batch | tokens/s | vs baseline | peak MB | GFLOP/update | {mfu_head} |",
              "|---:|---|---:|---:|---|---:|---:|---:|" + ("---:|" if datasheet else "")]  # fmt: skip
    for row in result["training"]:
        versus = "-" if row["baseline"] is None else f"{_fmt(row['speed_vs_baseline'])}x speed of {row['baseline']}"
        mfu = f"{100 * row['mfu']:.1f}%"
        if datasheet:
            mfu += " | -" if row.get("mfu_datasheet") is None else f" | {100 * row['mfu_datasheet']:.1f}%"
        lines.append(
            f"| {row['length']} | {_label(row)} | {row['batch_sequences']} | {row['tokens_per_s']:.1f} | {versus} "
            f"| {row['peak_memory_mb']:.0f} | {row['flops_per_update'] / 1e9:.1f} | {mfu} |"
        )
    skipped = [f"{row['key']} at {row['length']}: {row['overflow_skips']}" for row in result["training"]
               if row.get("overflow_skips")]  # fmt: skip
    if skipped:
        lines += ["", "fp16 updates skipped by the loss scaler (overflow; timed as run): " + ", ".join(skipped)]
    lines += ["", f"### Decoding: sentences/s, beam {s['beam']}, sources of {s['source_tokens']} tokens, median of "
              f"{_repeats(result, 'decode_repeats')} generations", "",
              "| sentences per batch | target tokens | configuration | sentences/s | s/sentence | vs baseline |",
              "|---:|---:|---|---:|---:|---|"]  # fmt: skip
    for row in result["decoding"]:
        versus = "-" if row["baseline"] is None else f"{_fmt(row['speed_vs_baseline'])}x speed of {row['baseline']}"
        lines.append(f"| {row['sentences']} | {row['target_tokens']} | {_label(row)} | {row['sentences_per_s']:.3f} "
                     f"| {1 / row['sentences_per_s']:.3f} | {versus} |")
    if result.get("data"):
        first = result["data"][0]
        lines += ["", f"### Data pipeline: each task's dataset + collater on one thread, batches of {first['batch']}, "
                  f"median of {_repeats(result, 'data_repeats')} passes over {first['examples']} examples", "",
                  "| length | configuration | examples/s | tokens/s | vs fairseq masked_lm |",
                  "|---:|---|---:|---:|---:|"]
        for row in result["data"]:
            lines.append(f"| {row['length']} | {_label(row)} | {row['examples_per_s']:.0f} | "
                         f"{row['tokens_per_s'] / 1e6:.2f}M | {_fmt(row['vs_masked_lm'])}x |")
    issue = "issue #15, on the GPU" if s.get("device", "cpu") == "cuda" else "issue #7, on the CPU"
    lines += ["", f"### Targets ({issue})", "", "| target | measured | threshold | result | how |",
              "|---|---:|---:|---|---|"]
    for t in result["targets"]:
        lines.append(f"| {t['target']} | {_fmt(t['value'], 3)} | {t['threshold']} | {t['status']} | {t['note']} |")
    if s["size"] == "tiny":
        lines += ["", "Tiny archs: these numbers show that the harness runs; the targets are judged on base-size runs."]
    if result["missing"]:
        lines += ["", "### Left out", ""] + [f"- {m['key']}: {m['reason']}" for m in result["missing"]]
    return "\n".join(lines) + "\n"  # fmt: skip


def write_json(result: Dict, path: str):
    """Replace the record at ``path`` whole: it is rewritten after each step, and a run killed while writing it
    must keep the steps saved before."""
    with atomic_open(path) as f:
        json.dump(result, f, indent=1)


def plot(result: Dict, path: str):
    """Four panels: training tokens/s, peak memory and MFU against length; decoding sentences/s."""
    from palm_tools.charts import pyplot

    plt = pyplot()

    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    keys = list(dict.fromkeys(row["key"] for row in result["training"]))
    panels = [("tokens_per_s", "training tokens/s", True), ("peak_memory_mb", "peak tensor memory (MB)", True),
              ("mfu", "model FLOPs utilisation", False)]  # fmt: skip
    for ax, (field, title, log) in zip(axes.flat, panels):
        for key in keys:
            rows = [r for r in result["training"] if r["key"] == key]
            ax.plot([r["length"] for r in rows], [r[field] for r in rows], marker="o", label=key,
                    linestyle="-" if rows[0]["plugin"] else "--")  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("sequence length")
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes.flat[2].axhline(0.5, color="grey", linestyle=":")
    axes.flat[0].legend(fontsize=8)
    ax = axes.flat[3]
    decode_keys = list(dict.fromkeys(row["key"] for row in result["decoding"]))
    shapes = sorted({(row["sentences"], row["target_tokens"]) for row in result["decoding"]})
    width = 0.8 / max(len(decode_keys), 1)
    for i, key in enumerate(decode_keys):
        values = [(_find(result["decoding"], key, sentences=n, target_tokens=t) or {}).get("sentences_per_s", 0)
                  for n, t in shapes]  # fmt: skip
        ax.bar([j + i * width for j in range(len(shapes))], values, width, label=key)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))],
                  [f"batch {n}, {t} target tokens" for n, t in shapes])
    ax.set_yscale("log")
    ax.set_title(f"decoding sentences/s (beam {result['settings']['beam']})")
    ax.legend(fontsize=8)
    where = f"{result['settings'].get('device', 'cpu')}, {result['settings'].get('precision', 'fp32')}"
    fig.suptitle(f"palm-bench ({result['settings']['size']}, {where}), {result['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
