"""The cloze loss of UniLM (Dong et al. 2019, section 2.3): recover the masked tokens, whatever the objective.

Calls ``model(**sample["net_input"])`` (corrupted tokens, segments, positions and the compact fields the model
builds its mask from) and reads ``sample["target"]`` (the original token at predicted positions, padding
elsewhere), as fairseq's ``masked_lm`` criterion does. With label smoothing
(section 3: 0.1 for fine-tuning) the loss is fairseq's label-smoothed cross-entropy. When the sample has
``next_sentence_target`` (pre-training: 0 = B follows A, 1 = B is random, -1 = not a bidirectional row), the next
sentence prediction loss of the bidirectional rows is added (section 2.3), weighted so that each of the two terms
counts as a mean (cloze per predicted token, NSP per bidirectional row), as in BERT.

Normalisation: the loss is summed over predicted tokens and fairseq divides by ``sample_size`` = their count
(not by sentences or input tokens), so the gradient is the mean per predicted token whatever share of a row is
masked, as in BERT and the UniLM code.

Logged in base 2: ``loss`` (all terms, per predicted token), ``nll_loss`` (the cloze negative log-likelihood per
predicted token), and ``next_sentence_loss`` / ``next_sentence_accuracy`` per bidirectional row.
"""
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks.translation import TranslationTask

from palm_plugin.errors import InputValueError
from palm_plugin.fixes.option_ranges import problem
from palm_plugin.modules.host_syncs import SYNCS_AT_START_HELP, count, flat_indices, select
from palm_plugin.tasks.shared_dictionary import task_name


@dataclass
class UniLMClozeConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.0, metadata={"help": "epsilon for label smoothing of the cloze loss (UniLM fine-tuning: 0.1)"}
    )
    syncs_at_start: bool = field(default=False, metadata={"help": SYNCS_AT_START_HELP})


@register_criterion("unilm_cloze", dataclass=UniLMClozeConfig)
class UniLMClozeCriterion(FairseqCriterion):
    def __init__(self, task, label_smoothing, syncs_at_start=False):
        super().__init__(task)
        # a PALM task's batches feed an encoder-decoder: a TypeError at the first batch
        pretraining = getattr(task, "trains_encoder_mlm", False)
        if pretraining or isinstance(task, TranslationTask):
            palm_loss = "palm_mlm_lm" if pretraining else "label_smoothed_cross_entropy"
            raise InputValueError(f"--criterion unilm_cloze is UniLM's loss (tasks unilm_seq2seq, unilm_pretraining, "
                                  f"pmlm), not one for --task {task_name(task)}: train PALM with --criterion "
                                  f"{palm_loss}")
        # the command line checks it when parsing (palm_plugin.fixes.option_ranges); this is for Python callers
        out_of_range = problem(SimpleNamespace(label_smoothing=label_smoothing))
        if out_of_range:
            raise InputValueError(out_of_range)
        self.eps = label_smoothing
        self.syncs_at_start = syncs_at_start

    def forward(self, model, sample, reduce=True):
        target = sample["target"]
        predicted = target.ne(self.padding_idx)
        with_next_sentence = "next_sentence_target" in sample
        if self.syncs_at_start:  # every index the step needs, before anything is queued on the device
            predicted = flat_indices(predicted)
            if with_next_sentence:
                rows = flat_indices(sample["next_sentence_target"].ne(-1))
        logits, extra = model(**sample["net_input"], masked_tokens=predicted, next_sentence=with_next_sentence)
        lprobs = F.log_softmax(logits.float(), dim=-1)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, select(target, predicted), self.eps, reduce=True)
        sample_size = count(predicted)
        logging_output = {
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"],
            "sample_size": sample_size,
        }
        if with_next_sentence:
            next_target = sample["next_sentence_target"]
            if not self.syncs_at_start:
                rows = next_target.ne(-1)
            next_logits = select(extra["next_sentence_logits"], rows, leading=1).float()
            next_loss = F.cross_entropy(next_logits, select(next_target, rows, leading=1), reduction="sum")
            bidirectional_rows = count(rows)
            if bidirectional_rows:
                loss = loss + next_loss * sample_size / bidirectional_rows
            correct = (next_logits.argmax(-1) == select(next_target, rows, leading=1)).sum()
            logging_output.update(
                next_sentence_loss=next_loss.data,
                next_sentence_rows=bidirectional_rows,
                # a device tensor with --syncs-at-start: summed where the trainer logs, not read inside the step
                next_sentence_correct=correct.data if self.syncs_at_start else int(correct),
            )
        logging_output["loss"] = loss.data
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size = total("sample_size")
        metrics.log_scalar("loss", total("loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))
        rows = total("next_sentence_rows")
        if rows:
            metrics.log_scalar("next_sentence_loss", total("next_sentence_loss") / rows / math.log(2), rows, round=3)
            correct = total("next_sentence_correct")
            # --syncs-at-start's count is a device tensor (not read here): divided in double as an int is, so that
            # both log the same accuracy (in float32, 3 of 80 rounds to 0.038; in double, to 0.037)
            if torch.is_tensor(correct):
                correct = correct.double()
            metrics.log_scalar("next_sentence_accuracy", correct / rows, rows, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
