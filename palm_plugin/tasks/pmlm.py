"""``pmlm``: UniLMv2 pre-training with the pseudo-masked LM (Bao et al. 2020, sections 3.1-3.3).

Data: fairseq-preprocess'ed monolingual text (``--only-source``; documents separated by a blank line), cut into
blocks of ``--tokens-per-sample - 3`` tokens (a block never crosses a document boundary with the default
``complete_doc``), each laid out as the paper's ``[SOS] S1 [EOS] S2 [EOS]`` (section 2.2; segments 0 and 1, cut at
a random sentence boundary inside the block, :func:`palm_plugin.data.pmlm_dataset.sentence_pair`). Each block is
masked by blockwise masking (Algorithm 1) in a random factorization order and laid out as a pseudo-masked example
(:mod:`palm_plugin.data.pmlm_dataset`); train with ``--criterion pmlm_ae_par`` on a ``unilm2_*`` arch.

The dictionary gets ``<mask>`` ([M]) and ``<pseudo>`` ([P]) if ``dict.txt`` lacks them, in that order (the
UniLMv2 fine-tuning task adds them the same way, so a pre-trained checkpoint's embedding rows line up).

``--objective`` selects the pre-training objectives of the paper's Table 6:

=========  ======================================================  =====================
objective  losses                                                  factorization steps
=========  ======================================================  =====================
ae_par     L_AE + L_PAR, one forward pass (UniLMv2)                spans (Algorithm 1)
ae         L_AE only (BERT's MLM; nothing appended)                spans (Algorithm 1)
par        L_PAR only                                              spans (Algorithm 1)
ar         L_PAR only, every step one token (autoregressive MLM)   single tokens
ae_ar      L_AE + L_PAR with single-token steps                    single tokens
=========  ======================================================  =====================
"""
import logging
from dataclasses import dataclass, field

from fairseq.data import Dictionary, TokenBlockDataset, TruncateDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import SAMPLE_BREAK_MODE_CHOICES
from omegaconf import II, MISSING

from palm_plugin.data.blockwise_masking import BlockwiseMaskingPolicy
from palm_plugin.data.monolingual import load_dictionary, load_sentences, split_prefix
from palm_plugin.data.pmlm_dataset import PseudoMaskedLMDataset
from palm_plugin.data.symbols import PSEUDO_SYMBOL
from palm_plugin.data.token_masking import BertReplacementConfig, TokenMaskingPolicy
from palm_plugin.errors import InputValueError
from palm_plugin.tasks.shared_dictionary import SharedDictionaryTask, check_positions

logger = logging.getLogger(__name__)

OBJECTIVE_CHOICES = ChoiceEnum(["ae_par", "ae", "par", "ar", "ae_ar"])
# objective -> (compute L_AE, compute L_PAR, factorization steps are spans)
OBJECTIVES = {
    "ae_par": (True, True, True),
    "ae": (True, False, True),
    "par": (False, True, True),
    "ar": (False, True, False),
    "ae_ar": (True, True, False),
}


@dataclass
class PseudoMaskedLMConfig(BertReplacementConfig):
    data: str = field(
        default=MISSING,
        metadata={"help": "colon-separated fairseq-preprocess output directories (one per epoch, round-robin)"},
    )
    sample_break_mode: SAMPLE_BREAK_MODE_CHOICES = field(
        default="complete_doc",
        metadata={"help": "how text is cut into blocks (fairseq's TokenBlockDataset); complete_doc: whole "
                  "sentences, never across a document boundary (a blank line in the raw text)"},
    )
    tokens_per_sample: int = field(
        default=512,
        metadata={"help": "longest [SOS] S1 [EOS] S2 [EOS] input (the paper: 512); appended tokens reuse positions"},
    )
    objective: OBJECTIVE_CHOICES = field(
        default="ae_par", metadata={"help": "pre-training objectives (the paper's Table 6): ae_par, ae, par, ar, ae_ar"}
    )
    mask_prob: float = field(default=0.15, metadata={"help": "share of tokens masked (Algorithm 1 stops at >= this)"})
    block_prob: float = field(
        default=0.4, metadata={"help": "probability that a drawn span is a block (n-gram) instead of one token"}
    )
    min_block_length: int = field(default=2, metadata={"help": "shortest block (n-gram) length"})
    max_block_length: int = field(default=6, metadata={"help": "longest block (n-gram) length"})
    seed: int = II("common.seed")


@register_task("pmlm", dataclass=PseudoMaskedLMConfig)
class PseudoMaskedLMTask(SharedDictionaryTask):
    cfg: PseudoMaskedLMConfig

    def __init__(self, cfg: PseudoMaskedLMConfig, dictionary: Dictionary):
        super().__init__(cfg, dictionary)
        if cfg.tokens_per_sample < 5:  # fairseq's TokenBlockDataset failed on blocks of fewer than 2 tokens
            raise InputValueError(f"--tokens-per-sample {cfg.tokens_per_sample}: must be at least 5 ([SOS] S1 [EOS] S2 "
                                  "[EOS], a token on each side)")
        self.pseudo_idx = dictionary.add_symbol(PSEUDO_SYMBOL)
        predict_masked_slots, append_pseudo, spans = OBJECTIVES[cfg.objective]
        unused = [f"--{name.replace('_', '-')} {getattr(cfg, name)}" for name in
                  ("block_prob", "min_block_length", "max_block_length")
                  if getattr(cfg, name) != getattr(PseudoMaskedLMConfig, name)]
        if unused and not spans:  # fairseq takes them, and these objectives draw no blocks
            logger.warning(f"{' and '.join(unused)}: not read with --objective {cfg.objective}, whose factorization "
                           "steps are single tokens (the spans of Algorithm 1 are ae_par's, ae's and par's): leave "
                           "them out")
        self.predict_masked_slots = predict_masked_slots
        self.append_pseudo = append_pseudo
        self.masking = BlockwiseMaskingPolicy(
            mask_prob=cfg.mask_prob,
            block_prob=cfg.block_prob if spans else 0.0,
            min_block_length=cfg.min_block_length,
            max_block_length=cfg.max_block_length,
        )
        self.replacement = TokenMaskingPolicy.from_config(cfg.mask_prob, cfg)  # at the [M] slots

    @classmethod
    def setup_task(cls, cfg: PseudoMaskedLMConfig, **kwargs):
        return cls(cfg, load_dictionary(cfg.data))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        dataset = load_sentences(self.cfg.data, split, epoch, self.dictionary, combine)
        block_size = self.cfg.tokens_per_sample - 3  # room for [SOS] and the [EOS] of both segments
        too_long = int((dataset.sizes > block_size).sum())
        if too_long and self.cfg.sample_break_mode != "none":
            # These modes never split a line, so a longer line would make a block longer than the model's positions
            # (fairseq would drop it); cut it instead, and say so.
            logger.warning(
                f"{split}: {too_long} lines are longer than a block ({block_size} tokens) and lose their end; "
                f"--sample-break-mode none packs text across lines without cutting"
            )
            dataset = TruncateDataset(dataset, block_size)
        blocks = TokenBlockDataset(
            dataset,
            dataset.sizes,
            block_size,
            pad=self.dictionary.pad(),
            eos=self.dictionary.eos(),
            break_mode=self.cfg.sample_break_mode,
        )
        logger.info(f"loaded {len(blocks)} blocks from {split_prefix(self.cfg.data, split, epoch)}")
        self.datasets[split] = PseudoMaskedLMDataset(
            blocks,
            self.dictionary,
            mask_idx=self.mask_idx,
            pseudo_idx=self.pseudo_idx,
            masking=self.masking,
            replacement=self.replacement,
            seed=self.cfg.seed,
            append_pseudo=self.append_pseudo,
            predict_masked_slots=self.predict_masked_slots,
            sentence_pairs=True,
        )

    def build_model(self, cfg, from_checkpoint=False):
        return check_positions(super().build_model(cfg, from_checkpoint), self.cfg.tokens_per_sample)

    def max_positions(self):
        return self.cfg.tokens_per_sample
