"""Every default of every option the plugin registers, pinned with where its value comes from.

A plausible wrong value (a masking rate of 0.2, spans up to 5, a smoothing of 0.1 where there was none, another
model size) passes the behavioural tests of the code that reads it, and a mutation tool's edits of a number are
refused by validation before a test sees them: this table is what fails when such a default changes.

The options are found by walking fairseq's registries, not listed by hand, so a new option cannot be forgotten:
the dataclass of each task, model and criterion (and of everything else in ``fairseq.registry.REGISTRIES``: the
optimizer) whose class lives in ``palm_plugin``, and each architecture of a plugin model, evaluated on an empty
namespace (an arch sets its values there; fairseq gives the model's dataclass default to every option the arch
leaves alone). Each row names its source: ``paper`` (paper and section), ``code`` (the authors' code and file) or
``ours`` (this project's choice and why). docs/defaults.md is rendered from this table; run
``python -m tests.test_paper_defaults`` to rewrite it after a change.
"""
import argparse
import dataclasses
import sys
from collections import Counter
from pathlib import Path

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY
from fairseq.registry import REGISTRIES
from fairseq.tasks import TASK_DATACLASS_REGISTRY, TASK_REGISTRY

import palm_plugin  # noqa: F401  (registers the tasks, criteria, models, archs and the optimizer)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "defaults.md"
REWRITE = "python -m tests.test_paper_defaults"
SOURCE_KINDS = ("paper", "code", "ours")

PALM, UNILM, UNILM2 = "PALM (Bi et al. 2020)", "UniLM (Dong et al. 2019)", "UniLMv2 (Bao et al. 2020)"
BERT = "BERT (Devlin et al. 2019)"
S2S_FT = "microsoft/unilm s2s-ft/run_seq2seq.py"
UNILM_V1 = "microsoft/unilm unilm-v1/src/biunilm"
FAIRSEQ_ROBERTA = "fairseq's roberta_base arch (fairseq/models/roberta/model.py)"
REQUIRED = ("ours", "required: no default (fairseq's MISSING), the data directories to read")
SEED = ("ours", "fairseq's --seed (interpolated), so one seed decides the masks and the model's initialisation")
SPEED = "a speed option, the same values up to float rounding; off by default (measured in docs/benchmarks-gpu.md)"
ACTIVATION_CHECKPOINTS = ("code", "fairseq's TransformerConfig (fairseq/models/transformer/transformer_config.py): "
                                  "off, memory traded for time only when asked")


def rows(kind, name, source, where, **values):
    """One row per option of ``values`` that share a source."""
    return [(kind, name, option, value, source, where) for option, value in values.items()]


def bert_80_10_10(kind, name, where):
    """The two replacement options of BERT's 80/10/10 (the rest of the chosen tokens become [MASK])."""
    return rows(kind, name, "paper", where, leave_unmasked_prob=0.1, random_token_prob=0.1)


def sizes(kind, name, source, where, layers, dim, ffn, heads):
    return rows(kind, name, source, where, encoder_layers=layers, encoder_embed_dim=dim, encoder_ffn_embed_dim=ffn,
                encoder_attention_heads=heads)


def palm_sizes(kind, name, source, where, layers, dim, ffn, heads, decoder_layers):
    """PALM's sizes; the decoder's feed-forward and heads are the encoder's (3.1 gives one size per model)."""
    return sizes(kind, name, source, where, layers, dim, ffn, heads) + rows(
        kind, name, source, where, decoder_layers=decoder_layers, decoder_ffn_embed_dim=ffn,
        decoder_attention_heads=heads)


TINY = "a size for tests and the demo: trains in seconds on a CPU"
UNILM_V1_SEGMENTS = f"{UNILM_V1}/seq2seq_loader.py: --new_segment_ids gives ids 0-5 (seq2seq: 4 and 5)"
UNILM2_SEGMENTS = f"{UNILM2} 2.2: segment embeddings as BERT's (2 types)"
T5_BUCKETS = f"{UNILM2} 4.1 adds T5's relative position bias; T5 (Raffel et al. 2020) 2.1: 32 buckets"

# (kind, name, option, value, source kind, where)
DEFAULTS = [
    # --- tasks ---------------------------------------------------------------------------------------------------
    *bert_80_10_10("task", "continuation_pair", f"{PALM} 2.1: the encoder trained as BERT's masked LM, 80/10/10"),
    ("task", "continuation_pair", "data", "???", *REQUIRED),
    ("task", "continuation_pair", "split_mode", "sentence", "paper",
     f"{PALM} 3.1: consecutive sentences, a window sliding by one sentence"),
    ("task", "continuation_pair", "max_source_tokens", 400, "paper",
     f"{PALM} 2.2 and 3.1: context of at most 400 tokens"),
    ("task", "continuation_pair", "max_target_tokens", 100, "paper",
     f"{PALM} 2.2 and 3.1: output of at most 100 tokens"),
    ("task", "continuation_pair", "mask_prob", 0.15, "paper", f"{PALM} 2.1: the encoder trained as BERT's masked LM"),
    ("task", "continuation_pair", "objective", "continuation", "paper",
     f"{PALM} 2.1: the decoder generates the text that follows the context"),
    ("task", "continuation_pair", "seed", "${common.seed}", *SEED),
    *bert_80_10_10("task", "pmlm", f"{UNILM2} 4.1: 80% masks, 10% random, 10% kept"),
    ("task", "pmlm", "data", "???", *REQUIRED),
    ("task", "pmlm", "sample_break_mode", "complete_doc", "paper",
     f"{UNILM2} 2.2: S1 and S2 are contiguous texts (whole sentences of one document)"),
    ("task", "pmlm", "tokens_per_sample", 512, "paper", f"{UNILM2} 4.1: maximum input length 512"),
    ("task", "pmlm", "objective", "ae_par", "paper", f"{UNILM2} 3.3: L_AE + L_PAR"),
    ("task", "pmlm", "mask_prob", 0.15, "paper", f"{UNILM2} 3.1.2, Algorithm 1: masking ratio 15%"),
    ("task", "pmlm", "block_prob", 0.4, "paper", f"{UNILM2} 3.1.2, Algorithm 1: an n-gram block 40% of the time"),
    ("task", "pmlm", "min_block_length", 2, "paper", f"{UNILM2} 3.1.2, Algorithm 1: rand_int(2, 6)"),
    ("task", "pmlm", "max_block_length", 6, "paper", f"{UNILM2} 3.1.2, Algorithm 1: rand_int(2, 6)"),
    ("task", "pmlm", "seed", "${common.seed}", *SEED),
    *bert_80_10_10("task", "unilm_pretraining", f"{UNILM} 2.4: 80% [MASK], 10% random, 10% kept"),
    ("task", "unilm_pretraining", "data", "???", *REQUIRED),
    ("task", "unilm_pretraining", "tokens_per_sample", 512, "paper", f"{UNILM} 2.4: maximum input length 512"),
    ("task", "unilm_pretraining", "mask_prob", 0.15, "paper", f"{UNILM} 2.4: token masking probability 15%"),
    ("task", "unilm_pretraining", "span_length_probs", "0.8,0.1,0.1", "paper",
     f"{UNILM} 2.4: 80% one token, 20% a bigram or trigram"),
    ("task", "unilm_pretraining", "objective_probs", "1/3,1/3,1/6,1/6", "paper",
     f"{UNILM} 2.4: 1/3 bidirectional, 1/3 seq2seq, 1/6 each unidirectional"),
    ("task", "unilm_pretraining", "seed", "${common.seed}", *SEED),
    *bert_80_10_10("task", "unilm_seq2seq",
                   f"{UNILM} 3.1: fine-tuning reuses pre-training's 80/10/10 (2.4); s2s-ft's --keep_prob and "
                   "--random_prob 0.1 for UniLMv2"),
    ("task", "unilm_seq2seq", "data", "???", *REQUIRED),
    ("task", "unilm_seq2seq", "source_lang", "src", "ours", "the suffixes palm-prepare writes (fairseq has none)"),
    ("task", "unilm_seq2seq", "target_lang", "tgt", "ours", "the suffixes palm-prepare writes (fairseq has none)"),
    ("task", "unilm_seq2seq", "max_source_positions", 384, "ours",
     "with --max-target-positions, the 512 positions of a BERT-size model (UniLM 2.4), a quarter for the target"),
    ("task", "unilm_seq2seq", "max_target_positions", 128, "ours",
     "with --max-source-positions, the 512 positions of a BERT-size model (UniLM 2.4), a quarter for the target"),
    ("task", "unilm_seq2seq", "mask_prob", 0.7, "paper", f"{UNILM} 3.1 and 3.3: masking probability 0.7"),
    ("task", "unilm_seq2seq", "source_segment", 4, "code", UNILM_V1_SEGMENTS),
    ("task", "unilm_seq2seq", "target_segment", 5, "code", UNILM_V1_SEGMENTS),
    ("task", "unilm_seq2seq", "pseudo_masks", False, "ours", "UniLM v1's layout unless UniLMv2's is asked for"),
    ("task", "unilm_seq2seq", "target_mask_prob", 0.5, "code", f"{S2S_FT}: --target_mask_prob 0.5"),
    ("task", "unilm_seq2seq", "pseudo_mask_noise", "exact", "ours",
     "pseudo slots hold the symbol decoding feeds, so training and decoding see one placeholder; s2s-ft's own "
     "scheme is --pseudo-mask-noise s2s_ft"),
    ("task", "unilm_seq2seq", "seed", "${common.seed}", *SEED),
    *rows("task", "unilm_seq2seq", "ours", "fairseq's translation task (fairseq/tasks/translation.py), the same "
          "options with the same defaults: validation by the loss unless --eval-bleu is asked for",
          eval_bleu=False, eval_bleu_args="{}", eval_bleu_detok="space", eval_bleu_detok_args="{}",
          eval_tokenized_bleu=False, eval_bleu_remove_bpe=None, eval_bleu_print_samples=False),
    ("task", "unilm_seq2seq", "train_subset", "${dataset.train_subset}", "ours",
     "fairseq's --train-subset (interpolated): the other splits are decoded with --eval-bleu"),
    # --- criteria ------------------------------------------------------------------------------------------------
    ("criterion", "palm_mlm_lm", "stage", "joint", "paper",
     f"{PALM} 2.1: the second stage, the decoder's predictions (equation 1)"),
    ("criterion", "palm_mlm_lm", "mlm_weight", 0.0, "paper",
     f"{PALM} 2.1 step 2: the decoder's predictions train stage joint"),
    ("criterion", "palm_mlm_lm", "lm_weight", 1.0, "paper", f"{PALM} 2.1 step 2 / equation 1"),
    ("criterion", "pmlm_ae_par", "syncs_at_start", False, "ours", SPEED),
    ("criterion", "unilm_cloze", "label_smoothing", 0.0, "code",
     f"{UNILM_V1}/run_seq2seq.py: --label_smoothing 0 (pre-training has none; fine-tuning recipes pass 0.1, "
     f"{UNILM} 3.1)"),
    ("criterion", "unilm_cloze", "syncs_at_start", False, "ours", SPEED),
    # --- models: the dataclass defaults, which an arch's values override ------------------------------------------
    ("model", "palm", "activation_fn", "gelu", "code",
     f"{FAIRSEQ_ROBERTA}: the exact GELU of the encoder PALM starts from; {PALM} 3.1 names GELU \"used as GPT\", whose "
     "tanh form differs from it by at most 4.7e-4 (docs/palm-authors-code.md)"),
    ("model", "palm", "dropout", 0.1, "paper", f"{PALM} 3.1: dropout 0.1 on all layers and attention weights"),
    ("model", "palm", "attention_dropout", 0.1, "paper",
     f"{PALM} 3.1: dropout 0.1 on all layers and attention weights"),
    ("model", "palm", "activation_dropout", 0.0, "code",
     f"{FAIRSEQ_ROBERTA}: no dropout after the activation, in the encoder PALM starts from ({PALM} 3.1)"),
    *palm_sizes("model", "palm", "paper", f"{PALM} 3.1: PALM (base)", 12, 768, 3072, 12, 12),
    ("model", "palm", "layer_norm_eps", 1e-5, "paper", f"{PALM} 3.1: initialised from RoBERTa (fairseq's LayerNorm)"),
    ("model", "palm", "encoder_max_positions", 512, "code", f"{FAIRSEQ_ROBERTA}: the 512 positions of RoBERTa"),
    ("model", "palm", "decoder_max_positions", 512, "ours",
     f"the encoder's 512; {PALM} 3.1 trains on sequences of at most 500 tokens"),
    ("model", "palm", "copy_attention_dim", None, "ours", f"the model size: {PALM} 2.3 gives no size for W_m, W_s"),
    ("model", "palm", "no_copy", False, "paper", f"{PALM} 2.3: the copy layer is part of PALM"),
    ("model", "palm", "source_position_markers", 0, "ours",
     "off: fairseq's pointer_generator vocabulary needs its own preprocessing"),
    ("model", "palm", "no_source_bos", False, "ours",
     "the encoder reads <s> source </s> as RoBERTa did, measured in docs/palm-source-format.md"),
    ("model", "palm", "compile_layers", False, "ours", SPEED),
    ("model", "palm", "checkpoint_activations", False, *ACTIVATION_CHECKPOINTS),
    ("model", "palm", "compile_copy_attention", False, "ours", SPEED),
    ("model", "palm", "copy_attention_impl", "auto", "ours",
     "equation (3) in Triton kernels on CUDA (PALM's step 1.16-1.43x faster than blocked on an H100, "
     "docs/benchmarks-gpu.md section 8), in cache-sized blocks elsewhere (the CPU's fastest); the same values up to "
     "float rounding"),
    ("model", "palm", "syncs_at_start", False, "ours", SPEED),
    ("model", "palm", "roberta_path", None, "ours",
     f"no file read unless given; {PALM} 3.1 starts from RoBERTa, a checkpoint the user names"),
    ("model", "palm", "reinit_encoder", False, "ours", f"an ablation of {PALM} Table 6, off"),
    ("model", "palm", "reinit_decoder", False, "ours", f"an ablation of {PALM} Table 6, off"),
    *sizes("model", "unilm", "paper", f"{BERT} 3: BERT_BASE, unilm_base's sizes", 12, 768, 3072, 12),
    ("model", "unilm", "dropout", 0.1, "paper", f"{UNILM} 2.4: dropout rate 0.1"),
    ("model", "unilm", "attention_dropout", 0.1, "code",
     f"{UNILM_V1}/run_seq2seq.py: --attention_probs_dropout_prob 0.1"),
    ("model", "unilm", "activation_dropout", 0.0, "code",
     "microsoft/unilm unilm-v1/src/pytorch_pretrained_bert/modeling.py: no dropout inside the feed-forward"),
    ("model", "unilm", "pooler_dropout", 0.1, "paper", f"{UNILM} 3.5: dropout 0.1 on the last linear projection"),
    ("model", "unilm", "layer_norm_eps", 1e-12, "ours",
     "BERT-family checkpoints' 1e-12 (their HF configs); UniLM v1's code hard-codes 1e-5 (DESIGN.md 7), which "
     "palm-convert takes from a converted checkpoint"),
    ("model", "unilm", "max_positions", 512, "paper", f"{UNILM} 2.4: maximum input length 512"),
    ("model", "unilm", "num_segments", 6, "code", UNILM_V1_SEGMENTS),
    ("model", "unilm", "relative_position_buckets", 0, "ours", "no relative position bias but in the unilm2_* archs"),
    ("model", "unilm", "relative_position_max_distance", 128, "paper",
     f"{UNILM2} appendix A, Table 7: max relative position 128"),
    ("model", "unilm", "compile_layers", False, "ours", SPEED),
    ("model", "unilm", "checkpoint_activations", False, *ACTIVATION_CHECKPOINTS),
    ("model", "unilm", "attention_impl", "sdpa", "ours",
     "torch's scaled_dot_product_attention, which runs everywhere (flex needs torch.compile); " + SPEED),
    ("model", "unilm", "drop_full_masks", False, "ours", SPEED),
    ("model", "unilm", "decoding_graph", False, "ours", SPEED),
    ("model", "unilm", "train_only_lm_head", False, "ours", "a control of continued pre-training, off"),
    ("model", "unilm", "decoding_placeholder", "<mask>", "code",
     "microsoft/unilm unilm-v1/src/pytorch_pretrained_bert/modeling.py, BertForSeq2SeqDecoder: each step appends "
     "[MASK] at the position it predicts"),
    # --- archs: what each sets on an empty namespace -------------------------------------------------------------
    *palm_sizes("arch", "palm_base", "paper", f"{PALM} 3.1: PALM (base)", 12, 768, 3072, 12, 12),
    *rows("arch", "palm_large", "paper", f"{PALM} 3.1: PALM_LARGE", encoder_layers=24, encoder_embed_dim=1024,
          encoder_attention_heads=16, decoder_layers=6, decoder_attention_heads=16),
    *rows("arch", "palm_large", "paper", f"{PALM} 3.1: RoBERTa large's size, where the encoder starts (one size for "
          "the whole model)", encoder_ffn_embed_dim=4096, decoder_ffn_embed_dim=4096),
    *palm_sizes("arch", "palm_tiny", "ours", TINY, 2, 64, 128, 2, 2),
    *sizes("arch", "unilm_base", "paper", f"{BERT} 3: BERT_BASE", 12, 768, 3072, 12),
    ("arch", "unilm_base", "num_segments", 6, "code", UNILM_V1_SEGMENTS),
    ("arch", "unilm_base", "relative_position_buckets", 0, "paper", f"{UNILM} 2.1: BERT's absolute positions only"),
    *rows("arch", "unilm_large", "paper", f"{UNILM} 2.4: a 24-layer Transformer, 1,024 hidden size, 16 heads",
          encoder_layers=24, encoder_embed_dim=1024, encoder_attention_heads=16),
    *rows("arch", "unilm_large", "paper", f"{UNILM} 2.4: BERT_LARGE's architecture", encoder_ffn_embed_dim=4096),
    ("arch", "unilm_large", "num_segments", 6, "code", UNILM_V1_SEGMENTS),
    ("arch", "unilm_large", "relative_position_buckets", 0, "paper", f"{UNILM} 2.1: BERT's absolute positions only"),
    *sizes("arch", "unilm_tiny", "ours", TINY, 2, 64, 256, 4),
    ("arch", "unilm_tiny", "num_segments", 6, "code", UNILM_V1_SEGMENTS),
    ("arch", "unilm_tiny", "relative_position_buckets", 0, "paper", f"{UNILM} 2.1: BERT's absolute positions only"),
    *sizes("arch", "unilm2_base", "paper", f"{UNILM2} 4.1 and appendix A, Table 7", 12, 768, 3072, 12),
    ("arch", "unilm2_base", "num_segments", 2, "paper", UNILM2_SEGMENTS),
    ("arch", "unilm2_base", "relative_position_buckets", 32, "paper", T5_BUCKETS),
    *sizes("arch", "unilm2_tiny", "ours", TINY, 2, 64, 256, 4),
    ("arch", "unilm2_tiny", "num_segments", 2, "paper", UNILM2_SEGMENTS),
    ("arch", "unilm2_tiny", "relative_position_buckets", 32, "paper", T5_BUCKETS),
    # --- optimizer -----------------------------------------------------------------------------------------------
    ("optimizer", "torch_adamw", "adam_betas", (0.9, 0.999), "paper", f"{UNILM} 2.4: beta_1 0.9, beta_2 0.999"),
    ("optimizer", "torch_adamw", "adam_eps", 1e-8, "ours",
     "fairseq's --optimizer adam and torch's AdamW both use 1e-8"),
    ("optimizer", "torch_adamw", "weight_decay", 0.0, "ours", "fairseq's --optimizer adam default (torch's is 0.01)"),
    ("optimizer", "torch_adamw", "adamw_impl", "fused", "ours", SPEED),
    ("optimizer", "torch_adamw", "lr", "${optimization.lr}", "ours", "fairseq's --lr (interpolated)"),
]


def is_plugins(cls) -> bool:
    return cls.__module__.split(".")[0] == "palm_plugin"


def dataclass_defaults(cls) -> dict:
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(cls)
        if not f.name.startswith("_")
    }


def plugin_options() -> dict:
    """``{(kind, name, option): default}`` for everything palm_plugin registers with fairseq."""
    options = {}
    groups = [("task", TASK_REGISTRY, TASK_DATACLASS_REGISTRY), ("model", MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY)]
    groups += [(kind, entry["registry"], entry["dataclass_registry"]) for kind, entry in REGISTRIES.items()]
    for kind, registry, dataclass_registry in groups:
        for name, cls in registry.items():
            if is_plugins(cls):
                assert name in dataclass_registry, f"{kind} {name} has no dataclass: register it with one"
                options.update({(kind, name, k): v for k, v in dataclass_defaults(dataclass_registry[name]).items()})
    for arch, model in ARCH_MODEL_REGISTRY.items():
        if is_plugins(model):
            namespace = argparse.Namespace()
            ARCH_CONFIG_REGISTRY[arch](namespace)
            options.update({("arch", arch, k): v for k, v in vars(namespace).items()})
    return options


OPTIONS = plugin_options()
HOW = (f"update its row in DEFAULTS of tests/test_paper_defaults.py, with where the value comes from (paper and "
       f"section, the authors' code and file, or our choice and why), then rewrite docs/defaults.md: {REWRITE}")


def flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def same(a, b) -> bool:
    """Equal values of the same type: a default of 1 is not the table's True, nor 0 its 0.0."""
    return type(a) is type(b) and a == b


def test_every_registered_option_has_a_row_and_every_row_an_option():
    keys = {(kind, name, option) for kind, name, option, *_ in DEFAULTS}
    missing = sorted(set(OPTIONS) - keys)
    gone = sorted(keys - set(OPTIONS))
    lines = [f"{kind} {name} {flag(option)} = {OPTIONS[(kind, name, option)]!r} has no row: add "
             f"({kind!r}, {name!r}, {option!r}, {OPTIONS[(kind, name, option)]!r}, SOURCE KIND, WHERE)"
             for kind, name, option in missing]
    lines += [f"{kind} {name} {flag(option)} is in the table but the plugin no longer has it: remove its row"
              for kind, name, option in gone]
    assert not lines, "\n".join(lines) + f"\nthen rewrite docs/defaults.md: {REWRITE}"


@pytest.mark.parametrize("kind, name, option, value, source, where", DEFAULTS,
                         ids=[f"{d[0]}-{d[1]}.{d[2]}" for d in DEFAULTS])
def test_default(kind, name, option, value, source, where):
    if (kind, name, option) not in OPTIONS:
        pytest.fail(f"{kind} {name} {flag(option)} is in the table but the plugin no longer has it: remove its row "
                    f"and rewrite docs/defaults.md ({REWRITE})")
    actual = OPTIONS[(kind, name, option)]
    assert same(actual, value), (
        f"{kind} {name} {flag(option)} defaults to {actual!r}, the table says {value!r} ({source}: {where}). "
        f"If the change is meant, {HOW}"
    )


def test_each_row_is_listed_once_with_a_source():
    keys = Counter((kind, name, option) for kind, name, option, *_ in DEFAULTS)
    assert [key for key, n in keys.items() if n > 1] == []
    for kind, name, option, _, source, where in DEFAULTS:
        assert source in SOURCE_KINDS, f"{kind} {name} {flag(option)}: source kind {source!r}, not in {SOURCE_KINDS}"
        assert len(where) > 10, f"{kind} {name} {flag(option)}: say where the value comes from, not {where!r}"


def render() -> str:
    """docs/defaults.md: one table per task, criterion, model, arch and optimizer, in the order of DEFAULTS."""
    counts = Counter(source for *_, source, _ in DEFAULTS)
    lines = [
        "# Defaults and where they come from",
        "",
        "Every option of every task, criterion, model, architecture and optimizer the plugin registers, with its "
        "default and its source: a paper and section, the authors' code and file, or our choice and why. An arch "
        "sets the values listed under it; every other option of its model keeps the model's default. Generated "
        f"from the table of `tests/test_paper_defaults.py` (`{REWRITE}`), which fails when a default changes or an "
        "option has no row.",
        "",
        f"{len(DEFAULTS)} options: " + ", ".join(
            f"{counts[kind]} from {kind_name}"
            for kind, kind_name in zip(SOURCE_KINDS, ("papers", "the authors' code", "our choices"))) + ".",
    ]
    current = None
    for kind, name, option, value, source, where in DEFAULTS:
        if (kind, name) != current:
            current = (kind, name)
            lines += ["", f"## {kind} `{name}`", "", "| option | default | source |", "|---|---|---|"]
        shown = "required" if value == "???" else f"`{value!r}`"
        lines.append(f"| `{flag(option)}` | {shown} | {source}: {where} |")
    return "\n".join(lines) + "\n"


def test_docs_page_is_the_table():
    assert DOCS.exists() and DOCS.read_text() == render(), f"docs/defaults.md differs from the table: {REWRITE}"


if __name__ == "__main__":
    DOCS.write_text(render())
    print(f"wrote {DOCS.relative_to(DOCS.parents[1])}: {len(DEFAULTS)} options", file=sys.stderr)
