"""PALM (Bi et al. 2020): a RoBERTa-compatible Transformer encoder, a Transformer decoder and a pointer-generator.

* Encoder: fairseq's Transformer encoder configured as RoBERTa (learned positions, layer norm on the embeddings,
  post-norm layers, GELU, unscaled embeddings), so a fairseq RoBERTa checkpoint loads into it (``--roberta-path``).
* Decoder: fairseq's Transformer decoder in the same style; its output goes through PALM's pointer-generator
  (:mod:`palm_plugin.modules.copy_generator`, equations (2)-(8)), so the decoder returns ``log P(y)`` and
  :meth:`PalmDecoder.get_normalized_probs` hands it on unchanged; fairseq's criteria and ``SequenceGenerator``
  work as they do for any encoder-decoder model.
* The stacks (:mod:`palm_plugin.models.palm_stacks`) are fairseq's; ``--syncs-at-start`` runs the encoder's forward
  with one padding test instead of one per layer (:mod:`palm_plugin.modules.padding_check`).
* One embedding matrix serves the encoder input, the decoder input, ``W_e`` of equation (2) and the encoder's MLM
  head (a RoBERTa LM head, built only for tasks that set ``trains_encoder_mlm``, i.e. ``continuation_pair``; a
  fine-tuning model drops it from the pre-training checkpoint).

PALM's Table 6 (section 3.7), each row as the paper defines it:

* "- pointer-generator": ``--no-copy`` in pre-training and fine-tuning (no copy layer);
* "- autoencoding" / "- autoregression": fine-tune the full pre-trained PALM (``--finetune-from-model``) with
  ``--reinit-encoder`` / ``--reinit-decoder``: that part of the checkpoint is replaced by a random initialisation
  (:meth:`PalmModel.upgrade_state_dict_named`);
* "- pre-training": fine-tune the ``palm`` architecture from scratch (no ``--finetune-from-model``, no
  ``--roberta-path``).
"""
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import FairseqEncoderDecoderModel, register_model, register_model_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr

from palm_plugin.errors import InputValueError
from palm_plugin.fixes.saved_model_build import building_from_checkpoint, building_saved_model
from palm_plugin.modules.dictionary_check import (
    FINGERPRINT, check_embedding_rows, check_symbols, symbol_fingerprint,
)
from palm_plugin.models.palm_roberta_init import load_roberta_encoder
from palm_plugin.models.palm_stacks import SOURCE_FORMAT, PalmDecoder, PalmEncoder, transformer_config
from palm_plugin.modules import activation_checkpoints, compiled_layers
from palm_plugin.modules.copy_generator import (COPY_ATTENTION_IMPLS, CopyAttentionImplError, PointerGenerator,
                                               check_copy_attention_impl)
from palm_plugin.modules.lm_head import MaskedLMHead
from palm_plugin.modules.marker_embedding import MarkerEmbedding
from palm_plugin.modules.size_check import check_sizes

logger = logging.getLogger(__name__)


@dataclass
class PalmConfig(FairseqDataclass):
    activation_fn: ChoiceEnum(utils.get_available_activation_fns()) = field(
        default="gelu", metadata={"help": "activation function of the feed-forward blocks (RoBERTa and PALM: gelu)"}
    )
    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    attention_dropout: float = field(default=0.1, metadata={"help": "dropout probability for attention weights"})
    activation_dropout: float = field(default=0.0, metadata={"help": "dropout probability after the activation"})
    encoder_layers: int = field(default=12, metadata={"help": "number of encoder layers"})
    encoder_embed_dim: int = field(
        default=768, metadata={"help": "embedding and hidden size (shared by encoder, decoder and embeddings)"}
    )
    encoder_ffn_embed_dim: int = field(default=3072, metadata={"help": "encoder feed-forward size"})
    encoder_attention_heads: int = field(default=12, metadata={"help": "encoder attention heads"})
    decoder_layers: int = field(default=12, metadata={"help": "number of decoder layers"})
    decoder_ffn_embed_dim: int = field(default=3072, metadata={"help": "decoder feed-forward size"})
    decoder_attention_heads: int = field(default=12, metadata={"help": "decoder attention heads"})
    layer_norm_eps: float = field(
        default=1e-5,
        metadata={"help": "epsilon of every LayerNorm (RoBERTa and fairseq: 1e-5; BERT-family checkpoints: 1e-12, "
                  "taken from a checkpoint converted by palm-convert bert when --roberta-path names one)"},
    )
    encoder_max_positions: int = field(
        default=512, metadata={"help": "learned source positions (RoBERTa checkpoints have 512)"}
    )
    decoder_max_positions: int = field(default=512, metadata={"help": "learned target positions"})
    copy_attention_dim: Optional[int] = field(
        default=None,
        metadata={
            "help": "hidden size of the copy layer's additive attention (W_m, W_s); default: the model size. "
            "Its tanh activations take batch x target x source x this many floats"
        },
    )
    no_copy: bool = field(
        default=False,
        metadata={
            "help": "ablation '- pointer-generator' (PALM Table 6): no copy layer, P = softmax(W_e(W_v s_t + b_v))"
        },
    )
    source_position_markers: int = field(
        default=0,
        metadata={
            "help": "the dictionary ends with this many source position markers (<unk-0>, <unk-1>, ...) that share "
            "the <unk> embedding and can only be copied: the extended vocabulary of fairseq's "
            "examples/pointer_generator (use its preprocess.py / postprocess.py). 0 = off"
        },
    )
    no_source_bos: bool = field(
        default=False,
        metadata={
            "help": "read sources as 'source </s>'. By default the encoder reads '<s> source </s>', as RoBERTa always "
            "did (measured in docs/palm-source-format.md), whatever the task: continuation_pair and translation "
            "give 'source </s>' and the encoder puts <s> first (a source of the full --encoder-max-positions loses "
            "its last token before </s>). A checkpoint keeps the format it was trained with, and so do the models "
            "fine-tuned from it and fairseq-generate (checkpoints from before this option: no <s>)"
        },
    )
    compile_layers: bool = field(default=False, metadata={"help": compiled_layers.HELP})
    checkpoint_activations: bool = field(default=False,
                                         metadata={"help": activation_checkpoints.HELP})
    copy_attention_impl: ChoiceEnum(COPY_ATTENTION_IMPLS) = field(
        default="auto",
        metadata={"help": "how the copy layer's attention scores, equation (3), are computed, forward and backward; "
                          "none writes their batch x target x source x attention-size activations to memory, all give "
                          "the same values up to float32 rounding (palm_plugin/modules/copy_generator.py). auto: "
                          "triton on CUDA, blocked elsewhere (and on CUDA without the triton package, with a "
                          "warning); blocked: in cache-sized blocks with torch's kernels, the fastest on a CPU; "
                          "compiled: kernels that torch.compile fuses (inductor: Triton on a GPU); triton: "
                          "hand-written Triton kernels (palm_plugin/modules/copy_attention_triton.py), for training "
                          "on CUDA (needs the triton package; 1.16-1.43x faster PALM steps than blocked on an H100). "
                          "A model built from a checkpoint to decode takes blocked; timings in docs/benchmarks-gpu.md"},
    )
    compile_copy_attention: bool = field(
        default=False,
        metadata={"help": "deprecated: --copy-attention-impl compiled (checkpoints saved with it load as before)"},
    )
    syncs_at_start: bool = field(
        default=False,
        metadata={"help": "the encoder asks once per forward whether a batch has padding, where fairseq's encoder "
                          "asks in every layer, each time making the host wait for the device "
                          "(palm_plugin/modules/padding_check.py); the same values; off by default"},
    )
    roberta_path: Optional[str] = field(
        default=None,
        metadata={
            "help": "fairseq RoBERTa / masked_lm checkpoint (model.pt), or a BERT-family checkpoint converted by "
            "palm-convert bert (its model.pt: BERT, UniLM, MiniLM), with the same dictionary: initialises the "
            "encoder, the shared embeddings and the MLM head of a new model (PALM section 3.1, before pre-training). "
            "Read only when a model is built to be trained from scratch, never when a saved checkpoint is loaded "
            "(fairseq-generate, checkpoint_utils), whatever the task"
        },
    )
    reinit_encoder: bool = field(
        default=False,
        metadata={
            "help": "ablation '- autoencoding' (PALM Table 6): fine-tune the pre-trained PALM of "
            "--finetune-from-model with its encoder (layers, positions, embedding layer norm) replaced by a random "
            "initialisation (the one of this run's --seed). The token embedding, shared by encoder, decoder and "
            "output layer, is kept from the checkpoint"
        },
    )
    reinit_decoder: bool = field(
        default=False,
        metadata={
            "help": "ablation '- autoregression' (PALM Table 6): as --reinit-encoder for the decoder (layers, "
            "positions, embedding layer norm and the pointer-generator: copy layer and W_v); the shared token "
            "embedding is kept. Other rows of Table 6: '- pointer-generator' = --no-copy in pre-training and "
            "fine-tuning; '- pre-training' = fine-tuning palm with no --finetune-from-model and no --roberta-path"
        },
    )


def _copy_attention_impl(cfg) -> str:
    """--copy-attention-impl, or ``compiled`` where the configuration has the deprecated --compile-copy-attention (a
    command line, or a checkpoint saved before the choice existed)."""
    impl = str(safe_getattr(cfg, "copy_attention_impl", "blocked"))
    if not safe_getattr(cfg, "compile_copy_attention", False):
        return impl
    if impl not in ("auto", "blocked", "compiled"):
        raise CopyAttentionImplError(f"--compile-copy-attention (deprecated) means --copy-attention-impl compiled, "
                                     f"which contradicts --copy-attention-impl {impl}: leave out --compile-copy-attention")
    if not building_from_checkpoint():
        logger.warning("--compile-copy-attention is deprecated: use --copy-attention-impl compiled")
    return "compiled"


# State-dict entry that marks a checkpoint whose part was already re-initialised (--reinit-encoder/-decoder): a
# resumed run or fairseq-generate loads it as it is.
REINIT_MARKER = "table6_reinitialised"


@register_model("palm", dataclass=PalmConfig)
class PalmModel(FairseqEncoderDecoderModel):
    """PALM encoder-decoder; ``mlm_head`` is None unless the task pre-trains the encoder with MLM."""

    def __init__(self, cfg, encoder, decoder, mlm_head=None):
        super().__init__(encoder, decoder)
        self.cfg = cfg
        self.mlm_head = mlm_head
        self.reinit_parts = [
            part for part, chosen in (("encoder", cfg.reinit_encoder), ("decoder", cfg.reinit_decoder)) if chosen
        ]
        if self.reinit_parts:
            self.register_buffer(REINIT_MARKER, torch.ones(()))
        self.register_buffer(FINGERPRINT, symbol_fingerprint(encoder.dictionary))

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="checkpoint_best.pt", data_name_or_path=".", **kwargs):
        """The plugin's hub interface (:func:`palm_plugin.models.hub_interface.from_pretrained`)."""
        from palm_plugin.models.hub_interface import from_pretrained

        return from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, **kwargs)

    @classmethod
    def build_model(cls, cfg, task):
        dictionary = task.source_dictionary
        if task.target_dictionary is not None and task.target_dictionary != dictionary:
            raise InputValueError(
                "PALM shares one embedding between source and target: binarize both sides with the same "
                "dictionary (fairseq-preprocess --joined-dictionary or --srcdict/--tgtdict with one file)"
            )
        check_sizes(cfg, ("encoder_layers", "decoder_layers", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim",
                          "encoder_max_positions", "decoder_max_positions"),
                    "encoder_embed_dim", ("encoder_attention_heads", "decoder_attention_heads"))
        copy_attention_impl = _copy_attention_impl(cfg)
        if copy_attention_impl not in ("auto", "blocked") and cfg.no_copy:
            raise CopyAttentionImplError(f"--copy-attention-impl {copy_attention_impl} computes the copy layer, "
                                         "which --no-copy removes: leave out one")
        if not compiled_layers.compiling():  # decoding: T = 1 at a time, no backward pass; the model may be on a CPU
            copy_attention_impl = "blocked"
        check_copy_attention_impl(copy_attention_impl)
        if cfg.reinit_encoder and cfg.roberta_path:
            raise InputValueError("--reinit-encoder replaces the encoder by a random one: leave out --roberta-path")
        markers = safe_getattr(cfg, "source_position_markers", 0)
        num_embeddings = len(dictionary) - markers
        # other symbols taken for markers would share the <unk> embedding and never be generated
        present = 0
        while f"<unk-{present}>" in dictionary:
            present += 1
        if markers != present and markers:
            raise InputValueError(
                f"--source-position-markers {markers}: the dictionary has {present} source position markers (<unk-0>, "
                "<unk-1>, ... at its end, as fairseq's examples/pointer_generator writes dict.txt): "
                + (f"give --source-position-markers {present}" if present else
                   "leave out --source-position-markers, or binarize with a dictionary that ends with them")
            )
        mask = dictionary.index("<mask>") if "<mask>" in dictionary else None
        if mask is not None and mask >= num_embeddings:
            raise InputValueError(
                f"the dictionary's <mask> (index {mask}) comes after the {markers} source position markers; "
                "list <mask> in dict.txt before the markers"
            )
        embed_dim = cfg.encoder_embed_dim
        embed_tokens = MarkerEmbedding(num_embeddings, embed_dim, dictionary.pad(), dictionary.unk())
        transformer_cfg = transformer_config(cfg)
        encoder = PalmEncoder(
            transformer_cfg, dictionary, embed_tokens, not safe_getattr(cfg, "no_source_bos", False)
        )
        decoder = PalmDecoder(
            transformer_cfg,
            dictionary,
            embed_tokens,
            PointerGenerator(
                decoder_dim=embed_dim,
                encoder_dim=embed_dim,
                output_embedding=embed_tokens.weight,
                num_types=len(dictionary),
                copy=not cfg.no_copy,
                attention_dim=cfg.copy_attention_dim,
            ),
        )
        mlm_head = None
        if getattr(task, "trains_encoder_mlm", False):
            activation = utils.get_activation_fn(cfg.activation_fn)
            mlm_head = MaskedLMHead(embed_dim, num_embeddings, embed_tokens.weight, activation)
        model = cls(cfg, encoder, decoder, mlm_head)
        # RoBERTa's initialisation (normal(0, 0.02), zero biases, zero padding row) for every part of the model.
        model.apply(init_bert_params)
        for module in model.modules():  # fairseq builds its LayerNorms with its own epsilon
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = safe_getattr(cfg, "layer_norm_eps", 1e-5)
        # A saved model already holds the RoBERTa weights (trained since): the file may be gone or stale.
        if cfg.roberta_path and not building_saved_model():
            load_roberta_encoder(model, cfg.roberta_path)
        encoder.one_padding_check = safe_getattr(cfg, "syncs_at_start", False)
        if safe_getattr(cfg, "checkpoint_activations", False):
            activation_checkpoints.checkpoint_layers(list(encoder.layers) + list(decoder.layers))
        if safe_getattr(cfg, "compile_layers", False):
            compiled_layers.compile_layers(list(encoder.layers) + list(decoder.layers))
        decoder.pointer_generator.scores_impl = copy_attention_impl
        return model

    def forward(self, src_tokens, src_lengths, prev_output_tokens=None, masked_tokens=None, **kwargs):
        """Run the encoder, then the MLM head and/or the decoder.

        Args:
            src_tokens / src_lengths: ``(B, S)`` / ``(B,)``.
            prev_output_tokens: ``(B, T)`` decoder input; None skips the decoder (stage "ae" of pre-training).
            masked_tokens: ``(B, S)`` bool, positions whose original tokens the MLM head predicts; None skips it.
        Returns:
            ``(log_probs, extra)``: ``log_probs`` ``(B, T, V_ext)`` from the pointer-generator (None when the
            decoder is skipped); ``extra`` has the decoder's ``attn``/``inner_states`` and, with
            ``masked_tokens``, ``mlm_logits`` ``(number of masked tokens, V)``.
        """
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
        log_probs, extra = None, {}
        if prev_output_tokens is not None:
            log_probs, extra = self.decoder(prev_output_tokens, encoder_out=encoder_out, **kwargs)
        if masked_tokens is not None:
            if self.mlm_head is None:
                raise ValueError("this PALM model has no MLM head: it is built only for the continuation_pair task")
            features = encoder_out["encoder_out"][0].transpose(0, 1)
            masked_tokens = self.encoder.source_layout(src_tokens, masked_tokens, False)
            extra["mlm_logits"] = self.mlm_head(features[masked_tokens])
        return log_probs, extra

    def max_positions(self):
        return self.encoder.max_positions(), self.decoder.max_positions()

    def alignment_problem(self):
        """Why ``--print-alignment`` cannot read this model's attention as an alignment to the source, or None."""
        if self.encoder.source_bos:
            return ("this PALM model's encoder reads <s> before the source, so its attention is not over the source "
                    "tokens fairseq aligns; decode without --print-alignment (a PALM trained with --no-source-bos "
                    "prints them)")
        return None

    def upgrade_state_dict_named(self, state_dict, name):
        """Adapt a checkpoint to this model: drop the MLM head when there is none (fine-tuning) and, as fairseq's
        BART does, drop the last embedding row (``<mask>``, appended by the pre-training task) when this
        dictionary has no ``<mask>``; then check that the embedding fits this dictionary. With
        ``--reinit-encoder`` / ``--reinit-decoder``, a checkpoint without :data:`REINIT_MARKER` (a pre-trained
        PALM) has that part replaced by this model's own fresh initialisation."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        self.encoder.adopt_source_format(state_dict, prefix + "encoder.")
        if self.reinit_parts and prefix + REINIT_MARKER not in state_dict:
            self._reinitialise(state_dict, prefix)
        if self.mlm_head is None:
            for key in [k for k in state_dict if k.startswith(prefix + "mlm_head.")]:
                del state_dict[key]
        embed_key = prefix + "encoder.embed_tokens.weight"
        rows = self.encoder.embed_tokens.num_embeddings
        one_row_more = embed_key in state_dict and state_dict[embed_key].size(0) == rows + 1
        if one_row_more and "<mask>" not in self.encoder.dictionary:
            for suffix in (
                "encoder.embed_tokens.weight",
                "decoder.embed_tokens.weight",
                "decoder.output_projection.weight",
                "decoder.pointer_generator.output_embedding",
            ):
                if prefix + suffix in state_dict:
                    state_dict[prefix + suffix] = state_dict[prefix + suffix][:-1]
        # one row more with <mask> in the dictionary is another dictionary's checkpoint: PALM has no <pseudo>
        check_embedding_rows(state_dict, embed_key, self.encoder.embed_tokens, self.encoder.dictionary,
                             pseudo_family=False)
        check_symbols(state_dict, prefix + FINGERPRINT, self.encoder.dictionary)


    def _reinitialise(self, state_dict, prefix: str) -> None:
        """Table 6's "- autoencoding" / "- autoregression": the chosen parts of ``state_dict`` become this model's
        current (freshly initialised, not yet loaded) values, except the token embedding that both sides share."""
        shared = self.encoder.embed_tokens.weight
        own = self.state_dict(keep_vars=True)
        for part in self.reinit_parts:
            names = [
                k for k, v in own.items() if k.startswith(part + ".") and v is not shared and k != SOURCE_FORMAT
            ]
            for key in names:
                state_dict[prefix + key] = own[key].detach().clone()
            logger.info(f"{part} re-initialised ({len(names)} tensors; token embedding kept from the checkpoint)")
        state_dict[prefix + REINIT_MARKER] = torch.ones(())


@register_model_architecture("palm", "palm_base")
def palm_base(args):
    """PALM: 12 + 12 layers, 768 hidden, 3072 feed-forward, 12 heads (initialised from roberta.base)."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", 12)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 768)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", 3072)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 12)
    args.decoder_layers = safe_getattr(args, "decoder_layers", 12)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", args.encoder_ffn_embed_dim)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", args.encoder_attention_heads)


@register_model_architecture("palm", "palm_large")
def palm_large(args):
    """PALM_LARGE: 24 encoder + 6 decoder layers, 1024 hidden, 4096 feed-forward, 16 heads (from roberta.large)."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", 24)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 1024)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", 4096)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 16)
    args.decoder_layers = safe_getattr(args, "decoder_layers", 6)
    palm_base(args)


@register_model_architecture("palm", "palm_tiny")
def palm_tiny(args):
    """For tests and the demo: 2 + 2 layers, 64 hidden, 128 feed-forward, 2 heads."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", 2)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 64)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", 128)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 2)
    args.decoder_layers = safe_getattr(args, "decoder_layers", 2)
    palm_base(args)
