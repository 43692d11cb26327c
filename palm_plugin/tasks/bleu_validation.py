"""Validation by decoding: the corpus BLEU of the validation split at each validation, with the options of fairseq's
``translation`` task (``--eval-bleu``, ``--eval-bleu-args``, ...), so that ``--best-checkpoint-metric bleu
--maximize-best-checkpoint-metric`` keeps the checkpoint that decodes best, on UniLM's task as on PALM's.

fairseq's own implementation lives in its ``TranslationTask`` and calls that class through ``super()``, so another
task cannot borrow it; this one computes the same statistics (sacrebleu's n-gram counts and lengths a batch, summed
over batches and processes, BLEU from the sums with exponential smoothing) under the same logging keys, and checks
what fairseq takes silently (:func:`~palm_plugin.fixes.generation_options.eval_bleu_problem`, for fairseq's
``translation`` too): decoding options it does not know are ignored there.
"""
import logging
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from fairseq import metrics, utils
from fairseq.data import encoders
from fairseq.dataclass import FairseqDataclass
from omegaconf import II

from palm_plugin.fixes.generation_options import REMOVE_BPE, json_option

logger = logging.getLogger(__name__)

ORDER = 4  # BLEU-4
# an unknown word matches nothing: the reference's and the hypothesis's <unk> are written apart (as fairseq does)
UNKNOWN_IN_REFERENCE, UNKNOWN_IN_HYPOTHESIS = "UNKNOWNTOKENINREF", "UNKNOWNTOKENINHYP"


@dataclass
class BleuValidationConfig(FairseqDataclass):
    eval_bleu: bool = field(
        default=False,
        metadata={"help": "at each validation, decode the validation split (beam search, --eval-bleu-args) and log "
                          "its corpus BLEU as 'bleu'; with --best-checkpoint-metric bleu "
                          "--maximize-best-checkpoint-metric, checkpoint_best.pt is the checkpoint that decodes best"},
    )
    eval_bleu_args: str = field(
        default="{}",
        metadata={"help": "with --eval-bleu: the decoding options as JSON, fairseq-generate's names with "
                          "underscores, e.g. '{\"beam\": 4, \"lenpen\": 0.6, \"max_len_b\": 64}' (default: "
                          "fairseq-generate's defaults)"},
    )
    eval_bleu_detok: str = field(
        default="space",
        metadata={"help": "with --eval-bleu: the tokenizer that detokenizes hypotheses and references before BLEU "
                          "(fairseq's --tokenizer names: space = none, moses, ...)"},
    )
    eval_bleu_detok_args: str = field(
        default="{}", metadata={"help": "with --eval-bleu: that tokenizer's options as JSON"}
    )
    eval_tokenized_bleu: bool = field(
        default=False,
        metadata={"help": "with --eval-bleu: BLEU of the detokenized text split at spaces, without sacrebleu's 13a "
                          "tokenization"},
    )
    eval_bleu_remove_bpe: Optional[str] = field(
        default=None,
        metadata={"help": "with --eval-bleu: join subwords before BLEU, as fairseq-generate's --post-process does: "
                          f"{', '.join(REMOVE_BPE)} ('@@ ' when given alone); without it, and for BPE these do not "
                          "cover (GPT-2's, BERT's WordPiece), BLEU counts the pieces",
                  "argparse_const": "@@ "},
    )
    eval_bleu_print_samples: bool = field(
        default=False, metadata={"help": "with --eval-bleu: log one hypothesis and its reference a batch"}
    )
    train_subset: str = II("dataset.train_subset")


class BleuValidation:
    """What ``--eval-bleu`` adds to a task: a generator and a detokenizer, built with the model, and the BLEU
    statistics of a validation batch (the batch's ``generation`` part: sources alone and whole references)."""

    def __init__(self, cfg: BleuValidationConfig, generator):
        self.cfg = cfg
        self.generator = generator
        detok_options = json_option("eval-bleu-detok-args", cfg.eval_bleu_detok_args)
        self.tokenizer = encoders.build_tokenizer(Namespace(tokenizer=cfg.eval_bleu_detok, **detok_options))

    def _text(self, dictionary, tokens, unknown: str) -> str:
        # the symbols fairseq-generate strips from what it prints (</s>, and any the generator adds)
        strip = getattr(self.generator, "symbols_to_strip_from_output", None)
        text = dictionary.string(tokens.int().cpu(), self.cfg.eval_bleu_remove_bpe, unk_string=unknown,
                                 extra_symbols_to_ignore=strip)
        return self.tokenizer.decode(text) if self.tokenizer else text

    def logging_output(self, task, sample, model) -> dict:
        """The sacrebleu statistics of decoding ``sample`` (summed by :func:`reduce_bleu`)."""
        import sacrebleu

        dictionary = task.target_dictionary
        output = task.inference_step(self.generator, [model], sample)
        hypotheses = [self._text(dictionary, hypos[0]["tokens"], UNKNOWN_IN_HYPOTHESIS) for hypos in output]
        references = [self._text(dictionary, utils.strip_pad(target, dictionary.pad()), UNKNOWN_IN_REFERENCE)
                      for target in sample["target"]]
        if self.cfg.eval_bleu_print_samples:
            logger.info(f"example hypothesis: {hypotheses[0]}")
            logger.info(f"example reference: {references[0]}")
        bleu = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none" if self.cfg.eval_tokenized_bleu else "13a")
        statistics = {"_bleu_sys_len": bleu.sys_len, "_bleu_ref_len": bleu.ref_len}
        for n in range(ORDER):
            statistics[f"_bleu_counts_{n}"], statistics[f"_bleu_totals_{n}"] = bleu.counts[n], bleu.totals[n]
        return statistics


def reduce_bleu(logging_outputs) -> None:
    """Log 'bleu' of the summed statistics of :meth:`BleuValidation.logging_output`."""
    def total(key):
        value = sum(log.get(key, 0) for log in logging_outputs)
        return value.cpu() if hasattr(value, "cpu") else value

    totals = [total(f"_bleu_totals_{n}") for n in range(ORDER)]
    if max(totals) == 0:
        return
    metrics.log_scalar("_bleu_counts", np.array([total(f"_bleu_counts_{n}") for n in range(ORDER)]))
    metrics.log_scalar("_bleu_totals", np.array(totals))
    metrics.log_scalar("_bleu_sys_len", total("_bleu_sys_len"))
    metrics.log_scalar("_bleu_ref_len", total("_bleu_ref_len"))

    def bleu(meters):
        from sacrebleu.metrics import BLEU

        score = BLEU.compute_bleu(correct=meters["_bleu_counts"].sum, total=meters["_bleu_totals"].sum,
                                  sys_len=meters["_bleu_sys_len"].sum, ref_len=meters["_bleu_ref_len"].sum,
                                  smooth_method="exp")
        return round(score.score, 2)

    metrics.log_derived("bleu", bleu)
