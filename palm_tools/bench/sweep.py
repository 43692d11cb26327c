"""``palm-bench --sweep``: training speed, memory and MFU against sequences per update, and the speed levers on and
off (issue 24).

**Sweep.** For each configuration of :data:`~palm_tools.bench.models.TRAIN_SPECS` (the naive PAR baseline aside), at
each ``--lengths`` and ``--sequences`` (sequences per update): one warm-up update (its peak memory), then
``--repeats`` timed updates, median. An update of S sequences runs as S / m micro-batches of m sequences (fairseq's
``--update-freq``: forward and backward per micro-batch, one optimizer step); m is S unless a micro-batch of that
size ran out of device memory, then half the size that did. With ``--find-max``, the largest micro-batch that fits
is searched next: a line through the measured peaks (peak = resident + m x per-sequence memory) predicts it, the
prediction is tried and, on out-of-memory, lowered by a fifth until it fits; its row is marked ``largest``. A run
with ``--memory-limit-mb`` treats a warm-up peak above the limit as out-of-memory (the CPU has no card to fill).

**Levers** (``--levers``, :data:`LEVERS`): at ``--lever-length`` and ``--lever-sequences``, each configuration is
measured plain and with each lever that applies to it, one model at a time, side by side (the ratio in the report
is to that plain row). Each lever is a command-line option of the plugin (or, for fairseq's baselines, the same
thing done by the benchmark), off by default; ``fairseq_loops`` is the other way round: fairseq's own loops, which the
plugin replaces.

Rows go to ``result["sweep"]``; the record is saved after each row. ``--time-budget-min`` (counted from the start of
the run, decoding included) skips the rows not started when it is spent (recorded as skipped), so that a card run
ends in its slot with what it measured.
"""
import contextlib
import importlib
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, ContextManager, Dict, Optional

import torch
from fairseq.data import iterators

from palm_plugin.fixes.multi_tensor_optimizer import use_fairseq_loops
from palm_plugin.modules import lm_head
from palm_plugin.modules.activation_checkpoints import checkpoint_layers
from palm_plugin.modules.compiled_layers import compile_layers
from palm_tools.bench.models import TRAIN_SPECS, build, prepare_sample
from palm_tools.bench.runlog import free_device_memory, log, record_failure, short_error, wanted
from palm_tools.bench.train import MB, TrainStep, median, peak_memory_bytes, timed, write_profile

SWEPT = [spec for spec in TRAIN_SPECS if spec.key != "naive_par"]
SPECS = {spec.key: spec for spec in SWEPT}
# BERT-style UniLM pre-training (bidirectional rows only): the one configuration whose masks can hide nothing
UNILM_BIDIRECTIONAL = replace(
    SPECS["unilm_pretraining"], key="unilm_bidirectional", label="unilm, unilm_pretraining, bidirectional rows only",
    args=lambda size, length: SPECS["unilm_pretraining"].args(size, length) + ["--objective-probs", "1,0,0,0"],
    baseline="roberta")
SAFETY = 0.92  # share of the device memory the largest micro-batch may fill (the allocator's cache, fragmentation)


def _criterion(spec) -> str:
    args = spec.args("tiny", 64)
    return args[args.index("--criterion") + 1]


def _fairseq_layers(built):
    """The Transformer layers of a fairseq baseline (encoder and decoder), which --compile-layers cannot reach."""
    model = built.model
    encoder = getattr(model.encoder, "sentence_encoder", model.encoder)
    return list(encoder.layers) + list(getattr(getattr(model, "decoder", None), "layers", []))


@dataclass
class Lever:
    name: str
    label: str
    applies: Callable = lambda spec: True
    args: Callable = lambda spec: []
    after_build: Optional[Callable] = None  # what the benchmark does itself (fairseq's baselines)
    loader: bool = False  # batches drawn per update from fairseq's iterator (loader_workers: ``--loader-workers``)
    compiles: bool = False  # torch.compile runs in its first updates: warmed up before the peak memory is taken
    setting: Callable[[], ContextManager] = contextlib.nullcontext  # a module's switch, set for this row only
    unchanged: Callable = lambda built: None  # why the lever would measure the plain row again, if it would


def _on_baseline_layers(wrap):
    """The ``after_build`` of a lever whose option fairseq's models lack (fairseq 0.12's RoBERTa and transformer have
    no --compile-layers or --checkpoint-activations): the benchmark wraps the layers of the baselines with the plugin's
    own ``wrap``, so that each row is measured against the same change."""
    def after_build(built):
        if not built.spec_plugin:
            wrap(_fairseq_layers(built))

    return after_build


def _compile_args(spec):
    return ["--compile-layers"] if spec.plugin else []


_compile_baseline = _on_baseline_layers(compile_layers)


def _checkpoint_args(spec):
    return ["--checkpoint-activations"] if spec.plugin else []


def _compile_copy_args(spec):
    return ["--copy-attention-impl", "compiled"] if spec.key == "palm" else []


def _arch(spec) -> str:
    args = spec.args("tiny", 64)
    return args[args.index("--arch") + 1]


def _flex_args(spec):
    """--attention-impl flex, for the UniLM family (FlexAttention has no attention dropout: it needs 0, which its
    fair baseline is the no_attention_dropout lever)."""
    return ["--attention-impl", "flex", "--attention-dropout", "0"] if spec.plugin and _arch(spec).startswith(
        "unilm") else []


def _triton_attention_args(spec):
    """--attention-impl triton, for the UniLM family (with the configuration's attention dropout, which the kernels
    draw: the plain row is its baseline)."""
    return ["--attention-impl", "triton"] if _flex_args(spec) else []


def _module_setting(module: str, name: str, value):
    """A lever's ``setting``: ``palm_plugin.modules.<module>.<name>`` set to ``value`` while its row runs, and set back
    after it, so that one row's choice never reaches the next."""
    @contextlib.contextmanager
    def setting():
        switched = importlib.import_module(f"palm_plugin.modules.{module}")
        saved = getattr(switched, name)
        setattr(switched, name, value)
        try:
            yield
        finally:
            setattr(switched, name, saved)

    return setting


def _flex_shapes(shapes):
    """How FlexAttention compiles on CUDA in a flex lever's row: for every shape or for the batch's."""
    return _module_setting("flex_attention", "CUDA_SHAPES", shapes)


def _triton_copy_args(spec):
    return ["--copy-attention-impl", "triton"] if spec.key == "palm" else []


def _aligned_already(built):
    types = len(built.task.source_dictionary)
    if types % lm_head.ROW_MULTIPLE == 0:
        return f"{types} types, a multiple of {lm_head.ROW_MULTIPLE}: nothing to pad"
    return None


def _syncs_args(spec):
    """--syncs-at-start: an option of the UniLM criteria and of the palm model; fairseq's baselines have none."""
    return ["--syncs-at-start"] if spec.plugin and (_criterion(spec) in ("unilm_cloze", "pmlm_ae_par")
                                                    or spec.key.startswith("palm")) else []


LEVERS = {
    "fairseq_loops": Lever("fairseq_loops", "fairseq's per-parameter loops in Adam, the mixed-precision master copy and "
                           "the gradient norm (the baseline of palm_plugin/fixes/multi_tensor_optimizer.py)",
                           after_build=lambda built: use_fairseq_loops(built.optimizer)),
    "torch_adamw": Lever("torch_adamw", "--optimizer torch_adamw (fused AdamW)",
                         args=lambda spec: ["--optimizer", "torch_adamw"]),
    "compile": Lever("compile", "--compile-layers (torch.compile of each layer; baselines: the same, by the benchmark)",
                     args=_compile_args, after_build=_compile_baseline, compiles=True),
    "syncs_at_start": Lever("syncs_at_start", "--syncs-at-start (UniLM criteria, palm encoder: host syncs first)",
                            applies=lambda spec: bool(_syncs_args(spec)), args=_syncs_args),
    "drop_full_masks": Lever("drop_full_masks", "--drop-full-masks (no attention mask when it hides nothing: flash)",
                             applies=lambda spec: spec.key == "unilm_bidirectional",
                             args=lambda spec: ["--drop-full-masks"]),
    "compile_copy": Lever("compile_copy", "--copy-attention-impl compiled (equation (3) in fused compiled kernels)",
                          applies=lambda spec: bool(_compile_copy_args(spec)), args=_compile_copy_args,
                          compiles=True),
    "no_attention_dropout": Lever("no_attention_dropout", "--attention-dropout 0 (the sdpa baseline of flex, which has "
                                  "no attention dropout)", applies=lambda spec: bool(_flex_args(spec)),
                                  args=lambda spec: ["--attention-dropout", "0"]),
    "flex": Lever("flex", "--attention-impl flex --attention-dropout 0 (FlexAttention: block masks skip hidden tiles, "
                          "UniLMv2's bias inside the kernel)", applies=lambda spec: bool(_flex_args(spec)),
                  args=_flex_args, setting=_flex_shapes("dynamic"), compiles=True),
    "flex_static": Lever("flex_static", "flex compiled for the batch's shape, not for every shape (an experiment: "
                                        "inductor's kernels without bound checks where lengths are multiples of 128)",
                         applies=lambda spec: bool(_flex_args(spec)), args=_flex_args,
                         setting=_flex_shapes("static"), compiles=True),
    "triton_attention": Lever("triton_attention", "--attention-impl triton (the plugin's Triton kernels: hidden "
                              "tiles skipped, UniLMv2's bias and the attention dropout inside the kernels)",
                              applies=lambda spec: bool(_triton_attention_args(spec)), args=_triton_attention_args),
    "triton_copy": Lever("triton_copy", "--copy-attention-impl triton (equation (3) in hand-written Triton kernels)",
                         applies=lambda spec: bool(_triton_copy_args(spec)), args=_triton_copy_args),
    "blocked_copy": Lever("blocked_copy", "--copy-attention-impl blocked (torch's kernels in blocks: the CPU's path, "
                          "and CUDA's default before auto chose triton there)",
                          applies=lambda spec: spec.key == "palm",
                          args=lambda spec: ["--copy-attention-impl", "blocked"]),
    "unaligned_vocabulary": Lever("unaligned_vocabulary", "the vocabulary products with the embedding matrix as it is, "
                                  "not padded to 64 rows (the baseline of palm_plugin/modules/lm_head.py)",
                                  applies=lambda spec: spec.plugin,
                                  setting=_module_setting("lm_head", "ROW_MULTIPLE", 1),
                                  unchanged=_aligned_already),
    "checkpoint_activations": Lever("checkpoint_activations", "--checkpoint-activations (each layer's activations "
                                    "recomputed in the backward pass: memory for time; baselines: the same, by the "
                                    "benchmark)", args=_checkpoint_args,
                                    after_build=_on_baseline_layers(checkpoint_layers)),
    "loader": Lever("loader", "batches from fairseq's iterator, pinned memory, 0 workers", loader=True),
    "loader_workers": Lever("loader_workers", "batches from fairseq's iterator, pinned memory, --loader-workers workers",
                            loader=True),
    "all": Lever("all", "torch_adamw + compile + compile_copy + syncs_at_start together",
                 args=lambda spec: ["--optimizer", "torch_adamw"] + _compile_args(spec) + _compile_copy_args(spec)
                 + _syncs_args(spec),
                 after_build=_compile_baseline, compiles=True),
    "all_kernels": Lever("all_kernels", "torch_adamw + compile + syncs_at_start + flex + triton_copy: the candidate "
                                        "CUDA defaults of issue 38",
                         args=lambda spec: ["--optimizer", "torch_adamw"] + _compile_args(spec) + _syncs_args(spec)
                         + _flex_args(spec) + _triton_copy_args(spec),
                         after_build=_compile_baseline, setting=_flex_shapes("dynamic"), compiles=True),
    "all_triton": Lever("all_triton", "torch_adamw + compile + syncs_at_start + triton_attention + triton_copy: all with "
                                      "the plugin's own kernels",
                        args=lambda spec: ["--optimizer", "torch_adamw"] + _compile_args(spec) + _syncs_args(spec)
                        + _triton_attention_args(spec) + _triton_copy_args(spec),
                        after_build=_compile_baseline, compiles=True),
}  # fmt: skip


class OutOfMemory(Exception):
    """A micro-batch did not fit: CUDA's out-of-memory error, or a warm-up peak above ``--memory-limit-mb``."""


class AccumulatedStep(TrainStep):
    """One update of several micro-batches (fairseq's ``--update-freq``): forward and backward per micro-batch,
    gradients summed, one optimizer step over the summed sample size."""

    def __init__(self, spec, built, batches):
        super().__init__(spec, built, batches[0])
        self.batches = batches

    @property
    def text_tokens(self) -> int:
        pad = self.built.task.source_dictionary.pad()
        return sum(self.spec.text_tokens(batch, pad) for batch in self.batches)

    @property
    def flops(self) -> float:
        return sum(self.spec.flops(self.built, batch) for batch in self.batches)

    def backward(self):
        """Forward and backward of every micro-batch, gradients summed; returns the summed sample size."""
        b = self.built
        sample_size = 0
        for batch in self.batches:
            _, size, _ = b.task.train_step(batch, b.model, b.criterion, b.optimizer, self.updates)
            sample_size += size
        return sample_size

    def __call__(self):
        self.built.optimizer.zero_grad()
        self._update(self.backward())


class LoaderStep(AccumulatedStep):
    """An update whose micro-batches come from fairseq's own batch iterator, as in fairseq-train: its DataLoader pins
    memory, ``workers`` processes build batches ahead (0: the main process builds each when it is needed), and the
    batches move to the device with ``non_blocking``. The time of an update includes waiting for them."""

    def __init__(self, spec, built, micro, update_freq, workers):
        task = built.task
        task.load_dataset("train")
        epoch_itr = task.get_batch_iterator(task.dataset("train"), max_sentences=micro, ignore_invalid_inputs=True,
                                            num_workers=workers, data_buffer_size=10, epoch=1)  # fmt: skip
        self.iterator = iterators.GroupedIterator(epoch_itr.next_epoch_itr(shuffle=False), update_freq)
        super().__init__(spec, built, [None])

    def __call__(self):
        self.batches = [prepare_sample(sample, self.built) for sample in next(self.iterator)]
        super().__call__()


def load_batches(built, micro: int, count: int):
    """``count`` micro-batches of ``micro`` consecutive examples of the task's ``train`` split, collated by the task's
    dataset and prepared for the device and precision."""
    built.task.load_dataset("train")
    dataset = built.task.dataset("train")
    if len(dataset) < micro * count:
        raise RuntimeError(f"synthetic data has {len(dataset)} examples, {micro * count} needed")
    return [prepare_sample(dataset.collater([dataset[i] for i in range(first, first + micro)]), built)
            for first in range(0, micro * count, micro)]  # fmt: skip


@dataclass
class Fit:
    """What is known of the micro-batches of one configuration and length: the peaks of those that fit, and the
    smallest that did not."""

    peaks: Dict[int, float] = field(default_factory=dict)
    fails: Optional[int] = None

    @property
    def fits(self) -> int:
        return max(self.peaks, default=0)

    def micro_for(self, sequences: int) -> int:
        """The micro-batch to try first for ``sequences`` per update: the largest halving of it below a failure."""
        micro = sequences
        while self.fails is not None and micro >= self.fails and micro > 1:
            micro //= 2
        return micro

    def predict(self, capacity: float) -> int:
        """The largest micro-batch whose peak a line through the two largest measured peaks puts below ``SAFETY x
        capacity`` bytes (one peak: all of it counted per sequence, which under-estimates the size), below a fifth
        under the smallest failure."""
        points = sorted(self.peaks.items())
        large, high = points[-1]
        per_sequence = high / large
        if len(points) > 1:
            small, low = points[-2]
            per_sequence = (high - low) / (large - small)
        guess = large + int((SAFETY * capacity - high) / max(per_sequence, 1.0))
        if self.fails is not None:
            guess = min(guess, int(0.8 * self.fails))
        return round_down(guess)


def round_down(micro: int) -> int:
    """Micro-batches of 16 or more are taken in multiples of 8 (the shapes tensor cores like)."""
    return micro - micro % 8 if micro >= 16 else max(micro, 1)


def device_capacity(args) -> Optional[float]:
    """Bytes the largest micro-batch may be sized against: ``--memory-limit-mb``, else the card's memory."""
    if args.memory_limit_mb:
        return args.memory_limit_mb * MB
    if args.device == "cuda":
        return float(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    return None


def measure_sweep(args, corpus, result, checkpoint):
    """The sweep, then the levers (module docstring); rows appended to ``result["sweep"]``, ``checkpoint()`` after
    each."""
    started = getattr(args, "started", None) or time.monotonic()  # the run's start: decoding counts too
    budget = args.time_budget_min * 60 if args.time_budget_min else None
    sweep = Sweep(args, corpus, result, checkpoint, lambda: budget is not None and time.monotonic() - started > budget)
    fits = {}
    for spec in SWEPT:
        if wanted(args, spec.key):
            fits.update(sweep.configuration(spec))
    for spec, levers in lever_plan(args):
        same_memory = "unilm_pretraining" if spec is UNILM_BIDIRECTIONAL else spec.key
        sweep.levers(spec, levers, fits.get((same_memory, args.lever_length), Fit()))


def lever_plan(args):
    """``[(configuration, its levers)]`` the sweep measures, in the order of ``--lever-configs`` (a budget cuts the
    last); ``--only`` bounds them as it bounds the sweep (``unilm_bidirectional`` goes with ``unilm_pretraining``)."""
    every = {spec.key: spec for spec in SWEPT + [UNILM_BIDIRECTIONAL]}
    plan = []
    for spec in [every[key] for key in args.lever_configs or every]:
        if not wanted(args, "unilm_pretraining" if spec is UNILM_BIDIRECTIONAL else spec.key):
            continue
        levers = [LEVERS[name] for name in args.levers if LEVERS[name].applies(spec)]
        if spec is UNILM_BIDIRECTIONAL:  # measured for the one lever that needs it
            levers = [lever for lever in levers if lever.name == "drop_full_masks"]
        if levers:
            plan.append((spec, levers))
    return plan


def describe_plan(args):
    """What ``--sweep`` will measure, in words, with its size (the rows it times) and its bound in time: printed
    before the first measurement, so a run that is not the one wanted can be stopped at once."""
    swept = [spec.key for spec in SWEPT if wanted(args, spec.key)]
    points = len(swept) * len(args.lengths) * len(args.sequences)
    levers = lever_plan(args)
    lever_rows = sum(len(chosen) + 1 for _, chosen in levers)  # each configuration's plain row, then one per lever
    lines = [f"sweep: {', '.join(swept) or 'no configuration'} at lengths {' '.join(map(str, args.lengths))} and "
             f"{' '.join(map(str, args.sequences))} sequences per update: {points} rows"
             + (", and the largest micro-batch of each length" if args.find_max else ""),
             "levers: " + ("; ".join(f"{spec.key}: {', '.join(lever.name for lever in chosen)}"
                                     for spec, chosen in levers) + f": {lever_rows} rows" if levers else "none")]
    budget = (f"rows not started after {args.time_budget_min:g} min are skipped" if args.time_budget_min else
              "no time budget (--time-budget-min): every row runs")
    lines.append(f"estimate: {points + lever_rows} timed rows of {args.repeats} updates each (plus a warm-up); {budget}")
    return lines


class Sweep:
    def __init__(self, args, corpus, result, checkpoint, over_budget):
        self.args, self.corpus, self.checkpoint, self.over_budget = args, corpus, checkpoint, over_budget
        self.rows, self.missing = result["sweep"], result["missing"]
        self.capacity = device_capacity(args)
        self.examples = max(max(args.sequences), args.lever_sequences) * (1 + args.repeats) + 8
        self._last_step = None

    def _build(self, spec, length, extra=(), reuse=None):
        where = dict(device=self.args.device, precision=self.args.precision)
        built = build(self.corpus.path(spec.layout, length, self.examples), spec.args(self.args.size, length)
                      + list(extra), reuse=reuse, **where)  # fmt: skip
        built.spec_plugin = spec.plugin
        return built

    def configuration(self, spec):
        """Every length and sequences-per-update point of one configuration, plain; returns its :class:`Fit` per
        length."""
        fits = {}
        try:
            model = self._build(spec, max(self.args.lengths))
        except Exception as error:
            record_failure(self.missing, spec.key, "build", error)
            return fits
        for length in self.args.lengths:
            fit = fits[spec.key, length] = Fit()
            try:
                built = self._build(spec, length, reuse=model)
            except Exception as error:
                record_failure(self.missing, spec.key, f"length {length}, build", error)
                continue
            for sequences in self.args.sequences:
                self.point(spec, built, length, sequences, fit, "plain")
            if self.args.find_max:
                self.largest(spec, built, length, fit)
        del model
        free_device_memory()
        return fits

    def levers(self, spec, levers, fit):
        """Plain and each lever at the lever point, one model at a time."""
        length, sequences = self.args.lever_length, self.args.lever_sequences
        for lever in [Lever("plain", "plain")] + levers:
            if self.over_budget():
                self._skip(spec, length, sequences, lever.name)
                continue
            try:
                built = self._build(spec, length, lever.args(spec))
                if lever.after_build:
                    lever.after_build(built)
                built.compiled = lever.compiles
            except Exception as error:
                record_failure(self.missing, f"{spec.key} {lever.name}", f"length {length}, build", error)
                continue
            reason = lever.unchanged(built)
            if reason:
                self._skip(spec, length, sequences, lever.name, reason)
            else:
                workers = self.args.loader_workers if lever.name == "loader_workers" else 0
                with lever.setting():
                    self.point(spec, built, length, sequences, fit, lever.name, loader=lever.loader, workers=workers,
                               stage="lever")  # fmt: skip
            del built
            free_device_memory()

    def largest(self, spec, built, length, fit):
        """Search the largest micro-batch that fits (module docstring) and measure it as one update."""
        if self.capacity is None or not fit.peaks:
            return
        for _ in range(4):
            micro = min(fit.predict(self.capacity), self.examples)
            if micro <= fit.fits:
                break
            if self.point(spec, built, length, micro, fit, "plain", how="largest") is not None:
                return
        self.point(spec, built, length, fit.fits, fit, "plain", how="largest")  # none above it fits

    def _skip(self, spec, length, sequences, variant, reason="time budget spent"):
        self.rows.append({"key": spec.key, "label": spec.label, "variant": variant, "length": length,
                          "sequences": sequences, "status": "skipped", "reason": reason})  # fmt: skip

    def point(self, spec, built, length, sequences, fit, variant, how="requested", loader=False, workers=0,
              stage=None):
        """Measure one point, halving the micro-batch on out-of-memory; the row (None if nothing fitted)."""
        stage = stage or ("sweep" if variant == "plain" else "lever")
        if self.over_budget():
            self._skip(spec, length, sequences, variant)
            return None
        micro = fit.micro_for(sequences) if how == "requested" else sequences
        while True:
            log(f"sweep {spec.key} [{variant}] length {length}: {sequences} sequences per update "
                f"({micro} x {sequences // micro})")
            try:
                row = self._measure(spec, built, length, micro, sequences // micro, loader, workers)
            except OutOfMemory as error:
                fit.fails = micro if fit.fails is None else min(fit.fails, micro)
                log(f"sweep {spec.key}: {micro} sequences per micro-batch do not fit ({error})")
                free_device_memory()
                if how != "requested" or micro == 1:
                    return None
                micro //= 2
                continue
            except Exception as error:
                record_failure(self.missing, f"{spec.key} {variant}", f"length {length}, {sequences} sequences", error)
                return None
            if variant == "plain" and not loader:
                fit.peaks[micro] = row["peak_memory_mb"] * MB
            row.update(key=spec.key, label=spec.label, group=spec.group, plugin=spec.plugin, baseline=spec.baseline,
                       variant=variant, stage=stage, how=how, status="ok", length=length, sequences=sequences,
                       precision=self.args.precision)  # fmt: skip
            self.rows.append(row)
            self.checkpoint()
            if self.args.profile_dir and stage == "sweep" and how == "requested" and (
                    length, sequences) == (self.args.lever_length, self.args.profile_sequences):
                self._profile(spec, row, spec.key)
            elif self.args.profile_dir and stage == "lever" and variant in self.args.profile_levers:
                self._profile(spec, row, f"{spec.key}_{variant}")
            return row

    def _measure(self, spec, built, length, micro, update_freq, loader, workers):
        step = self._last_step = None
        try:
            if loader:
                step = LoaderStep(spec, built, micro, update_freq, workers)
            else:
                step = AccumulatedStep(spec, built, load_batches(built, micro, update_freq))
            for _ in range(2 if getattr(built, "compiled", False) else 0):
                step()  # compiling (and its first recompile) happens here, outside the profiler of the CPU's peak
            built.optimizer.zero_grad()
            peak = peak_memory_bytes(step)
            if self.args.memory_limit_mb and peak > self.args.memory_limit_mb * MB:
                raise OutOfMemory(f"peak {peak / MB:.0f} MB above --memory-limit-mb {self.args.memory_limit_mb}")
            times = [timed(step) for _ in range(self.args.repeats)]
        except torch.cuda.OutOfMemoryError as error:
            raise OutOfMemory(short_error(error)) from None
        finally:
            if step is not None:
                built.optimizer.zero_grad()
        self._last_step = step
        seconds = median(times)
        flops, tokens = step.flops, step.text_tokens
        return {"micro_batch": micro, "update_freq": update_freq, "loader_workers": workers if loader else None,
                "text_tokens": tokens, "times_s": times, "median_s": seconds, "tokens_per_s": tokens / seconds,
                "peak_memory_mb": peak / MB, "flops_per_update": flops, "achieved_gflops": flops / seconds / 1e9,
                "mfu": flops / seconds / 1e9 / self.args.peak_gflops,
                "mfu_datasheet": flops / seconds / 1e12 / self.args.peak_tflops if self.args.peak_tflops else None,
                "overflow_skips": step.overflows}  # fmt: skip

    def _profile(self, spec, row, name):
        step = self._last_step
        header = (f"{name}: {spec.label}\nlength {row['length']}, {row['sequences']} sequences per update "
                  f"({row['micro_batch']} x {row['update_freq']}), {self.args.precision} on {self.args.device}; "
                  f"median update {row['median_s']:.4f} s")  # fmt: skip
        try:
            os.makedirs(self.args.profile_dir, exist_ok=True)
            write_profile(step, os.path.join(self.args.profile_dir, f"{name}.txt"), header)
        except Exception as error:
            record_failure(self.missing, spec.key, "profile", error)
