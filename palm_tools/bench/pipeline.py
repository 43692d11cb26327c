"""``palm-bench``'s data-pipeline table: how fast each task's own dataset and collater prepare batches.

Each configuration is a task set up as ``fairseq-train`` sets it up (``load_dataset("train")`` on synthetic
binarized data, :mod:`palm_tools.bench.data`); what is timed is what a fairseq data-loader worker does for a batch:
``dataset[i]`` for each example, then ``dataset.collater``, on one thread (a worker is one process), for
consecutive batches of ``batch`` examples. Time is the process's CPU time, so "per core" holds on a machine whose
cores other processes share (wall-clock time would count their turns too). Every layout holds ``length`` tokens
per example (special tokens included), so tokens/s = ``length`` x examples/s and the rows compare directly;
fairseq's own ``masked_lm`` and ``translation`` are the reference points.
"""
import time
from dataclasses import dataclass
from typing import Callable, List

import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from palm_tools.bench.data import target_split
from palm_tools.bench.models import COMMON, positions, translation_task, unilm_seq2seq_task


@dataclass
class DataSpec:
    key: str
    label: str
    layout: str
    args: Callable[[int], List[str]]  # length -> fairseq arguments (task, and an arch for option parsing)
    plugin: bool = True


def _continuation(length):
    source_body, target_body = target_split(length)
    return ["--arch", "palm_tiny", "--task", "continuation_pair", "--max-source-tokens", str(source_body + 1),
            "--max-target-tokens", str(target_body)]  # fmt: skip


DATA_SPECS = [
    DataSpec("masked_lm", "fairseq masked_lm (reference)", "block",
             lambda n: ["--arch", "roberta_base", "--task", "masked_lm", "--tokens-per-sample", str(n)], plugin=False),
    DataSpec("translation", "fairseq translation (reference)", "parallel",
             lambda n: ["--arch", "transformer"] + translation_task(n), plugin=False),
    DataSpec("continuation_pair", "continuation_pair (PALM pre-training)", "continuation", _continuation),
    DataSpec("pmlm", "pmlm (UniLMv2 pre-training, AE + PAR)", "block",
             lambda n: ["--arch", "unilm2_tiny", "--task", "pmlm", "--tokens-per-sample", str(n)]),
    DataSpec("unilm_pretraining", "unilm_pretraining (UniLM pre-training)", "two_sentences",
             lambda n: ["--arch", "unilm_tiny", "--task", "unilm_pretraining", "--tokens-per-sample", str(n)]),
    DataSpec("unilm_seq2seq", "unilm_seq2seq (UniLM fine-tuning)", "parallel",
             lambda n: ["--arch", "unilm_tiny", "--max-positions", positions(n)] + unilm_seq2seq_task(n)),
    DataSpec("unilm_seq2seq_pseudo", "unilm_seq2seq --pseudo-masks (UniLMv2 fine-tuning)", "parallel",
             lambda n: ["--arch", "unilm2_tiny", "--max-positions", positions(n)] + unilm_seq2seq_task(n, "unilm2")),
]


def training_dataset(data: str, args: List[str]):
    """The task's ``train`` split, set up from command-line arguments as ``fairseq-train`` does."""
    namespace = options.parse_args_and_arch(options.get_training_parser(), [data] + COMMON + args)
    task = tasks.setup_task(convert_namespace_to_omegaconf(namespace).task)
    task.load_dataset("train")
    return task.dataset("train")


def examples_per_second(dataset, examples: int, batch: int, repeats: int) -> List[float]:
    """Examples per CPU second of ``repeats`` passes over the first ``examples`` items (items and collater, one
    thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rates = []
        for _ in range(repeats):
            start = time.process_time()
            for first in range(0, examples, batch):
                dataset.collater([dataset[i] for i in range(first, min(first + batch, examples))])
            rates.append(examples / (time.process_time() - start))
        return rates
    finally:
        torch.set_num_threads(threads)


def measure_data_pipeline(corpus, length: int, examples: int, batch: int, repeats: int, wanted=None):
    """One row per :data:`DATA_SPECS` configuration (``wanted(key)`` selects): examples/s and tokens/s per core."""
    rows = []
    for spec in DATA_SPECS:
        if wanted is not None and not wanted(spec.key):
            continue
        dataset = training_dataset(corpus.path(spec.layout, length, examples), spec.args(length))
        dataset.set_epoch(1)
        rates = examples_per_second(dataset, min(examples, len(dataset)), batch, repeats)
        rate = sorted(rates)[len(rates) // 2]
        rows.append({"key": spec.key, "label": spec.label, "plugin": spec.plugin, "length": length, "batch": batch,
                     "examples": min(examples, len(dataset)), "examples_per_s": rate, "tokens_per_s": rate * length,
                     "rates": rates})  # fmt: skip
    return rows
