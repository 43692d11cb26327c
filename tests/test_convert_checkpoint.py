"""palm-convert (palm_tools/convert/): BERT / UniLM v1 / UniLMv2 / RoBERTa checkpoints -> unilm, checked numerically
against the reference implementations (transformers' BERT, fairseq's RoBERTa, an independent UniLMv2 forward)."""
import argparse
import json
import math
import re

import pytest
import torch
import transformers
from fairseq.data import Dictionary
from transformers.models.t5.modeling_t5 import T5Attention

from palm_plugin.fixes import safe_loading
from palm_plugin.models.unilm import UniLMModel
from tests.conftest import REPO

VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(30)] + ["##s", "the"]
from palm_tools.convert import cli as convert


def tiny_bert_config(**overrides):
    values = dict(
        vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
        max_position_embeddings=64, type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    values.update(overrides)
    return transformers.BertConfig(**values)


def randomize(model, seed=0):
    """Non-trivial values everywhere (LayerNorm and biases too), so that a swapped parameter shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1 + (parameter.dim() == 1) * 0.0)
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.add_(1.0)
    return model


def write_bert_dir(directory, model, config, state=None):
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict() if state is None else state, directory / "pytorch_model.bin")
    (directory / "config.json").write_text(config.to_json_string())
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return directory


def load_converted(output):
    """The converted checkpoint as a UniLMModel (eval mode) and its dictionary, as the tasks build them."""
    state = safe_loading.load_state(str(output / "model.pt"))
    dictionary = Dictionary.load(str(output / "dict.txt"))
    dictionary.add_symbol("<mask>")
    from omegaconf import OmegaConf

    model = UniLMModel.build_model(OmegaConf.create(state["cfg"]["model"]), argparse.Namespace(source_dictionary=dictionary))
    model.load_state_dict(state["model"], strict=True)
    return model.eval(), dictionary


def bert_ids(dictionary, ours):
    """BERT vocabulary ids of our token ids (the converter's row mapping, recomputed from the two vocabularies)."""
    names = {"<s>": "[CLS]", "<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]", "<mask>": "[MASK]", "<pseudo>": "[MASK]"}
    table = torch.tensor([VOCAB.index(names.get(symbol, symbol)) for symbol in dictionary.symbols])
    return table[ours], table


def sample_batch(dictionary, generator, lengths=(9, 6)):
    """Right-padded ``[SOS] words [EOS]`` rows of our ids."""
    width = max(lengths)
    tokens = torch.full((len(lengths), width), dictionary.pad())
    for row, length in enumerate(lengths):
        body = torch.randint(dictionary.nspecial, len(dictionary), (length - 2,), generator=generator)
        tokens[row, :length] = torch.cat([torch.tensor([dictionary.bos()]), body, torch.tensor([dictionary.eos()])])
    return tokens


def check_masked_lm(reference, output):
    """The converted model's hidden states and logits against the transformers model's, to 1e-5."""
    model, dictionary = load_converted(output)
    tokens = sample_batch(dictionary, torch.Generator().manual_seed(1))
    ids, table = bert_ids(dictionary, tokens)
    real = tokens.ne(dictionary.pad())
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=real.long(), output_hidden_states=True)
        features, _ = model(tokens, features_only=True)
        logits, _ = model(tokens)
    torch.testing.assert_close(features[real], expected.hidden_states[-1][real], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[real], expected.logits[..., table][real], atol=1e-5, rtol=0)
    return model, dictionary


def test_bert_for_masked_lm_gives_the_same_hidden_states_and_logits(tmp_path):
    config = tiny_bert_config()
    reference = randomize(transformers.BertForMaskedLM(config)).eval()
    reference.tie_weights()
    source = write_bert_dir(tmp_path / "bert", reference, config)
    # no newline after the last token (a vocab.txt saved by hand): the last token is still a token, its row kept
    (source / "vocab.txt").write_text("\n".join(VOCAB))
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    check_masked_lm(reference, tmp_path / "out")
    assert (tmp_path / "out" / "vocab.txt").read_text() == "".join(token + "\n" for token in VOCAB)


@pytest.mark.parametrize("old_layer_norm_names", [False, True])
def test_bert_model_hidden_states_pooler_and_segments(tmp_path, old_layer_norm_names):
    config = tiny_bert_config()
    reference = randomize(transformers.BertModel(config), seed=2).eval()
    state = reference.state_dict()
    if old_layer_norm_names:  # the pre-2019 file format: LayerNorm.gamma / LayerNorm.beta
        state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                 for k, v in state.items()}
    source = write_bert_dir(tmp_path / "bert", reference, config, state)
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out"), "--num-segments", "6"])
    model, dictionary = load_converted(tmp_path / "out")
    assert model.cfg.num_segments == 6
    segments_table = model.stack.embeddings.segments.weight
    # Rows added for UniLM's objective segments start as copies of type 0.
    for row in range(2, 6):
        torch.testing.assert_close(segments_table[row], segments_table[0])
    tokens = sample_batch(dictionary, torch.Generator().manual_seed(3))
    ids, _ = bert_ids(dictionary, tokens)
    real = tokens.ne(dictionary.pad())
    token_types = (torch.arange(tokens.size(1)) >= 4).long().expand_as(tokens)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=real.long(), token_type_ids=token_types)
        features, _ = model(tokens, segment_ids=token_types, features_only=True)
    torch.testing.assert_close(features[real], expected.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tanh(model.pooler(features[:, 0])), expected.pooler_output, atol=1e-5, rtol=0)


def fuse_unilm2_state(bert_state, layers, heads, buckets, generator):
    """A UniLMv2 "fast qkv" state dict from a BERT one: fused [3H, H] projection, q_bias / v_bias, no key bias,
    plus a random relative position table ``bert.rel_pos_bias.weight`` [heads, buckets]."""
    state = {"bert." + k: v for k, v in bert_state.items()}
    for layer in range(layers):
        prefix = f"bert.encoder.layer.{layer}.attention.self."
        state[prefix + "qkv_linear.weight"] = torch.cat(
            [state.pop(prefix + f"{p}.weight") for p in ("query", "key", "value")]
        )
        state[prefix + "q_bias"] = state.pop(prefix + "query.bias")
        state[prefix + "v_bias"] = state.pop(prefix + "value.bias")
        del state[prefix + "key.bias"]
    state["bert.rel_pos_bias.weight"] = torch.randn(heads, buckets, generator=generator) * 0.5
    return state


def unilm2_reference_forward(state, ids, padding, heads, buckets, max_distance, eps=1e-12):
    """UniLMv2's encoder written out from the paper and the released model's description, independently of the
    plugin: BERT with a fused qkv projection (no key bias) and T5's bidirectional relative position buckets."""
    def linear(x, name):
        return x @ state[name + ".weight"].t() + state[name + ".bias"]

    def layer_norm(x, name):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], state[name + ".weight"], state[name + ".bias"], eps)

    batch, length = ids.shape
    positions = torch.arange(length)
    x = (state["bert.embeddings.word_embeddings.weight"][ids] + state["bert.embeddings.position_embeddings.weight"][positions]
         + state["bert.embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(x, "bert.embeddings.LayerNorm")
    relative = positions.view(1, -1) - positions.view(-1, 1)  # key - query
    bucket = T5Attention._relative_position_bucket(relative, bidirectional=True, num_buckets=buckets, max_distance=max_distance)
    bias = state["bert.rel_pos_bias.weight"][:, bucket]  # (heads, T, T)
    hidden = x.size(-1)
    head_dim = hidden // heads
    layer = 0
    while f"bert.encoder.layer.{layer}.attention.self.qkv_linear.weight" in state:
        prefix = f"bert.encoder.layer.{layer}."
        qkv = x @ state[prefix + "attention.self.qkv_linear.weight"].t()
        q, k, v = qkv.split(hidden, dim=-1)
        q = q + state[prefix + "attention.self.q_bias"]
        v = v + state[prefix + "attention.self.v_bias"]
        q, k, v = (t.view(batch, length, heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim) + bias
        scores = scores.masked_fill(padding.view(batch, 1, 1, length), float("-inf"))
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, hidden)
        x = layer_norm(x + linear(context, prefix + "attention.output.dense"), prefix + "attention.output.LayerNorm")
        inner = torch.nn.functional.gelu(linear(x, prefix + "intermediate.dense"))
        x = layer_norm(x + linear(inner, prefix + "output.dense"), prefix + "output.LayerNorm")
        layer += 1
    return x


@pytest.mark.parametrize("table_name", ["bert.rel_pos_bias.weight", "bert.encoder.rel_pos_bias.weight"])
def test_unilm2_fused_qkv_checkpoint_matches_an_independent_forward(tmp_path, table_name):
    config = tiny_bert_config(max_position_embeddings=200)
    generator = torch.Generator().manual_seed(4)
    bert = randomize(transformers.BertModel(config, add_pooling_layer=False), seed=4)
    state = fuse_unilm2_state(bert.state_dict(), layers=2, heads=4, buckets=32, generator=generator)
    state[table_name] = state.pop("bert.rel_pos_bias.weight")
    convert.main(["bert", "--input", str(write_bert_dir(tmp_path / "v2", bert, config, state)), "--output", str(tmp_path / "out")])
    model, dictionary = load_converted(tmp_path / "out")
    assert model.cfg.relative_position_buckets == 32 and "<pseudo>" in dictionary.indices
    # A long row, so that distances beyond the exact buckets (and beyond max_distance) are exercised.
    tokens = sample_batch(dictionary, generator, lengths=(150, 40))
    ids, _ = bert_ids(dictionary, tokens)
    padding = tokens.eq(dictionary.pad())
    reference_state = dict(state)
    reference_state["bert.rel_pos_bias.weight"] = state[table_name]
    with torch.no_grad():
        expected = unilm2_reference_forward(reference_state, ids, padding, heads=4, buckets=32, max_distance=128)
        features, _ = model(tokens, segment_ids=torch.zeros_like(tokens), features_only=True)
    torch.testing.assert_close(features[~padding], expected[~padding], atol=1e-5, rtol=0)
    # <pseudo> starts as [MASK].
    embeddings = model.stack.embeddings.tokens.weight
    torch.testing.assert_close(embeddings[dictionary.index("<pseudo>")], embeddings[dictionary.index("<mask>")])


def tiny_roberta(dictionary):
    from fairseq.models.roberta import RobertaModel
    from fairseq.models.roberta.model import base_architecture

    args = argparse.Namespace(
        encoder_layers=2, encoder_embed_dim=64, encoder_ffn_embed_dim=256, encoder_attention_heads=4,
        max_positions=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pooler_dropout=0.0,
    )
    base_architecture(args)
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return RobertaModel.build_model(args, task), args


def randomized_tiny_roberta(directory, seed):
    """fairseq's RoBERTa over 40 words, random weights; its dict.txt (without <mask>, as released) in ``directory``."""
    dictionary = Dictionary()
    for index in range(40):
        dictionary.add_symbol(f"w{index}")
    dictionary.save(str(directory / "dict.txt"))
    dictionary.add_symbol("<mask>")  # what fairseq's masked_lm task does
    roberta, args = tiny_roberta(dictionary)
    return randomize(roberta, seed=seed).eval(), args, dictionary


def test_roberta_checkpoint_gives_the_same_features_and_logits(tmp_path):
    roberta, args, dictionary = randomized_tiny_roberta(tmp_path, seed=5)
    torch.save({"model": roberta.state_dict(), "cfg": {"model": vars(args)}}, tmp_path / "roberta.pt")
    # fairseq before 0.10 kept the options as an argparse Namespace under "args", without "cfg"
    torch.save({"model": roberta.state_dict(), "args": args}, tmp_path / "roberta_args.pt")
    # fairseq-train itself saves the options as an OmegaConf DictConfig
    from omegaconf import OmegaConf

    torch.save({"model": roberta.state_dict(), "cfg": OmegaConf.create({"model": vars(args)})}, tmp_path / "roberta_omegaconf.pt")
    for name, output in (("roberta.pt", "out"), ("roberta_args.pt", "out_args"), ("roberta_omegaconf.pt", "out_omegaconf")):
        convert.main(["roberta", "--input", str(tmp_path / name), "--dict", str(tmp_path / "dict.txt"),
                      "--output", str(tmp_path / output)])
    model, ours = load_converted(tmp_path / "out")
    assert model.cfg.max_positions == args.max_positions  # fairseq's table holds pad + 1 rows more
    # RoBERTa has no segments: the converted model's 6 start at zero, the seq2seq ids UniLM v1's (source 4, target 5)
    task = safe_loading.load_state(str(tmp_path / "out" / "model.pt"))["cfg"]["task"]
    assert (model.cfg.num_segments, task["source_segment"], task["target_segment"]) == (6, 4, 5)
    for other in ("out_args", "out_omegaconf"):
        converted = safe_loading.load_state(str(tmp_path / other / "model.pt"))["model"]
        assert all(torch.equal(value, converted[name]) for name, value in model.state_dict().items()), other
    assert ours.symbols == dictionary.symbols
    tokens = sample_batch(ours, torch.Generator().manual_seed(6))
    real = tokens.ne(ours.pad())
    with torch.no_grad():
        expected_features, _ = roberta.encoder.extract_features(tokens)
        expected_logits, _ = roberta(tokens)
        features, _ = model(tokens, features_only=True)
        logits, _ = model(tokens)
    torch.testing.assert_close(features[real], expected_features[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits[real], expected_logits[real], atol=1e-5, rtol=0)


def test_bad_inputs_give_errors_that_name_the_file(tmp_path, capsys):
    config = tiny_bert_config()
    bert = transformers.BertModel(config)
    source = write_bert_dir(tmp_path / "bert", bert, config)

    (source / "pytorch_model.bin").rename(tmp_path / "weights.bak")
    with pytest.raises(SystemExit, match=r"bert: no weights: an HF directory holds one of model\.safetensors, "
                                         r"model\.safetensors\.index\.json, pytorch_model\.bin, "
                                         r"pytorch_model\.bin\.index\.json$"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    (tmp_path / "weights.bak").rename(source / "pytorch_model.bin")

    with pytest.raises(SystemExit) as exit_status:  # argparse's usage error, before any file is read
        convert.main(["bert", "--input", str(tmp_path / "absent"), "--output", str(tmp_path / "out"),
                      "--layer-norm-eps", "tiny"])
    assert exit_status.value.code == 2
    assert "argument --layer-norm-eps: invalid float value: 'tiny'" in capsys.readouterr().err
    for epsilon in ("0", "1", "1.5"):  # an epsilon is a small positive number: the open interval (0, 1)
        with pytest.raises(SystemExit) as exit_status:
            convert.main(["bert", "--input", str(tmp_path / "absent"), "--output", str(tmp_path / "out"),
                          "--layer-norm-eps", epsilon])
        assert exit_status.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f" bert: error: argument --layer-norm-eps: {epsilon} is outside (0, 1): a LayerNorm epsilon (BERT: 1e-12)")

    fused = fuse_unilm2_state(bert.state_dict(), layers=2, heads=4, buckets=32, generator=torch.Generator())
    fused["bert.encoder.layer.1.attention.self.qkv_linear.weight"] = torch.zeros(2 * 64, 64)
    write_bert_dir(tmp_path / "fused", bert, config, fused)
    with pytest.raises(SystemExit, match=r"encoder\.layer\.1\.attention\.self\.qkv_linear\.weight has shape "
                                         r"\(128, 64\), expected \[3H, H\] = \[192, 64\]"):
        convert.main(["bert", "--input", str(tmp_path / "fused"), "--output", str(tmp_path / "out")])

    (source / "vocab.txt").rename(source / "vocab.bak")
    # neither vocabulary file: the message names the one looked for first and says what --input must be
    with pytest.raises(SystemExit) as exit_status:
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    assert str(exit_status.value) == (f"error: {source / 'vocab.txt'}: file not found (nor tokenizer.json): --input "
                                      "must be the model's HF folder, with its vocabulary")
    (source / "vocab.bak").rename(source / "vocab.txt")

    # weights without their config.json (a folder copied in part): the one line says which file is missing
    (source / "config.json").rename(source / "config.bak")
    with pytest.raises(SystemExit) as exit_status:
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    assert str(exit_status.value) == f"error: {source / 'config.json'}: file not found (an HF directory holds config.json)"
    (source / "config.bak").rename(source / "config.json")

    # a pytorch_model.bin that loads but holds no state dict (a list of tensors, a dict of other values)
    for content in ([torch.zeros(2)], {"embeddings.word_embeddings.weight": [0.0, 1.0]}):
        torch.save(content, source / "pytorch_model.bin")
        with pytest.raises(SystemExit) as exit_status:
            convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
        assert str(exit_status.value) == f"error: {source / 'pytorch_model.bin'}: not a state dict of tensors"
    torch.save(bert.state_dict(), source / "pytorch_model.bin")

    # weights of more layers than config.json describes (the config.json of a smaller model of the family): the
    # first parameter without a place is named, with the model it was converted for (unilm; unilm2 for UniLMv2)
    config_text = (source / "config.json").read_text()
    (source / "config.json").write_text(json.dumps(dict(json.loads(config_text), num_hidden_layers=1)))
    with pytest.raises(SystemExit) as exit_status:
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    assert str(exit_status.value) == (f"error: {source / 'pytorch_model.bin'}: parameter for "
                                      "'encoder.stack.layers.1.q_proj.weight' has no place in a unilm model")
    write_bert_dir(tmp_path / "fused_1_layer", bert, tiny_bert_config(num_hidden_layers=1), fuse_unilm2_state(
        bert.state_dict(), layers=2, heads=4, buckets=32, generator=torch.Generator()))
    with pytest.raises(SystemExit, match=r"fused_1_layer/pytorch_model\.bin: parameter for "
                                         r"'encoder\.stack\.layers\.1\.\w+\.weight' has no place in a unilm2 model$"):
        convert.main(["bert", "--input", str(tmp_path / "fused_1_layer"), "--output", str(tmp_path / "out")])
    (source / "config.json").write_text(config_text)

    (source / "vocab.txt").write_text("\n".join(VOCAB[:7] + [VOCAB[3]] + VOCAB[8:]) + "\n")  # line 8 repeats [CLS]
    with pytest.raises(SystemExit, match=r"vocab\.txt: line 8 \('\[CLS\]'\) is empty, has a space, or repeats"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    (source / "vocab.txt").write_text("\n".join(VOCAB[:8] + ["two words"] + VOCAB[9:]) + "\n")  # fairseq splits at it
    with pytest.raises(SystemExit, match=r"vocab\.txt: line 9 \('two words'\) is empty, has a space, or repeats"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    (source / "vocab.txt").write_text("\n".join(VOCAB) + "\n")

    state = dict(bert.state_dict(), **{"encoder.layer.0.attention.self.mystery.weight": torch.zeros(2)})
    config_text = (source / "config.json").read_text()
    (source / "config.json").write_text(json.dumps({k: v for k, v in json.loads(config_text).items()
                                                    if k != "intermediate_size"}))
    with pytest.raises(SystemExit, match=r"config\.json: missing 'intermediate_size', which a BERT-family config\.json "
                                         r"holds: use the model's own config\.json$"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    (source / "config.json").write_text(config_text)

    incomplete = {k: v for k, v in bert.state_dict().items() if k != "encoder.layer.1.output.dense.weight"}
    torch.save(incomplete, source / "pytorch_model.bin")
    with pytest.raises(SystemExit,
                       match=r"pytorch_model\.bin: missing parameters encoder\.stack\.layers\.1\.fc2\.weight; the "
                             r"file holds part of the model, .* convert the model's complete weights$"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    # five missing are all named; more (a whole layer: 16) are the first five and how many more
    feed_forward = ["intermediate.dense.bias", "intermediate.dense.weight", "output.LayerNorm.bias",
                    "output.LayerNorm.weight", "output.dense.bias"]
    five = ", ".join(f"encoder.stack.layers.1.{n}" for n in ("fc1.bias", "fc1.weight", "fc2.bias",
                                                              "final_layer_norm.bias", "final_layer_norm.weight"))
    layer_1 = r"encoder\.stack\.layers\.1\.[\w.]+"
    for dropped, named in ((feed_forward, re.escape(five)), ([""], rf"({layer_1}, ){{4}}{layer_1} and 11 more")):
        torch.save({k: v for k, v in bert.state_dict().items()
                    if not k.startswith(tuple(f"encoder.layer.1.{n}" for n in dropped))}, source / "pytorch_model.bin")
        with pytest.raises(SystemExit) as exit_status:
            convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
        assert re.fullmatch(rf"error: .*pytorch_model\.bin: missing parameters {named}; the file holds part of the "
                            r"model, or another one than config\.json describes: convert the model's complete weights",
                            str(exit_status.value)), str(exit_status.value)

    # no token embedding (checked before any name is mapped): the message names the file and the parameter
    torch.save({k: v for k, v in bert.state_dict().items() if k != "embeddings.word_embeddings.weight"},
               source / "pytorch_model.bin")
    with pytest.raises(SystemExit, match=r"^error: .*pytorch_model\.bin: no embeddings\.word_embeddings\.weight$"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])

    torch.save(state, source / "pytorch_model.bin")
    with pytest.raises(SystemExit, match=r"pytorch_model\.bin: unknown parameter 'encoder\.layer\.0\.attention\.self\.mystery\.weight'"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])

    torch.save({"model": bert.state_dict(), "cfg": {}}, source / "pytorch_model.bin")
    with pytest.raises(SystemExit, match=r"pytorch_model\.bin: this is a fairseq checkpoint, not an HF state dict"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])

    # a shard index that names a weight its shards lack
    (source / "pytorch_model.bin").unlink()
    torch.save(bert.state_dict(), source / "shard-1.bin")
    five = "extra.0, extra.1, extra.2, extra.3, extra.4"
    for absent, named in ((["pooler.extra.weight"], "pooler.extra.weight"), ([f"extra.{i}" for i in range(5)], five),
                          ([f"extra.{i}" for i in range(6)], five + " and 1 more")):
        weight_map = dict.fromkeys([*bert.state_dict(), *absent], "shard-1.bin")
        (source / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        with pytest.raises(SystemExit, match=rf"index\.json: the shards lack {re.escape(named)}; download the shard "
                                             r"files again$"):
            convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    (source / "pytorch_model.bin.index.json").unlink()

    torch.save(bert.state_dict(), source / "pytorch_model.bin")
    (source / "config.json").write_text(json.dumps(dict(json.loads(config.to_json_string()), intermediate_size=128)))
    with pytest.raises(SystemExit, match=r"pytorch_model\.bin: shape mismatch for encoder\.stack\.layers\.0\.fc1\.weight"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "model.pt").exists()

    with pytest.raises(SystemExit, match=r"missing\.pt: file not found"):
        convert.main(["roberta", "--input", str(tmp_path / "missing.pt"), "--dict", str(tmp_path / "d.txt"),
                      "--output", str(tmp_path / "out")])

    for command in (["bert"], ["roberta", "--dict", str(tmp_path / "d.txt")], ["hf-roberta"], ["export"]):
        for given, required in (("--input", "--output"), ("--output", "--input")):
            with pytest.raises(SystemExit) as exit_status:  # argparse's usage error, before anything is read
                convert.main([*command, given, str(source)])
            assert exit_status.value.code == 2
            assert f"the following arguments are required: {required}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_status:  # no command: argparse's usage error, which lists them
        convert.main([])
    assert exit_status.value.code == 2
    usage = capsys.readouterr().err
    assert "{bert,roberta,hf-roberta,export}" in usage and "the following arguments are required: command" in usage

    torch.save({"weights": {}}, tmp_path / "no_model.pt")
    with pytest.raises(SystemExit, match=r"no_model\.pt: not a fairseq checkpoint \(no 'model' entry\); pass the "
                                         r"model\.pt of a fairseq RoBERTa \(an HF RoBERTa folder: palm-convert "
                                         r"hf-roberta\)$"):
        convert.main(["roberta", "--input", str(tmp_path / "no_model.pt"), "--dict", str(tmp_path / "d.txt"),
                      "--output", str(tmp_path / "out")])

    # a checkpoint without its dict.txt (which fairseq keeps beside, not inside, the model): the one line names it
    torch.save({"model": {}, "cfg": {}}, tmp_path / "no_dict.pt")
    with pytest.raises(SystemExit) as exit_status:
        convert.main(["roberta", "--input", str(tmp_path / "no_dict.pt"), "--dict", str(tmp_path / "d.txt"),
                      "--output", str(tmp_path / "out")])
    assert str(exit_status.value) == (f"error: {tmp_path / 'd.txt'}: file not found; pass the dict.txt the RoBERTa "
                                      "model was trained with")


@pytest.mark.slow
def test_converted_bert_fine_tunes_and_decodes_with_fairseq_and_wordpiece(tmp_path, cli):
    """Real processes: convert -> fairseq-preprocess (--srcdict) -> fairseq-train --finetune-from-model ->
    fairseq-generate --bpe bert (WordPiece detokenisation), and fairseq-generate straight from the converted file."""
    config = tiny_bert_config()
    source = write_bert_dir(tmp_path / "bert", randomize(transformers.BertForMaskedLM(config)), config)
    out = tmp_path / "converted"
    cli("palm-convert", "bert", "--input", source, "--output", out, "--num-segments", "6")
    tokenizer = transformers.BertTokenizer(str(out / "vocab.txt"), do_lower_case=True)
    raw = tmp_path / "raw"
    raw.mkdir()
    generator = torch.Generator().manual_seed(7)
    words = [w for w in VOCAB if w.startswith("w")]
    for split, count in (("train", 16), ("valid", 8)):
        for side in ("src", "tgt"):
            lines = []
            for _ in range(count):
                picks = torch.randint(len(words), (5,), generator=generator).tolist()
                lines.append(" ".join(tokenizer.tokenize(" ".join(words[i] + ("s" if i % 3 == 0 else "") for i in picks))))
            (raw / f"{split}.{side}").write_text("\n".join(lines) + "\n")
    data = tmp_path / "bin"
    cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
        "--validpref", raw / "valid", "--destdir", data, "--srcdict", out / "dict.txt", "--tgtdict", out / "dict.txt",
        "--workers", "1")
    common = ["--user-dir", REPO / "palm_plugin", "--task", "unilm_seq2seq", "--cpu", "--max-source-positions", "16",
              "--max-target-positions", "16"]
    cli("fairseq-train", data, *common, "--arch", "unilm_tiny", "--max-positions", "64", "--num-segments", "6",
        "--finetune-from-model", out / "model.pt", "--criterion", "unilm_cloze", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "1e-4", "--batch-size", "8", "--max-update", "2", "--save-dir", tmp_path / "ckpt",
        "--no-epoch-checkpoints", "--required-batch-size-multiple", "1")
    # PALM with the converted encoder (--roberta-path, the checkpoint's sizes), fairseq's translation task
    palm = ["--user-dir", REPO / "palm_plugin", "--task", "translation", "--cpu", "--max-source-positions", "16",
            "--max-target-positions", "16"]
    cli("fairseq-train", data, *palm, "--arch", "palm_tiny", "--roberta-path", out / "model.pt", "--encoder-layers",
        "2", "--decoder-layers", "1", "--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256",
        "--encoder-attention-heads", "4", "--encoder-max-positions", "64", "--criterion",
        "label_smoothed_cross_entropy", "--optimizer", "adam", "--lr", "1e-4", "--batch-size", "8", "--max-update", "2",
        "--save-dir", tmp_path / "palm", "--no-epoch-checkpoints", "--required-batch-size-multiple", "1")
    for checkpoint, task in ((out / "model.pt", common), (tmp_path / "ckpt" / "checkpoint_last.pt", common),
                             (tmp_path / "palm" / "checkpoint_last.pt", palm)):
        result = cli("fairseq-generate", data, *task, "--path", checkpoint, "--gen-subset", "valid", "--beam", "2",
                     "--batch-size", "8", "--max-len-b", "6", "--bpe", "bert", "--bpe-vocab-file", out / "vocab.txt")
        hypotheses = [line for line in result.stdout.splitlines() if line.startswith("D-")]
        assert len(hypotheses) == 8
        # WordPiece pieces were joined back into words (a continuation piece can stay only where a hypothesis starts)
        assert all("##" not in line.split("\t")[-1][1:] for line in hypotheses), hypotheses
