"""Two CPU processes under torchrun train exactly like one process with the same global batch.

The invocation is the one README.md documents: ``torchrun --nproc_per_node 2 $(which fairseq-train) --cpu
--distributed-backend gloo --ddp-backend legacy_ddp ...`` (the plugin supplies the world size from torchrun and
fixes fairseq's GPU-only device inference; see palm_plugin/fixes/distributed.py). Two ranks with batch B each see the
batches that one process sees with batch B and --update-freq 2, so parameters must agree.
"""
import random

import pytest
import torch

import palm_plugin  # noqa: F401  (weights-only loading of fairseq checkpoints)

from tests.conftest import BIN, PRETRAINING, USER_DIR

def parameters(path):
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(PRETRAINING))
def test_two_processes_equal_one_process(task, mono_data, tmp_path, cli):
    common = [mono_data, "--user-dir", USER_DIR, *PRETRAINING[task], "--optimizer", "adam", "--lr", "1e-3",
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
