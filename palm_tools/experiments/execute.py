"""Executing the plan: each run's commands in its own folder, its result.json last; the scheduler that runs them
in parallel, each after the runs it needs."""
import collections
import concurrent.futures
import json
import math
import re
import shutil
import time
from pathlib import Path

from palm_tools.atomic_files import atomic_open, atomic_path
from palm_tools.experiments.logged_run import run_checked
from palm_tools.experiments.plan import UNIGRAM
from palm_tools.experiments.rows import GEN
from palm_tools.scoring.perplexity import perplexity_from_generate


def _logged_params(log_text):
    found = re.findall(r"num\. shared model params: ([\d,]+)", log_text)
    return int(found[-1].replace(",", "")) if found else None


def _test_accuracy(log_text):
    """sentence_prediction's accuracy (in %) in fairseq-train's validation line for the test subset."""
    found = re.findall(r"\| valid on 'test' subset \|.*?\| accuracy ([-0-9.]+)", log_text)
    return float(found[-1]) if found else None


def unigram_perplexity(train, test, vocabulary):
    """Perplexity of ``test`` (lines of pieces, each ended by </s> as fairseq scores them) under the add-one unigram
    model of ``train`` over ``vocabulary`` symbols: what a model that ignores the context can reach."""
    counts = collections.Counter(piece for line in train for piece in line.split() + ["</s>"])
    total = sum(counts.values())
    pieces = [piece for line in test for piece in line.split() + ["</s>"]]
    bits = -sum(math.log2((counts[piece] + 1) / (total + vocabulary)) for piece in pieces)
    return {"ppl": 2 ** (bits / len(pieces)), "tokens": len(pieces), "sentences": len(test)}


def device_name(scale):
    """What a run ran on, recorded in its result.json: the report of a folder whose seeds ran on different cards says
    which card ran each (the same process's GPU as fairseq's, its device 0; torch is imported only on a GPU)."""
    if scale.device != "gpu":
        return "CPU"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU torch can see"


def execute(plan, run):
    """Run ``run``'s commands in a fresh folder, then write its result.json (the mark of a finished run)."""
    folder = plan.run_dir(run.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log, started = folder / "log.txt", time.time()
    if run.kind == UNIGRAM:  # the generation data's training responses and test pairs, the dictionary's symbols
        text, dictionary = plan.vocabulary("spm" if run.name == UNIGRAM else "wordpiece")
        vocabulary = len(dictionary.read_text().splitlines()) + 4  # + fairseq's <s> <pad> </s> <unk>
        result = {"run": run.name, **unigram_perplexity((text / "train.tgt").read_text().splitlines(),
                                                        (text / "test.tgt").read_text().splitlines(), vocabulary),
                  "seconds": round(time.time() - started, 1)}
        with atomic_open(folder / "result.json") as handle:
            json.dump(result, handle, indent=1)
        return result
    outputs, cpu = [], 0.0
    for tool, args in run.commands:
        before = log.stat().st_size if log.exists() else 0
        cpu += run_checked(tool, args, log)
        outputs.append(log.read_bytes()[before:].decode(errors="replace"))  # bytes: the text may not be ASCII
    result = {"run": run.name, "seconds": round(time.time() - started, 1), "cpu_seconds": round(cpu, 2),
              "params": _logged_params(outputs[0]), "device": device_name(plan.scale)}
    if run.kind == "pretrain":
        losses = re.findall(r"\| train_inner \|.*? loss=([-0-9.]+)", outputs[-1])
        result["last_train_loss"] = float(losses[-1]) if losses else None
    elif run.kind == GEN:
        generated = folder / "test.generate.txt"
        generated.write_text(outputs[-1], encoding="utf-8")
        result.update(perplexity_from_generate(generated))
        _drop_pair_lines(log, before)
    else:
        result["accuracy"] = _test_accuracy(outputs[-1])
        if result["accuracy"] is None:
            raise RuntimeError(f"{log}: no test accuracy logged")
    with atomic_open(folder / "result.json") as handle:
        json.dump(result, handle, indent=1)
    return result


PAIR_LINE = re.compile(rb"^[SHTDP]-\d+\t")


def _drop_pair_lines(log, start):
    """Keep in ``log`` (committed with the results) the scoring's summary but not its five lines per test pair, which
    test.generate.txt beside it holds (not committed): 1,000 pairs are 5,000 lines, most of a run's log."""
    text = log.read_bytes()
    kept = [line for line in text[start:].splitlines(keepends=True) if not PAIR_LINE.match(line)]
    with atomic_path(log) as temporary:
        Path(temporary).write_bytes(text[:start] + b"".join(kept))


def result_of(plan, name):
    path = plan.run_dir(name) / "result.json"
    return json.loads(path.read_text()) if path.exists() else None


def runs_to_run(plan, skip=None):
    """{name: run} of what ``run_all`` runs, in its order: every unfinished run but those of ``skip``, and each
    finished pre-training whose checkpoint is gone (a clone holds only the committed results) that an unfinished
    fine-tuning needs."""
    # seed by seed: a run stopped part way has every row with its first seeds, not some tables with none; within a
    # seed the pre-trainings first, the longest runs, which the fine-tunings then wait for
    order = sorted(plan.runs.items(), key=lambda item: (item[1].seed, item[1].kind != "pretrain"))
    pending = {n for n, _ in order if result_of(plan, n) is None and n not in (skip or {})}
    pending |= {need for n in pending for need in plan.runs[n].needs if not plan.checkpoint(need).exists()}
    return {n: r for n, r in order if n in pending}


def run_all(plan, jobs, log=print, skip=None):
    """Run every unfinished run but those of ``skip`` ({name: why}), ``jobs`` at a time, each after the runs it
    needs; returns {name: error or why skipped}."""
    pending = runs_to_run(plan, skip)
    log(f"{len(plan.runs) - len(pending)} of {len(plan.runs)} runs already finished; {len(pending)} to run")
    errors, running = dict(skip or {}), {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            for name, run in list(pending.items()):
                if len(running) >= jobs:
                    break
                failed = [n for n in run.needs if n in errors]
                if failed:
                    errors[name] = f"not run: {failed[0]} failed"
                    del pending[name]
                elif all(n not in pending and n not in running.values() for n in run.needs):
                    running[pool.submit(execute, plan, run)] = name
                    del pending[name]
            if not running:
                continue
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                name = running.pop(future)
                try:
                    result = future.result()
                    log(f"finished {name} ({result['seconds']:.0f} s)")
                except Exception as error:  # one failed run must not stop the others: the table says which failed
                    errors[name] = str(error).splitlines()[0]
                    log(f"FAILED {name}: {error}")
    return errors
