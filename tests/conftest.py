"""Shared test helpers: paths, and real fairseq command-line processes with the plugin on their path."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER_DIR = REPO / "palm_plugin"
BIN = Path(sys.executable).parent


def run_cli(tool, *args, cwd=None, check=True, timeout=900, env_extra=None):
    """Run ``tool`` (a fairseq console script such as ``fairseq-train``, or a path to a Python script) as a real
    process with this interpreter's environment; return the completed process. On failure the captured output is
    shown in the assertion message."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **(env_extra or {}))
    command = [sys.executable, str(tool)] if str(tool).endswith(".py") else [str(BIN / tool)]
    result = subprocess.run(
        command + [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"{tool} exited {result.returncode}\n--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


@pytest.fixture
def cli():
    return run_cli
