"""Every pre-training objective trains under ``--cpu --bf16`` (fairseq would otherwise look for a TPU): finite
losses, close to but not equal to the fp32 run with the same seed (so bfloat16 arithmetic really ran)."""
import math
import re

import pytest

from tests.conftest import PRETRAINING, USER_DIR

OURS = sorted(task for task in PRETRAINING if task != "masked_lm")


def train_losses(cli, data, task, save_dir, *extra):
    result = cli("fairseq-train", data, "--user-dir", USER_DIR, *PRETRAINING[task], "--cpu", "--optimizer", "adam",
                 "--lr", "1e-3", "--max-update", "6", "--batch-size", "4", "--required-batch-size-multiple", "1",
                 "--disable-validation", "--log-interval", "1", "--no-save", "--save-dir", save_dir, *extra)
    log = result.stdout + result.stderr
    return log, [float(x) for x in re.findall(r"train_inner .*? loss=([\d.a-z]+)", log)]


@pytest.mark.slow
@pytest.mark.parametrize("task", OURS)
def test_bf16_on_cpu(task, mono_data, tmp_path, cli):
    log, bf16 = train_losses(cli, mono_data, task, tmp_path / "bf16", "--bf16")
    assert "training in bfloat16 on the CPU" in log
    _, fp32 = train_losses(cli, mono_data, task, tmp_path / "fp32")
    assert len(bf16) == len(fp32) == 6 and all(math.isfinite(x) for x in bf16)
    assert bf16 != fp32
    assert max(abs(a - b) for a, b in zip(bf16, fp32)) < 0.5
