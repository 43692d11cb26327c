"""The card calls of card/ (card/README.md), checked before a card is lent: each script run as written with
CARD_PLAN=1 (nothing installed, every tool's --plan-only, the CUDA tests each group selects), what each carries and
how long it may take against the device tool's limits, and what each call plans against what its issue asks."""
import json
import os
import re
import shlex
import subprocess

from palm_tools.bench import cli as benchmark
from tests.conftest import BIN, REPO

CARD = REPO / "card"
CALLS = sorted(path.name for path in CARD.glob("call_*.sh"))
RUN_LIMIT_S = 600  # the device tool's limit of one command
CARRY_LIMIT = 64 * 2 ** 20  # what one call may carry, the working tree included


def card_plan(script, *args, check=True):
    """``CARD_PLAN=1 bash card/SCRIPT ARGS`` here, as a session would check it: its completed process."""
    env = dict(os.environ, CARD_PLAN="1", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
               OUT="/tmp/card-plan-out")
    result = subprocess.run(["bash", f"card/{script}", *args], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    if check:
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def script_lines(script):
    """The script's commands, each joined with its continuation lines."""
    lines, pending = [], ""
    for line in (CARD / script).read_text().splitlines():
        pending += line[:-1] if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(pending)
            pending = ""
    return lines


def tool_call(script, module):
    """``(seconds, arguments)`` of the script's ``tool SECONDS MODULE ARGUMENTS`` line."""
    line = next(line for line in script_lines(script) if line.startswith("tool ") and f" {module} " in line)
    seconds, _, *argv = shlex.split(line)[1:]
    return int(seconds), argv


def options(argv):
    """``{option: [its values]}`` of a command line of ``--option value ...``."""
    found, option = {}, None
    for arg in argv:
        if arg.startswith("--"):
            option = arg
            found[option] = []
        else:
            found[option].append(arg)
    return found


def run_parameters(script):
    """The ``run`` tool's parameters from the script's ``# run: carry PATHS; timeout_s N`` line."""
    match = re.search(r"^# run: carry (.+); timeout_s (\d+)$", (CARD / script).read_text(), re.M)
    assert match, f"card/{script} has no '# run: carry ...; timeout_s N' line"
    return match.group(1).split(), int(match.group(2))


def test_every_call_carries_what_card_prepare_makes_and_ends_within_its_timeout():
    """Each call names what it carries, all of it ignored by git and made by card/prepare.sh (the files `unpack`
    reads among them); its tools' and tests' timeouts, with a minute for the wheels and the transfers, end within
    the call's timeout_s, itself within the device tool's limit. prepare.sh measures the carried size; here, the
    working tree's share is checked to leave room for it."""
    prepare = (CARD / "prepare.sh").read_text()
    assert CALLS == ["call_38.sh", "call_41.sh", "call_real_install.sh", "call_real_seed.sh"]
    for script in CALLS + ["prepare.sh", "common.sh"]:
        subprocess.run(["bash", "-n", f"card/{script}"], cwd=REPO, check=True)
    for script in CALLS:
        carry, timeout_s = run_parameters(script)
        ignored = subprocess.run(["git", "check-ignore", *carry], cwd=REPO, capture_output=True, text=True).stdout
        assert ignored.split() == carry, (script, carry)
        for path in carry:
            assert path.rstrip("/") in prepare, (script, path)
        text = "\n".join(script_lines(script))
        for archive in re.findall(r"^unpack (\S+)$", text, re.M):
            assert archive in carry, (script, archive)
        spent = sum(int(s) for s in re.findall(r"^tool (\d+) ", text, re.M))
        for seconds, groups in re.findall(r"^cuda_tests (\d+) (.*)$", text, re.M):
            spent += int(seconds) * len(shlex.split(groups))
        assert spent + 60 <= timeout_s <= RUN_LIMIT_S, (script, spent, timeout_s)
    tree = sum((REPO / path).stat().st_size for path in subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.splitlines()
        if (REPO / path).is_file())
    assert tree < CARRY_LIMIT - 50 * 2 ** 20  # the largest carry, MiniLM in float16, is 45 MB


def test_issue_38s_call_tests_and_measures_what_the_last_card_left_open():
    """card/call_38.sh: its CUDA tests run in processes of their own, the relative-bias tests first and alone
    (whether one of them leaves a CUDA error that failed every later test of section 11's single process), then the
    padded products and the copy kernels, then the Triton attention (values, gradients, its grid, the training
    step's memory), no test twice and no FlexAttention (its compilation would take the card's minutes); then it
    measures the UniLM family beside roberta at 64 and 256 sequences and the Triton attention's lever on pmlm and
    both UniLM configurations, profiled, a row started just before the time budget ends still ending inside its
    timeout."""
    result = card_plan("call_38.sh")
    out = result.stdout + result.stderr  # palm-bench logs its plan
    selected, group, plan = {}, None, []
    for line in out.splitlines():
        header = re.match(r'^card: tests/test_gpu.py -k "(.*)"$', line)
        if header:
            group = header.group(1)
            selected[group] = []
        elif "tests/test_gpu.py::" in line:
            selected[group].append(line.split("::")[1])
        elif line.startswith("[palm-bench"):
            plan.append(line.split("] plan: ", 1)[1])
    groups = list(selected)
    assert groups[0] == "relative_bias" and {t.split("[")[0] for t in selected[groups[0]]} == {
        "test_relative_bias_gradient_on_cuda_equals_float64_reference",
        "test_relative_bias_reaches_cuda_attention_without_a_padded_copy"}
    everything = [t.split("[")[0] for tests in selected.values() for t in tests]
    for test in ("test_triton_attention_on_cuda_equals_sdpa",
                 "test_triton_attention_on_cuda_with_more_sentence_heads_than_a_grid_axis_takes",
                 "test_fused_attention_pmlm_training_step_on_cuda_takes_less_memory_than_sdpa",
                 "test_default_copy_attention_on_cuda_is_tritons",
                 "test_triton_copy_attention_on_cuda_equals_float64_reference_in_less_memory",
                 "test_vocabulary_products_on_cuda_multiply_by_a_padded_matrix_while_training"):
        assert test in everything, test
    flat = [t for tests in selected.values() for t in tests]
    assert len(flat) == len(set(flat)) and not any("[flex]" in t for t in flat)

    timeout, argv = tool_call("call_38.sh", "palm_tools.bench.cli")
    args = benchmark.parse_args(argv + ["--plan-only"])
    assert args.device == "cuda" and args.sequences == [64, 256] and args.profile_dir
    sweep, levers, estimate, _ = plan
    assert (sweep, levers, estimate) == tuple(benchmark.plan(args)[:3])
    assert set(sweep.split(" at ")[0].split(": ")[1].split(", ")) == {
        "roberta", "pmlm_ae_par", "unilm_pretraining", "unilm_seq2seq"}
    for config in ("pmlm_ae_par", "unilm_pretraining", "unilm_seq2seq"):
        assert f"{config}: triton_attention, no_attention_dropout" in levers, levers
    assert args.profile_levers == ["triton_attention"]
    assert f"after {args.time_budget_min:g} min" in estimate and args.time_budget_min * 60 + 60 <= timeout


def test_issue_41s_call_runs_the_presets_other_rows_resumed_from_the_committed_runs():
    """card/call_41.sh plans the gpu preset without --rows and --tasks (its 13 rows and generation) at 3 seeds on
    the committed runs of results/gpu (tests/test_experiments_gpu.py checks the estimate it prints), and writes
    nothing there when it plans."""
    timeout, argv = tool_call("call_41.sh", "palm_tools.experiments.cli")
    assert "--rows" not in argv and "--tasks" not in argv and "seeds=1,2,3" in argv
    before = subprocess.run(["git", "status", "--porcelain", "results"], cwd=REPO, capture_output=True,
                            text=True).stdout
    line = card_plan("call_41.sh").stdout.strip().splitlines()[-1]
    assert line.startswith("plan: 21 of 64 runs to run (12 gen, 9 pretrain; 9 of them finished, run again for the "
                           "checkpoint a fine-tuning needs), in results/gpu;"), line
    assert subprocess.run(["git", "status", "--porcelain", "results"], cwd=REPO, capture_output=True,
                          text=True).stdout == before


def test_the_real_weights_calls_plan_a_seed_in_the_committed_folder():
    """card/call_real_seed.sh N: the committed results/real_gpu folder accepts its settings (scale.json: 3,000
    continued pre-training updates, the card's data folder), and one seed is the four pre-trainings of the question,
    six fine-tunings (the four, the checkpoint directly in both layouts) and the WordPiece unigram baseline; without
    a seed it says how to call it. The install call only unpacks what it carries."""
    before = sorted(p.name for p in (REPO / "results" / "real_gpu").iterdir())
    line = card_plan("call_real_seed.sh", "2").stdout.strip().splitlines()[-1]
    assert line.startswith("plan: 11 of 11 runs to run (6 gen, 4 pretrain, 1 unigram), in results/real_gpu;")
    assert "seeds=$SEED" in tool_call("call_real_seed.sh", "palm_tools.experiments.cli")[1]
    assert sorted(p.name for p in (REPO / "results" / "real_gpu").iterdir()) == before
    missing = card_plan("call_real_seed.sh", check=False)
    assert missing.returncode != 0 and missing.stderr.strip().splitlines()[-1].endswith(
        "usage: bash card/call_real_seed.sh SEED (1, 2 or 3)")
    assert card_plan("call_real_install.sh").stdout.strip() == "card: would unpack card/real.tgz"
    # the data card/prepare.sh prepares is that of the runs the seed call runs: the same rows, scale, work folder
    prepared = next(line for line in script_lines("prepare.sh") if " -m palm_tools.experiments.cli " in line)
    prepared = options(shlex.split(prepared.split(" -m palm_tools.experiments.cli ")[1]))
    run = options(tool_call("call_real_seed.sh", "palm_tools.experiments.cli")[1])
    assert "--prepare-only" in prepared and run["--scale"][-1] == "seeds=$SEED"
    assert prepared.pop("--prepare-only") == [] and run.pop("--jobs") and run.pop("--out")
    assert prepared == dict(run, **{"--scale": run["--scale"][:-1]})
    scale = json.loads((REPO / "results" / "real_gpu" / "scale.json").read_text())
    assert (scale["real_pretrain_updates"], scale["data"], scale["device"]) == (3000, "card_data", "gpu")
    assert {k: scale[k] for k in ("blocks", "tokens_per_sample", "real_pretrain_lr", "minilm_updates", "eval_pairs",
                                  "warmup_updates")} == {k: json.loads((REPO / "results" / "real" / "scale.json")
                                                                       .read_text())[k] for k in (
        "blocks", "tokens_per_sample", "real_pretrain_lr", "minilm_updates", "eval_pairs", "warmup_updates")}
