"""``continuation_pair``: PALM pre-training data (Bi et al. 2020, sections 2.2 and 3.1).

Reads fairseq binarized monolingual data (one sentence a line, a blank line between documents) and serves
(masked context, continuation) pairs built by :mod:`palm_plugin.data.continuation_pair_dataset`. Use it with the
``palm`` model and the ``palm_mlm_lm`` criterion; fine-tune the resulting checkpoint with fairseq's ``translation``
task on data binarized with the same dictionary.
"""
import logging
from dataclasses import dataclass, field

from fairseq.data import Dictionary
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from omegaconf import II, MISSING

from palm_plugin.data.monolingual import load_dictionary, load_sentences, split_prefix
from palm_plugin.data.continuation_pair_dataset import ContinuationPairDataset, build_pair_index
from palm_plugin.data.token_masking import BertReplacementConfig, TokenMaskingPolicy
from palm_plugin.errors import InputValueError
from palm_plugin.tasks.shared_dictionary import SharedDictionaryTask

logger = logging.getLogger(__name__)


@dataclass
class ContinuationPairConfig(BertReplacementConfig):
    data: str = field(
        default=MISSING,
        metadata={
            "help": "directory of fairseq-preprocess'd monolingual data (dict.txt, {split}.bin/.idx): one sentence "
            "per line, a blank line between documents; several directories separated by ':' are used one per epoch"
        },
    )
    split_mode: ChoiceEnum(["sentence", "fraction"]) = field(
        default="sentence",
        metadata={
            "help": "sentence: source = consecutive sentences up to --max-source-tokens, target = the following "
            "sentences up to --max-target-tokens, a window sliding by one sentence (PALM section 3.1); fraction: "
            "a fragment of up to max-source + max-target tokens cut in that ratio, 80/20 (PALM section 2.2)"
        },
    )
    max_source_tokens: int = field(
        default=400, metadata={"help": "most source tokens, EOS not counted; longer sentences are truncated"}
    )
    max_target_tokens: int = field(
        default=100, metadata={"help": "most target tokens, EOS not counted; longer sentences are truncated"}
    )
    mask_prob: float = field(default=0.15, metadata={"help": "fraction of source tokens the encoder predicts (MLM)"})
    objective: ChoiceEnum(list(ContinuationPairDataset.OBJECTIVES)) = field(
        default="continuation",
        metadata={
            "help": "what the decoder predicts from what. continuation: PALM (the text after the masked context); "
            "masked_span: a MASS-like baseline (a span as long as the target, at a random place in the fragment, "
            "masked in the encoder's input and predicted by the decoder; no other source token masked); "
            "unconditional: a BERT+LM-like baseline (the continuation with no source: the decoder as a language "
            "model; use after a --stage ae run, which trains the encoder)"
        },
    )
    seed: int = II("common.seed")


@register_task("continuation_pair", dataclass=ContinuationPairConfig)
class ContinuationPairTask(SharedDictionaryTask):
    """PALM's (context, continuation) pre-training task over one shared dictionary (with ``<mask>``)."""

    trains_encoder_mlm = True  # tells the palm model to build its MLM head
    model_name = "palm"

    def __init__(self, cfg: ContinuationPairConfig, dictionary: Dictionary):
        super().__init__(cfg, dictionary)
        self.masking = TokenMaskingPolicy.from_config(cfg.mask_prob, cfg)

    @classmethod
    def setup_task(cls, cfg: ContinuationPairConfig, **kwargs):
        return cls(cfg, load_dictionary(cfg.data))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        sentences = load_sentences(self.cfg.data, split, epoch, self.dictionary, combine)
        pairs = build_pair_index(
            sentences.sizes, self.cfg.max_source_tokens, self.cfg.max_target_tokens, self.cfg.split_mode
        )
        # What a document needs to give a pair in each mode.
        shortest = "two sentences" if self.cfg.split_mode == "sentence" else "two tokens"
        if len(pairs) == 0:
            raise InputValueError(
                f"{split_prefix(self.cfg.data, split, epoch)}: no pairs: none of its {pairs.documents} documents has "
                f"{shortest}. Put one sentence per line and a blank line between documents"
                + (" (or use --split-mode fraction)" if self.cfg.split_mode == "sentence" else "")
            )
        if pairs.documents_without_pairs:
            logger.warning(
                f"{split}: {pairs.documents_without_pairs} of {pairs.documents} documents dropped: shorter than "
                f"{shortest}, they give no pair ({self.cfg.split_mode} mode)"
            )
        if pairs.truncated_sources or pairs.truncated_targets:
            logger.warning(
                f"{split}: {pairs.truncated_sources} of {len(pairs)} sources truncated to --max-source-tokens "
                f"{self.cfg.max_source_tokens} and {pairs.truncated_targets} "
                f"{'targets' if self.cfg.split_mode == 'sentence' else 'fragments'} truncated (to "
                f"{self.cfg.max_target_tokens if self.cfg.split_mode == 'sentence' else 'max-source + max-target'} "
                "tokens): sentences longer than the limits"
            )
        logger.info(f"{split}: {len(pairs)} pairs ({self.cfg.split_mode} mode) from {len(sentences)} lines")
        self.datasets[split] = ContinuationPairDataset(
            sentences, pairs, self.dictionary, self.mask_idx, self.masking, self.cfg.seed, self.cfg.objective
        )

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        # fairseq stopped at the first longer pair, asking to skip such pairs (most sources fill the window)
        source = f"--max-source-tokens {self.cfg.max_source_tokens}"
        target = f"--max-target-tokens {self.cfg.max_target_tokens}"
        if self.cfg.objective == "masked_span":  # the span is in the source
            source += f" + {target} (--objective masked_span)"
        for lengths, needed, limit, model_option in zip((source, target), self.max_positions(), model.max_positions(),
                                                        ("--encoder-max-positions", "--decoder-max-positions")):
            if needed > limit:
                raise InputValueError(f"{lengths} + [EOS]: up to {needed} tokens, and the model reads at most "
                                      f"{model_option} {limit}: lower {lengths.split()[0]} or raise {model_option}")
        return model

    def max_positions(self):
        source = self.cfg.max_source_tokens + (self.cfg.max_target_tokens if self.cfg.objective == "masked_span" else 0)
        return source + 1, self.cfg.max_target_tokens + 1
