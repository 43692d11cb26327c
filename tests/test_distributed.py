"""Two CPU processes under torchrun train exactly like one process with the same global batch.

The invocation is the one README.md documents: ``torchrun --nproc_per_node 2 $(which fairseq-train) --cpu
--distributed-backend gloo --ddp-backend legacy_ddp ...`` (the plugin supplies the world size from torchrun and
fixes fairseq's GPU-only device inference; see palm_plugin/distributed.py). Two ranks with batch B each see the
batches that one process sees with batch B and --update-freq 2, so parameters must agree.
"""
import random

import pytest
import torch

import palm_plugin  # noqa: F401  (weights-only loading of fairseq checkpoints)

from tests.conftest import BIN, USER_DIR

TASKS = {
    "masked_lm": ["--task", "masked_lm", "--arch", "roberta_base", "--encoder-layers", "2", "--encoder-embed-dim",
                  "64", "--encoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--criterion",
                  "masked_lm", "--tokens-per-sample", "64", "--dropout", "0", "--attention-dropout", "0"],
}


@pytest.fixture(scope="module")
def mono_data(tmp_path_factory):
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("mono")
    rng = random.Random(0)
    lines = []
    for _ in range(30):
        lines += [" ".join(f"w{rng.randrange(50)}" for _ in range(rng.randint(4, 12))) for _ in range(6)] + [""]
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    (root / "valid.txt").write_text("\n".join(lines[:20]) + "\n")
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", root / "train.txt", "--validpref",
            root / "valid.txt", "--destdir", root / "bin", "--workers", "1")
    return root / "bin"


def parameters(path):
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(TASKS))
def test_two_processes_equal_one_process(task, mono_data, tmp_path, cli):
    common = [mono_data, "--user-dir", USER_DIR, *TASKS[task], "--optimizer", "adam", "--lr", "1e-3",
              "--max-update", "3", "--cpu", "--seed", "1", "--batch-size", "4", "--required-batch-size-multiple",
              "1", "--disable-validation", "--no-progress-bar", "--no-epoch-checkpoints"]
    cli("fairseq-train", *common, "--update-freq", "2", "--save-dir", tmp_path / "one")
    two = cli(BIN / "torchrun", "--nproc_per_node", "2", "--master_port", str(29500 + random.randrange(1000)),
              BIN / "fairseq-train", *common, "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
              "--save-dir", tmp_path / "two")
    assert "initialized host" in two.stderr + two.stdout and "as rank 1" in two.stderr + two.stdout
    one, two = parameters(tmp_path / "one" / "checkpoint_last.pt"), parameters(tmp_path / "two" / "checkpoint_last.pt")
    assert one.keys() == two.keys()
    for name in one:
        assert torch.allclose(one[name], two[name], atol=1e-5, rtol=0), name
