"""PALM's encoder and decoder stacks: fairseq's Transformer encoder and decoder in RoBERTa's style
(:func:`transformer_config`), the encoder reading ``<s>`` first, the decoder ending in the pointer-generator. The model
around them, its options and archs are in :mod:`palm_plugin.models.palm`."""
import logging
from typing import Optional

import torch
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerEncoderBase

from palm_plugin.modules import padding_check
from palm_plugin.modules.copy_generator import PointerGenerator

logger = logging.getLogger(__name__)


# State-dict entry (a buffer of the encoder) that records whether the encoder was trained with <s> first.
SOURCE_FORMAT = "encoder.bos_first"


class PalmEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder that reads ``<s>`` first (``source_bos``) and also returns the tokens it read,
    which the copy layer scatters onto."""

    def __init__(self, cfg, dictionary, embed_tokens, source_bos: bool):
        super().__init__(cfg, dictionary, embed_tokens)
        self.source_bos = source_bos
        self.register_buffer("bos_first", torch.tensor(float(source_bos)))  # saved with the weights: SOURCE_FORMAT

    def adopt_source_format(self, state_dict, prefix: str) -> None:
        """Take the source format of the checkpoint in ``state_dict`` (one written before the format was recorded
        had no ``<s>``), so that fine-tuning and decoding read sources as the weights were trained to."""
        key = prefix + "bos_first"
        if key not in state_dict:
            state_dict[key] = torch.zeros(())
        trained_with_bos = bool(state_dict[key])
        if trained_with_bos != self.source_bos:
            logger.info(f"the checkpoint's encoder was trained {'with' if trained_with_bos else 'without'} <s> "
                        "first: its sources keep that format")
            self.source_bos = trained_with_bos

    def source_layout(self, src_tokens, values, bos_value):
        """``values`` (aligned with ``src_tokens``, e.g. the tokens themselves or the MLM mask) as the encoder reads
        them: unchanged without ``source_bos``; else right-padded rows ``bos_value, values of the real tokens``, at
        most ``max_positions`` long (an over-long row keeps its last value, the final ``</s>``)."""
        if not self.source_bos:
            return values
        real = src_tokens.ne(self.padding_idx)
        # real positions first, in their order: rows become right-padded whatever the batch's padding side
        order = torch.sort((~real).to(torch.uint8), dim=1, stable=True).indices
        packed = values.gather(1, order)
        first = packed.new_full((packed.size(0), 1), bos_value)
        laid_out = torch.cat((first, packed), dim=1)
        limit = self.max_positions()
        if laid_out.size(1) > limit:
            lengths = real.sum(1) + 1
            too_long = torch.nonzero(lengths > limit).squeeze(1)
            laid_out[too_long, limit - 1] = laid_out[too_long, lengths[too_long] - 1]
            laid_out = laid_out[:, :limit]
        return laid_out

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None):
        """Returns fairseq's encoder output dict (``encoder_out`` ``[(S', B, C)]``, ``encoder_padding_mask``
        ``[(B, S')]``, ...) with ``src_tokens`` ``[(B, S')]`` the tokens read (:meth:`source_layout`);
        ``reorder_encoder_out`` reorders them."""
        tokens = self.source_layout(src_tokens, src_tokens, self.dictionary.bos())
        if getattr(self, "one_padding_check", False):  # --syncs-at-start: the same values, one host sync
            encoder_out = padding_check.encode(self, tokens, return_all_hiddens, token_embeddings)
        else:  # fairseq's encoder counts the lengths of the tokens it reads itself (its src_lengths is unread)
            encoder_out = self.forward_scriptable(tokens, None, return_all_hiddens, token_embeddings)
        encoder_out["src_tokens"] = [tokens]
        return encoder_out


class PalmDecoder(TransformerDecoderBase):
    """fairseq's Transformer decoder whose output layer is PALM's pointer-generator."""

    def __init__(self, cfg, dictionary, embed_tokens, pointer_generator: PointerGenerator):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=False)
        self.pointer_generator = pointer_generator

    def forward(
        self,
        prev_output_tokens,
        encoder_out=None,
        incremental_state=None,
        features_only: bool = False,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
        src_lengths=None,
        return_all_hiddens: bool = False,
    ):
        """Returns ``(log P, extra)`` with ``log P`` ``(B, T, V_ext)`` float32 (or the ``(B, T, C)`` decoder states
        with ``features_only``); with ``incremental_state`` only the last position is computed (``T = 1``)."""
        states, extra = self.extract_features(
            prev_output_tokens,
            encoder_out=encoder_out,
            incremental_state=incremental_state,
            full_context_alignment=full_context_alignment,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
        )
        if features_only:
            return states, extra
        return self.pointer_generator(states, encoder_out, incremental_state), extra

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        """The decoder's output is already ``log P``: return it (or ``P``) without another softmax."""
        return net_output[0] if log_probs else net_output[0].exp()


def transformer_config(cfg) -> TransformerConfig:
    """fairseq's TransformerConfig for RoBERTa-style encoder and decoder stacks of the sizes in ``cfg``."""
    config = TransformerConfig()
    config.activation_fn = cfg.activation_fn
    config.dropout = cfg.dropout
    config.attention_dropout = cfg.attention_dropout
    config.activation_dropout = cfg.activation_dropout
    config.layernorm_embedding = True
    config.no_scale_embedding = True
    config.share_decoder_input_output_embed = True
    config.share_all_embeddings = True
    config.max_source_positions = cfg.encoder_max_positions
    config.max_target_positions = cfg.decoder_max_positions
    for side, layers, ffn, heads in (
        (config.encoder, cfg.encoder_layers, cfg.encoder_ffn_embed_dim, cfg.encoder_attention_heads),
        (config.decoder, cfg.decoder_layers, cfg.decoder_ffn_embed_dim, cfg.decoder_attention_heads),
    ):
        side.embed_dim = cfg.encoder_embed_dim
        side.ffn_embed_dim = ffn
        side.layers = layers
        side.attention_heads = heads
        side.learned_pos = True
        side.normalize_before = False
    config.decoder.output_dim = cfg.encoder_embed_dim
    return config
