"""The benchmark recipes (examples/<benchmark>/run.sh) in SMOKE=1 mode: small files in each benchmark's raw format,
through every stage of the recipe with a real tiny fairseq model, the three model families spread over them."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, python_path

# benchmark, model, the variant suffix of its work folder, the metrics it writes
RECIPES = [
    ("cnndm", "palm", "", ["rouge"]),
    ("xsum", "unilm2", "", ["rouge"]),
    ("gigaword", "unilm", "-full", ["rouge"]),
    ("squad_qg", "unilm2", "-du", ["bleu", "meteor", "rougel"]),
    ("msmarco", "palm", "-nlg", ["rougel", "bleu"]),
    ("coqa", "unilm", "", ["f1"]),
    ("cornell", "palm", "-full", ["ppl"]),
    ("chitchat", "unilm", "-full", ["ppl"]),
]
BENCHMARKS = [recipe[0] for recipe in RECIPES]
# The search each recipe gives fairseq-generate, with its source (SMOKE=1 changes the beam and the lengths only):
# --lenpen, --lenpen-style, --no-repeat-ngram-size
SEARCH = {
    ("cnndm", "palm"): ("0.95", "gnmt", "0"),  # AliceMind's PALM/finetune_cnndm_task_roberta.sh: -alpha 0.95 (GNMT),
    # no -block_trigram (docs/palm-authors-code.md)
    ("xsum", "unilm2"): ("0.6", "gnmt", "3"),  # UniLMv2 appendix Table 10's penalty; s2s-ft's trigram blocking
    ("gigaword", "unilm"): ("0.0", "fairseq", "3"),  # UniLM v1's decode_seq2seq.py: summed log-probabilities
    ("squad_qg", "unilm2"): ("1.3", "gnmt", "0"),  # UniLMv2 appendix Table 10
    ("msmarco", "palm"): ("1.0", "fairseq", "0"),  # ours: PALM's paper gives the beam only
    ("coqa", "unilm"): ("0.0", "fairseq", "0"),  # UniLM v1's decode_seq2seq.py
}
SCORE_KEYS = {"rouge": "rouge-1", "bleu": "bleu", "meteor": "meteor", "rougel": "rouge-l", "f1": "f1"}


def run_recipe(benchmark, tmp_path, stages, model="palm", **extra):
    env = dict(os.environ, PYTHONPATH=python_path(), SMOKE="1", MODEL=model, STAGES=stages,
               ROOT=str(tmp_path / benchmark), BIN=str(Path(sys.executable).parent), PYTHON=sys.executable,
               **extra)
    result = subprocess.run(["bash", str(REPO / "examples" / benchmark / "run.sh")], env=env, capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"{benchmark} recipe exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result


def line_count(path):
    return len(path.read_text(encoding="utf-8").splitlines())


def test_recipes_are_valid_bash():
    scripts = [REPO / "examples" / "common.sh", REPO / "examples" / "dialog.sh"]
    for script in scripts + [REPO / "examples" / b / "run.sh" for b in BENCHMARKS]:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"


def test_recipes_train_with_fused_adamw_on_gpus_and_fairseq_adam_on_the_cpu():
    """The device options every recipe's fairseq-train takes (examples/common.sh training_device; the smoke runs take
    the CPU's): fp16 with torch's fused AdamW where nvidia-smi counts GPUs, the measured faster step
    (docs/gpu.md); fairseq's Adam, the faster on 2 CPU cores, with --cpu otherwise."""
    script = (f"BENCHMARK=gigaword BIN={Path(sys.executable).parent} source {REPO}/examples/common.sh; "
              "for n in 0 1 8; do NGPUS=$n; training_device; done")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == ["--cpu --optimizer adam"] + ["--fp16 --optimizer torch_adamw"] * 2


def test_real_run_stops_with_what_to_do(tmp_path):
    """Without SMOKE and with the default ROOT, a recipe gets through its set-up and a release that needs a manual
    step stops the download stage with the recipe's message (a failing test in the set-up would end the script
    with status 1 and no word, under `set -e`)."""
    env = dict(os.environ, PYTHONPATH=python_path(), MODEL="unilm", STAGES="download", WORK=str(tmp_path / "work"),
               DOWNLOAD=str(tmp_path / "download"), BIN=str(Path(sys.executable).parent), PYTHON=sys.executable)
    env.pop("ROOT", None)
    env.pop("SMOKE", None)
    result = subprocess.run(["bash", str(REPO / "examples" / "gigaword" / "run.sh")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and "[gigaword/unilm] stage download" in result.stderr, result.stderr[-2000:]
    assert f"unpack summary.tar.gz (https://github.com/harvardnlp/sent-summary) into {tmp_path}/download" in result.stderr


# recipe, settings, the last line. Each was a bash error, a Python traceback, a download of the wrong model's data
# or a silent change: MODEL=bert went on to download, STAGES=trian said "trian: command not found", binarize before
# tokenize ended in fairseq-preprocess's FileNotFoundError, TOTAL_BATCH=0 in "division by 0", EPOCHS=abc trained with
# --max-update 0 (no limit), WARMUP_RATIO=2% warmed up over 0 updates.
RECIPE_ERRORS = {
    "model": ("cnndm", {"MODEL": "bert"}, "[cnndm/bert] error: MODEL=bert: choose palm, unilm or unilm2"),
    "stage-typo": ("xsum", {"STAGES": "download trian"},
                   "[xsum/palm] error: STAGES: there is no stage 'trian'; the stages are: download convert tokenize "
                   "binarize train decode score"),
    "binarize-first": ("gigaword", {"STAGES": "binarize"},
                       "[gigaword/palm] error: stage binarize reads {work}-full/tok/train.src, which is not there: run the "
                       "stage tokenize first (STAGES=\"tokenize binarize\"), with the same MODEL and ROOT"),
    "decode-first": ("coqa", {"STAGES": "decode score", "MODEL": "unilm2"},
                     "[coqa/unilm2] error: stage decode reads {work}/bin/dict.src.txt, which is not there: run the "
                     "stage binarize first (STAGES=\"binarize train decode\"), with the same MODEL and ROOT"),
    "score-first": ("cornell", {"STAGES": "score"},
                    "[cornell/palm] error: stage score reads {work}-full/gen/test.out, which is not there: run the stage "
                    "decode first (STAGES=\"decode score\"), with the same MODEL and ROOT"),
    "total-batch": ("squad_qg", {"TOTAL_BATCH": "0"}, "[squad_qg/palm] error: TOTAL_BATCH=0: give a whole number of 1 or more"),
    "epochs": ("msmarco", {"EPOCHS": "abc", "SMOKE": "0"}, "[msmarco/palm] error: EPOCHS=abc: give a whole number of 1 or more"),
    "gpus": ("cnndm", {"NGPUS": "two", "SMOKE": "0"},
             "[cnndm/palm] error: NGPUS=two: give the number of GPUs to train on (0: the CPU)"),
    "warmup": ("xsum", {"WARMUP_RATIO": "2%"},
               "[xsum/palm] error: WARMUP_RATIO=2%: give the share of the updates that warm up, from 0 to 1 (e.g. 0.02)"),
    "pretrain-stage": ("pretrain", {"STAGES": "train", "MODEL": "unilm2"},
                       "[pretrain/unilm2] error: stage train reads {work}/bin/dict.txt, which is not there: run the "
                       "stage binarize first (STAGES=\"binarize train\"), with the same MODEL and ROOT"),
    "pretrain-batch": ("pretrain", {"BATCH_SIZE": "-8", "SMOKE": "0"}, "[pretrain/palm] error: BATCH_SIZE=-8: give a whole number of 1 or more"),
}


@pytest.mark.parametrize("case", list(RECIPE_ERRORS))
def test_bad_settings_and_stages_out_of_order_stop_before_any_stage_with_what_to_do(tmp_path, case):
    benchmark, settings, message = RECIPE_ERRORS[case]
    env = dict(os.environ, PYTHONPATH=python_path(), SMOKE="1", ROOT=str(tmp_path), BIN=str(Path(sys.executable).parent),
               PYTHON=sys.executable)
    env.update(settings)
    result = subprocess.run(["bash", str(REPO / "examples" / benchmark / "run.sh")], env=env, capture_output=True,
                            text=True, timeout=60)
    work = tmp_path / env.get("MODEL", "palm")
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == message.format(work=work)
    assert "stage" not in result.stderr.replace(message.format(work=work), "")  # no stage began
    assert not (tmp_path / "download").exists()


def test_a_stage_left_out_stops_the_recipe_at_the_stage_that_needs_it(tmp_path):
    """The check runs before each stage, after those before it: the earlier stages' files are kept."""
    env = dict(os.environ, PYTHONPATH=python_path(), SMOKE="1", ROOT=str(tmp_path), BIN=str(Path(sys.executable).parent),
               PYTHON=sys.executable, STAGES="download convert tokenize train")
    result = subprocess.run(["bash", str(REPO / "examples" / "gigaword" / "run.sh")], env=env, capture_output=True,
                            text=True, timeout=300)
    work = tmp_path / "palm-full"
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"[gigaword/palm] error: stage train reads {work}/bin/dict.src.txt, which is not there: run the stage binarize "
        f"first (STAGES=\"binarize train\"), with the same MODEL and ROOT")
    assert [line for line in result.stderr.splitlines() if line.startswith("[gigaword/palm] stage")] == [
        f"[gigaword/palm] stage {stage}" for stage in ("download", "convert", "tokenize")]
    assert line_count(work / "tok" / "train.src") == line_count(work / "raw" / "train.src") > 0


@pytest.mark.slow
@pytest.mark.parametrize("benchmark,model,variant,metrics", RECIPES)
def test_smoke_recipe_end_to_end(tmp_path, benchmark, model, variant, metrics):
    """Every stage: download (examples/smoke_data.py), convert (palm-prepare, counts printed), sentencepiece,
    fairseq-preprocess, fairseq-train (tiny arch, 4 updates), fairseq-generate (beam search with the recipe's length
    penalty and n-gram blocking, or --score-reference for perplexity) and palm-score, whose score files hold one score
    over all test examples."""
    result = run_recipe(benchmark, tmp_path, "download convert tokenize binarize train decode score", model=model)
    if metrics != ["ppl"]:  # the search as fairseq-generate read it (its echo of its configuration)
        read = tuple(re.findall(rf"'{key}': '?([^,'}}]*)", result.stderr)[-1]
                     for key in ("lenpen", "lenpen_style", "no_repeat_ngram_size"))
        assert read == SEARCH[benchmark, model]
    work = tmp_path / benchmark / f"{model}{variant}"
    raw = work / "raw"
    for split in ("train", "valid", "test"):
        sources, targets = line_count(raw / f"{split}.src"), line_count(raw / f"{split}.tgt")
        assert sources == targets > 0, (split, sources, targets)
    assert (work / "checkpoints" / "checkpoint_best.pt").is_file()
    tests = line_count(raw / "test.src")
    for metric in metrics:
        scores = json.loads((work / f"scores.{metric}.json").read_text())
        if metric == "ppl":
            assert scores["sentences"] == tests and scores["tokens"] > tests and scores["ppl"] > 1
        else:
            value = scores[SCORE_KEYS[metric]]
            value = value["f"] if isinstance(value, dict) else value
            assert scores["examples"] == tests and 0 <= value <= 100, scores


@pytest.mark.slow
def test_hyperparameters_from_the_environment_win(tmp_path):
    """LR / MAX_UPDATE set by the user override the recipe's (and SMOKE's) values in the fairseq-train call."""
    run_recipe("gigaword", tmp_path, "download convert tokenize binarize", model="palm")
    result = run_recipe("gigaword", tmp_path, "train", model="palm", LR="0.00123", MAX_UPDATE="2")
    assert "2 updates" in result.stderr and "lr 0.00123" in result.stderr, result.stderr[-2000:]
    log = result.stdout + result.stderr  # fairseq's own echo of its configuration
    assert "'lr': [0.00123]" in log and "'max_update': 2" in log


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
    from palm_tools.data import prepare

    load_smoke_data().WRITERS[benchmark](tmp_path / "download")
    argv = [a.format(d=tmp_path / "download") for a in argv] + ["--out", str(tmp_path / "raw" / "test")]
    assert prepare.main(argv) == 0
    assert counts in capsys.readouterr().out
    assert line_count(tmp_path / "raw" / "test.src") == line_count(tmp_path / "raw" / "test.tgt") > 0
