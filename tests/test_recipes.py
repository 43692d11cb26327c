"""The benchmark recipes (examples/<benchmark>/run.sh) in SMOKE=1 mode: small files in each benchmark's raw format,
converted by the recipe's own stage, and for two recipes every stage through a real tiny fairseq model."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BENCHMARKS = ["cnndm", "xsum", "gigaword", "squad_qg", "msmarco", "coqa", "cornell", "chitchat"]
END_TO_END = [("gigaword", "unilm", "rouge"), ("cornell", "palm", "ppl")]
CONVERTED = ["cnndm", "xsum", "squad_qg"]


def run_recipe(benchmark, tmp_path, stages, model="palm", **extra):
    env = dict(os.environ, SMOKE="1", MODEL=model, STAGES=stages, ROOT=str(tmp_path / benchmark),
               BIN=str(Path(sys.executable).parent), PYTHON=sys.executable, OMP_NUM_THREADS="1", **extra)
    result = subprocess.run(["bash", str(REPO / "examples" / benchmark / "run.sh")], env=env, capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"{benchmark} recipe exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result


def line_count(path):
    return len(path.read_text(encoding="utf-8").splitlines())


def test_recipes_are_valid_bash():
    for script in [REPO / "examples" / "common.sh"] + [REPO / "examples" / b / "run.sh" for b in BENCHMARKS]:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"


@pytest.mark.slow
def test_smoke_data_converts(tmp_path):
    """The download (SMOKE: examples/smoke_data.py) and convert stages give parallel, non-empty splits, for the
    recipes whose conversion maps file or split names (each palm-prepare start imports fairseq, a few seconds, so
    the other recipes are only parsed; their readers are tested in tests/test_readers.py)."""
    for benchmark in CONVERTED:
        result = run_recipe(benchmark, tmp_path, "download convert")
        variant = "-du" if benchmark == "squad_qg" else ""
        raw = tmp_path / benchmark / f"palm{variant}" / "raw"
        for split in ("train", "valid", "test"):
            sources, targets = line_count(raw / f"{split}.src"), line_count(raw / f"{split}.tgt")
            assert sources == targets > 0, (benchmark, split, sources, targets)
        assert f"read {line_count(raw / 'test.src')}, kept" in result.stdout, result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("benchmark,model,metric", END_TO_END)
def test_smoke_recipe_end_to_end(tmp_path, benchmark, model, metric):
    """Every stage: convert, sentencepiece, fairseq-preprocess, fairseq-train (tiny arch, 4 updates),
    fairseq-generate (beam search, or --score-reference for perplexity) and palm-score."""
    run_recipe(benchmark, tmp_path, "download convert tokenize binarize train decode score", model=model)
    variant = "-full" if benchmark == "cornell" else ""
    work = tmp_path / benchmark / f"{model}{variant}"
    assert (work / "checkpoints" / "checkpoint_best.pt").is_file()
    scores = json.loads((work / f"scores.{metric}.json").read_text())
    tests = line_count(work / "raw" / "test.src")
    if metric == "ppl":
        assert scores["sentences"] == tests and scores["ppl"] > 1
    else:
        assert scores["examples"] == tests and 0 <= scores["rouge-1"]["f"] <= 100


def load_smoke_data():
    import importlib.util

    spec = importlib.util.spec_from_file_location("smoke_data", REPO / "examples" / "smoke_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("benchmark,argv,counts", [
    ("msmarco", ["msmarco", "--json", "{d}/dev_v2.1.json", "--task", "nlg"],
     "read 12, kept 6, dropped 6 (6 no well-formed answer)"),
    ("coqa", ["coqa", "--json", "{d}/coqa-dev-v1.0.json", "--max-history", "2"], "read 24, kept 24, dropped 0"),
    ("gigaword", ["gigaword", "--source", "{d}/Giga/input.txt", "--target", "{d}/Giga/task1_ref0.txt"],
     "read 6, kept 6, dropped 0"),
])
def test_smoke_data_is_in_the_readers_format(tmp_path, capsys, benchmark, argv, counts):
    """The small files of the recipes that test_smoke_data_converts does not run, through their readers in-process."""
    from palm_plugin.cli import prepare

    load_smoke_data().WRITERS[benchmark](tmp_path / "download")
    argv = [a.format(d=tmp_path / "download") for a in argv] + ["--out", str(tmp_path / "raw" / "test")]
    assert prepare.main(argv) == 0
    assert counts in capsys.readouterr().out
    assert line_count(tmp_path / "raw" / "test.src") == line_count(tmp_path / "raw" / "test.tgt") > 0
