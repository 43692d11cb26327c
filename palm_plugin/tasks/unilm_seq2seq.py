"""UniLM sequence-to-sequence fine-tuning and decoding (Dong et al. 2019, section 2.5).

Data: ``fairseq-preprocess --source-lang src --target-lang tgt --joined-dictionary`` output, named as for
fairseq's ``translation`` task (``{data}/{split}.{src}-{tgt}.{src|tgt}.bin/.idx``, ``dict.{src|tgt}.txt``). UniLM
shares one vocabulary between source and target, so both dictionaries must be the same.

Training packs ``[SOS] S1 [EOS] S2 [EOS]`` (``--max-source-positions`` / ``--max-target-positions`` truncation,
counted and logged), predicts ``--mask-prob`` of ``S2 [EOS]`` (80/10/10) with ``--criterion unilm_cloze``
(``--label-smoothing 0.1`` in the paper). ``fairseq-generate`` decodes with the model's cached incremental decoder;
``fairseq-generate --score-reference`` scores the references (perplexity) with
:class:`~palm_plugin.models.unilm_reference_scorer.UniLMReferenceScorer`; ``fairseq-interactive`` (and fairseq's hub
interface) decodes raw text through :meth:`UniLMSeq2SeqTask.build_dataset_for_inference`.

``--pseudo-masks`` switches to UniLMv2's fine-tuning layout ``[source | target | pseudo target]`` (Bao et al.
2020): the dataset is :class:`palm_plugin.data.pseudo_seq2seq_dataset.PseudoSeq2SeqDataset` (same constructor
arguments and batch keys as :class:`~palm_plugin.data.unilm_seq2seq_dataset.UniLMSeq2SeqDataset`), the dictionary
gets the pseudo symbol, and decoding feeds the pseudo symbol as placeholder (``--pseudo-mask-noise s2s_ft``:
[MASK], the symbol s2s-ft's pseudo slots mostly hold).

``--eval-bleu`` (:mod:`palm_plugin.tasks.bleu_validation`, the options of fairseq's ``translation`` task) decodes the
validation splits at each validation and logs their BLEU: their batches carry the generation view of the same pairs
beside the training view the loss reads.
"""
import contextlib
import logging
import os
from dataclasses import dataclass, field

import torch
from fairseq import utils
from fairseq.data import Dictionary, ListDataset, data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from omegaconf import II, MISSING, OmegaConf, open_dict

from palm_plugin.data.pseudo_seq2seq_dataset import NOISE_SCHEMES, PseudoSeq2SeqDataset
from palm_plugin.data.symbols import MASK_SYMBOL, PSEUDO_SYMBOL
from palm_plugin.data.token_masking import BertReplacementConfig, TokenMaskingPolicy
from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset
from palm_plugin.errors import InputFileNotFoundError, InputValueError
from palm_plugin.fixes.data_checks import missing_split
from palm_plugin.fixes.generation_options import decoding_options
from palm_plugin.models.unilm_reference_scorer import UniLMReferenceScorer
from palm_plugin.tasks.bleu_validation import BleuValidation, BleuValidationConfig, reduce_bleu
from palm_plugin.tasks.shared_dictionary import SharedDictionaryTask

logger = logging.getLogger(__name__)


@dataclass
class UniLMSeq2SeqConfig(BertReplacementConfig, BleuValidationConfig):
    data: str = field(default=MISSING, metadata={"help": "directory of fairseq-preprocess output (translation layout)"})
    source_lang: str = field(
        default="src", metadata={"help": "source language suffix of the data files", "argparse_alias": "-s"}
    )
    target_lang: str = field(
        default="tgt", metadata={"help": "target language suffix of the data files", "argparse_alias": "-t"}
    )
    max_source_positions: int = field(
        default=384, metadata={"help": "longest [SOS] S1 [EOS]; longer sources are cut at the end"}
    )
    max_target_positions: int = field(
        default=128,
        metadata={
            "help": "longest S2 [EOS]; longer targets are cut at the end (the [EOS] stays). Pairs that still need "
            "more than the model's positions (--max-positions) are skipped"
        },
    )
    mask_prob: float = field(
        default=0.7, metadata={"help": "fraction of S2 [EOS] to predict (paper: 0.7 summaries/QG, 0.5 QA/dialog)"}
    )
    source_segment: int = field(
        default=4, metadata={"help": "segment id of the source (UniLM v1: 4; UniLMv2 / BERT checkpoints: 0)"}
    )
    target_segment: int = field(
        default=5, metadata={"help": "segment id of the target (UniLM v1: 5; UniLMv2 / BERT checkpoints: 1)"}
    )
    pseudo_masks: bool = field(
        default=False, metadata={"help": "UniLMv2 fine-tuning layout [source | target | pseudo target]"}
    )
    target_mask_prob: float = field(
        default=0.5,
        metadata={
            "help": "with --pseudo-masks: fraction of the target history corrupted (80/10/10, --leave-unmasked-prob / "
            "--random-token-prob) so the model tolerates its own decoding errors; every target token is predicted "
            "from its pseudo token whatever this is (--mask-prob applies to the UniLM v1 layout only)"
        },
    )
    pseudo_mask_noise: ChoiceEnum(NOISE_SCHEMES) = field(
        default="exact",
        metadata={
            "help": "with --pseudo-masks: exact = ceil(target_mask_prob * n) target tokens corrupted, pseudo slots "
            "always <pseudo> (the placeholder decoding feeds); s2s_ft = Microsoft's s2s-ft scheme: pseudo slots "
            "[MASK] / random / true token (80/10/10, --leave-unmasked-prob / --random-token-prob), each target "
            "token replaced by its slot's token with probability --target-mask-prob, decoding placeholder [MASK]"
        },
    )
    seed: int = II("common.seed")


@register_task("unilm_seq2seq", dataclass=UniLMSeq2SeqConfig)
class UniLMSeq2SeqTask(SharedDictionaryTask):
    def __init__(self, cfg: UniLMSeq2SeqConfig, dictionary):
        super().__init__(cfg, dictionary)
        if cfg.pseudo_masks:
            dictionary.add_symbol(PSEUDO_SYMBOL)
        # the other layout's options, which fairseq takes and this layout does not read
        other = ("mask_prob",) if cfg.pseudo_masks else ("target_mask_prob", "pseudo_mask_noise")
        unused = [f"--{name.replace('_', '-')} {getattr(cfg, name)}" for name in other
                  if str(getattr(cfg, name)) != str(getattr(UniLMSeq2SeqConfig, name))]
        if unused and cfg.pseudo_masks:
            logger.warning(f"{unused[0]}: not read with --pseudo-masks, which predicts every target token (the "
                           f"history's corrupted share is --target-mask-prob {cfg.target_mask_prob}): leave it out")
        elif unused:
            logger.warning(f"{' and '.join(unused)}: not read without --pseudo-masks (UniLM v1's layout predicts "
                           f"--mask-prob {cfg.mask_prob} of the target): add --pseudo-masks, or leave them out")
        self.masking = TokenMaskingPolicy.from_config(cfg.target_mask_prob if cfg.pseudo_masks else cfg.mask_prob, cfg)

    @classmethod
    def setup_task(cls, cfg: UniLMSeq2SeqConfig, **kwargs):
        data = utils.split_paths(cfg.data)[0]
        paths = [os.path.join(data, f"dict.{lang}.txt") for lang in (cfg.source_lang, cfg.target_lang)]
        for path in paths:
            if not os.path.exists(path):
                raise InputFileNotFoundError(f"{path}: no dictionary; run fairseq-preprocess (translation layout) "
                                             "first")
        source_dict, target_dict = (Dictionary.load(path) for path in paths)
        if source_dict.symbols != target_dict.symbols:
            raise InputValueError(
                f"{paths[0]} and {paths[1]} differ: UniLM shares one vocabulary; preprocess with "
                f"--joined-dictionary (or the same --srcdict and --tgtdict)"
            )
        logger.info(f"dictionary: {len(source_dict)} types")
        return cls(cfg, source_dict)

    def _split_prefix(self, split, data):
        src, tgt = self.cfg.source_lang, self.cfg.target_lang
        for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
            prefix = os.path.join(data, f"{split}.{pair}.")
            if os.path.exists(prefix + f"{src}.idx"):
                return prefix
        raise missing_split(data, split, src, tgt)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        prefix = self._split_prefix(split, paths[(epoch - 1) % len(paths)])
        source = data_utils.load_indexed_dataset(prefix + self.cfg.source_lang, self.dictionary)
        target = data_utils.load_indexed_dataset(prefix + self.cfg.target_lang, self.dictionary)
        if source is None or target is None:
            raise InputFileNotFoundError(f"{prefix}{{{self.cfg.source_lang},{self.cfg.target_lang}}}.bin: cannot read")
        dataset = self._dataset(source, target)
        counts = (
            f"{split}: {len(dataset)} pairs; truncated {dataset.truncated_sources} sources to --max-source-positions "
            f"{self.cfg.max_source_positions} and {dataset.truncated_targets} targets to --max-target-positions "
            f"{self.cfg.max_target_positions}; kept {dataset.empty_sources} empty sources and {dataset.empty_targets} "
            "empty targets"
        )
        changed = dataset.truncated_sources + dataset.truncated_targets + dataset.empty_sources + dataset.empty_targets
        (logger.warning if changed else logger.info)(counts)
        dataset.with_generation_view = self.cfg.eval_bleu and split != self.cfg.train_subset
        self.datasets[split] = dataset

    def _dataset(self, source, target, generation=False):
        """The switch point between UniLM's layout and UniLMv2's (``--pseudo-masks``)."""
        arguments = (
            source, target, self.dictionary, self.cfg.max_source_positions, self.cfg.max_target_positions,
            self.masking, self.mask_idx, self.cfg.source_segment, self.cfg.target_segment, self.cfg.seed,
        )
        if self.cfg.pseudo_masks:
            return PseudoSeq2SeqDataset(*arguments, generation=generation, noise=self.cfg.pseudo_mask_noise)
        return UniLMSeq2SeqDataset(*arguments, generation=generation)

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        """Sources to decode (``fairseq-interactive``, hub interfaces): token tensors ending with [EOS], as
        ``source_dictionary.encode_line`` gives them; batches hold the generation view (no target)."""
        if constraints is not None:
            raise InputValueError("--constraints is not supported by the unilm decoder; decode without constraints")
        return self._dataset(ListDataset(src_tokens, sizes=list(src_lengths)), None, generation=True)

    def build_model(self, cfg, from_checkpoint=False):
        if self.cfg.pseudo_masks:
            with open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.ExitStack():
                # the symbol the pseudo slots held in training
                cfg.decoding_placeholder = PSEUDO_SYMBOL if self.cfg.pseudo_mask_noise == "exact" else MASK_SYMBOL
        model = super().build_model(cfg, from_checkpoint)
        segments = model.cfg.num_segments
        if not (0 <= self.cfg.source_segment < segments and 0 <= self.cfg.target_segment < segments):
            raise InputValueError(
                f"--source-segment {self.cfg.source_segment} / --target-segment {self.cfg.target_segment} do not fit "
                f"the model's {segments} segment types (UniLMv2 and BERT checkpoints: --source-segment 0 "
                f"--target-segment 1)"
            )
        if self.cfg.eval_bleu:
            # the loaded validation splits keep their training view: the loss reads it
            self.bleu = BleuValidation(self.cfg, super().build_generator([model], decoding_options(
                self.cfg.eval_bleu_args)))
        return model

    def build_generator(self, models, args, **kwargs):
        """fairseq's beam search over the models' cached decoder; with ``--score-reference``, the reference scorer
        (fairseq's own cannot call a UniLM, see :mod:`palm_plugin.models.unilm_reference_scorer`)."""
        # fairseq-generate loads its split (load_dataset) before it builds the generator and draws the first batch
        # after: switch the loaded datasets to the generation view here, so decoding collates no training rows.
        for dataset in self.datasets.values():
            dataset.generation = True
        if getattr(args, "score_reference", False):
            return UniLMReferenceScorer(self.dictionary, self.cfg.source_segment, self.cfg.target_segment)
        return super().build_generator(models, args, **kwargs)

    def valid_step(self, sample, model, criterion):
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        if self.cfg.eval_bleu and "generation" in sample:  # not in the dummy batch of a process without one
            logging_output.update(self.bleu.logging_output(self, sample["generation"], model))
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        if self.cfg.eval_bleu:
            reduce_bleu(logging_outputs)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """fairseq-interactive passes ``src_tokens`` and ``src_lengths`` only: add the segments of this task."""
        net_input = sample["net_input"]
        self._check_room_for_min_len(generator, models, net_input["src_tokens"])
        if "target_segment" not in net_input:
            if "objectives" in net_input or "target_lengths" in net_input:
                raise RuntimeError(
                    "a training batch reached the generator: the data loader started before the task built its "
                    "generator (with fairseq-generate: --data-buffer-size 0 and --num-workers > 0); keep the default "
                    "--data-buffer-size, or --num-workers 0, or in Python call task.build_generator before iterating "
                    "(or use task.build_dataset_for_inference)"
                )
            src_tokens = net_input["src_tokens"]
            net_input["source_segments"] = torch.full_like(src_tokens, self.cfg.source_segment)
            net_input["target_segment"] = torch.full(
                (src_tokens.size(0),), self.cfg.target_segment, dtype=torch.long, device=src_tokens.device
            )
        if getattr(generator, "match_source_len", False):
            # fairseq's generator caps each hypothesis at its src_lengths, which count the source and its </s> in
            # fairseq's translation task; [SOS] would add one more (the model reads no src_lengths)
            sample = {**sample, "net_input": {**net_input, "src_lengths": net_input["src_tokens"].ne(
                self.dictionary.pad()).sum(1) - 1}}
        return super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints)

    def _check_room_for_min_len(self, generator, models, src_tokens):
        """A hypothesis ends with </s> at the model's last position (:class:`UniLMIncrementalDecoder`), but --min-len
        forbids </s> before its length: a source too long for it would take the decoder past its positions (with
        --match-source-len too, which caps a hypothesis at its source's length, not at the room the source leaves)."""
        min_len = getattr(generator, "min_len", 0)
        if not min_len:
            return
        positions = min(model.max_positions() for model in models)
        if min_len <= positions - 1 - src_tokens.size(1):  # room even for the padded width: no host sync a batch
            return
        longest = int(src_tokens.ne(self.dictionary.pad()).sum(1).max())
        room = positions - 1 - longest
        if min_len > room:
            raise InputValueError(
                f"--min-len {min_len}: the longest source of this batch takes {longest} of the model's {positions} "
                f"positions, which leaves room for {room} tokens before </s>; give --min-len {room} or less, or "
                f"shorter sources (--max-source-positions)"
            )

    def max_positions(self):
        """The most positions a packed pair may take. fairseq resolves it with the model's positions and skips longer
        pairs (:meth:`UniLMSeq2SeqDataset.filter_indices_by_size`) with a count in training, instead of a position
        error mid-epoch when --max-source-positions + --max-target-positions exceed the model's."""
        return self.cfg.max_source_positions + self.cfg.max_target_positions
