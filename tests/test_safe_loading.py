"""Checkpoints load through torch's weights-only unpickler once the plugin is imported; code payloads are refused."""
import argparse
import os
import pickle
import random
import re

import pytest
import torch

import palm_plugin  # noqa: F401  (installs the allow-list)
from palm_plugin.fixes.safe_loading import CorruptCheckpointError, UnsafeCheckpointError, load_state
from tests.conftest import USER_DIR, binarize_pairs


class CodePayload:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def write_pairs(directory, n_train=120, n_valid=12, seed=0):
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]
    for split, n in (("train", n_train), ("valid", n_valid)):
        with open(directory / f"{split}.src", "w") as src, open(directory / f"{split}.tgt", "w") as tgt:
            for _ in range(n):
                sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 8)))
                src.write(sentence + "\n")
                tgt.write(sentence + "\n")


TINY_TRANSFORMER = [
    "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "1e-3",
    "--max-tokens", "400", "--criterion", "cross_entropy", "--cpu", "--no-progress-bar", "--seed", "1",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Binarized pairs and a checkpoint written by a real fairseq-train run with the plugin loaded."""
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("safe_loading")
    write_pairs(root)
    binarize_pairs(root / "bin", root / "train", root / "valid")
    run_cli("fairseq-train", root / "bin", "--user-dir", USER_DIR, "--save-dir", root / "ck", "--max-update", "4",
            *TINY_TRANSFORMER)
    return root


@pytest.mark.slow
def test_checkpoint_loads_weights_only(trained):
    from fairseq import checkpoint_utils

    path = trained / "ck" / "checkpoint_last.pt"
    state = torch.load(path, weights_only=True)  # would raise without the allow-list (argparse.Namespace inside)
    assert isinstance(state["cfg"]["model"], argparse.Namespace) and state["cfg"]["model"].arch == "transformer"
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    for name, tensor in models[0].state_dict().items():
        assert torch.equal(tensor, state["model"][name]), name


@pytest.mark.slow
def test_generate_restore_and_finetune_load_our_checkpoint(trained, cli):
    checkpoint = trained / "ck" / "checkpoint_last.pt"
    env_without_override = {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": ""}
    generated = cli("fairseq-generate", trained / "bin", "--user-dir", USER_DIR, "--gen-subset", "valid",
                    "--path", checkpoint, "--beam", "2", "--cpu", env_extra=env_without_override)
    translated = re.search(r"Translated (\d+) sentences", generated.stderr + generated.stdout)
    assert translated and int(translated.group(1)) > 0
    assert len(re.findall(r"^H-\d+\t", generated.stdout, flags=re.M)) == int(translated.group(1))

    restored = cli("fairseq-train", trained / "bin", "--user-dir", USER_DIR, "--save-dir", trained / "ck",
                   "--max-update", "6", *TINY_TRANSFORMER, env_extra=env_without_override)
    assert f"Loaded checkpoint {trained / 'ck' / 'checkpoint_last.pt'} (epoch" in restored.stderr + restored.stdout
    assert torch.load(trained / "ck" / "checkpoint_last.pt", weights_only=True)["optimizer_history"][-1][
        "num_updates"] == 6

    finetuned = cli("fairseq-train", trained / "bin", "--user-dir", USER_DIR, "--save-dir", trained / "ft",
                    "--max-update", "2", "--finetune-from-model", checkpoint, *TINY_TRANSFORMER,
                    env_extra=env_without_override)
    assert re.search(r"Loaded checkpoint \S+ \(epoch \d+ @ 0 updates\)", finetuned.stderr + finetuned.stdout)


def test_code_payload_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "payload_ran"
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "args": CodePayload(marker)}, evil)
    from fairseq import checkpoint_utils

    with pytest.raises(UnsafeCheckpointError) as raised:
        checkpoint_utils.load_checkpoint_to_cpu(str(evil))
    assert str(evil) in str(raised.value)
    with pytest.raises(UnsafeCheckpointError, match="evil.pt"):
        load_state(evil)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):  # the wrapper keeps the exception type callers may catch
        checkpoint_utils.load_checkpoint_to_cpu(str(evil))


def test_code_payload_is_refused_even_where_the_environment_turns_off_weights_only_loading(monkeypatch, tmp_path):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 makes torch.load unpickle anything where the caller leaves weights_only
    unset; the plugin's readers ask for weights-only loading explicitly, which the variable does not override."""
    marker = tmp_path / "payload_ran"
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "args": CodePayload(marker)}, evil)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeCheckpointError, match="evil.pt: refused to load"):
        load_state(evil)
    assert not marker.exists()


@pytest.mark.slow
def test_generate_refuses_code_payload(trained, tmp_path, cli):
    marker = tmp_path / "payload_ran"
    state = torch.load(trained / "ck" / "checkpoint_last.pt", weights_only=True)
    state["extra_state"]["payload"] = CodePayload(marker)
    evil = tmp_path / "checkpoint_evil.pt"
    torch.save(state, evil)
    result = cli("fairseq-generate", trained / "bin", "--user-dir", USER_DIR, "--gen-subset", "valid",
                 "--path", evil, "--cpu", check=False)
    assert result.returncode != 0
    assert "refused to load" in result.stderr and str(evil) in result.stderr
    assert not marker.exists()


def test_truncated_file_names_the_file(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(100)}, path)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(RuntimeError, match="model.pt: cannot read this file") as raised:
        load_state(path)
    # the message quotes torch's own diagnosis of the file
    assert "(torch: RuntimeError: PytorchStreamReader failed reading zip archive" in str(raised.value)


def test_a_file_cut_in_its_first_64_kb_is_named_as_truncated(tmp_path):
    """torch's zip reader raises OSError "[Errno 22] Invalid argument", with no filename, for such a file; it is a
    truncated checkpoint like any other, while an OSError naming a file (a missing one) stays itself."""
    from fairseq import checkpoint_utils

    from palm_plugin.fixes.checkpoint_paths import CheckpointPathError, read_checkpoint

    path = tmp_path / "checkpoint_cut.pt"
    torch.save({"model": {"w": torch.zeros(100_000)}, "args": None}, path)
    path.write_bytes(path.read_bytes()[:20_000])
    message = f"{path}: cannot read this file as a torch checkpoint: it is truncated or corrupt"
    with pytest.raises(CorruptCheckpointError, match="Copy it again") as raised:
        load_state(path)
    assert str(raised.value).startswith(message)
    with pytest.raises(CorruptCheckpointError, match=re.escape(message)):  # the API's from_pretrained
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    with pytest.raises(CheckpointPathError, match=re.escape(message)):  # --path, --restore-file, ...
        read_checkpoint(str(path), "--path")
    with pytest.raises(FileNotFoundError, match="nosuch.pt"):
        load_state(tmp_path / "nosuch.pt")


@pytest.mark.slow
def test_generate_names_a_truncated_checkpoint(trained, tmp_path, cli):
    data = (trained / "ck" / "checkpoint_last.pt").read_bytes()
    truncated = tmp_path / "checkpoint_truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    result = cli("fairseq-generate", trained / "bin", "--user-dir", USER_DIR, "--gen-subset", "valid",
                 "--path", truncated, "--cpu", check=False)
    assert result.returncode != 0
    assert f"{truncated}: cannot read this file as a torch checkpoint: it is truncated or corrupt" in result.stderr


def test_garbage_file_names_the_file(tmp_path):
    from fairseq import checkpoint_utils

    path = tmp_path / "notes.pt"
    path.write_text("these are notes, not a checkpoint")
    with pytest.raises(CorruptCheckpointError, match="notes.pt: cannot read this file as a torch checkpoint"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))


def test_a_dictionary_mismatch_names_the_dictionaries_of_the_languages_given(monkeypatch, tmp_path):
    """-s/-t given (in the checkpoint's configuration and the data's): their dict.LANG.txt, not ones inferred from
    the files in DATA, where the training data (from another machine) is not even there."""
    from fairseq import checkpoint_utils

    from palm_plugin.fixes.safe_loading import _name_dictionary_mismatch
    from palm_plugin.modules.dictionary_check import DictionaryMismatchError

    data, gone = tmp_path / "data", tmp_path / "gone"
    data.mkdir()
    trained = argparse.Namespace(data=str(gone), source_lang="en", target_lang="de")
    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu",
                        lambda path, *rest: {"cfg": argparse.Namespace(task=trained)})

    def load(filenames, arg_overrides=None, task=None):
        raise DictionaryMismatchError("another dictionary")

    task = argparse.Namespace(cfg=argparse.Namespace(data=str(data), source_lang="en", target_lang="de"))
    with pytest.raises(DictionaryMismatchError) as mismatch:
        _name_dictionary_mismatch(load)(["model.pt"], None, task)
    assert str(mismatch.value) == (f"model.pt: does not fit the dictionary {data}/dict.en.txt and {data}/dict.de.txt: "
                                   f"another dictionary. This checkpoint was trained with {gone}/dict.en.txt and "
                                   f"{gone}/dict.de.txt")
