"""Names in the formats palm-convert reads and writes: the special symbols, and the tables that rename a source
checkpoint's parameters to the unilm model's."""
import re

from palm_tools.convert import ConversionError

BERT_SPECIALS = {"<s>": "[CLS]", "<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]"}
MASK, PSEUDO = "<mask>", "<pseudo>"

# Source name (prefix stripped, LayerNorm gamma/beta renamed) -> unilm name.
BERT_NAMES = [
    (r"embeddings\.word_embeddings\.weight", "encoder.stack.embeddings.tokens.weight"),
    (r"embeddings\.position_embeddings\.weight", "encoder.stack.embeddings.positions.weight"),
    (r"embeddings\.token_type_embeddings\.weight", "encoder.stack.embeddings.segments.weight"),
    (r"embeddings\.LayerNorm\.(weight|bias)", r"encoder.stack.embeddings.layer_norm.\1"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query\.(weight|bias)", r"encoder.stack.layers.\1.q_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key\.(weight|bias)", r"encoder.stack.layers.\1.k_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value\.(weight|bias)", r"encoder.stack.layers.\1.v_proj.\2"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.q_bias", r"encoder.stack.layers.\1.q_proj.bias"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.v_bias", r"encoder.stack.layers.\1.v_proj.bias"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)", r"encoder.stack.layers.\1.out_proj.\2"),
    (
        r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)",
        r"encoder.stack.layers.\1.self_attn_layer_norm.\2",
    ),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)", r"encoder.stack.layers.\1.fc1.\2"),
    (r"encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)", r"encoder.stack.layers.\1.fc2.\2"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)", r"encoder.stack.layers.\1.final_layer_norm.\2"),
    (r"(?:encoder\.)?rel_pos_bias\.weight", "encoder.stack.relative_position.weight"),
    (r"pooler\.dense\.(weight|bias)", r"pooler.\1"),
    (r"cls\.seq_relationship\.(weight|bias)", r"next_sentence_head.\1"),
    (r"cls\.predictions\.transform\.dense\.(weight|bias)", r"lm_head.dense.\1"),
    (r"cls\.predictions\.transform\.LayerNorm\.(weight|bias)", r"lm_head.layer_norm.\1"),
    (r"cls\.predictions\.bias", "lm_head.bias"),
]
# Present in some files, carried by other parameters here: position ids (a buffer), the decoder's copy of the
# output bias, the tied output embedding (checked equal to the input embedding).
BERT_IGNORED = [r"embeddings\.position_ids", r"cls\.predictions\.decoder\.bias", r"cls\.predictions\.decoder\.weight"]
TIED_OUTPUT = ("cls.predictions.decoder.weight", "cls.predictions.decoder_weight")
# s2s-ft's fine-tuned checkpoints: the label smoothing loss's target buffer, and the output embedding under the name
# s2s-ft's prediction head gives it (tied: checked equal to the input embedding before it is dropped).
TRAINING_ONLY = [r"crit_mask_lm_smoothed\.one_hot", r"cls\.predictions\.decoder_weight"]
FUSED_QKV = re.compile(r"encoder\.layer\.(\d+)\.attention\.self\.qkv_linear\.weight")

ROBERTA_NAMES = [
    (r"encoder\.sentence_encoder\.embed_tokens\.weight", "encoder.stack.embeddings.tokens.weight"),
    (r"encoder\.sentence_encoder\.embed_positions\.weight", "encoder.stack.embeddings.positions.weight"),
    (r"encoder\.sentence_encoder\.(?:layernorm_embedding|emb_layer_norm)\.(weight|bias)", r"encoder.stack.embeddings.layer_norm.\1"),
    (r"encoder\.sentence_encoder\.layers\.(\d+)\.self_attn\.(q|k|v|out)_proj\.(weight|bias)", r"encoder.stack.layers.\1.\2_proj.\3"),
    (r"encoder\.sentence_encoder\.layers\.(\d+)\.(self_attn_layer_norm|fc1|fc2|final_layer_norm)\.(weight|bias)", r"encoder.stack.layers.\1.\2.\3"),
    (r"encoder\.lm_head\.dense\.(weight|bias)", r"lm_head.dense.\1"),
    (r"encoder\.lm_head\.layer_norm\.(weight|bias)", r"lm_head.layer_norm.\1"),
    (r"encoder\.lm_head\.bias", "lm_head.bias"),
]
ROBERTA_IGNORED = [r"encoder\.lm_head\.weight", r"encoder\.sentence_encoder\.version", r"encoder\.version"]

# HF's RoBERTa is BERT under other names for the LM head (as s2s-ft's hf_roberta_to_hf_bert renames it); the
# import table then gives unilm names, and :func:`palm_tools.convert.roberta.fairseq_roberta_names` the fairseq ones.
HF_ROBERTA_HEAD = [(r"lm_head\.(dense)\.", r"cls.predictions.transform.\1."),
                   (r"lm_head\.layer_norm\.", "cls.predictions.transform.LayerNorm."),
                   (r"lm_head\.(bias|decoder\.weight|decoder\.bias)$", r"cls.predictions.\1")]
GPT2_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


def rename(name, table, ignored, path):
    """The unilm name of ``name`` (None for ignored ones); unknown names are an error that names ``path``."""
    for pattern in ignored:
        if re.fullmatch(pattern, name):
            return None
    for pattern, target in table:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, target, name)
    raise ConversionError(f"{path}: unknown parameter {name!r}; this is not a BERT/UniLM/RoBERTa checkpoint we know: "
                          "palm-convert takes BERT, UniLM, MiniLM (bert) and RoBERTa (roberta, hf-roberta) weights")
