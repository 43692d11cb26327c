"""What ``palm-bench`` measures: each configuration as fairseq command-line arguments, built in-process.

Every model is built the way ``fairseq-train`` builds it (``options.parse_args_and_arch`` ->
``tasks.setup_task`` -> ``task.build_model`` / ``task.build_criterion`` -> ``optim.build_optimizer``), so a row of
the table is a configuration a user can run with the same flags. Baselines have the same shape as the plugin's
model they are compared with:

* ``transformer``: fairseq's encoder-decoder with PALM's layers and sizes (12 + 12 layers, 768 / 3072 / 12 heads
  at base size, GELU, one shared embedding, PALM's dropout 0.1 and attention dropout 0.1), trained and decoded
  with fairseq's ``translation`` task; ``palm``
  (the same task, fine-tuning) differs by its RoBERTa-style blocks and the pointer-generator;
* ``roberta``: fairseq's ``roberta_base`` (12 layers, 768) with the ``masked_lm`` task, the shape of ``unilm_base``.

``--size tiny`` swaps in the 2-layer archs used by the tests (``palm_tiny``, ``unilm_tiny``, ``unilm2_tiny``) and
baselines of the same sizes.

Device and precision are fairseq's own flags (``--cpu``; ``--bf16`` / ``--fp16``) and are applied as fairseq's
trainer applies them: model and criterion converted to the precision and moved to the device, the optimizer wrapped
in ``FP16Optimizer`` (fp32 master weights; a dynamic loss scale for fp16), batches moved with
``utils.move_to_cuda`` and their float tensors converted.
"""
from dataclasses import dataclass
from itertools import chain
from typing import Callable, List, Optional

import torch
from fairseq import optim, options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import palm_plugin  # noqa: F401  (registers the plugin's tasks, models and criteria)
from palm_tools.bench.data import target_split
from palm_tools.bench.flops import Dims, encoder_decoder_step, encoder_only_step
from palm_plugin.modules.attention_masks import PseudoMaskKind

COMMON = ["--optimizer", "adam", "--lr", "0.0001", "--seed", "1", "--num-workers", "0"]
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Sizes per --size: (layers, model dim, feed-forward dim, heads) of the baselines, matching the plugin's archs.
SEQ2SEQ_SHAPE = {"base": (12, 768, 3072, 12), "tiny": (2, 64, 128, 2)}  # palm_base / palm_tiny
ENCODER_SHAPE = {"base": (12, 768, 3072, 12), "tiny": (2, 64, 256, 4)}  # unilm_base / unilm_tiny


def positions(length: int) -> str:
    """Learned position tables: the archs' 512, or more for longer sequences."""
    return str(max(512, length))


def transformer_arch(size: str) -> List[str]:
    layers, dim, ffn, heads = SEQ2SEQ_SHAPE[size]
    # PALM's regularisation too (fairseq's transformer defaults to no attention dropout, which lets it take the fused
    # attention kernel): the comparison is then about PALM's own parts, the copy layer first.
    args = ["--arch", "transformer", "--share-all-embeddings", "--activation-fn", "gelu", "--dropout", "0.1",
            "--attention-dropout", "0.1", "--activation-dropout", "0.0"]
    for side in ("encoder", "decoder"):
        args += [f"--{side}-layers", str(layers), f"--{side}-embed-dim", str(dim)]
        args += [f"--{side}-ffn-embed-dim", str(ffn), f"--{side}-attention-heads", str(heads)]
    return args


def roberta_arch(size: str, length: int) -> List[str]:
    layers, dim, ffn, heads = ENCODER_SHAPE[size]
    return [
        "--arch", "roberta_base", "--max-positions", positions(length), "--encoder-layers", str(layers),
        "--encoder-embed-dim", str(dim), "--encoder-ffn-embed-dim", str(ffn), "--encoder-attention-heads", str(heads),
    ]  # fmt: skip


def palm_arch(size: str, length: int) -> List[str]:
    return ["--arch", f"palm_{size}", "--encoder-max-positions", positions(length), "--decoder-max-positions",
            positions(length)]  # fmt: skip


def unilm_arch(version: str, size: str, length: int) -> List[str]:
    return ["--arch", f"{version}_{size}", "--max-positions", positions(length)]


def translation_task(length: int) -> List[str]:
    return ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--max-source-positions",
            positions(length), "--max-target-positions", positions(length)]  # fmt: skip


def unilm_seq2seq_task(length: int, version: str = "unilm") -> List[str]:
    args = ["--task", "unilm_seq2seq", "--max-source-positions", positions(length),
            "--max-target-positions", positions(length)]  # fmt: skip
    if version == "unilm2":  # UniLMv2 fine-tuning: [source | target | pseudo target], BERT's segment ids 0 / 1
        args += ["--pseudo-masks", "--source-segment", "0", "--target-segment", "1"]
    return args


@dataclass
class Built:
    """A configuration built through fairseq's APIs."""

    args: object  # the argparse namespace (arch defaults filled in)
    cfg: object  # its omegaconf form
    task: object
    model: torch.nn.Module
    criterion: Optional[torch.nn.Module] = None
    optimizer: Optional[object] = None
    device: str = "cpu"
    precision: str = "fp32"

    @property
    def dims(self) -> Dims:
        a = self.args
        copy = 0
        if a.arch.startswith("palm") and not getattr(a, "no_copy", False):
            copy = getattr(a, "copy_attention_dim", None) or a.encoder_embed_dim
        return Dims(
            layers=a.encoder_layers,
            d=a.encoder_embed_dim,
            f=a.encoder_ffn_embed_dim,
            vocab=len(self.task.source_dictionary),
            decoder_layers=getattr(a, "decoder_layers", 0) if not a.arch.startswith(("unilm", "roberta")) else 0,
            copy=copy,
            pointer_generator=a.arch.startswith("palm"),
        )


def placement_args(device: str, precision: str) -> List[str]:
    """fairseq's flags for running on ``device`` (``cpu`` / ``cuda``) in ``precision`` (a key of PRECISIONS)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device == "cpu":
        # fairseq's FP16Optimizer keeps its flat fp32 copy on the current CUDA device; fairseq-train fails alike
        raise ValueError("--precision fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    return (["--cpu"] if device == "cpu" else []) + ([] if precision == "fp32" else [f"--{precision}"])


def place(module: torch.nn.Module, device: str, precision: str) -> torch.nn.Module:
    """``module`` in ``precision`` on ``device``, as fairseq's trainer converts its model and criterion."""
    return module.to(dtype=PRECISIONS[precision]).to(device=device)


def build(data: str, args: List[str], training: bool = True, reuse: Optional[Built] = None, device: str = "cpu",
          precision: str = "fp32") -> Built:
    """Parse ``[data] + args`` (with the flags of ``device`` and ``precision``) like ``fairseq-train`` and build
    task, model (and, for training, criterion and optimizer; for decoding the model is prepared for inference as
    ``fairseq-generate`` prepares it and ``cfg.generation`` holds the defaults).

    ``reuse``: keep that configuration's model and optimizer (built for the longest length) and set up only the
    task and criterion for ``args`` (another length of the same configuration).
    """
    parser = options.get_training_parser()
    namespace = options.parse_args_and_arch(parser, [data] + COMMON + placement_args(device, precision) + args)
    cfg = convert_namespace_to_omegaconf(namespace)
    torch.manual_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    where = dict(device=device, precision=precision)
    if reuse is not None:
        criterion = place(task.build_criterion(cfg.criterion), **where)
        return Built(namespace, cfg, task, reuse.model, criterion, reuse.optimizer, **where)
    model = place(task.build_model(cfg.model), **where)
    if not training:
        # fairseq-generate converts only for --fp16 (it decodes in fp32 under --bf16); here the decoding precision
        # is the one asked for, whichever it is
        model.prepare_for_inference_(cfg)  # also puts it in eval mode, for good: its train() then returns None
        return Built(namespace, cfg, task, model, **where)
    criterion = place(task.build_criterion(cfg.criterion), **where)
    params = [p for p in chain(model.parameters(), criterion.parameters()) if p.requires_grad]
    if precision == "fp32":
        optimizer = optim.build_optimizer(cfg.optimizer, params)
    else:  # as fairseq's Trainer._build_optimizer for --fp16 / --bf16
        optimizer = optim.FP16Optimizer.build_optimizer(cfg, params)
    return Built(namespace, cfg, task, model, criterion, optimizer, **where)


def prepare_sample(sample, built: Built, convert_floats: bool = True):
    """``sample`` as fairseq's trainer prepares a batch: moved to the device, float tensors in the training
    precision (``convert_floats=False``: as fairseq-generate, which only moves it)."""
    if built.device != "cpu":
        sample = utils.move_to_cuda(sample, torch.device(built.device))
    dtype = PRECISIONS[built.precision]
    if convert_floats and dtype != torch.float32:
        sample = utils.apply_to_sample(lambda t: t.to(dtype) if t.dtype is torch.float32 else t, sample)
    return sample


def load_batch(built: Built, examples: int):
    """The first ``examples`` items of the task's ``train`` split, collated by the task's own dataset and prepared
    for the device and precision (:func:`prepare_sample`)."""
    built.task.load_dataset("train")
    dataset = built.task.dataset("train")
    if len(dataset) < examples:
        raise RuntimeError(f"synthetic data has {len(dataset)} examples, {examples} needed")
    return prepare_sample(dataset.collater([dataset[i] for i in range(examples)]), built)


def _nonpad(tensor, pad):
    return int(tensor.ne(pad).sum())


@dataclass
class TrainSpec:
    """One training configuration.

    ``text_tokens(batch, pad)``: the text the step learns from (source + target tokens; for UniLMv2 the original
    sequence, not the appended pseudo/original copies, which are cost, not data). ``flops(built, batch)``: the
    analytic training FLOPs of one step (:mod:`palm_tools.bench.flops`).
    """

    key: str
    label: str
    group: str
    layout: str
    args: Callable[[str, int], List[str]]  # (size, length) -> fairseq arguments
    text_tokens: Callable
    flops: Callable
    baseline: Optional[str] = None
    plugin: bool = True


def _seq2seq_tokens(batch, pad):
    return _nonpad(batch["net_input"]["src_tokens"], pad) + _nonpad(batch["target"], pad)


def _seq2seq_flops(built, batch):
    src, prev = batch["net_input"]["src_tokens"], batch["net_input"]["prev_output_tokens"]
    mlm = _nonpad(batch["mlm_target"], built.task.source_dictionary.pad()) if "mlm_target" in batch else 0
    layout = getattr(built.model.encoder, "source_layout", None)  # PALM's encoder reads <s> first
    source = layout(src, src, built.task.source_dictionary.bos()).size(1) if layout else src.size(1)
    return encoder_decoder_step(built.dims, src.size(0), source, prev.size(1), mlm)


def pmlm_text_tokens(batch, pad):
    net = batch["net_input"]
    return int((net["kinds"].eq(int(PseudoMaskKind.CONTEXT)) & net["src_tokens"].ne(pad)).sum())


def _pmlm_flops(built, batch):
    src = batch["net_input"]["src_tokens"]
    return encoder_only_step(built.dims, src.size(0), src.size(1), _nonpad(batch["target"], built.task.dictionary.pad()))


def _cloze_tokens(batch, pad):
    return _nonpad(batch["net_input"]["src_tokens"], pad)


def _cloze_flops(built, batch):
    src = batch["net_input"]["src_tokens"]
    predicted = _nonpad(batch["target"], built.task.dictionary.pad())
    return encoder_only_step(built.dims, src.size(0), src.size(1), predicted)


def _mlm_tokens(batch, pad):
    return _nonpad(batch["net_input"]["src_tokens"], pad)


def _mlm_flops(built, batch):
    src = batch["net_input"]["src_tokens"]
    return encoder_only_step(built.dims, src.size(0), src.size(1), _nonpad(batch["target"], built.task.dictionary.pad()))


def _continuation_args(size, length):
    source_body, target_body = target_split(length)
    return palm_arch(size, length) + [
        "--task", "continuation_pair", "--max-source-tokens", str(source_body + 1), "--max-target-tokens",
        str(target_body), "--criterion", "palm_mlm_lm", "--mlm-weight", "1",
    ]  # fmt: skip  (MLM + LM: the pre-training workload with every part trained, as in docs/benchmarks.md)


LABEL_SMOOTHED = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]

TRAIN_SPECS = [
    TrainSpec(
        "transformer", "fairseq transformer, translation (baseline)", "seq2seq", "parallel",
        lambda size, length: transformer_arch(size) + translation_task(length) + LABEL_SMOOTHED,
        _seq2seq_tokens, _seq2seq_flops, plugin=False,
    ),
    TrainSpec(
        "palm", "palm, translation (fine-tuning, copy layer)", "seq2seq", "parallel",
        lambda size, length: palm_arch(size, length) + translation_task(length) + LABEL_SMOOTHED,
        _seq2seq_tokens, _seq2seq_flops, baseline="transformer",
    ),
    TrainSpec(
        "palm_nocopy", "palm --no-copy, translation (ablation: no pointer-generator)", "seq2seq", "parallel",
        lambda size, length: palm_arch(size, length) + ["--no-copy"] + translation_task(length) + LABEL_SMOOTHED,
        _seq2seq_tokens, _seq2seq_flops, baseline="transformer",
    ),
    TrainSpec(
        "palm_pretrain", "palm, continuation_pair + palm_mlm_lm (pre-training)", "palm_pretrain", "continuation",
        _continuation_args, _seq2seq_tokens, _seq2seq_flops, baseline="transformer",
    ),
    TrainSpec(
        "pmlm_mlm", "unilm2, pmlm --objective ae (plain MLM)", "pmlm", "block",
        lambda size, length: unilm_arch("unilm2", size, length)
        + ["--task", "pmlm", "--tokens-per-sample", str(length), "--objective", "ae", "--criterion", "pmlm_ae_par"],
        pmlm_text_tokens, _pmlm_flops,
    ),
    TrainSpec(
        "pmlm_ae_par", "unilm2, pmlm + pmlm_ae_par (AE + PAR, one pass)", "pmlm", "block",
        lambda size, length: unilm_arch("unilm2", size, length)
        + ["--task", "pmlm", "--tokens-per-sample", str(length), "--objective", "ae_par", "--criterion", "pmlm_ae_par"],
        pmlm_text_tokens, _pmlm_flops, baseline="pmlm_mlm",
    ),
    # The naive baseline reuses the ae_par configuration's batch; its step is bench_train.NaivePARStep.
    TrainSpec(
        "naive_par", "unilm2, naive per-step PAR: one pass per factorization step (benchmark-only baseline)",
        "pmlm", "block",
        lambda size, length: unilm_arch("unilm2", size, length)
        + ["--task", "pmlm", "--tokens-per-sample", str(length), "--objective", "ae_par", "--criterion", "pmlm_ae_par"],
        pmlm_text_tokens, None, baseline="pmlm_ae_par", plugin=False,
    ),
    TrainSpec(
        "roberta", "fairseq roberta_base, masked_lm (baseline)", "unilm", "block",
        lambda size, length: roberta_arch(size, length)
        + ["--task", "masked_lm", "--tokens-per-sample", str(length), "--criterion", "masked_lm"],
        _mlm_tokens, _mlm_flops, plugin=False,
    ),
    TrainSpec(
        "unilm_pretraining", "unilm, unilm_pretraining + unilm_cloze (4 objectives)", "unilm", "two_sentences",
        lambda size, length: unilm_arch("unilm", size, length)
        + ["--task", "unilm_pretraining", "--tokens-per-sample", str(length), "--criterion", "unilm_cloze"],
        _cloze_tokens, _cloze_flops, baseline="roberta",
    ),
    TrainSpec(
        "unilm_seq2seq", "unilm, unilm_seq2seq + unilm_cloze (fine-tuning)", "unilm", "parallel",
        lambda size, length: unilm_arch("unilm", size, length) + unilm_seq2seq_task(length)
        + ["--criterion", "unilm_cloze", "--label-smoothing", "0.1"],
        _cloze_tokens, _cloze_flops, baseline="roberta",
    ),
]
