"""UniLM pre-training (Dong et al. 2019, sections 2.3-2.4): one batch mixes the four cloze objectives.

Data: ``fairseq-preprocess --only-source`` output of text with one sentence a line and an empty line between
documents (``{data}/dict.txt``, ``{data}/{split}.bin/.idx``); see :mod:`palm_plugin.data.unilm_pretraining_dataset`
for the sampling. Train with ``--criterion unilm_cloze`` and a ``unilm_*`` arch (six segment types).
"""
import logging
from dataclasses import dataclass, field
from fractions import Fraction

from fairseq.tasks import register_task
from omegaconf import II, MISSING

from palm_plugin.data.monolingual import load_dictionary, load_sentences, split_prefix
from palm_plugin.data.token_masking import BertReplacementConfig, TokenMaskingPolicy
from palm_plugin.data.unilm_pretraining_dataset import NUM_OBJECTIVE_SEGMENTS, UniLMPretrainingDataset
from palm_plugin.errors import InputValueError
from palm_plugin.tasks.shared_dictionary import SharedDictionaryTask, check_positions

logger = logging.getLogger(__name__)


def _floats(text, option, meaning, count=None):
    """``"0.8,0.1,0.1"`` or ``"1/3,1/3,1/6,1/6"`` -> a tuple of ``count`` (or any number of) probabilities."""
    try:
        values = tuple(float(Fraction(x.strip())) for x in text.split(","))
    except (ValueError, ZeroDivisionError):
        raise InputValueError(f"{option}: expected comma-separated numbers or fractions, got {text!r}") from None
    # a negative one failed in numpy's sampling at the first batch, and a sum other than 1 named no option
    if (count and len(values) != count) or min(values) < 0 or abs(sum(values) - 1) > 1e-6:
        raise InputValueError(f"{option} {text}: {len(values)} values summing to {sum(values):g}; give "
                              f"{count or 'the'} probabilities {meaning}, none negative, that sum to 1")
    return values


@dataclass
class UniLMPretrainingConfig(BertReplacementConfig):
    data: str = field(default=MISSING, metadata={"help": "directory of fairseq-preprocess --only-source output"})
    tokens_per_sample: int = field(
        default=512, metadata={"help": "longest packed sequence [SOS] A [EOS] B [EOS], special tokens included"}
    )
    mask_prob: float = field(default=0.15, metadata={"help": "fraction of the text tokens to predict"})
    span_length_probs: str = field(
        default="0.8,0.1,0.1",
        metadata={
            "help": "probabilities of masking 1, 2, 3, ... consecutive tokens (UniLM: 0.8 unigrams, 0.2 bigrams and "
            "trigrams)"
        },
    )
    objective_probs: str = field(
        default="1/3,1/3,1/6,1/6",
        metadata={"help": "probabilities of the objectives bidirectional, seq2seq, left-to-right, right-to-left"},
    )
    seed: int = II("common.seed")


@register_task("unilm_pretraining", dataclass=UniLMPretrainingConfig)
class UniLMPretrainingTask(SharedDictionaryTask):
    def __init__(self, cfg: UniLMPretrainingConfig, dictionary):
        super().__init__(cfg, dictionary)
        span_length_probs = _floats(cfg.span_length_probs, "--span-length-probs", "of spans of 1, 2, 3, ... tokens")
        self.masking = TokenMaskingPolicy.from_config(cfg.mask_prob, cfg, span_length_probs=span_length_probs)
        self.objective_probs = _floats(
            cfg.objective_probs, "--objective-probs", "of bidirectional, seq2seq, left-to-right, right-to-left", 4)

    @classmethod
    def setup_task(cls, cfg: UniLMPretrainingConfig, **kwargs):
        return cls(cfg, load_dictionary(cfg.data))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        sentences = load_sentences(self.cfg.data, split, epoch, self.dictionary, combine)
        dataset = UniLMPretrainingDataset(
            sentences,
            self.dictionary,
            self.cfg.tokens_per_sample,
            self.masking,
            self.mask_idx,
            self.cfg.seed,
            self.objective_probs,
        )
        if len(dataset) == 0:
            raise InputValueError(
                f"{split_prefix(self.cfg.data, split, epoch)}: no chunk of two text tokens: every document is a "
                "single one-token sentence. Give documents of several words, one sentence a line"
            )
        if dataset.dropped_sentences:
            logger.warning(
                f"{split}: {dataset.dropped_sentences} one-token sentences dropped: each would form a chunk alone "
                "(a one-word document, or a one-word sentence next to one that fills --tokens-per-sample), and a "
                "chunk needs two text tokens"
            )
        logger.info(f"{split}: {len(sentences)} sentences -> {len(dataset)} chunks")
        self.datasets[split] = dataset

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if model.cfg.num_segments < NUM_OBJECTIVE_SEGMENTS:
            raise InputValueError(
                f"unilm_pretraining marks the objective with segment ids 0-5; the model has {model.cfg.num_segments} "
                f"segment types: use a unilm_* arch (not unilm2_*) or --num-segments 6"
            )
        return check_positions(model, self.cfg.tokens_per_sample)

    def max_positions(self):
        return self.cfg.tokens_per_sample
