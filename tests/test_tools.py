"""palm_tools: every console script runs as documented, and the tools that need no model import no fairseq."""
import importlib
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_cli

# setup.py's console scripts: the module each runs (checked against setup.py below, so a new one cannot be missed).
CONSOLE_SCRIPTS = {
    "palm-score": "palm_tools.scoring.cli",
    "palm-prepare": "palm_tools.data.prepare",
    "palm-bench": "palm_tools.bench.cli",
    "palm-convert": "palm_tools.convert.cli",
    "palm-data": "palm_tools.data.corpora",
    "palm-demo": "palm_tools.demo",
    "palm-plot": "palm_tools.plot",
    "palm-experiments": "palm_tools.experiments.cli",
    "palm-gpu-check": "palm_tools.experiments.gpu_check",
}


def test_console_scripts_are_the_ones_setup_py_declares():
    declared = dict(re.findall(r'"(palm-[\w-]+)=([\w.]+):main"', (REPO / "setup.py").read_text()))
    assert declared == CONSOLE_SCRIPTS


def test_console_script_help_runs_under_the_scripts_name(capsys):
    """Each script's ``main`` prints its help headed with the name a user types, also when it is run as
    ``python -m MODULE`` (argparse would name the file: ``usage: cli.py``), and exits 0; the installed script starts."""
    for script, module in CONSOLE_SCRIPTS.items():
        with pytest.raises(SystemExit) as stop:
            importlib.import_module(module).main(["--help"])
        out = capsys.readouterr().out
        assert stop.value.code == 0 and out.startswith(f"usage: {script} "), (script, out[:200])
    assert run_cli("palm-convert", "--help").stdout.startswith("usage: palm-convert ")


def _imported_modules(*python_args, stdin=None):
    """Top-level packages a Python process imported, read from ``-X importtime`` (what the issue asks to show)."""
    result = subprocess.run([sys.executable, "-X", "importtime", *map(str, python_args)], cwd=REPO, input=stdin,
                            capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    names = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    return {name.split(".")[0] for name in names}, result


@pytest.mark.parametrize("metric", ["bleu", "rouge", "f1", "rougel"])
def test_scoring_imports_neither_fairseq_nor_torch(tmp_path, metric):
    """`palm-score bleu/rouge/f1/rougel` is a text tool: a real run imports no fairseq, torch or plugin code."""
    (tmp_path / "hyp.txt").write_text("the cat sat on the mat\na dog barked\n")
    (tmp_path / "ref.txt").write_text("the cat sat on a mat\nthe dog barked loudly\n")
    modules, result = _imported_modules("-m", "palm_tools.scoring.cli", metric, "--hyp", tmp_path / "hyp.txt",
                                        "--ref", tmp_path / "ref.txt")
    assert result.stdout.strip(), "no score printed"
    assert "palm_tools" in modules  # the reading works: the tool's own package is seen
    assert not modules & {"fairseq", "torch", "palm_plugin"}


def test_benchmark_readers_import_neither_fairseq_nor_torch():
    """`palm-prepare` converts raw releases to text: its readers need no model code."""
    modules, _ = _imported_modules("-c", "import palm_tools.data.prepare")
    assert "palm_tools" in modules and not modules & {"fairseq", "torch", "palm_plugin"}
