"""Every default that a paper fixes, pinned with the paper and section it comes from.

A plausible wrong value (a masking rate of 0.2, spans up to 5, another mix of objectives) passes the behavioural
tests of the code that reads it, and a mutation tool's edits of a number are refused by validation before a test
sees them: this table is what fails when such a default changes. Values the papers leave open (the authors' code
or this project's choices) are not here.
"""
import argparse
import dataclasses

import pytest
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.tasks import TASK_DATACLASS_REGISTRY

import palm_plugin  # noqa: F401  (registers the tasks, criteria and archs)
from palm_plugin.models.palm import PalmConfig
from palm_plugin.models.unilm import UniLMConfig

PALM, UNILM, UNILM2 = "PALM (Bi et al. 2020)", "UniLM (Dong et al. 2019)", "UniLMv2 (Bao et al. 2020)"
BERT_80_10_10 = [("leave_unmasked_prob", 0.1), ("random_token_prob", 0.1)]

# (kind, name, option, value, paper, where)
DEFAULTS = [
    # PALM: pre-training pairs and the encoder's masked LM
    ("task", "continuation_pair", "max_source_tokens", 400, PALM, "2.2: context of at most 400 tokens"),
    ("task", "continuation_pair", "max_target_tokens", 100, PALM, "2.2: output of at most 100 tokens"),
    ("task", "continuation_pair", "mask_prob", 0.15, PALM, "2.1: the encoder trained as BERT's masked LM"),
    *[("task", "continuation_pair", option, value, PALM, "2.1: BERT's 80/10/10") for option, value in BERT_80_10_10],
    ("criterion", "palm_mlm_lm", "mlm_weight", 0.0, PALM, "2.1 step 2: the decoder's predictions train stage joint"),
    ("criterion", "palm_mlm_lm", "lm_weight", 1.0, PALM, "2.1 step 2 / equation 1"),
    ("arch", "palm_base", "encoder_layers", 12, PALM, "3.1: PALM_BASE"),
    ("arch", "palm_base", "decoder_layers", 12, PALM, "3.1: PALM_BASE"),
    ("arch", "palm_base", "encoder_embed_dim", 768, PALM, "3.1: PALM_BASE"),
    ("arch", "palm_base", "encoder_attention_heads", 12, PALM, "3.1: PALM_BASE (RoBERTa base)"),
    ("arch", "palm_large", "encoder_layers", 24, PALM, "3.1: PALM_LARGE"),
    ("arch", "palm_large", "decoder_layers", 6, PALM, "3.1: PALM_LARGE"),
    ("arch", "palm_large", "encoder_embed_dim", 1024, PALM, "3.1: PALM_LARGE"),
    ("arch", "palm_large", "encoder_attention_heads", 16, PALM, "3.1: PALM_LARGE"),
    ("model", "palm", "layer_norm_eps", 1e-5, PALM, "3.1: initialised from RoBERTa (fairseq's LayerNorm)"),
    # UniLM
    ("task", "unilm_pretraining", "mask_prob", 0.15, UNILM, "2.4: token masking probability 15%"),
    *[("task", "unilm_pretraining", option, value, UNILM, "2.4: 80% [MASK], 10% random, 10% kept")
      for option, value in BERT_80_10_10],
    ("task", "unilm_pretraining", "span_length_probs", "0.8,0.1,0.1", UNILM,
     "2.4: 80% one token, 20% a bigram or trigram"),
    ("task", "unilm_pretraining", "objective_probs", "1/3,1/3,1/6,1/6", UNILM,
     "2.4: 1/3 bidirectional, 1/3 seq2seq, 1/6 each unidirectional"),
    ("task", "unilm_pretraining", "tokens_per_sample", 512, UNILM, "2.4: maximum input length 512"),
    ("task", "unilm_seq2seq", "mask_prob", 0.7, UNILM, "3.1 and 3.3: masking probability 0.7"),
    ("arch", "unilm_large", "encoder_layers", 24, UNILM, "2.4: 24-layer Transformer"),
    ("arch", "unilm_large", "encoder_embed_dim", 1024, UNILM, "2.4: 1,024 hidden size"),
    ("arch", "unilm_large", "encoder_attention_heads", 16, UNILM, "2.4: 16 attention heads"),
    ("model", "unilm", "max_positions", 512, UNILM, "2.4: maximum input length 512"),
    # UniLMv2
    ("task", "pmlm", "mask_prob", 0.15, UNILM2, "3.1.2, Algorithm 1: masking ratio 15%"),
    ("task", "pmlm", "block_prob", 0.4, UNILM2, "3.1.2, Algorithm 1: an n-gram block 40% of the time"),
    ("task", "pmlm", "min_block_length", 2, UNILM2, "3.1.2, Algorithm 1: rand_int(2, 6)"),
    ("task", "pmlm", "max_block_length", 6, UNILM2, "3.1.2, Algorithm 1: rand_int(2, 6)"),
    ("task", "pmlm", "objective", "ae_par", UNILM2, "3.3: L_AE + L_PAR"),
    ("task", "pmlm", "tokens_per_sample", 512, UNILM2, "4.1: maximum input length 512"),
    *[("task", "pmlm", option, value, UNILM2, "4.1: 80% masks, 10% random, 10% kept") for option, value in
      BERT_80_10_10],
    ("arch", "unilm2_base", "encoder_layers", 12, UNILM2, "4.1 and appendix A: 12 layers"),
    ("arch", "unilm2_base", "encoder_embed_dim", 768, UNILM2, "4.1 and appendix A: hidden size 768"),
    ("arch", "unilm2_base", "encoder_ffn_embed_dim", 3072, UNILM2, "4.1 and appendix A: inner size 3072"),
    ("arch", "unilm2_base", "encoder_attention_heads", 12, UNILM2, "4.1 and appendix A: 12 heads"),
    ("model", "unilm", "relative_position_max_distance", 128, UNILM2, "appendix A: max relative position 128"),
]


def default(kind, name, option):
    """The value a user gets without setting ``option``: a task's or criterion's dataclass default, an arch's
    value, or the model's dataclass default."""
    if kind in ("task", "criterion"):
        registry = TASK_DATACLASS_REGISTRY if kind == "task" else CRITERION_DATACLASS_REGISTRY
        return {f.name: f.default for f in dataclasses.fields(registry[name])}[option]
    if kind == "arch":
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[name](args)
        return getattr(args, option)
    return getattr({"palm": PalmConfig, "unilm": UniLMConfig}[name](), option)


@pytest.mark.parametrize("kind, name, option, value, paper, where", DEFAULTS,
                         ids=[f"{d[1]}.{d[2]}" for d in DEFAULTS])
def test_paper_fixed_default(kind, name, option, value, paper, where):
    assert default(kind, name, option) == value, f"{kind} {name} --{option.replace('_', '-')}: {paper}, {where}"


def test_each_default_is_listed_once():
    keys = [(kind, name, option) for kind, name, option, *_ in DEFAULTS]
    assert len(keys) == len(set(keys))
