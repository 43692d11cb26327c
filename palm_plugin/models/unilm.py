"""UniLM (Dong et al. 2019): one shared Transformer whose self-attention mask selects the language model.

The network (embeddings, layers, equations 1-3) is :class:`palm_plugin.modules.unilm_transformer.UniLMTransformer`; this
file adds the output heads and fairseq's interfaces:

* :meth:`UniLMModel.forward`: training and scoring, called as ``model(**sample["net_input"])``. The batch
  describes its mask by compact fields (each row's objective, section 2.3; UniLMv2's factorization steps and token
  kinds, or its seq2seq lengths), from which :func:`palm_plugin.modules.attention_masks.mask_from_fields` builds
  it on the model's device. Predictions come from the masked-LM head whose softmax is
  tied to the token embeddings (section 2.4); the bidirectional rows also feed next sentence prediction.
* an encoder/decoder pair for fairseq's ``SequenceGenerator`` (section 2.5, decoding;
  :mod:`palm_plugin.models.unilm_decoding`): the source's keys and values are computed once per sentence, the
  decoder caches those of the decoded tokens.
* classification heads for fairseq's ``sentence_prediction`` task (section 2.5: ``softmax(h_1^L W^C)`` on the
  [SOS] state).

Archs: ``unilm_base`` / ``unilm_large`` / ``unilm_tiny`` (BERT sizes, 6 segment types: UniLM v1's segment ids
mark the objective) and ``unilm2_base`` / ``unilm2_tiny`` (UniLMv2: + relative position bias, 2 segment types).
"""
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import FairseqEncoderDecoderModel, register_model, register_model_architecture

from palm_plugin.data.symbols import MASK_SYMBOL, PSEUDO_SYMBOL
from palm_plugin.fixes.saved_model_build import building_from_checkpoint
from palm_plugin.modules import attention_impl as attention_impls
from palm_plugin.modules import activation_checkpoints, compiled_layers, flex_attention, table_extension
from palm_plugin.modules.dictionary_check import (
    FINGERPRINT, check_embedding_rows, check_symbols, symbol_fingerprint,
)
from palm_plugin.modules.size_check import check_sizes
from palm_plugin.models.unilm_decoding import UniLMIncrementalDecoder, UniLMSourceEncoder
from palm_plugin.modules.attention_masks import hide_padding, mask_from_fields
from palm_plugin.modules.lm_head import MaskedLMHead
from palm_plugin.modules.unilm_transformer import UniLMTransformer

logger = logging.getLogger(__name__)


@dataclass
class UniLMConfig(FairseqDataclass):
    encoder_layers: int = field(default=12, metadata={"help": "number of Transformer layers"})
    encoder_embed_dim: int = field(default=768, metadata={"help": "model (hidden) dimension"})
    encoder_ffn_embed_dim: int = field(default=3072, metadata={"help": "feed-forward inner dimension"})
    encoder_attention_heads: int = field(default=12, metadata={"help": "number of attention heads"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings and sublayer outputs"})
    attention_dropout: float = field(default=0.1, metadata={"help": "dropout on attention probabilities"})
    activation_dropout: float = field(default=0.0, metadata={"help": "dropout after the feed-forward GELU"})
    pooler_dropout: float = field(default=0.1, metadata={"help": "dropout before a classification head"})
    layer_norm_eps: float = field(default=1e-12, metadata={"help": "LayerNorm epsilon (BERT: 1e-12, RoBERTa: 1e-5)"})
    max_positions: int = field(default=512, metadata={"help": "number of absolute position embeddings"})
    num_segments: int = field(
        default=6,
        metadata={"help": "segment (token type) vocabulary; UniLM v1 uses 6 (ids 0-5 mark the objective), BERT 2"},
    )
    relative_position_buckets: int = field(
        default=0, metadata={"help": "UniLMv2 relative position bias buckets (0 = no relative position bias; else at "
                                    "least 4, T5's scheme)"}
    )
    relative_position_max_distance: int = field(
        default=128, metadata={"help": "distance from which relative positions share the last bucket"}
    )
    compile_layers: bool = field(default=False, metadata={"help": compiled_layers.HELP})
    checkpoint_activations: bool = field(default=False,
                                         metadata={"help": activation_checkpoints.HELP})
    attention_impl: ChoiceEnum(attention_impls.IMPLEMENTATIONS) = field(
        default="sdpa", metadata={"help": attention_impls.HELP}
    )
    drop_full_masks: bool = field(
        default=False,
        metadata={"help": "give attention no mask when a batch's mask hides nothing (bidirectional rows without "
                          "padding), so that torch may pick its flash kernel; one host sync per forward to find out. "
                          "No effect with a relative position bias (UniLMv2), which always needs the masked kernels"},
    )
    decoding_graph: bool = field(
        default=False,
        metadata={"help": "decode with a fixed-size cache, each step one CUDA graph on a GPU "
                          "(palm_plugin/modules/fixed_shape_decoding.py; the same values; off by default, measured "
                          "in docs/benchmarks-gpu.md); set it for decoding with --model-overrides"},
    )
    train_only_lm_head: bool = field(
        default=False,
        metadata={"help": "freeze every parameter but the masked-LM head's own (its dense layer, LayerNorm and output "
                          "bias; the softmax weights stay tied to the frozen embeddings): trains the head a checkpoint "
                          "lacks (a sentence-embedding model) without adapting the network, the control of "
                          "continued pre-training (docs/paper_tables_real.md)"},
    )
    decoding_placeholder: str = field(
        default=MASK_SYMBOL,
        metadata={"help": "symbol fed at the position being predicted while decoding ([MASK]; UniLMv2: its pseudo token)"},
    )


class UniLMClassificationHead(nn.Module):
    """Section 2.5: ``softmax(h_1^L W^C)``, a linear classifier on the top state of [SOS] (after dropout)."""

    def __init__(self, dim, num_classes, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(dim, num_classes)

    def forward(self, features):
        """``(B, T, C)`` -> ``(B, num_classes)``."""
        return self.out_proj(self.dropout(features[:, 0]))


@register_model("unilm", dataclass=UniLMConfig)
class UniLMModel(FairseqEncoderDecoderModel):
    def __init__(self, cfg: UniLMConfig, dictionary, attention_impl_choice: Optional[str] = None):
        """``attention_impl_choice``: what the stack uses, when not ``cfg.attention_impl`` (a checkpoint's choice
        that cannot run here, :meth:`build_model`)."""
        stack = UniLMTransformer(
            vocab_size=len(dictionary),
            padding_idx=dictionary.pad(),
            dim=cfg.encoder_embed_dim,
            ffn_dim=cfg.encoder_ffn_embed_dim,
            layers=cfg.encoder_layers,
            num_heads=cfg.encoder_attention_heads,
            max_positions=cfg.max_positions,
            num_segments=cfg.num_segments,
            layer_norm_eps=cfg.layer_norm_eps,
            dropout=cfg.dropout,
            attention_dropout=cfg.attention_dropout,
            activation_dropout=cfg.activation_dropout,
            relative_position_buckets=cfg.relative_position_buckets,
            relative_position_max_distance=cfg.relative_position_max_distance,
            attention_impl=attention_impl_choice or getattr(cfg, "attention_impl", "sdpa"),
        )
        lm_head = MaskedLMHead(
            cfg.encoder_embed_dim, len(dictionary), stack.embeddings.tokens.weight, layer_norm_eps=cfg.layer_norm_eps
        )
        super().__init__(
            UniLMSourceEncoder(dictionary, stack),
            UniLMIncrementalDecoder(dictionary, stack, lm_head, cfg),
        )
        self.cfg = cfg
        self.lm_head = lm_head
        self.register_buffer(FINGERPRINT, symbol_fingerprint(dictionary))
        self.padding_idx = dictionary.pad()
        # Next sentence prediction (section 2.3), on the bidirectional rows: BERT's pooler + a 2-way classifier.
        self.pooler = nn.Linear(cfg.encoder_embed_dim, cfg.encoder_embed_dim)
        self.next_sentence_head = nn.Linear(cfg.encoder_embed_dim, 2)
        self.classification_heads = nn.ModuleDict()
        self.apply(self._init_weights)
        if getattr(cfg, "train_only_lm_head", False):  # fairseq's optimizer takes only what requires a gradient
            head = {id(p) for p in (*lm_head.dense.parameters(), *lm_head.layer_norm.parameters(), lm_head.bias)}
            for parameter in self.parameters():
                parameter.requires_grad_(id(parameter) in head)
        if getattr(cfg, "checkpoint_activations", False):
            activation_checkpoints.checkpoint_layers(stack.layers)
        if getattr(cfg, "compile_layers", False):
            compiled_layers.compile_layers(stack.layers)

    @staticmethod
    def _init_weights(module):
        """BERT's initialisation: normal(0, 0.02) weights, zero biases."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            nn.init.zeros_(module.weight[module.padding_idx])

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="checkpoint_best.pt", data_name_or_path=".", **kwargs):
        """The plugin's hub interface (:func:`palm_plugin.models.hub_interface.from_pretrained`)."""
        from palm_plugin.models.hub_interface import from_pretrained

        return from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, **kwargs)

    @classmethod
    def build_model(cls, cfg, task):
        check_sizes(cfg, ("encoder_layers", "encoder_ffn_embed_dim", "max_positions", "num_segments"),
                    "encoder_embed_dim", ("encoder_attention_heads",))
        impl = getattr(cfg, "attention_impl", "sdpa")
        if impl == "triton" and building_from_checkpoint() and not attention_impls.triton_runs_here():
            # a checkpoint trained on a card, used where its kernels cannot run: the same values through sdpa
            logger.warning("this checkpoint was trained with --attention-impl triton, whose kernels cannot run here "
                           "(no CUDA device or no triton package): it attends with --attention-impl sdpa, the same "
                           "values")
            impl = "sdpa"
        # a model built from a checkpoint for use (generate, hub) only infers; every other build is for training
        attention_impls.check_usable(impl, not building_from_checkpoint(), cfg.attention_dropout)
        return cls(cfg, task.source_dictionary, impl)

    @property
    def stack(self) -> UniLMTransformer:
        return self.encoder.stack

    def forward(
        self,
        src_tokens,
        src_lengths=None,
        segment_ids=None,
        position_ids=None,
        attention_mask=None,
        objectives=None,
        source_lengths=None,
        target_lengths=None,
        steps=None,
        kinds=None,
        masked_tokens=None,
        features_only=False,
        classification_head_name=None,
        next_sentence=False,
        return_all_hiddens=False,
    ):
        """
        Args:
            src_tokens: ``(B, T)`` right-padded token ids.
            src_lengths: unused (fairseq's ``sentence_prediction`` passes it).
            segment_ids / position_ids: ``(B, T)``; default 0 / ``0 .. T-1``.
            objectives, source_lengths, target_lengths ``(B,)``, steps, kinds ``(B, T)``: the compact fields the
                tasks' datasets put in ``net_input``, from which the attention mask is built here
                (:func:`~palm_plugin.modules.attention_masks.mask_from_fields`: UniLM's objectives, UniLMv2's seq2seq
                layout, the pseudo-masked LM, or bidirectional when all are None).
            attention_mask: boolean ``(B, T, T)`` or ``(T, T)``, an explicit mask instead of those fields (a caller's
                own masks, e.g. tests). Padding is always hidden.
            masked_tokens: ``(B, T)`` bool, or ``(M,)`` long indices into the ``B * T`` flattened positions:
                compute LM logits only at these positions.
            features_only: return the top states instead of logits.
            classification_head_name: return that head's ``(B, classes)`` output.
            next_sentence: also return ``extra["next_sentence_logits"]`` ``(B, 2)``.
        Returns:
            ``(x, extra)``: logits ``(B, T, V)`` (or ``(M, V)`` for the ``M`` masked positions), or the features
            ``(B, T, C)``, or classification logits; ``extra["inner_states"]`` holds ``H^0 .. H^L`` when asked.
        """
        padding = src_tokens.eq(self.padding_idx)
        if attention_mask is None and self.stack.attention_impl != "sdpa":  # the kernels read the fields
            attention_mask = flex_attention.MaskFields(padding, objectives, source_lengths, target_lengths, steps,
                                                       kinds)
        elif attention_mask is None:
            attention_mask = mask_from_fields(padding, objectives, source_lengths, target_lengths, steps, kinds)
        else:
            attention_mask = hide_padding(attention_mask, padding)
        if getattr(self.cfg, "drop_full_masks", False) and self.stack.attention_impl == "sdpa" and \
                self.stack.relative_position is None:
            attention_mask = None if bool(attention_mask.all()) else attention_mask
        features, hiddens = self.stack(src_tokens, attention_mask, position_ids, segment_ids, return_all_hiddens=True)
        extra = {"inner_states": hiddens if return_all_hiddens else None}
        if next_sentence:
            extra["next_sentence_logits"] = self.next_sentence_head(torch.tanh(self.pooler(features[:, 0])))
        if classification_head_name is not None:
            return self.classification_heads[classification_head_name](features), extra
        if features_only:
            return features, extra
        if masked_tokens is not None and masked_tokens.dtype == torch.bool:
            features = features[masked_tokens]
        elif masked_tokens is not None:  # indices into the B * T rows: no host sync (criteria's --syncs-at-start)
            features = features.flatten(0, 1).index_select(0, masked_tokens)
        return self.lm_head(features), extra

    def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
        """Add a ``num_classes``-way head on the [SOS] state (used by fairseq's ``sentence_prediction``)."""
        if inner_dim is not None:
            raise ValueError("UniLM's classification head is one linear layer (section 2.5); inner_dim is not used")
        if name in self.classification_heads and self.classification_heads[name].out_proj.out_features != num_classes:
            logger.warning(f"re-registering head {name!r} with {num_classes} classes")
        self.classification_heads[name] = UniLMClassificationHead(
            self.cfg.encoder_embed_dim, num_classes, self.cfg.pooler_dropout
        )

    def upgrade_state_dict_named(self, state_dict, name):
        """Keep only the checkpoint's classification heads this model has (same shape), add the model's new ones
        (a pre-trained checkpoint has none when fine-tuning with ``sentence_prediction`` starts); grow the tables a
        BERT-family checkpoint lacks (:mod:`palm_plugin.modules.table_extension`); check that the token embedding
        fits this dictionary."""
        prefix = name + "." if name else ""
        head_prefix = prefix + "classification_heads."
        current = self.classification_heads.state_dict()
        for key in [k for k in state_dict if k.startswith(head_prefix)]:
            own = current.get(key[len(head_prefix) :])
            if own is None or own.shape != state_dict[key].shape:
                logger.warning(f"dropping {key} from the checkpoint: this model has no such head (or another shape)")
                del state_dict[key]
        for key, value in current.items():
            state_dict.setdefault(head_prefix + key, value)
        super().upgrade_state_dict_named(state_dict, name)
        # fine-tuning at more positions (or segments) than pre-training had: grow the tables as the authors' code does
        grown = table_extension.fit_tables(state_dict, prefix, self.cfg.max_positions, self.cfg.num_segments)
        # a BERT-family checkpoint under a UniLMv2 task: <pseudo> starts as [MASK], the relative bias at zero
        if table_extension.add_pseudo_row(state_dict, prefix, self.encoder.dictionary, PSEUDO_SYMBOL, MASK_SYMBOL):
            grown.append("<pseudo> added as a copy of <mask>")
        relative = self.stack.relative_position
        if relative is not None and table_extension.add_relative_bias(state_dict, prefix, relative.weight.shape):
            grown.append("relative position bias added, all zero")
        if grown:
            logger.info(f"resized the checkpoint's tables to this model's: {', '.join(grown)}")
        check_embedding_rows(
            state_dict, prefix + "encoder.stack.embeddings.tokens.weight", self.stack.embeddings.tokens,
            self.encoder.dictionary,
        )
        check_symbols(state_dict, prefix + FINGERPRINT, self.encoder.dictionary)

    def max_positions(self):
        return self.cfg.max_positions

    def max_decoder_positions(self):
        return self.cfg.max_positions

    def alignment_problem(self):
        """Why ``--print-alignment`` cannot read this model's attention as an alignment to the source."""
        return ("a UniLM model has no encoder-decoder attention to align with (source and target share one "
                "self-attention); decode without --print-alignment")


def _architecture(args, layers, dim, ffn, heads, num_segments, relative_position_buckets):
    args.encoder_layers = getattr(args, "encoder_layers", layers)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", dim)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", ffn)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", heads)
    args.num_segments = getattr(args, "num_segments", num_segments)
    args.relative_position_buckets = getattr(args, "relative_position_buckets", relative_position_buckets)


@register_model_architecture("unilm", "unilm_base")
def unilm_base(args):
    _architecture(args, 12, 768, 3072, 12, num_segments=6, relative_position_buckets=0)


@register_model_architecture("unilm", "unilm_large")
def unilm_large(args):
    _architecture(args, 24, 1024, 4096, 16, num_segments=6, relative_position_buckets=0)


@register_model_architecture("unilm", "unilm_tiny")
def unilm_tiny(args):
    _architecture(args, 2, 64, 256, 4, num_segments=6, relative_position_buckets=0)


@register_model_architecture("unilm", "unilm2_base")
def unilm2_base(args):
    _architecture(args, 12, 768, 3072, 12, num_segments=2, relative_position_buckets=32)


@register_model_architecture("unilm", "unilm2_tiny")
def unilm2_tiny(args):
    _architecture(args, 2, 64, 256, 4, num_segments=2, relative_position_buckets=32)
