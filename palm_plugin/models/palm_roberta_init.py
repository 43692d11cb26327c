"""Initialise PALM's encoder, shared embeddings and MLM head from a fairseq RoBERTa (``masked_lm``) checkpoint, or
from a BERT-family one converted by ``palm-convert bert`` (a ``unilm`` checkpoint: BERT, UniLM v1, MiniLM).

fairseq's RoBERTa keeps its Transformer encoder under ``encoder.sentence_encoder.`` and its LM head under
``encoder.lm_head.``; checkpoints written before fairseq 0.10 say ``decoder.`` and ``emb_layer_norm`` instead
(the renames below are the ones ``RobertaModel.upgrade_state_dict_named`` applies). PALM's encoder is the same
fairseq Transformer encoder, so after the renames every tensor must match by name and shape: anything else is an
error that names the file, never a partial load.

A BERT-family encoder is RoBERTa's network with three differences, each mapped so that PALM's encoder computes what
the checkpoint computes (tested against ``transformers.BertModel``): positions count from 0 where fairseq's learned
positions start after the padding index (row ``i`` goes to row ``i + 2``); every source token carries the source
segment's token-type embedding, a constant added to each position row; and LayerNorm's epsilon (1e-12 in BERT) is
the model's ``--layer-norm-eps``, which must equal the checkpoint's. A relative position bias (UniLMv2) has no place
in PALM and is refused.
"""
import logging
import os

from palm_plugin.errors import InputValueError
from palm_plugin.fixes import safe_loading
from palm_plugin.fixes.checkpoint_paths import read_checkpoint
from palm_plugin.modules.dictionary_check import FINGERPRINT, DictionaryMismatchError

logger = logging.getLogger(__name__)

_ENCODER = "encoder.sentence_encoder."
_LM_HEAD = "encoder.lm_head."
_UNILM = "encoder.stack."
_UNILM_LAYER_PARTS = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                      "out_proj": "self_attn.out_proj"}


def _palm_names(roberta_weights):
    """RoBERTa parameter names -> PALM names (``encoder.*`` and ``mlm_head.*``); other entries are dropped."""
    renamed = {}
    for key, value in roberta_weights.items():
        if key.startswith("decoder."):
            key = "encoder." + key[len("decoder."):]
        key = key.replace(".emb_layer_norm.", ".layernorm_embedding.")
        if key.startswith(_ENCODER):
            renamed["encoder." + key[len(_ENCODER):]] = value
        elif key.startswith(_LM_HEAD):
            renamed["mlm_head." + key[len(_LM_HEAD):]] = value
    return renamed


def _palm_names_from_unilm(state, path, model):
    """A converted BERT-family (``unilm``) state -> PALM names, positions shifted and the source segment folded in."""
    weights, cfg = state["model"], state.get("cfg") or {}
    if _UNILM + "relative_position.weight" in weights:
        raise InputValueError(f"{path}: a UniLMv2 checkpoint (relative position bias): PALM's encoder has none; start "
                              "PALM from a BERT, UniLM v1 or MiniLM checkpoint")
    eps = (cfg.get("model") or {}).get("layer_norm_eps", 1e-12)
    own_eps = model.encoder.layernorm_embedding.eps
    if eps != own_eps:
        raise InputValueError(f"{path}: its LayerNorm epsilon is {eps}, this model's {own_eps}: pass "
                              f"--layer-norm-eps {eps}")
    segment = (cfg.get("task") or {}).get("source_segment", 0)
    renamed = {}
    for key, value in weights.items():
        if key.startswith(_UNILM + "layers."):
            number, part, leaf = key[len(_UNILM + "layers."):].split(".", 2)
            renamed[f"encoder.layers.{number}.{_UNILM_LAYER_PARTS.get(part, part)}.{leaf}"] = value
        elif key.startswith("lm_head.") and key != "lm_head.weight":
            renamed["mlm_head." + key[len("lm_head."):]] = value
    embeddings = _UNILM + "embeddings."
    renamed["encoder.embed_tokens.weight"] = weights[embeddings + "tokens.weight"]
    for leaf in ("weight", "bias"):
        renamed[f"encoder.layernorm_embedding.{leaf}"] = weights[f"{embeddings}layer_norm.{leaf}"]
    positions, segments = weights[embeddings + "positions.weight"], weights[embeddings + "segments.weight"]
    offset = model.encoder.embed_positions.padding_idx + 1  # fairseq's first position row
    table = positions.new_zeros(positions.size(0) + offset, positions.size(1))
    table[offset:] = positions + segments[segment]
    renamed["encoder.embed_positions.weight"] = table
    if FINGERPRINT in weights:  # the checkpoint's dictionary, checked against PALM's
        renamed[FINGERPRINT] = weights[FINGERPRINT]
    return renamed


def load_roberta_encoder(model, path: str) -> None:
    """Copy the RoBERTa weights in ``path`` into ``model`` (a :class:`PalmModel`), in place.

    The MLM head's output weight is PALM's shared embedding, so only its dense layer, layer norm and bias are taken
    (when the model has an MLM head). The dictionary size is checked first
    (:mod:`palm_plugin.modules.dictionary_check`); a checkpoint whose embedding has one row more than a dictionary
    without ``<mask>`` loses that row, as in fairseq's BART.
    """
    if not os.path.isfile(path):  # a missing file or a folder: read_checkpoint names what is there to give
        read_checkpoint(path, "--roberta-path")
    state = safe_loading.load_state(path)
    if not isinstance(state, dict) or "model" not in state:
        raise InputValueError(f"{path}: not a fairseq checkpoint (no 'model' entry); pass the model.pt of a RoBERTa "
                              "model")
    if _UNILM + "embeddings.tokens.weight" in state["model"]:
        weights = _palm_names_from_unilm(state, path, model)
    else:
        weights = _palm_names(state["model"])
    if "encoder.embed_tokens.weight" not in weights:
        raise InputValueError(
            f"{path}: no RoBERTa encoder in this checkpoint (expected '{_ENCODER}embed_tokens.weight'); "
            "--roberta-path takes a checkpoint of fairseq's masked_lm task / roberta architecture, or the model.pt of "
            "palm-convert bert"
        )
    # RoBERTa read <s> first, but the source format stays the one this model was configured with.
    weights["encoder.bos_first"] = model.encoder.bos_first.clone()
    # fairseq's own upgrades (old layer-norm names, fused in_proj attention weights, the <mask> row), then the
    # embedding's size against this dictionary: PALM must use the dictionary RoBERTa was trained with.
    try:
        model.upgrade_state_dict_named(weights, "")
    except DictionaryMismatchError as error:
        raise DictionaryMismatchError(f"{path}: {error}") from error

    own = model.state_dict()
    encoder_keys = {k for k in own if k.startswith("encoder.") and not k.endswith(".version")}
    loaded_keys = {k for k in weights if k.startswith("encoder.") and not k.endswith(".version")}
    missing, unexpected = sorted(encoder_keys - loaded_keys), sorted(loaded_keys - encoder_keys)
    mismatched = [
        f"{k}: checkpoint {tuple(weights[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(encoder_keys & loaded_keys)
        if weights[k].shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        raise InputValueError(
            f"{path}: this RoBERTa encoder does not fit the PALM encoder; set --encoder-layers, "
            "--encoder-embed-dim, --encoder-ffn-embed-dim, --encoder-attention-heads and --encoder-max-positions "
            f"to the checkpoint's. Missing: {missing[:5]}; unexpected: {unexpected[:5]}; shapes: {mismatched[:5]}"
        )
    model.encoder.load_state_dict(
        {k[len("encoder."):]: v for k, v in weights.items() if k in loaded_keys}, strict=False
    )

    if model.mlm_head is not None:
        head = {k[len("mlm_head."):]: v for k, v in weights.items() if k.startswith("mlm_head.") and k != "mlm_head.weight"}
        if head:
            try:
                model.mlm_head.load_state_dict({**head, "weight": model.mlm_head.weight}, strict=True)
            except RuntimeError as error:  # torch's lines say what is missing or of another shape
                found = " ".join(line.strip() for line in str(error).splitlines()[1:])
                raise InputValueError(f"{path}: its LM head does not fit PALM's MLM head ({found}); give a checkpoint "
                                      "with the whole LM head of this model size, or one without an LM head (PALM's "
                                      "then starts from random weights)") from None
        else:
            logger.warning(f"{path}: no LM head in this checkpoint; PALM's MLM head starts from random weights")
    logger.info(f"initialised the PALM encoder and embeddings from checkpoint {path}")
