"""The unilm model's own interfaces: mask/bias handling, output heads, classification heads, sentence_prediction."""
import argparse
import re

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary

from palm_plugin.models.unilm import UniLMConfig, UniLMModel, unilm2_tiny, unilm_tiny
from palm_plugin.modules.attention_masks import Objective, left_to_right_mask, right_to_left_mask
from tests.conftest import REPO


def build(arch, seed=0):
    dictionary = Dictionary()
    for index in range(30):
        dictionary.add_symbol(f"w{index}")
    dictionary.add_symbol("<mask>")
    torch.manual_seed(seed)
    namespace = argparse.Namespace()
    arch(namespace)
    return UniLMModel.build_model(UniLMConfig.from_namespace(namespace), argparse.Namespace(source_dictionary=dictionary)).eval(), dictionary


def tokens_with_padding(dictionary):
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (2, 7), generator=torch.Generator().manual_seed(1))
    tokens[1, 5:] = dictionary.pad()
    return tokens


def test_relative_position_bias_goes_through_the_additive_mask():
    """With a zero bias table, unilm2 (float mask + bias) equals unilm (boolean mask) with the same weights; with a
    non-zero table, the scores shift by exactly that bias (checked on one layer against a manual attention)."""
    v1, dictionary = build(unilm_tiny)
    v2, _ = build(unilm2_tiny)
    state = {k: v for k, v in v1.state_dict().items() if "segments" not in k}
    v2.load_state_dict(state, strict=False)
    with torch.no_grad():
        v2.stack.embeddings.segments.weight.copy_(v1.stack.embeddings.segments.weight[:2])
        v2.stack.relative_position.weight.zero_()
    tokens = tokens_with_padding(dictionary)
    real = tokens.ne(dictionary.pad())
    objectives = torch.tensor([Objective.SEQ2SEQ, Objective.LEFT_TO_RIGHT])
    with torch.no_grad():
        a, _ = v1(tokens, objectives=objectives, source_lengths=torch.tensor([3, 0]), features_only=True)
        b, _ = v2(tokens, objectives=objectives, source_lengths=torch.tensor([3, 0]), features_only=True)
        torch.testing.assert_close(a[real], b[real], atol=1e-6, rtol=0)

        torch.nn.init.normal_(v2.stack.relative_position.weight, std=1.0)
        layer = v2.stack.layers[0]
        x = torch.randn(2, 7, 64)
        positions = v2.stack.default_positions(tokens)
        mask = left_to_right_mask(7).expand(2, 7, 7)
        out, _ = layer(x, v2.stack.attention_bias(positions, positions, mask, x.dtype))
        q, k, v = layer.project(x)
        bias = v2.stack.relative_position(positions, positions)
        scores = (q @ k.transpose(-1, -2)) / 4.0 + bias  # head_dim 16
        scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
        expected = layer._finish(x, scores.softmax(-1) @ v)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_outputs_probabilities_and_explicit_masks():
    model, dictionary = build(unilm_tiny)
    tokens = tokens_with_padding(dictionary)
    with torch.no_grad():
        logits, extra = model(tokens, next_sentence=True, return_all_hiddens=True)
        probs = model.get_normalized_probs((logits, None), log_probs=False)
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, 7))
        assert extra["next_sentence_logits"].shape == (2, 2) and len(extra["inner_states"]) == 3
        masked = tokens.ne(dictionary.pad()) & (torch.arange(7) % 2 == 0)
        only_masked, _ = model(tokens, masked_tokens=masked)
        torch.testing.assert_close(only_masked, logits[masked], atol=1e-6, rtol=0)
        # An explicit (T, T) mask is the same as the objective it encodes.
        explicit, _ = model(tokens, attention_mask=left_to_right_mask(7), features_only=True)
        by_objective, _ = model(tokens, objectives=torch.tensor([1, 1]), source_lengths=torch.zeros(2, dtype=torch.long), features_only=True)
        torch.testing.assert_close(explicit, by_objective)


def test_next_sentence_logits_come_only_when_asked():
    """BERT's next-sentence head on the [SOS] state (tanh pooler, then 2 classes), in ``extra`` only when the caller
    asks (the pre-training criterion, for its bidirectional rows); a plain call (fine-tuning, scoring) leaves the
    head out, and the states of every layer."""
    model, dictionary = build(unilm_tiny)
    tokens = tokens_with_padding(dictionary)
    with torch.no_grad():
        states, _ = model(tokens, features_only=True)
        expected = torch.tanh(states[:, 0] @ model.pooler.weight.T + model.pooler.bias) @ \
            model.next_sentence_head.weight.T + model.next_sentence_head.bias
        _, asked = model(tokens, next_sentence=True)
        _, plain = model(tokens)
    torch.testing.assert_close(asked["next_sentence_logits"], expected)
    assert "next_sentence_logits" not in plain
    assert plain["inner_states"] is None  # nor each layer's states, which only return_all_hiddens keeps


def features(model, tokens, how, rows=slice(None)):
    """Top states ``(B, T, C)`` of ``tokens`` (the batch rows ``rows`` of the test), with the mask given the way
    ``how`` says. The only place the padding test touches the model's inputs."""
    with torch.no_grad():
        if how == "default":
            return model(tokens, features_only=True)[0]
        if how == "explicit":
            return model(tokens, attention_mask=right_to_left_mask(tokens.size(1)), features_only=True)[0]
        objectives = torch.tensor([Objective.SEQ2SEQ, Objective.RIGHT_TO_LEFT])[rows]
        return model(tokens, objectives=objectives, source_lengths=torch.tensor([3, 3])[rows], features_only=True)[0]


@pytest.mark.parametrize("how", ["default", "explicit", "objectives"])
@pytest.mark.parametrize("arch", [unilm_tiny, unilm2_tiny])
def test_padding_keys_are_invisible(arch, how):
    """Row 1 holds two padding keys. Its real positions must not change when the padding's embedding changes, and
    must equal the same row run alone without padding."""
    model, dictionary = build(arch)
    with torch.no_grad():  # larger weights than BERT's init: a visible key would move the outputs clearly
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    tokens = tokens_with_padding(dictionary)
    reference = features(model, tokens, how)
    with torch.no_grad():
        model.stack.embeddings.tokens.weight[dictionary.pad()].normal_(0, 3.0)
    perturbed = features(model, tokens, how)
    alone = features(model, tokens[1:, :5], how, rows=slice(1, 2))
    torch.testing.assert_close(perturbed[:, :5], reference[:, :5], atol=1e-5, rtol=0)
    torch.testing.assert_close(perturbed[1, :5], alone[0], atol=1e-5, rtol=0)
    assert (perturbed[1, 5:] - reference[1, 5:]).abs().max() > 0.1  # the padding itself did change


@pytest.mark.parametrize("arch", [unilm_tiny, unilm2_tiny])
def test_the_padding_embedding_starts_at_zero_and_is_never_trained(arch):
    """As BERT's (HF's padding_idx): the [PAD] row of the token table is zero in a new model and gets no gradient,
    even from outputs at padded positions."""
    model, dictionary = build(arch)
    table = model.stack.embeddings.tokens.weight
    assert table[dictionary.pad()].abs().max() == 0 and table.abs().max() > 0
    model(tokens_with_padding(dictionary), features_only=True)[0].square().sum().backward()
    assert table.grad[dictionary.pad()].abs().max() == 0 and table.grad.abs().max() > 0


def test_classification_heads_and_checkpoint_upgrade():
    model, dictionary = build(unilm_tiny)
    model.register_classification_head("sentiment", num_classes=3)
    model.eval()
    tokens = tokens_with_padding(dictionary)
    with torch.no_grad():
        logits, _ = model(tokens, classification_head_name="sentiment")
        features, _ = model(tokens, features_only=True)
    assert logits.shape == (2, 3)
    head = model.classification_heads["sentiment"]
    torch.testing.assert_close(logits, head.out_proj(features[:, 0]))  # softmax(h_1^L W^C): the [SOS] state
    pretrained = {k: v for k, v in model.state_dict().items() if not k.startswith("classification_heads")}
    model.upgrade_state_dict_named(pretrained, "")
    assert "classification_heads.sentiment.out_proj.weight" in pretrained  # a fresh head for fine-tuning
    stale = dict(pretrained, **{"classification_heads.other.out_proj.weight": torch.zeros(5, 64)})
    model.upgrade_state_dict_named(stale, "")
    assert not any(k.startswith("classification_heads.other") for k in stale)
    model.load_state_dict(stale, strict=True)
    # a fine-tuned head of the same shape is kept (evaluating, resuming); one of another shape gives way to this one's
    key = "classification_heads.sentiment.out_proj.weight"
    trained = dict(pretrained, **{key: torch.full((3, 64), 0.5)})
    model.upgrade_state_dict_named(trained, "")
    assert torch.equal(trained[key], torch.full((3, 64), 0.5))
    reshaped = dict(pretrained, **{key: torch.zeros(4, 64)})
    model.upgrade_state_dict_named(reshaped, "")
    assert torch.equal(reshaped[key], head.out_proj.weight)


@pytest.mark.slow
def test_fairseq_sentence_prediction_fine_tunes_unilm_tiny(tmp_path, cli):
    rng = np.random.default_rng(0)
    for split, count in (("train", 96), ("valid", 32)):
        labels, texts = [], []
        for _ in range(count):
            label = int(rng.integers(2))
            texts.append(" ".join(["good" if label else "bad"] + [f"w{i}" for i in rng.integers(20, size=5)]))
            labels.append(str(label))
        (tmp_path / f"{split}.input0").write_text("\n".join(texts) + "\n")
        (tmp_path / f"{split}.label").write_text("\n".join(labels) + "\n")
    for part in ("input0", "label"):
        cli("fairseq-preprocess", "--only-source", "--trainpref", tmp_path / f"train.{part}", "--validpref",
            tmp_path / f"valid.{part}", "--destdir", tmp_path / "bin" / part, "--workers", "1")
    result = cli("fairseq-train", tmp_path / "bin", "--user-dir", REPO / "palm_plugin", "--task", "sentence_prediction",
                 "--arch", "unilm_tiny", "--criterion", "sentence_prediction", "--num-classes", "2", "--init-token", "0",
                 "--max-positions", "64", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "16", "--max-epoch",
                 "6", "--cpu", "--save-dir", tmp_path / "ckpt", "--no-epoch-checkpoints", "--log-format", "simple",
                 "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric")
    log = result.stdout + result.stderr
    accuracies = [float(a) for a in re.findall(r"valid on 'valid' subset .*?\| accuracy ([\d.]+)", log)]
    assert len(accuracies) == 6
    assert accuracies[-1] >= 90.0, accuracies  # the first word decides the label: learned through [SOS]


@pytest.mark.parametrize("architecture", ["unilm_base", "unilm_large", "unilm_tiny", "unilm2_base", "unilm2_tiny"])
def test_architecture_defaults_give_way_to_options_set_by_the_user(architecture):
    """fairseq's convention: an architecture fills in only the sizes the command line left unset. Each size set
    alone keeps its value, and every other one takes the architecture's default."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    fill = ARCH_CONFIG_REGISTRY[architecture]
    defaults = argparse.Namespace()
    fill(defaults)
    sizes = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads", "num_segments",
             "relative_position_buckets")
    assert set(vars(defaults)) == set(sizes)
    for size in sizes:
        chosen = argparse.Namespace(**{size: 7})
        fill(chosen)
        assert vars(chosen) == {**vars(defaults), size: 7}, size


def test_a_configuration_from_before_compile_layers_builds_uncompiled_layers():
    """--compile-layers is off unless asked: a model configuration saved before the option existed (built directly,
    as palm-convert builds its model from a configuration, not through fairseq's loader) gets plain layers."""
    from omegaconf import OmegaConf

    namespace = argparse.Namespace()
    unilm_tiny(namespace)
    saved = OmegaConf.structured(UniLMConfig.from_namespace(namespace))
    old = OmegaConf.create({key: value for key, value in OmegaConf.to_container(saved).items()
                            if key != "compile_layers"})
    dictionary = Dictionary()
    dictionary.add_symbol("<mask>")
    model = UniLMModel.build_model(old, argparse.Namespace(source_dictionary=dictionary))
    # nn.Module.compile (what --compile-layers does) sets _compiled_call_impl on each layer
    assert [getattr(layer, "_compiled_call_impl", None) for layer in model.stack.layers] == [None, None]


def test_a_model_built_directly_attends_as_its_configuration_says():
    """UniLMModel(cfg, dictionary), built without fairseq's build_model (as Python callers and the tests build it),
    takes the configuration's --attention-impl; the choice build_model passes (sdpa for a triton checkpoint used
    where its kernels cannot run) takes precedence."""
    import dataclasses

    namespace = argparse.Namespace()
    unilm_tiny(namespace)
    dictionary = Dictionary()
    dictionary.add_symbol("<mask>")
    for impl in ("sdpa", "flex"):
        cfg = dataclasses.replace(UniLMConfig.from_namespace(namespace), attention_impl=impl)
        assert UniLMModel(cfg, dictionary).stack.attention_impl == impl
    assert UniLMModel(cfg, dictionary, "sdpa").stack.attention_impl == "sdpa"


@pytest.mark.parametrize("triton_package", [True, False])
def test_a_triton_checkpoint_used_where_its_kernels_cannot_run_attends_with_sdpa_and_says_so(monkeypatch, caplog,
                                                                                             triton_package):
    """A model trained with --attention-impl triton, built from its checkpoint for use (fairseq-generate, hub
    loading) on a machine without CUDA, or without the triton package: it gives the outputs of an sdpa model with the
    same weights, and one warning says so. (Building to train stops there: tests/test_attention_triton.py.)"""
    import logging

    from palm_plugin.modules import attention_impl
    from tests.test_flex_attention import build as build_as_fairseq
    from tests.test_unilm_decoding import tiny_dictionary

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if not triton_package:
        monkeypatch.setattr(attention_impl, "triton_installed", lambda: False)
    elif not attention_impl.triton_installed():
        pytest.skip("needs the triton package")
    dictionary = tiny_dictionary()
    torch.manual_seed(0)
    reference = build_as_fairseq("unilm2_tiny", dictionary, for_training=True, dropout=0.0, attention_dropout=0.0)
    with caplog.at_level(logging.WARNING, logger="palm_plugin.models.unilm"):
        model = build_as_fairseq("unilm2_tiny", dictionary, for_training=False, attention_impl="triton")
    assert [r.getMessage() for r in caplog.records if r.name == "palm_plugin.models.unilm"] == [
        "this checkpoint was trained with --attention-impl triton, whose kernels cannot run here (no CUDA device or "
        "no triton package): it attends with --attention-impl sdpa, the same values"]
    model.load_state_dict(reference.state_dict())
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (2, 9), generator=torch.Generator().manual_seed(2))
    tokens[1, 6:] = dictionary.pad()
    with torch.no_grad():
        expected, _ = reference.eval()(tokens, features_only=True)
        actual, _ = model.eval()(tokens, features_only=True)
    assert torch.equal(actual, expected)


def test_triton_on_a_machine_without_cuda_names_what_is_missing(monkeypatch):
    """--attention-impl triton where its kernels cannot run names the missing part: with the triton package importable
    (torch's builds bring it) the CUDA device, without it the package to install."""
    from palm_plugin.errors import CommandError
    from palm_plugin.modules import attention_impl

    try:  # whether the package imports, found apart from triton_installed()
        import triton
    except ImportError:
        triton = None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if triton is not None:  # this process does not interpret the kernels (their tests run in a process of their own)
        monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    assert attention_impl.triton_installed() == (triton is not None)
    with pytest.raises(CommandError) as refused:
        attention_impl.check_usable("triton", True, 0.0)
    assert str(refused.value.code) == "error: --attention-impl triton: " + (
        f"its kernels run on CUDA, and no CUDA device is available (torch {torch.__version__}); use --attention-impl "
        "sdpa" if triton is not None else
        "its kernels need the triton package (pip install triton), which is not installed; use --attention-impl sdpa")


def test_classification_head_registered_again_with_other_classes_is_replaced_with_a_warning(caplog):
    """fairseq's convention (RoBERTa): registering a head of the same name again replaces it, and says so only when
    the number of classes changes; an inner_dim is refused with the reason."""
    import logging

    namespace = argparse.Namespace()
    unilm_tiny(namespace)
    dictionary = Dictionary()
    dictionary.add_symbol("<mask>")
    model = UniLMModel.build_model(UniLMConfig.from_namespace(namespace), argparse.Namespace(source_dictionary=dictionary))
    with caplog.at_level(logging.WARNING, logger="palm_plugin.models.unilm"):
        model.register_classification_head("pairs", num_classes=2)
        model.register_classification_head("pairs", num_classes=2)
        assert not caplog.records
        model.register_classification_head("pairs", num_classes=3)
    assert [r.getMessage() for r in caplog.records] == ["re-registering head 'pairs' with 3 classes"]
    assert model.classification_heads["pairs"].out_proj.out_features == 3
    # RoBERTa's inner_dim (a dense + tanh layer before the projection) has no place in UniLM's one-layer head: the
    # error says why and leaves the registered head as it was
    with pytest.raises(ValueError, match=r"one linear layer \(section 2\.5\); inner_dim is not used"):
        model.register_classification_head("pairs", num_classes=5, inner_dim=16)
    assert model.classification_heads["pairs"].out_proj.out_features == 3


def test_decoding_placeholder_missing_from_the_dictionary_is_named():
    namespace = argparse.Namespace(decoding_placeholder="<pseudo>")
    unilm2_tiny(namespace)
    with pytest.raises(ValueError, match="decoding placeholder '<pseudo>' is not in the dictionary; the task must add"):
        UniLMModel.build_model(UniLMConfig.from_namespace(namespace), argparse.Namespace(source_dictionary=Dictionary()))


def test_a_position_past_the_table_is_named_before_any_lookup():
    model, dictionary = build(unilm_tiny)
    limit = model.stack.embeddings.positions.num_embeddings
    tokens = torch.full((1, limit + 1), dictionary.index("w1"))
    with pytest.raises(ValueError, match=f"position id {limit} exceeds the model's {limit} positions; truncate"):
        model(tokens, features_only=True)


def test_a_stack_whose_heads_do_not_divide_its_width_is_refused_for_python_callers():
    """The model's options are checked when it is built (palm_plugin/modules/size_check.py); a UniLMTransformer built
    directly checks its own layer sizes."""
    from palm_plugin.modules.unilm_transformer import UniLMTransformer

    with pytest.raises(ValueError, match=r"^model dimension 30 is not divisible by the number of heads 4$"):
        UniLMTransformer(vocab_size=20, padding_idx=1, dim=30, ffn_dim=60, layers=1, num_heads=4, max_positions=16,
                         num_segments=2, dropout=0.0, attention_dropout=0.0)


def test_a_stack_built_in_python_without_an_epsilon_normalises_as_bert():
    """A UniLMTransformer built directly takes BERT's LayerNorm epsilon, 1e-12 (transformers.BertConfig's default,
    the one the checkpoints it reads were trained with): its states are those of the stack given 1e-12."""
    from transformers import BertConfig

    from palm_plugin.modules.unilm_transformer import UniLMTransformer

    sizes = dict(vocab_size=20, padding_idx=1, dim=16, ffn_dim=32, layers=1, num_heads=2, max_positions=16,
                 num_segments=2, dropout=0.0, attention_dropout=0.0)
    stacks = []
    for eps in ({}, {"layer_norm_eps": BertConfig().layer_norm_eps}):
        torch.manual_seed(0)
        stacks.append(UniLMTransformer(**sizes, **eps).eval())
    tokens = torch.randint(2, 20, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(stacks[0](tokens, None), stacks[1](tokens, None))
