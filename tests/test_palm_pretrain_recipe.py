"""examples/pretrain/run.sh in SMOKE=1 mode: raw text (a few State of the Union addresses) -> sentences ->
sentencepiece -> fairseq-preprocess -> fairseq-train with each family's pre-training task (PALM: both stages), and a
second run that resumes where the first stopped."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, python_path

RECIPE = REPO / "examples" / "pretrain" / "run.sh"


def run_recipe(tmp_path, model, **extra):
    env = dict(os.environ, PYTHONPATH=python_path(), SMOKE="1", MODEL=model, ROOT=str(tmp_path),
               BIN=str(Path(sys.executable).parent), PYTHON=sys.executable, **extra)
    result = subprocess.run(["bash", str(RECIPE)], env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"pretrain recipe exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result.stdout + result.stderr


def updates(checkpoint):
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return state["optimizer_history"][-1]["num_updates"]


def test_recipe_is_valid_bash():
    result = subprocess.run(["bash", "-n", str(RECIPE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_palm_pretraining_both_stages_and_resume(tmp_path):
    log = run_recipe(tmp_path, "palm")
    work = tmp_path / "palm"
    assert (work / "raw" / "train.txt").read_text().count("\n\n") >= 2  # documents kept apart by blank lines
    ae, joint = work / "checkpoints" / "ae" / "checkpoint_last.pt", work / "checkpoints" / "joint" / "checkpoint_last.pt"
    assert updates(ae) == 2 and updates(joint) == 2
    assert f"loading pretrained model from {ae}" in log  # stage joint starts from stage ae
    assert re.search(r"\| mlm_loss [0-9.]+ \| lm_loss", log)  # stage joint logs both losses
    # a longer second stage: the first is finished (not trained again), the second resumes at update 2
    log = run_recipe(tmp_path, "palm", STAGES="train", MAX_UPDATE="3")
    assert updates(ae) == 2 and updates(joint) == 3
    assert re.search(rf"Loaded checkpoint {re.escape(str(joint))} \(epoch \d+ @ 2 updates\)", log), log[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("model,task", [("unilm", "unilm_pretraining"), ("unilm2", "pmlm")])
def test_unilm_pretraining(tmp_path, model, task):
    log = run_recipe(tmp_path, model)
    assert f"'task': {{'_name': '{task}'" in log
    assert updates(tmp_path / model / "checkpoints" / "checkpoint_last.pt") == 2
