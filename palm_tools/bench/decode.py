"""Decoding measurements of ``palm-bench``: fairseq's ``SequenceGenerator`` (beam search) on each model.

Every hypothesis decodes exactly ``T`` target tokens (``--min-len T --max-len-a 0 --max-len-b T``: EOS is
forbidden before ``T`` tokens and forced after), so random-weight models do the work of a ``T``-token output.

* ``transformer`` / ``palm``: fairseq's ``translation`` task (PALM is fine-tuned and decoded with it), source
  ``S`` tokens ending with EOS;
* ``unilm`` / ``unilm2``: ``unilm_seq2seq`` (``--pseudo-masks`` for UniLMv2), source ``[SOS] S1 [EOS]`` of ``S``
  tokens, decoded with the model's cached incremental decoder; ``... recompute`` is the baseline that re-runs
  the whole packed ``[source | decoded tokens | placeholder]`` sequence at every step: the same model and
  generator with the generator's incremental path switched off (the UniLM decoder then takes its
  full-recomputation branch; both give the same hypotheses, tests/test_benchmark.py checks it); ``..._graph``
  decodes with ``--decoding-graph`` (:mod:`palm_plugin.modules.fixed_shape_decoding`).
"""
import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List

import torch

from palm_plugin.data.symbols import MASK_SYMBOL
from palm_tools.bench.flops import synchronize
from palm_tools.bench.models import (build, palm_arch, prepare_sample, transformer_arch, translation_task,
                                     unilm_arch, unilm_seq2seq_task)
from palm_tools.bench.runlog import log, record_failure, wanted


@dataclass
class DecodeSpec:
    key: str
    label: str
    args: Callable[[str, int], List[str]]  # (size, total length) -> fairseq arguments
    unilm: bool
    recompute: bool = False
    baseline: str = "transformer"
    plugin: bool = True


DECODE_SPECS = [
    DecodeSpec("transformer", "fairseq transformer (baseline)",
               lambda size, n: transformer_arch(size) + translation_task(n), unilm=False, baseline=None, plugin=False),
    DecodeSpec("palm", "palm (pointer-generator)", lambda size, n: palm_arch(size, n) + translation_task(n), unilm=False),
    DecodeSpec("unilm", "unilm, cached", lambda size, n: unilm_arch("unilm", size, n) + unilm_seq2seq_task(n), unilm=True),
    DecodeSpec("unilm_recompute", "unilm, full recomputation (baseline)",
               lambda size, n: unilm_arch("unilm", size, n) + unilm_seq2seq_task(n), unilm=True, recompute=True,
               baseline="unilm", plugin=False),
    DecodeSpec("unilm2", "unilm2, cached",
               lambda size, n: unilm_arch("unilm2", size, n) + unilm_seq2seq_task(n, "unilm2"), unilm=True),
    DecodeSpec("unilm2_recompute", "unilm2, full recomputation (baseline)",
               lambda size, n: unilm_arch("unilm2", size, n) + unilm_seq2seq_task(n, "unilm2"), unilm=True,
               recompute=True, baseline="unilm2", plugin=False),
    DecodeSpec("unilm_graph", "unilm, --decoding-graph (fixed shapes; a CUDA graph per step on a GPU)",
               lambda size, n: unilm_arch("unilm", size, n) + unilm_seq2seq_task(n) + ["--decoding-graph"], unilm=True),
    DecodeSpec("unilm2_graph", "unilm2, --decoding-graph (fixed shapes; a CUDA graph per step on a GPU)",
               lambda size, n: unilm_arch("unilm2", size, n) + unilm_seq2seq_task(n, "unilm2") + ["--decoding-graph"],
               unilm=True),
]  # fmt: skip


def source_batch(built, unilm: bool, sentences: int, source_length: int, seed: int = 1):
    """A generation batch of ``sentences`` random sources of ``source_length`` tokens, in the task's layout, on the
    model's device."""
    dictionary = built.task.source_dictionary
    generator = torch.Generator().manual_seed(seed)
    first = dictionary.index(MASK_SYMBOL) + 1
    words = torch.randint(first, len(dictionary) - 1, (sentences, source_length), generator=generator)
    words[:, -1] = dictionary.eos()
    net_input = {"src_tokens": words, "src_lengths": torch.full((sentences,), source_length)}
    if unilm:
        words[:, 0] = dictionary.bos()
        task_cfg = built.task.cfg
        net_input["source_segments"] = torch.full_like(words, task_cfg.source_segment)
        net_input["target_segment"] = torch.full((sentences,), task_cfg.target_segment)
    return prepare_sample({"id": torch.arange(sentences), "net_input": net_input}, built, convert_floats=False)


def generator_for(built, beam: int, target_tokens: int, recompute: bool):
    """fairseq's generator for exactly ``target_tokens`` tokens per hypothesis."""
    gen_cfg = built.cfg.generation
    gen_cfg.beam, gen_cfg.min_len, gen_cfg.max_len_a, gen_cfg.max_len_b = beam, target_tokens, 0, target_tokens
    generator = built.task.build_generator([built.model], gen_cfg)
    if recompute:
        # SequenceGenerator wraps the models in an EnsembleModel; without incremental states it calls the decoder
        # with the whole prefix every step.
        generator.model.has_incremental = False
    return generator


def generate(built, generator, sample):
    with torch.no_grad():
        return built.task.inference_step(generator, [built.model], sample)


class TimedDecoder:
    """One decoder at one shape (``sentences`` sources of ``source_length`` tokens, ``target_tokens`` decoded per
    hypothesis), warmed up; each call times one generation (and checks every hypothesis has its length)."""

    def __init__(self, built, spec: DecodeSpec, beam: int, target_tokens: int, sentences: int, source_length: int):
        self.built, self.spec, self.target_tokens = built, spec, target_tokens
        self.sample = source_batch(built, spec.unilm, sentences, source_length)
        generate(built, generator_for(built, beam, 2, spec.recompute), self.sample)
        self.generator = generator_for(built, beam, target_tokens, spec.recompute)

    def __call__(self) -> float:
        synchronize(self.built.device)
        start = time.perf_counter()
        hypotheses = generate(self.built, self.generator, self.sample)
        synchronize(self.built.device)
        seconds = time.perf_counter() - start
        produced = {len(h[0]["tokens"]) for h in hypotheses}
        if produced != {self.target_tokens + 1}:
            raise RuntimeError(f"{self.spec.key}: decoded lengths {produced}, expected {self.target_tokens} tokens + EOS")
        return seconds


def measure_decoding(args, corpus, result, checkpoint):
    """Each decoder at each ``--target-tokens`` and ``--sentences``, the decoders' generations interleaved (every
    decoder's first repeat, then every decoder's second, ...), so that a change in the machine's load falls on all of
    them alike; appends to ``result["decoding"]``, ``checkpoint()`` per shape."""
    rows, missing = result["decoding"], result["missing"]
    total = args.source_tokens + max(args.target_tokens) + 2
    decoders = {}
    for spec in DECODE_SPECS:
        # fairseq's transformer is the baseline of the others' ratios: decoded when another decoder is
        if not wanted(args, spec.key) and not (spec.key == "transformer" and any(
                wanted(args, other.key) for other in DECODE_SPECS[1:])):
            continue
        if spec.recompute and not set(args.target_tokens) & set(args.recompute_target_tokens):
            continue
        try:
            decoders[spec.key] = spec, build(corpus.path("parallel", 64, 1), spec.args(args.size, total),
                                             training=False, device=args.device, precision=args.precision)
        except Exception as error:
            record_failure(missing, f"decode {spec.key}", "build", error)
    for sentences in args.sentences:
        for target_tokens in args.target_tokens:
            timed, times = {}, {}
            for key, (spec, built) in decoders.items():
                if spec.recompute and target_tokens not in args.recompute_target_tokens:
                    continue
                try:
                    timed[key] = TimedDecoder(built, spec, args.beam, target_tokens, sentences, args.source_tokens)
                    times[key] = []
                except Exception as error:
                    record_failure(missing, f"decode {key}", f"{sentences} sentence(s), {target_tokens} tokens", error)
            log(f"decode {', '.join(timed)}: {sentences} sentence(s), {target_tokens} target tokens")
            for repeat in range(max(args.decode_repeats, args.recompute_repeats)):
                for key, decoder in list(timed.items()):
                    if repeat >= (args.recompute_repeats if decoder.spec.recompute else args.decode_repeats):
                        continue
                    try:
                        times[key].append(decoder())
                    except Exception as error:
                        del timed[key]
                        record_failure(missing, f"decode {key}", f"{sentences} sentence(s), {target_tokens} tokens",
                                       error)  # fmt: skip
            for key, decoder in timed.items():
                seconds = statistics.median(times[key])
                rows.append({
                    "key": key, "label": decoder.spec.label, "plugin": decoder.spec.plugin,
                    "baseline": decoder.spec.baseline, "target_tokens": target_tokens,
                    "source_tokens": args.source_tokens, "beam": args.beam, "sentences": sentences,
                    "precision": args.precision, "times_s": times[key], "median_s": seconds,
                    "sentences_per_s": sentences / seconds,
                })  # fmt: skip
            checkpoint()
    decoders.clear()
    gc.collect()
