"""A published checkpoint goes in, is fine-tuned without retyping its sizes, and every wrong checkpoint path stops
fairseq with what to do (palm_plugin/fixes/checkpoint_paths.py). Real fairseq-train / fairseq-generate processes."""
import argparse

import pytest
import torch
import transformers
from fairseq.data import Dictionary
from omegaconf import OmegaConf
from safetensors.torch import load_file

from palm_plugin.fixes import safe_loading
from palm_plugin.models.unilm import UniLMModel
from tests.conftest import REPO
from tests.test_convert_checkpoint import VOCAB, bert_ids, randomize, sample_batch

MINILM = dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536)


def save_hf(directory, model_class=transformers.BertModel, **config):
    values = dict(vocab_size=len(VOCAB), max_position_embeddings=64, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, **config)
    model = randomize(model_class(transformers.BertConfig(**values)), seed=11)
    model.save_pretrained(directory)
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return model


@pytest.fixture(scope="module")
def converted_minilm_sizes(tmp_path_factory):
    """A 6-layer 384-dim BERT saved by transformers (safetensors), converted, plus binarized pairs in its dictionary."""
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("journey")
    save_hf(root / "hf", **MINILM)
    run_cli("palm-convert", "bert", "--input", root / "hf", "--output", root / "converted")
    raw = root / "raw"
    raw.mkdir()
    words = [w for w in VOCAB if w.startswith("w")]
    generator = torch.Generator().manual_seed(3)
    for split, count in (("train", 8), ("valid", 4)):
        for side, length in (("src", 8), ("tgt", 4)):
            rows = [" ".join(words[i] for i in torch.randint(len(words), (length,), generator=generator).tolist())
                    for _ in range(count)]
            (raw / f"{split}.{side}").write_text("\n".join(rows) + "\n")
    run_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
            "--validpref", raw / "valid", "--destdir", root / "bin", "--srcdict", root / "converted" / "dict.txt",
            "--tgtdict", root / "converted" / "dict.txt", "--workers", "1")
    return root


def train_args(root, *extra):
    return [root / "bin", "--user-dir", REPO / "palm_plugin", "--task", "unilm_seq2seq", "--arch", "unilm_base",
            "--criterion", "unilm_cloze", "--optimizer", "adam", "--lr", "1e-4", "--batch-size", "4", "--max-update",
            "1", "--cpu", "--save-dir", root / "ckpt", "--no-epoch-checkpoints", "--max-source-positions", "16",
            "--max-target-positions", "8", "--no-save", *extra]


def last_line(result):
    return (result.stderr.strip().splitlines() or [""])[-1]


@pytest.mark.slow
def test_fine_tuning_a_converted_checkpoint_adopts_its_sizes_and_the_result_exports_to_hf(converted_minilm_sizes, cli):
    root = converted_minilm_sizes
    # its own save dir: a checkpoint_last.pt left in the shared one would make the other tests resume from it
    args = [a for a in train_args(root, "--finetune-from-model", root / "converted" / "model.pt") if a != "--no-save"]
    args += ["--save-dir", root / "ckpt_adopted"]
    result = cli("fairseq-train", *args)
    log = result.stdout + result.stderr
    assert "encoder_layers=6" in log and "encoder_embed_dim=384" in log and "max_positions=64" in log, log[-3000:]
    assert "source_segment=0" in log and "target_segment=1" in log  # a BERT checkpoint: sentence A / B
    assert "loading pretrained model from" in log and "done training" in log
    # the fine-tuned checkpoint (trained here) goes back out as an HF BERT directory with the same hidden states
    checkpoint = root / "ckpt_adopted" / "checkpoint_last.pt"
    cli("palm-convert", "export", "--input", checkpoint, "--vocab", root / "converted" / "vocab.txt",
        "--output", root / "exported")
    exported = transformers.BertModel.from_pretrained(root / "exported").eval()
    state = safe_loading.load_state(str(checkpoint))
    dictionary = Dictionary.load(str(root / "bin" / "dict.src.txt"))
    dictionary.add_symbol("<mask>")
    model = UniLMModel.build_model(OmegaConf.create(state["cfg"]["model"]), argparse.Namespace(source_dictionary=dictionary))
    model.load_state_dict(state["model"], strict=True)
    tokens = sample_batch(dictionary, torch.Generator().manual_seed(5))
    ids, _ = bert_ids(dictionary, tokens)
    real = tokens.ne(dictionary.pad())
    with torch.no_grad():
        features, _ = model.eval()(tokens, features_only=True)
        expected = exported(input_ids=ids, attention_mask=real.long()).last_hidden_state
    torch.testing.assert_close(features[real], expected[real], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_larger_max_positions_grows_the_table_and_a_conflicting_size_names_the_flags(converted_minilm_sizes, cli):
    root = converted_minilm_sizes
    model = root / "converted" / "model.pt"
    result = cli("fairseq-train", *train_args(root, "--finetune-from-model", model, "--max-positions", "96"))
    assert "resized the checkpoint's tables to this model's: positions 64 -> 96" in result.stdout + result.stderr
    result = cli("fairseq-train", *train_args(root, "--finetune-from-model", model, "--encoder-layers", "12"), check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert last_line(result).endswith("pass the checkpoint's: --encoder-layers 6"), result.stderr[-2000:]


@pytest.mark.slow
def test_wrong_checkpoint_paths_stop_with_what_to_do(converted_minilm_sizes, cli, tmp_path):
    root = converted_minilm_sizes
    hf = root / "hf"
    bin_dir = tmp_path / "bin_format"
    bin_dir.mkdir()
    # transformers 5 writes safetensors only; its earlier versions' safe_serialization=False wrote this
    torch.save(load_file(hf / "model.safetensors"), bin_dir / "pytorch_model.bin")
    traps = [
        ("--finetune-from-model", root / "converted", "a directory; pass the checkpoint file in it"),
        ("--finetune-from-model", hf, "a Hugging Face model directory, not a fairseq checkpoint; convert it first"),
        ("--finetune-from-model", tmp_path / "missing.pt", f"file not found; {tmp_path} holds no .pt file"),
        ("--finetune-from-model", hf / "model.safetensors", "Hugging Face weights, not a fairseq checkpoint"),
        ("--finetune-from-model", bin_dir / "pytorch_model.bin", "an HF state dict (e.g. pytorch_model.bin)"),
        ("--restore-file", tmp_path / "missing.pt", f"file not found; {tmp_path} holds no .pt file"),
    ]
    for option, path, message in traps:
        result = cli("fairseq-train", *train_args(root, option, path), check=False)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert message in last_line(result) and str(path) in last_line(result), (option, path, result.stderr[-2000:])
        assert "convert it first" not in message or "palm-convert bert" in last_line(result)
    for path, message in ((root / "converted", "a directory"), (bin_dir / "pytorch_model.bin", "an HF state dict")):
        result = cli("fairseq-generate", root / "bin", "--user-dir", REPO / "palm_plugin", "--task", "unilm_seq2seq",
                     "--path", path, "--cpu", "--gen-subset", "valid", check=False)
        assert result.returncode != 0 and message in last_line(result), result.stderr[-2000:]
