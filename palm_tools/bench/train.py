"""Training measurements of ``palm-bench``: one real fairseq update per call, its time and its peak memory.

A step is what ``fairseq-train``'s trainer does per update: ``optimizer.zero_grad()``, ``task.train_step``
(forward through the criterion, backward), gradients divided by the sample size, the gradient norm
(``clip_grad_norm(0)``: computed, not clipped; with fp16 it is the loss scaler's overflow check) and the check that
it is finite, ``optimizer.step()`` (fairseq's Adam, wrapped in ``FP16Optimizer`` for bf16 / fp16). Batches are
built once, before timing. On CUDA the clock is read after ``torch.cuda.synchronize()``.

Peak memory is the peak of live torch tensor bytes (parameters, gradients, Adam state, batch, activations and
temporaries) during one update, on the untimed warm-up update. On the CPU it is taken from the PyTorch
profiler's memory timeline (``profile_memory=True``; ``export_memory_timeline``); on CUDA from the caching
allocator's counters (:func:`peak_cuda_bytes`). It counts what torch allocates, not the Python heap nor memory the
allocator keeps cached; ``tracemalloc`` cannot see torch tensors, and a process's peak RSS would mix
configurations measured in one process.

:class:`NaivePARStep` is the benchmark's own baseline for UniLMv2's partially autoregressive loss, not part of the
plugin: one forward and backward pass per factorization step, the cost PMLM's pseudo masks avoid.
"""
import gc
import json
import os
import statistics
import tempfile
import time
from itertools import chain

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from palm_plugin.modules.attention_masks import PseudoMaskKind
from palm_tools.bench.flops import encoder_only_step, synchronize
from palm_tools.bench.models import TRAIN_SPECS, build, load_batch
from palm_tools.bench.runlog import log, record_failure, wanted

MB = 2**20
median = statistics.median


class TrainStep:
    """One fairseq update of ``built`` (:class:`palm_tools.bench.models.Built`) on ``batch``."""

    def __init__(self, spec, built, batch):
        self.spec, self.built, self.batch = spec, built, batch
        self.updates = 0
        self.overflows = 0  # fp16 updates skipped by the loss scaler

    @property
    def text_tokens(self) -> int:
        return self.spec.text_tokens(self.batch, self.built.task.source_dictionary.pad())

    @property
    def flops(self) -> float:
        return self.spec.flops(self.built, self.batch)

    def __call__(self):
        b = self.built
        b.optimizer.zero_grad()
        _, sample_size, _ = b.task.train_step(self.batch, b.model, b.criterion, b.optimizer, self.updates)
        self._update(sample_size)

    def _update(self, sample_size):
        """What fairseq's trainer does after the backward pass (with its default ``--clip-norm 0``)."""
        optimizer = self.built.optimizer
        optimizer.multiply_grads(1.0 / float(sample_size or 1))
        try:
            grad_norm = optimizer.clip_grad_norm(0.0)
        except OverflowError:  # fp16: the loss scale is lowered and the update skipped, as the trainer does
            self.overflows += 1
            optimizer.zero_grad()
            return
        if not torch.isfinite(grad_norm).all():
            raise FloatingPointError(f"{self.spec.key}: gradients are NaN/Inf")
        optimizer.step()
        self.updates += 1


class NaivePARStep(TrainStep):
    """UniLMv2's AE + PAR losses computed the naive way: one pass per factorization step.

    From a ``pmlm`` (``--objective ae_par``) batch, keep the original sequence (with its 80/10/10 corrupted masked
    positions) and the factorization steps ``M_1 .. M_K``. Pass ``i`` feeds the sequence with the tokens of steps
    ``< i`` restored and those of steps ``>= i`` still corrupted, bidirectionally, and predicts the tokens of
    ``M_i`` (L_PAR, equation 5); pass 1 sees every masked position corrupted, so it also predicts all of them
    (L_AE, equation 3). K forward and backward passes, gradients accumulated, one optimizer update, the same
    normalisation as ``pmlm_ae_par`` (the sum of both losses over the number of masked tokens).

    ``max_passes`` truncates the step (used only to take the memory peak cheaply: every pass has the same shape).
    """

    def __init__(self, spec, built, batch, max_passes=None):
        super().__init__(spec, built, batch)
        self.passes = self.build_passes(batch, built.task.source_dictionary.pad())
        if max_passes is not None:
            self.passes = self.passes[:max_passes]
        self.masked = sum(int(p[1].sum()) for p in self.passes[:1])  # pass 1 predicts every masked token (AE)
        # the text's segments ([SOS] S1 [EOS] | S2 [EOS]): the text fills the first columns of the pmlm rows
        self.segment_ids = batch["net_input"]["segment_ids"][:, : self.passes[0][0].size(1)]

    @staticmethod
    def build_passes(batch, pad):
        """``[(tokens (B, T), predicted (B, T) bool, targets (N,), of_this_step (N,) bool, first)]``, one per
        factorization step; the first pass predicts every masked position (AE) and its step's tokens (PAR) are
        read from the same logits."""
        net = batch["net_input"]
        source, kinds, steps, position_ids = net["src_tokens"], net["kinds"], net["steps"], net["position_ids"]
        context = kinds.eq(int(PseudoMaskKind.CONTEXT)) & source.ne(pad)
        width = int(context.sum(1).max())
        corrupted = source[:, :width].masked_fill(~context[:, :width], pad)
        original = corrupted.clone()
        step_of = torch.full_like(corrupted, -1)
        rows, cols = kinds.eq(int(PseudoMaskKind.ORIGINAL)).nonzero(as_tuple=True)
        original[rows, position_ids[rows, cols]] = source[rows, cols]
        step_of[rows, position_ids[rows, cols]] = steps[rows, cols]
        masked = step_of.ge(0)
        passes = []
        for step in range(int(step_of.max()) + 1):
            tokens = torch.where(step_of.lt(step) & masked, original, corrupted)
            predicted = masked if step == 0 else step_of.eq(step)
            passes.append((tokens, predicted, original[predicted], step_of[predicted].eq(step), step == 0))
        return passes

    def losses(self):
        """Yield ``(ae_loss, par_loss)`` sums (nats) per pass; the caller backpropagates each before the next."""
        model = self.built.model
        for tokens, predicted, targets, of_this_step, first in self.passes:
            logits, _ = model(tokens, segment_ids=self.segment_ids, masked_tokens=predicted)
            losses = F.cross_entropy(logits.float(), targets, reduction="none")
            yield (losses.sum() if first else losses.new_zeros(())), losses[of_this_step].sum()

    def __call__(self):
        b = self.built
        b.optimizer.zero_grad()
        b.model.train()
        for ae, par in self.losses():
            b.optimizer.backward(ae + par)
        self._update(self.masked)

    @property
    def flops(self) -> float:
        tokens = self.passes[0][0]
        predicted = sum(int(p[1].sum()) for p in self.passes)
        return encoder_only_step(self.built.dims, tokens.size(0), tokens.size(1), predicted, passes=len(self.passes))


def timed(step) -> float:
    """Seconds one call of ``step`` takes (its kernels finished)."""
    synchronize(step.built.device)
    start = time.perf_counter()
    step()
    synchronize(step.built.device)
    return time.perf_counter() - start


def resident_bytes(built) -> int:
    """Bytes of the tensors a configuration holds between updates: parameters and buffers, the optimizer's
    parameters (fp32 master weights under bf16 / fp16), their gradients, and the optimizer's state. Storages are
    counted once."""
    torch_optimizer = built.optimizer.optimizer
    tensors = list(chain(built.model.parameters(), built.model.buffers()))
    tensors += [p for group in torch_optimizer.param_groups for p in group["params"]]
    tensors += [p.grad for p in tensors if p.grad is not None]
    tensors += [t for state in torch_optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    storages = {(t.device, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def peak_cuda_bytes(step) -> int:
    """Peak tensor bytes of one call of ``step`` on CUDA: what the configuration holds before it
    (:func:`resident_bytes`) plus the most the allocator had allocated above its level before the update. Other
    configurations of the group, resident on the same card, are left out."""
    synchronize(step.built.device)
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    resident = resident_bytes(step.built)
    step()
    synchronize(step.built.device)
    return resident + torch.cuda.max_memory_allocated() - before


def peak_memory_bytes(step) -> int:
    """Peak tensor bytes of one call of ``step``: the allocator's counters on CUDA, the profiler's memory timeline
    on the CPU."""
    if torch.device(step.built.device).type == "cuda":
        return peak_cuda_bytes(step)
    return peak_tensor_bytes(step)


def write_profile(step, path: str, header: str) -> None:
    """Profile one call of ``step`` and write the profiler's per-operator table to ``path``: on CUDA the top 25
    operators by self device time, then the top 25 by self CPU time (launch and Python overhead); on the CPU the
    top 25 by self CPU time. Its timeline goes to ``traces/<name>.json.gz`` beside it (chrome://tracing, Perfetto;
    compressed, a few MB; kept apart so that the tables can be copied without them)."""
    cuda = torch.device(step.built.device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(step.built.device)
    with profile(activities=activities) as prof:
        step()
        synchronize(step.built.device)
    averages = prof.key_averages()
    sections = [("self device time", "self_device_time_total")] if cuda else []
    sections.append(("self CPU time", "self_cpu_time_total"))
    with open(path, "w") as f:
        f.write(header + "\n")
        for title, key in sections:
            f.write(f"\nTop 25 operators by {title}\n{averages.table(sort_by=key, row_limit=25)}\n")
    directory, name = os.path.split(path)
    os.makedirs(os.path.join(directory, "traces"), exist_ok=True)
    prof.export_chrome_trace(os.path.join(directory, "traces", os.path.splitext(name)[0] + ".json.gz"))


def peak_tensor_bytes(step) -> int:
    """Run ``step`` once under the profiler; the peak of live CPU tensor bytes over its memory timeline. Tensors
    that exist before (parameters, optimizer state, batch) count as live; free gradients first (the profiler does
    not see a tensor allocated before it started being freed)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "timeline.json")
        prof.export_memory_timeline(path, device="cpu")
        with open(path) as f:
            _, sizes = json.load(f)
    return int(max(sum(by_category) for by_category in sizes)) if sizes else 0


def _naive_first_passes(step):
    """The naive PAR baseline cut to its first two passes (every pass has the same shape): what its memory peak and
    profile are taken on."""
    return NaivePARStep(step.spec, step.built, step.batch, max_passes=2)


def _profile(args, key, step, length, seconds, times):
    naive = key == "naive_par"
    header = (f"{key}: {step.spec.label}\nlength {length}, {args.batch_sequences} sequence(s) per update, "
              f"{args.precision} on {args.device}; median update {seconds:.4f} s over {times} timed updates"
              + (f"\nprofiled: the first 2 of its {len(step.passes)} passes" if naive else ""))
    write_profile(_naive_first_passes(step) if naive else step, os.path.join(args.profile_dir, f"{key}.txt"), header)


def measure_training(args, corpus, result, checkpoint):
    """Per group (configurations compared with each other; a group's models stay in memory together), per length:
    a warm-up update (peak memory), then ``repeats`` timed updates with the group's configurations interleaved
    (and with ``--profile-dir``, at the reference length, one profiled update each). Appends to
    ``result["training"]`` and calls ``checkpoint()`` after each length."""
    rows, missing = result["training"], result["missing"]
    where = dict(device=args.device, precision=args.precision)
    groups = list(dict.fromkeys(spec.group for spec in TRAIN_SPECS))
    longest = max(args.lengths)
    for group in groups:
        specs = [s for s in TRAIN_SPECS if s.group == group and wanted(args, s.key)]
        models = {}
        for spec in specs:
            if spec.key == "naive_par":
                continue
            try:
                models[spec.key] = build(corpus.path(spec.layout, longest, 1), spec.args(args.size, longest), **where)
            except Exception as error:  # a model that has not landed (or fails to build) is reported, not fatal
                record_failure(missing, spec.key, "build", error)
        for length in args.lengths:
            batch_sequences = args.batch_sequences
            steps = {}
            for spec in specs:
                try:
                    if spec.key == "naive_par":
                        if "pmlm_ae_par" not in steps or length > args.naive_max_length:
                            continue
                        # the same unilm2 model and batch as AE+PAR, trained the naive way
                        steps[spec.key] = NaivePARStep(spec, steps["pmlm_ae_par"].built, steps["pmlm_ae_par"].batch)
                        continue
                    if spec.key not in models:
                        continue
                    task_built = build(corpus.path(spec.layout, length, batch_sequences),
                                       spec.args(args.size, length), reuse=models[spec.key], **where)  # fmt: skip
                    steps[spec.key] = TrainStep(spec, task_built, load_batch(task_built, batch_sequences))
                except Exception as error:
                    record_failure(missing, spec.key, f"length {length}, batch", error)
            records = {}
            for key, step in list(steps.items()):
                log(f"train {key} length {length}: warm-up update (memory)")
                # Gradients of an earlier update are freed before the peak is taken: the profiler does not see frees
                # of tensors allocated before it started, and would count them as live.
                step.built.optimizer.zero_grad()
                try:
                    peak = peak_memory_bytes(_naive_first_passes(step) if key == "naive_par" else step)
                    records[key] = {"times": [], "peak": peak}
                except Exception as error:
                    del steps[key]
                    record_failure(missing, key, f"length {length}, warm-up update", error)
            for repeat in range(args.repeats):
                for key, step in list(steps.items()):
                    if key == "naive_par" and repeat >= args.naive_repeats:
                        continue
                    try:
                        records[key]["times"].append(timed(step))
                    except Exception as error:
                        del steps[key]
                        record_failure(missing, key, f"length {length}, timed update", error)
                        continue
                    log(f"train {key} length {length}: {records[key]['times'][-1]:.3f} s")
            for key, step in steps.items():
                seconds = median(records[key]["times"])
                rows.append({
                    "key": key, "label": step.spec.label, "group": group, "plugin": step.spec.plugin,
                    "baseline": step.spec.baseline, "length": length, "batch_sequences": batch_sequences,
                    "precision": args.precision, "text_tokens": step.text_tokens,
                    "times_s": records[key]["times"], "median_s": seconds,
                    "tokens_per_s": step.text_tokens / seconds, "peak_memory_mb": records[key]["peak"] / MB,
                    "flops_per_update": step.flops, "achieved_gflops": step.flops / seconds / 1e9,
                    "mfu": step.flops / seconds / 1e9 / args.peak_gflops,
                    "mfu_datasheet": step.flops / seconds / 1e12 / args.peak_tflops if args.peak_tflops else None,
                    "overflow_skips": step.overflows,
                })  # fmt: skip
                if args.profile_dir and length == args.reference_length:
                    log(f"train {key} length {length}: profiled update")
                    try:
                        _profile(args, key, step, length, seconds, len(records[key]["times"]))
                    except Exception as error:
                        record_failure(missing, key, f"length {length}, profile", error)
            del steps
            gc.collect()
            checkpoint()
        del models
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
