"""``palm_mlm_lm``: PALM's two pre-training losses (Bi et al. 2020, section 2.1).

* ``mlm_loss``: masked language modelling on the encoder (cross-entropy of the MLM head at the masked source
  positions against the original tokens), the autoencoding objective;
* ``lm_loss``: the decoder's negative log-likelihood of the continuation, equation (1), through the
  pointer-generator mixture.

``--stage ae`` (first stage) optimises the MLM loss alone (the decoder is not run). ``--stage joint`` (second
stage) optimises ``lm_weight * mean LM loss + mlm_weight * mean MLM loss`` per batch (each a per-token mean, so the
weights keep their meaning whatever the number of masked and target tokens). The paper's second stage maximises the
decoder's log-likelihood only (equation (1); section 2.2: the encoder's and the decoder's predictions "are used for
training in the two stages, respectively"), so ``mlm_weight`` defaults to 0: the encoder still reads the masked
context (Figure 1(d)) and the MLM loss is still logged, without gradient. ``--mlm-weight 1`` gives the 1:1 MLM + LM
variant. Logged losses are in base 2 per predicted token.
"""
import math
from dataclasses import dataclass, field

import torch.nn.functional as F
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask

from palm_plugin.errors import InputValueError
from palm_plugin.tasks.shared_dictionary import task_name


@dataclass
class PalmMlmLmConfig(FairseqDataclass):
    stage: ChoiceEnum(["ae", "joint"]) = field(
        default="joint",
        metadata={
            "help": "ae: first stage, the encoder alone as a masked-LM autoencoder (decoder not run); joint: "
            "second stage, the decoder's log-likelihood of the continuation given the masked context (PALM "
            "equation (1); add the MLM loss with --mlm-weight). Several GPUs need --find-unused-parameters in "
            "stage ae (the decoder gets no gradient) and in stage joint with --mlm-weight 0 (nor does the MLM head)"
        },
    )
    mlm_weight: float = field(
        default=0.0,
        metadata={
            "help": "stage joint: weight of the encoder's masked-LM loss added to the decoder's LM loss. 0 (the "
            "paper's second stage): not optimised, only logged; 1: MLM + LM 1:1. Stage ae optimises the MLM loss "
            "alone whatever this is"
        },
    )
    lm_weight: float = field(default=1.0, metadata={"help": "stage joint: weight of the decoder's LM loss"})


@register_criterion("palm_mlm_lm", dataclass=PalmMlmLmConfig)
class PalmMlmLmCriterion(FairseqCriterion):
    def __init__(self, task, stage, mlm_weight, lm_weight):
        super().__init__(task)
        # another task's batches have no mlm_target: a KeyError at the first batch
        if isinstance(task, FairseqTask) and not getattr(task, "trains_encoder_mlm", False):
            raise InputValueError(f"--criterion palm_mlm_lm is PALM's pre-training loss (--task continuation_pair), "
                                  f"not one for --task {task_name(task)}: fine-tune PALM with --criterion "
                                  "label_smoothed_cross_entropy")
        if stage == "joint" and mlm_weight == 0 and lm_weight == 0:  # a loss of 0: nothing would be learned
            raise InputValueError("--mlm-weight 0 and --lm-weight 0: stage joint would train nothing; give one of "
                                  "them a weight above 0")
        if stage == "ae" and getattr(getattr(task, "cfg", None), "objective", None) == "unconditional":
            raise InputValueError("--stage ae trains the encoder, and --objective unconditional gives it no source: "
                                  "train stage ae with --objective continuation, then stage joint with --objective "
                                  "unconditional")
        self.stage = stage
        self.mlm_weight = mlm_weight
        self.lm_weight = lm_weight

    def forward(self, model, sample, reduce=True):
        """Returns ``(loss, sample_size=1, logging_output)``; ``loss`` is the weighted sum of per-token means."""
        net_input = sample["net_input"]
        mlm_target = sample["mlm_target"]
        masked = mlm_target.ne(self.padding_idx)
        joint = self.stage == "joint"
        log_probs, extra = model(
            net_input["src_tokens"],
            net_input["src_lengths"],
            net_input["prev_output_tokens"] if joint else None,
            masked_tokens=masked,
        )
        mlm_tokens = int(masked.sum())
        mlm_loss = F.cross_entropy(extra["mlm_logits"].float(), mlm_target[masked], reduction="sum")
        if not joint:
            loss = mlm_loss / mlm_tokens
        elif self.mlm_weight:
            loss = self.mlm_weight * mlm_loss / mlm_tokens
        else:
            loss = 0.0  # the paper's second stage: the MLM loss is only logged (the MLM head gets no gradient)
        logging_output = {
            "mlm_loss": mlm_loss.detach(),
            "mlm_tokens": mlm_tokens,
            "nsentences": sample["nsentences"],
            "sample_size": 1,
        }
        if joint:
            target = sample["target"]
            log_probs = model.get_normalized_probs((log_probs, extra), log_probs=True)
            lm_loss = F.nll_loss(
                log_probs.view(-1, log_probs.size(-1)), target.view(-1), ignore_index=self.padding_idx, reduction="sum"
            )
            loss = loss + self.lm_weight * lm_loss / sample["ntokens"]
            logging_output["lm_loss"] = lm_loss.detach()
        logging_output["ntokens"] = sample["ntokens"]
        logging_output["loss"] = loss.detach()
        return loss, 1, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        sample_size = total("sample_size")
        metrics.log_scalar("loss", total("loss") / sample_size / math.log(2), sample_size, round=3)
        mlm_tokens = total("mlm_tokens")
        if mlm_tokens:  # none with --objective unconditional
            metrics.log_scalar("mlm_loss", total("mlm_loss") / mlm_tokens / math.log(2), mlm_tokens, round=3)
        if any("lm_loss" in log for log in logging_outputs):
            ntokens = total("ntokens")
            metrics.log_scalar("lm_loss", total("lm_loss") / ntokens / math.log(2), ntokens, round=3)
            metrics.log_derived("lm_ppl", lambda meters: utils.get_perplexity(meters["lm_loss"].avg))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
