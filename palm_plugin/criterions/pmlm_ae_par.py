"""``pmlm_ae_par``: the UniLMv2 pre-training loss (Bao et al. 2020, equations 3, 6 and 7).

    L = L_AE + L_PAR                                                          (7)
    L_AE  = - sum_{m in M} log p(x_m | x_{\\M})           predicted at the [M] slots              (3)
    L_PAR = - sum_i sum_{m in M_i} log p(x_m | x_{\\M>=i})  predicted at the [P] tokens of step i   (5, 6)

Both come from ONE forward pass over the pseudo-masked input (:mod:`palm_plugin.data.pmlm_dataset`),
``model(**sample["net_input"])``: the model builds the mask of
:func:`palm_plugin.modules.attention_masks.pmlm_mask` from the batch's steps and kinds; the LM head runs on the
predicted rows only.

Normalisation: the loss is divided by the number of masked tokens ``|M|`` (``sample_size``), not by the number
of predictions ``2|M|``, so the gradient is the mean AE loss plus the mean PAR loss, the equal-weight sum of (7).
Logged, in base 2 per predicted token: ``ae_loss``, ``par_loss`` and ``loss`` (their sum when both are on).
"""
import math
from dataclasses import dataclass, field

import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from fairseq.tasks import FairseqTask

from palm_plugin.errors import InputValueError
from palm_plugin.modules.attention_masks import PseudoMaskKind
from palm_plugin.modules.host_syncs import SYNCS_AT_START_HELP, count, flat_indices, select
from palm_plugin.tasks.pmlm import PseudoMaskedLMTask
from palm_plugin.tasks.shared_dictionary import task_name


@dataclass
class PseudoMaskedLMConfig(FairseqDataclass):
    syncs_at_start: bool = field(default=False, metadata={"help": SYNCS_AT_START_HELP})


@register_criterion("pmlm_ae_par", dataclass=PseudoMaskedLMConfig)
class PseudoMaskedLMCriterion(FairseqCriterion):
    """Sums of AE and PAR cross-entropies; the objective mix is decided by the task's data (``--objective``)."""

    def __init__(self, task, syncs_at_start=False):
        super().__init__(task)
        # another task's batches have no factorization steps or kinds: a KeyError at the first batch
        if isinstance(task, FairseqTask) and not isinstance(task, PseudoMaskedLMTask):
            raise InputValueError(f"--criterion pmlm_ae_par is the loss of --task pmlm's pseudo-masked batches, not of "
                                  f"--task {task_name(task)}: train the other UniLM tasks with --criterion unilm_cloze")
        self.syncs_at_start = syncs_at_start

    def forward(self, model, sample, reduce=True):
        kinds = sample["net_input"]["kinds"]
        target = sample["target"]
        predicted = target.ne(self.padding_idx)  # (B, L): the [M] slots (AE) and the [P] tokens (PAR)
        if self.syncs_at_start:  # both counts and the indices before anything is queued on the device
            predicted = flat_indices(predicted)
            is_par = select(kinds, predicted) == PseudoMaskKind.PSEUDO
            par_count = int(is_par.sum())
        logits, _ = model(**sample["net_input"], masked_tokens=predicted)
        losses = F.cross_entropy(logits.float(), select(target, predicted), reduction="none")  # (N,) nats
        if not self.syncs_at_start:
            is_par = kinds[predicted] == PseudoMaskKind.PSEUDO
            par_count = int(is_par.sum())
        ae_loss = losses.masked_fill(is_par, 0.0).sum()
        par_loss = losses.masked_fill(~is_par, 0.0).sum()
        ae_count = count(predicted) - par_count
        # Every masked token is predicted once by each enabled objective.
        sample_size = max(ae_count, par_count)
        loss = ae_loss + par_loss
        logging_output = {
            "loss": loss.data,
            "ae_loss": ae_loss.data,
            "par_loss": par_loss.data,
            "ae_count": ae_count,
            "par_count": par_count,
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"],
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size = total("sample_size")
        if sample_size > 0:
            metrics.log_scalar("loss", total("loss") / sample_size / math.log(2), sample_size, round=3)
        for name in ("ae", "par"):
            count = total(f"{name}_count")
            if count > 0:
                metrics.log_scalar(f"{name}_loss", total(f"{name}_loss") / count / math.log(2), count, round=3)
                metrics.log_derived(
                    f"{name}_ppl", lambda meters, name=name: utils.get_perplexity(meters[f"{name}_loss"].avg)
                )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
