"""Every family starts from a BERT-family checkpoint converted by palm-convert bert, and computes what the checkpoint
computes before any update (checked against transformers' BERT): UniLMv2's tasks (``<pseudo>`` appended as a copy of
[MASK], a relative position bias of zeros), PALM's encoder (positions, token types and LayerNorm epsilon mapped), and
the head-only control (every parameter frozen but the MLM head's)."""
import argparse
import logging

import pytest
import torch
import transformers
from fairseq.data import Dictionary
from omegaconf import OmegaConf

from palm_plugin.data.symbols import PSEUDO_SYMBOL
from palm_plugin.fixes import checkpoint_paths, safe_loading
from palm_plugin.models.unilm import UniLMModel
from palm_tools.convert import cli as convert
from tests.test_convert_checkpoint import bert_ids, randomize, sample_batch, tiny_bert_config, write_bert_dir
from tests.test_palm_model import build as build_palm


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A random tiny BertForMaskedLM (LayerNorm epsilon 1e-12), its palm-convert bert output and the checkpoint."""
    folder = tmp_path_factory.mktemp("bert")
    config = tiny_bert_config()
    reference = randomize(transformers.BertForMaskedLM(config), seed=5).eval()
    reference.tie_weights()
    convert.main(["bert", "--input", str(write_bert_dir(folder / "bert", reference, config)), "--output",
                  str(folder / "out")])
    return reference, folder / "out", safe_loading.load_state(str(folder / "out" / "model.pt"))


def unilm2_model(state, dictionary, **changes):
    """A unilm model built from the checkpoint's configuration with ``changes`` (as fairseq-train builds it), loaded
    through fairseq's load_state_dict (which runs the model's upgrade)."""
    cfg = OmegaConf.create({**state["cfg"]["model"], **changes})
    model = UniLMModel.build_model(cfg, argparse.Namespace(source_dictionary=dictionary))
    model.load_state_dict({k: v.clone() for k, v in state["model"].items()}, strict=True)
    return model.eval()


def test_a_bert_checkpoint_under_unilm2_tasks_computes_what_the_checkpoint_computes(converted, caplog):
    """A BERT checkpoint under UniLMv2's tasks (<pseudo> appended as a copy of [MASK], a relative bias of zeros)
    computes what the checkpoint computes, and the log names each table that grew."""
    reference, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    dictionary.add_symbol("<mask>")
    pseudo = dictionary.add_symbol(PSEUDO_SYMBOL)  # what pmlm and unilm_seq2seq --pseudo-masks append
    assert pseudo == len(dictionary) - 1 == state["model"]["encoder.stack.embeddings.tokens.weight"].size(0)
    caplog.set_level(logging.INFO, logger="palm_plugin.models.unilm")
    model = unilm2_model(state, dictionary, relative_position_buckets=32)
    assert torch.count_nonzero(model.stack.relative_position.weight) == 0
    assert "resized the checkpoint's tables to this model's: <pseudo> added as a copy of <mask>, relative position " \
           "bias added, all zero" in caplog.messages
    tokens = sample_batch(dictionary, torch.Generator().manual_seed(2))
    real = tokens.ne(dictionary.pad())
    ids, table = bert_ids(dictionary, tokens)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=real.long(), output_hidden_states=True)
        features, _ = model(tokens, features_only=True)
        logits, _ = model(tokens)
        # <pseudo> is read as the checkpoint reads [MASK]: the same states where one replaces the other
        masked = tokens.clone()
        masked[:, 2] = dictionary.index("<mask>")
        with_pseudo = tokens.clone()
        with_pseudo[:, 2] = pseudo
        as_mask, _ = model(masked, features_only=True)
        as_pseudo, _ = model(with_pseudo, features_only=True)
    torch.testing.assert_close(features[real], expected.hidden_states[-1][real], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[real], expected.logits[..., table][real], atol=1e-5, rtol=0)
    torch.testing.assert_close(as_pseudo, as_mask, atol=0, rtol=0)
    # the output layer predicts <pseudo> with [MASK]'s logit (weight tied to the copied row, bias copied)
    torch.testing.assert_close(logits[..., pseudo], logits[..., dictionary.index("<mask>")], atol=0, rtol=0)


def test_fine_tuning_a_checkpoint_without_relative_bias_keeps_the_unilm2_arch(converted, caplog):
    """fairseq-train --arch unilm2_* --finetune-from-model BERT adopts the checkpoint's sizes but not its lack of a
    relative position bias (that would silently train UniLM v1); a size that conflicts still stops."""
    _, out, state = converted

    def unilm2_args():
        return argparse.Namespace(arch="unilm2_tiny", relative_position_buckets=32, relative_position_max_distance=64,
                                  encoder_layers=4, source_segment=4, target_segment=5, task="unilm_seq2seq")

    args = unilm2_args()
    adopted = checkpoint_paths.adopt(args, ["--arch", "unilm2_tiny"], state, str(out / "model.pt"))
    assert (args.relative_position_buckets, args.relative_position_max_distance) == (32, 64)
    assert args.encoder_layers == adopted["encoder_layers"] == 2
    assert "relative_position_buckets" not in adopted
    # the same from a configuration that lists the relative sizes before the others (its order is the writer's)
    model_cfg = state["cfg"]["model"]
    reordered = {**state, "cfg": {**state["cfg"], "model": {key: model_cfg[key] for key in reversed(model_cfg)}}}
    again = unilm2_args()
    assert checkpoint_paths.adopt(again, ["--arch", "unilm2_tiny"], reordered, "reordered.pt") == adopted
    assert vars(again) == vars(args)
    # a pmlm checkpoint (UniLMv2 pre-training: S1 / S2 are segments 0 / 1) gives its segments to unilm_seq2seq
    pmlm = {**state, "cfg": {**state["cfg"], "task": {"_name": "pmlm"}}}
    args = argparse.Namespace(arch="unilm2_tiny", source_segment=4, target_segment=5, task="unilm_seq2seq")
    checkpoint_paths.adopt(args, ["--arch", "unilm2_tiny"], pmlm, "pmlm.pt")
    assert (args.source_segment, args.target_segment) == (0, 1)
    args = argparse.Namespace(arch="unilm2_tiny", source_segment=2, target_segment=5, task="unilm_seq2seq")
    checkpoint_paths.adopt(args, ["--source-segment", "2"], pmlm, "pmlm.pt")
    assert (args.source_segment, args.target_segment) == (2, 1)
    # fairseq-generate --path of a checkpoint fine-tuned in UniLMv2's layout decodes in it, as with its segments
    tuned = {**state, "cfg": {**state["cfg"], "task": {"_name": "unilm_seq2seq", "pseudo_masks": True,
                                                       "source_segment": 0, "target_segment": 1}}}
    args = argparse.Namespace(arch="unilm2_tiny", source_segment=4, target_segment=5, pseudo_masks=False,
                              task="unilm_seq2seq")
    caplog.set_level(logging.INFO, logger="palm_plugin.fixes.checkpoint_paths")
    checkpoint_paths.adopt(args, [], tuned, "tuned.pt", sizes=False)
    assert (args.pseudo_masks, args.source_segment, args.target_segment) == (True, 0, 1)
    # the log tells the user which values came from the checkpoint
    assert "from tuned.pt: source_segment=0, target_segment=1, pseudo_masks=True" in caplog.messages
    with pytest.raises(checkpoint_paths.CheckpointPathError, match="--encoder-layers 2"):
        checkpoint_paths.adopt(argparse.Namespace(arch="unilm2_tiny", encoder_layers=4, task="unilm_seq2seq"),
                               ["--encoder-layers", "4"], state, str(out / "model.pt"))


def test_palm_encoder_from_a_converted_bert_equals_bert(converted):
    reference, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    sizes = dict(encoder_layers=2, encoder_embed_dim=64, encoder_ffn_embed_dim=256, encoder_attention_heads=4,
                 encoder_max_positions=64)
    with pytest.raises(ValueError, match=r"pass --layer-norm-eps 1e-12$"):
        build_palm(dictionary, roberta_path=str(out / "model.pt"), **sizes)
    palm = build_palm(dictionary, roberta_path=str(out / "model.pt"), layer_norm_eps=1e-12, **sizes).eval()
    # PALM reads sources as "words </s>" and puts <s> first: BERT's "[CLS] words [SEP]"
    tokens = sample_batch(dictionary, torch.Generator().manual_seed(4), lengths=(9, 9))[:, 1:]
    ids, table = bert_ids(dictionary, torch.cat([torch.full((2, 1), dictionary.bos()), tokens], dim=1))
    with torch.no_grad():
        expected = reference(input_ids=ids, output_hidden_states=True)
        encoder_out = palm.encoder(tokens, src_lengths=torch.full((2,), tokens.size(1)))
        states = encoder_out["encoder_out"][0].transpose(0, 1)
        mlm = palm.mlm_head(states)
    torch.testing.assert_close(states, expected.hidden_states[-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(mlm, expected.logits[..., table], atol=1e-5, rtol=0)
    assert all(m.eps == 1e-12 for m in palm.modules() if isinstance(m, torch.nn.LayerNorm))
    # the option is adopted from the converted file when the command line does not set it
    args = argparse.Namespace(roberta_path=str(out / "model.pt"), layer_norm_eps=1e-5)
    checkpoint_paths.check(args, ["--roberta-path", str(out / "model.pt")])
    assert args.layer_norm_eps == 1e-12


def test_head_only_control_trains_the_mlm_head_and_nothing_else(converted):
    _, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    dictionary.add_symbol("<mask>")
    model = unilm2_model(state, dictionary, train_only_lm_head=True)
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {"lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
                       "lm_head.layer_norm.bias", "lm_head.bias"}
    logits, _ = model(sample_batch(dictionary, torch.Generator().manual_seed(3)))
    logits.logsumexp(-1).sum().backward()
    assert model.stack.embeddings.tokens.weight.grad is None and model.lm_head.dense.weight.grad is not None


def test_a_unilm2_checkpoint_under_a_task_without_pseudo_masks_says_so(converted):
    """The reverse: a checkpoint trained with <pseudo> has one row more than a dictionary without it; the message
    names the task's option, not the data's dictionary."""
    from palm_plugin.modules.dictionary_check import DictionaryMismatchError

    _, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    dictionary.add_symbol("<mask>")
    pseudo = Dictionary.load(str(out / "dict.txt"))
    pseudo.add_symbol("<mask>")
    pseudo.add_symbol(PSEUDO_SYMBOL)
    trained = unilm2_model(state, pseudo, relative_position_buckets=32).state_dict()
    with pytest.raises(DictionaryMismatchError, match=r"one more than .* add --pseudo-masks to fine-tune or decode"):
        unilm2_model({**state, "model": trained}, dictionary, relative_position_buckets=32)


def test_palm_from_a_unilm2_checkpoint_is_refused_naming_the_checkpoints_it_starts_from(converted, tmp_path):
    """PALM's encoder has no relative position bias: a UniLMv2 checkpoint (here the converted BERT fine-tuned under
    --arch unilm2_*, which adds the bias table) is refused with the kinds of checkpoint --roberta-path takes."""
    _, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    dictionary.add_symbol("<mask>")
    path = tmp_path / "unilm2.pt"
    torch.save({**state, "model": unilm2_model(state, dictionary, relative_position_buckets=32).state_dict()}, path)
    with pytest.raises(ValueError) as refused:
        build_palm(dictionary, roberta_path=str(path), layer_norm_eps=1e-12, encoder_layers=2, encoder_embed_dim=64,
                   encoder_ffn_embed_dim=256, encoder_attention_heads=4, encoder_max_positions=64)
    assert str(refused.value) == (f"{path}: a UniLMv2 checkpoint (relative position bias): PALM's encoder has none; "
                                  "start PALM from a BERT, UniLM v1 or MiniLM checkpoint")


def test_palm_from_a_conversion_that_recorded_no_epsilon_takes_berts(converted, tmp_path):
    """A converted checkpoint whose configuration names no LayerNorm epsilon (written before palm-convert recorded
    it) is a BERT, whose epsilon is 1e-12 (transformers.BertConfig's default): PALM with that epsilon starts from it,
    and PALM with fairseq's 1e-5 is told which one to pass."""
    _, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    cfg = OmegaConf.to_container(OmegaConf.create(state["cfg"]))
    del cfg["model"]["layer_norm_eps"]
    older = tmp_path / "model.pt"
    torch.save({**state, "cfg": cfg}, older)
    sizes = dict(encoder_layers=2, encoder_embed_dim=64, encoder_ffn_embed_dim=256, encoder_attention_heads=4,
                 encoder_max_positions=64)
    assert transformers.BertConfig().layer_norm_eps == 1e-12
    palm = build_palm(dictionary, roberta_path=str(older), layer_norm_eps=1e-12, **sizes)
    weight = state["model"]["encoder.stack.embeddings.layer_norm.weight"]  # the random BERT's, not LayerNorm's ones
    assert not torch.equal(weight, torch.ones_like(weight))
    torch.testing.assert_close(palm.encoder.layernorm_embedding.weight, weight, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"epsilon is 1e-12, this model's 1e-05: pass --layer-norm-eps 1e-12$"):
        build_palm(dictionary, roberta_path=str(older), **sizes)


@pytest.mark.parametrize("task_cfg, token_type", [({"source_segment": 1, "target_segment": 0}, 1),
                                                  ({"_name": "masked_lm"}, 0)],
                         ids=["source-segment-1", "no-source-segment"])
def test_palm_from_a_converted_bert_reads_the_source_segment_its_checkpoint_names(converted, tmp_path, task_cfg,
                                                                                  token_type):
    """PALM's encoder folds the source segment the checkpoint's task configuration names into its positions: with
    segment 1 it computes what BERT computes with token type 1 everywhere; a configuration that names none (a task
    without the option) is BERT's sentence A, token type 0."""
    reference, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    cfg = OmegaConf.to_container(OmegaConf.create(state["cfg"]))
    cfg["task"] = task_cfg
    path = tmp_path / "model.pt"
    torch.save({**state, "cfg": cfg}, path)
    sizes = dict(encoder_layers=2, encoder_embed_dim=64, encoder_ffn_embed_dim=256, encoder_attention_heads=4,
                 encoder_max_positions=64)
    palm = build_palm(dictionary, roberta_path=str(path), layer_norm_eps=1e-12, **sizes).eval()
    tokens = sample_batch(dictionary, torch.Generator().manual_seed(6), lengths=(9, 9))[:, 1:]
    ids, _ = bert_ids(dictionary, torch.cat([torch.full((2, 1), dictionary.bos()), tokens], dim=1))
    with torch.no_grad():
        expected = {t: reference(input_ids=ids, token_type_ids=torch.full_like(ids, t),
                                 output_hidden_states=True).hidden_states[-1] for t in (0, 1)}
        encoder_out = palm.encoder(tokens, src_lengths=torch.full((2,), tokens.size(1)))
        states = encoder_out["encoder_out"][0].transpose(0, 1)
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)  # the two token types give different states
    torch.testing.assert_close(states, expected[token_type], atol=1e-5, rtol=0)


def test_palm_takes_the_layer_norm_epsilon_its_converted_checkpoint_records(converted, tmp_path):
    """A converted checkpoint whose configuration records another LayerNorm epsilon (1e-5, as a BERT-family model
    trained with it): PALM with that epsilon starts from it, PALM with BERT's 1e-12 is told to pass 1e-05, and the
    option is adopted from the file when the command line does not set it."""
    _, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    cfg = OmegaConf.to_container(OmegaConf.create(state["cfg"]))
    cfg["model"]["layer_norm_eps"] = 1e-5
    path = tmp_path / "model.pt"
    torch.save({**state, "cfg": cfg}, path)
    sizes = dict(encoder_layers=2, encoder_embed_dim=64, encoder_ffn_embed_dim=256, encoder_attention_heads=4,
                 encoder_max_positions=64)
    palm = build_palm(dictionary, roberta_path=str(path), layer_norm_eps=1e-5, **sizes)
    assert {m.eps for m in palm.encoder.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-5}
    weight = state["model"]["encoder.stack.embeddings.layer_norm.weight"]
    torch.testing.assert_close(palm.encoder.layernorm_embedding.weight, weight, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"epsilon is 1e-05, this model's 1e-12: pass --layer-norm-eps 1e-05$"):
        build_palm(dictionary, roberta_path=str(path), layer_norm_eps=1e-12, **sizes)
    args = argparse.Namespace(roberta_path=str(path), layer_norm_eps=1e-12)
    checkpoint_paths.check(args, ["--roberta-path", str(path)])
    assert args.layer_norm_eps == 1e-5


def test_palm_from_a_converted_bert_with_a_nested_layer_parameter_names_it(converted, tmp_path):
    """A converted checkpoint whose layers hold a module PALM's layers lack, nested a level deeper than theirs (an
    adapter's ``layers.1.adapter.down.weight``): refused, naming that parameter under PALM's name."""
    _, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    path = tmp_path / "model.pt"
    torch.save({**state, "model": {**state["model"], "encoder.stack.layers.1.adapter.down.weight": torch.zeros(8, 64)}},
               path)
    with pytest.raises(ValueError, match=r"Missing: \[\]; unexpected: \['encoder\.layers\.1\.adapter\.down\.weight'\]; "
                                         r"shapes: \[\]$"):
        build_palm(dictionary, roberta_path=str(path), layer_norm_eps=1e-12, encoder_layers=2, encoder_embed_dim=64,
                   encoder_ffn_embed_dim=256, encoder_attention_heads=4, encoder_max_positions=64)


def test_palm_from_a_checkpoint_without_a_roberta_encoder_says_what_roberta_path_takes(tmp_path):
    """A fairseq checkpoint (a 'model' entry) holding no RoBERTa encoder: the message names the file, the parameter
    it looked for and what --roberta-path takes."""
    path = tmp_path / "other.pt"
    torch.save({"model": {"decoder.embed_tokens.weight": torch.zeros(3, 4)}, "cfg": {}}, path)
    with pytest.raises(ValueError) as error:
        build_palm(roberta_path=str(path), encoder_max_positions=64)
    assert str(error.value) == (
        f"{path}: no RoBERTa encoder in this checkpoint (expected 'encoder.sentence_encoder.embed_tokens.weight'); "
        "--roberta-path takes a checkpoint of fairseq's masked_lm task / roberta architecture, or the model.pt of "
        "palm-convert bert")


def test_palm_from_a_bert_with_fewer_positions_than_its_hidden_size_equals_bert(converted, tmp_path):
    """A BERT whose position table has fewer rows (48) than its hidden size (64): here the converted BERT cut to its
    first 48 positions, which computes what BERT computes on shorter sentences. PALM's position table takes its rows
    after fairseq's padding rows."""
    reference, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    positions = "encoder.stack.embeddings.positions.weight"
    assert state["model"][positions].shape == (64, 64)
    path = tmp_path / "model.pt"
    torch.save({**state, "model": {**state["model"], positions: state["model"][positions][:48].clone()}}, path)
    palm = build_palm(dictionary, roberta_path=str(path), layer_norm_eps=1e-12, encoder_layers=2, encoder_embed_dim=64,
                      encoder_ffn_embed_dim=256, encoder_attention_heads=4, encoder_max_positions=48).eval()
    offset = palm.encoder.embed_positions.padding_idx + 1
    assert palm.encoder.embed_positions.weight.shape == (48 + offset, 64)
    tokens = sample_batch(dictionary, torch.Generator().manual_seed(4), lengths=(9, 9))[:, 1:]
    ids, _ = bert_ids(dictionary, torch.cat([torch.full((2, 1), dictionary.bos()), tokens], dim=1))
    with torch.no_grad():
        expected = reference(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        states = palm.encoder(tokens, src_lengths=torch.full((2,), tokens.size(1)))["encoder_out"][0].transpose(0, 1)
    torch.testing.assert_close(states, expected, atol=1e-5, rtol=0)


def test_palm_from_a_bert_without_its_lm_head_warns_that_the_mlm_head_starts_from_random_weights(converted, tmp_path,
                                                                                                  caplog):
    _, out, state = converted
    dictionary = Dictionary.load(str(out / "dict.txt"))
    path = tmp_path / "model.pt"
    torch.save({**state, "model": {k: v for k, v in state["model"].items() if not k.startswith("lm_head.")}}, path)
    with caplog.at_level(logging.WARNING, logger="palm_plugin.models.palm_roberta_init"):
        palm = build_palm(dictionary, roberta_path=str(path), layer_norm_eps=1e-12, encoder_layers=2,
                          encoder_embed_dim=64, encoder_ffn_embed_dim=256, encoder_attention_heads=4,
                          encoder_max_positions=64)
    assert palm.mlm_head is not None
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{path}: no LM head in this checkpoint; PALM's MLM head starts from random weights"]
