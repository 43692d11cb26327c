"""A pre-training run killed with SIGKILL and restarted from checkpoint_last.pt ends exactly where an
uninterrupted run with the same seed ends (fairseq reseeds every update from seed + update number; our datasets
seed their noise from (seed, epoch, index), so the resumed run sees the same masks)."""
import os
import signal
import subprocess
import time

import pytest
import torch

import palm_plugin  # noqa: F401  (weights-only loading of fairseq checkpoints)
from tests.conftest import BIN, PRETRAINING, REPO, USER_DIR, python_path

MAX_UPDATE = 60


def train_command(data, task, save_dir):
    return [str(BIN / "fairseq-train"), str(data), "--user-dir", str(USER_DIR), *PRETRAINING[task], "--optimizer", "adam",
            "--lr", "1e-3", "--max-update", str(MAX_UPDATE), "--cpu", "--seed", "3", "--batch-size", "2",
            "--required-batch-size-multiple", "1", "--disable-validation", "--no-progress-bar",
            "--save-interval-updates", "5", "--no-epoch-checkpoints", "--keep-interval-updates", "1",
            "--save-dir", str(save_dir)]


def run(command):
    env = dict(os.environ, PYTHONPATH=python_path(REPO))
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(PRETRAINING))
def test_sigkill_then_resume_matches_uninterrupted(task, mono_data, tmp_path):
    reference = run(train_command(mono_data, task, tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]

    killed_dir = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=python_path(REPO))
    process = subprocess.Popen(train_command(mono_data, task, killed_dir), env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    last = killed_dir / "checkpoint_last.pt"
    deadline = time.time() + 300
    while not last.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    updates_at_kill = torch.load(last, weights_only=True)["optimizer_history"][-1]["num_updates"]
    assert 0 < updates_at_kill < MAX_UPDATE

    resumed = run(train_command(mono_data, task, killed_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Loaded checkpoint {last}" in resumed.stderr + resumed.stdout

    expected = torch.load(tmp_path / "reference" / "checkpoint_last.pt", weights_only=True)
    actual = torch.load(last, weights_only=True)
    assert actual["optimizer_history"][-1]["num_updates"] == MAX_UPDATE
    for name, tensor in expected["model"].items():
        assert torch.allclose(actual["model"][name], tensor, atol=1e-6, rtol=0), name
    for key, value in expected["last_optimizer_state"]["state"].items():
        assert torch.allclose(actual["last_optimizer_state"]["state"][key]["exp_avg"], value["exp_avg"], atol=1e-6)
