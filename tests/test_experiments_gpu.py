"""palm-experiments --preset gpu (issue 23): the plan of the card run (rows, equal budgets, the large pre-training
text, the card's flags), the unigram baseline, and (slow) the same command's --quick path end to end on the CPU."""
import collections
import hashlib
import json
import math
import re
import shlex
import shutil
from pathlib import Path

import pytest

from palm_tools.experiments.cli import check_work_folder, select
from palm_tools.experiments.execute import unigram_perplexity
from palm_tools.experiments.plan import UNIGRAM, Plan
from palm_tools.experiments.rows import GEN, PRESET_SELECTION
from palm_tools.experiments.scale import PRESETS
from tests.conftest import REPO, run_cli
from tests.test_card_calls import tool_call
from tests.test_experiments import check_budgets_and_seeds


def gpu_plan(tmp_path, scale=PRESETS["gpu"]):
    chosen = PRESET_SELECTION["gpu"]
    return Plan(scale.with_overrides([f"data={tmp_path / 'data'}"]), tmp_path,
                select(rows=chosen["rows"], tasks=chosen["tasks"]))


def test_gpu_plan_runs_the_issue_rows_with_equal_budgets_on_the_card(tmp_path):
    plan = gpu_plan(tmp_path)
    check_budgets_and_seeds(plan, min_seeds=3)
    kinds = [run.kind for run in plan.runs.values()]
    # UniLM 3 rows, UniLMv2 6, PALM 4, each with 3 seeds; 8 pre-trainings per seed; one unigram baseline
    assert (kinds.count(GEN), kinds.count("pretrain"), kinds.count(UNIGRAM), len(kinds)) == (39, 24, 1, 64)
    for run in plan.runs.values():
        for tool, args in run.commands:
            args = [str(a) for a in args]
            assert "--cpu" not in args
            if tool == "fairseq-train":
                assert "--fp16" in args
            if run.kind == "pretrain":
                assert args[0] == str(tmp_path / "data" / "bin" / "pretrain")
    quick = gpu_plan(tmp_path / "quick", PRESETS["gpu"].quick())
    assert quick.pretrain_text == tmp_path / "quick" / "data" / "bin" / "pretrain"
    assert all("--cpu" in run.commands[0][1] for run in quick.runs.values() if run.commands)


def test_unigram_perplexity_by_hand():
    # counts with </s>: a 2, b 1, </s> 2 (total 5); add-one over 5 symbols
    result = unigram_perplexity(["a b", "a"], ["a", "c"], vocabulary=5)
    p = {"a": 3 / 10, "c": 1 / 10, "</s>": 3 / 10}
    expected = math.exp(-(math.log(p["a"]) + 2 * math.log(p["</s>"]) + math.log(p["c"])) / 4)
    assert result == {"ppl": pytest.approx(expected), "tokens": 4, "sentences": 2}


def test_work_folder_made_before_a_key_existed_keeps_its_default(tmp_path):
    """A folder whose scale.json predates the corpus key was made with sotu: reused with it, refused with all."""
    default = PRESETS["default"]
    check_work_folder(tmp_path, default)
    record = json.loads((tmp_path / "scale.json").read_text())
    del record["corpus"]
    (tmp_path / "scale.json").write_text(json.dumps(record))
    check_work_folder(tmp_path, default)
    with pytest.raises(SystemExit, match="corpus: 'sotu' -> 'all'"):
        check_work_folder(tmp_path, default.with_overrides(["corpus=all"]))


@pytest.mark.slow
def test_quick_path_of_the_card_command(tmp_path, small_palm_data):
    """`palm-experiments --preset gpu --quick --device cpu` on a copy of the small palm-data: the large corpus is
    built and pre-trained on, every chosen row is fine-tuned and scored, the unigram baseline scores the same test
    tokens as the models, and exactly the md, json and png land in the chosen folder."""
    data = tmp_path / "data"
    shutil.copytree(small_palm_data, data)
    work, out = tmp_path / "work", tmp_path / "results"
    rows = ["unilm/scratch", "unilm2/ae_par", "palm/palm"]
    run_cli("palm-experiments", "--preset", "gpu", "--quick", "--device", "cpu", "--work", work, "--scale",
            f"data={data}", "--jobs", 2, "--rows", *rows, "--tasks", GEN, "--out", out / "paper_tables_gpu",
            timeout=900)
    assert sorted(p.name for p in out.iterdir()) == ["paper_tables_gpu.json", "paper_tables_gpu.md",
                                                     "paper_tables_gpu.png"]
    report = json.loads((out / "paper_tables_gpu.json").read_text())
    assert report["scale"]["corpus"] == "all" and report["scale"]["device"] == "cpu"
    sources = json.loads((data / "pretrain" / "sources.json").read_text())
    assert set(sources) >= {"sotu", "chitchat_train_conversations"}
    assert (data / "bin" / "pretrain" / "train.bin").stat().st_size > (data / "bin" / "sotu" / "train.bin").stat().st_size
    for log in (work / "runs").glob("pre-*/log.txt"):
        assert f"{data}/bin/pretrain" in log.read_text().splitlines()[0]

    generated = [json.loads(p.read_text()) for p in (work / "runs").glob("gen-*/result.json")]
    assert len(generated) == len(rows)
    unigram = report["unigram"]
    assert {(r["tokens"], r["sentences"]) for r in generated} == {(unigram["tokens"], unigram["sentences"])}
    assert unigram["sentences"] == PRESETS["quick"].eval_pairs and 1 < unigram["ppl"] < 1e4
    pair = re.compile(r"[SHTDP]-\d+\t")
    for folder in (work / "runs").glob("gen-*"):  # the log keeps the scoring's summary, test.generate.txt every pair
        log, generated = ((folder / name).read_text().splitlines() for name in ("log.txt", "test.generate.txt"))
        summary = [line for line in generated if not pair.match(line)]
        assert summary and log[-len(summary):] == summary and not any(pair.match(line) for line in log)
        assert sum(line.startswith("H-") for line in generated) == unigram["sentences"]
    cells = [row["tasks"][GEN] for table in report["experiments"] for row in table["rows"]]
    assert len(cells) == len(rows) and all(c["n"] == 1 and math.isfinite(c["mean"]) and c["mean"] > 1 for c in cells)
    assert all(table["unigram_ppl"] == unigram["ppl"] for table in report["experiments"])
    text = (out / "paper_tables_gpu.md").read_text()
    assert (f"| unigram model of the training responses in palm-data's pieces (no context; the baseline) | "
            f"{unigram['ppl']:.2f} |") in text
    assert "Pre-training text: " + str(data / "bin" / "pretrain") in text
    assert (out / "paper_tables_gpu.png").read_bytes()[:4] == b"\x89PNG"
    assert not Path(small_palm_data / "pretrain").exists()  # the shared fixture is left as it was


def check_rows_card_call():
    """The arguments of the check rows' card call of docs/paper_tables_gpu_plan.md (the indented command that begins
    with ``timeout 540 python3 -m palm_tools.experiments.cli`` and goes on over lines that end with a backslash; the
    later calls are card/'s scripts)."""
    start = "timeout 540 python3 -m palm_tools.experiments.cli"
    text = (REPO / "docs" / "paper_tables_gpu_plan.md").read_text()
    lines = []
    for line in text[text.index(start):].splitlines():
        lines.append(line.strip().rstrip("\\"))
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(lines))[len(shlex.split(start)):]


def test_the_check_rows_card_call_finds_its_three_seeds_committed_with_the_card_of_each(capsys):
    """Issue 41's first card call as docs/paper_tables_gpu_plan.md writes it ran seed 3 on an H100 (session 21): with
    --plan-only on the committed runs of results/gpu it has nothing left to run, and every run of the 13 check rows
    is there at seeds 1, 2 and 3, each naming the card it ran on (seed 1 an H200, seeds 2 and 3 an H100), as the
    report's "Where the runs ran" line reads them."""
    from palm_tools.experiments import cli

    assert cli.main(check_rows_card_call() + ["--plan-only"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == ("plan: 0 of 40 runs to run: every run has finished, in results/gpu; the tables are written from "
                    "them")
    runs = REPO / "results" / "gpu" / "runs"
    rows = sorted({re.sub(r"-s\d+$", "", p.name) for p in runs.iterdir() if p.name != "unigram"} - set(OTHER_ROWS))
    assert len(rows) == 13
    for row in rows:
        cards = [json.loads((runs / f"{row}-s{seed}" / "result.json").read_text())["device"] for seed in (1, 2, 3)]
        assert cards == ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"], (row, cards)


# the preset's rows beyond the check rows, as run names without the seed: pmlm's AR, PAR and AE+AR (pre-training and
# fine-tuning), PALM's fine-tunings with the encoder or the decoder re-initialised (from pre-palm's checkpoints)
OTHER_ROWS = [f"{kind}-pmlm_{o}" for o in ("ar", "par", "ae_ar") for kind in ("pre", "gen-unilm2")] + [
    f"gen-palm-palm_reinit-{part}" for part in ("encoder", "decoder")]


def test_the_presets_other_rows_card_call_counts_every_run_it_will_run_and_times_each_by_what_finished(capsys):
    """card/call_41.sh's palm-experiments (the gpu preset's 13 rows at 3 seeds) on the committed
    runs, after its first try (session 24, an H100, stopped by its timeout): every pre-training of the new rows and 3
    of their 15 fine-tunings finished. It runs the 12 other fine-tunings and again the 9 finished pre-trainings they
    fine-tune from (checkpoints are not committed), as run_all would; a run's time is its own seeds' mean where one
    finished, else the mean of the finished runs of the same family (from the run's name) and kind."""
    from palm_tools.experiments import cli

    argv = tool_call("call_41.sh", "palm_tools.experiments.cli")[1]
    assert "--rows" not in argv and "--tasks" not in argv  # the preset's own rows and task
    assert cli.main(argv + ["--plan-only"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("plan: 21 of 64 runs to run (12 gen, 9 pretrain; 9 of them finished, run again for the "
                           "checkpoint a fine-tuning needs), in results/gpu;")
    runs = REPO / "results" / "gpu" / "runs"
    seconds = {p.name: json.loads((p / "result.json").read_text())["seconds"] for p in runs.iterdir()
               if p.name != "unigram"}

    def family(name):  # gen-MODEL-..., pre-pmlm_* (UniLMv2), pre-unilm_* (UniLM), pre-palm
        kind, rest = name.split("-", 1)
        model = rest.split("-")[0] if kind == "gen" else {"pmlm": "unilm2", "unilm": "unilm", "palm": "palm"}[
            rest.split("_")[0].split("-")[0]]
        return kind, model

    def mean(values):
        return sum(values) / len(values) if values else None

    alike, same_row = collections.defaultdict(list), collections.defaultdict(list)
    for name, time in seconds.items():
        alike[family(name)].append(time)
        same_row[re.sub(r"-s\d+$", "", name)].append(time)
    gens = [f"gen-unilm2-pmlm_{o}-s{s}" for o in ("ar", "par", "ae_ar") for s in (1, 2, 3)]
    gens += [f"gen-palm-palm_reinit-{part}-s{s}" for part in ("encoder", "decoder") for s in (1, 2, 3)]
    gens = [name for name in gens if name not in seconds]

    def pretraining(gen):  # gen-FAMILY-KEY-sN fine-tunes what pre-KEY-sN pre-trained (reinit rows: pre-palm)
        key = re.sub(r"_reinit-(encoder|decoder)", "", gen.split("-", 2)[2])
        return f"pre-{key}"

    again = sorted({pretraining(name) for name in gens})
    assert len(gens) == 12 and len(again) == 9 and all(name in seconds for name in again)
    own = {name: mean(same_row[re.sub(r"-s\d+$", "", name)]) for name in gens + again}
    pending = {name: own[name] or mean(alike[family(name)]) for name in own}

    chain = max(time + (pending[pretraining(name)] if name in gens else 0) for name, time in pending.items())
    minutes = max(sum(pending.values()) / 14, chain) / 60
    with_own = sum(1 for time in own.values() if time)
    assert with_own == 12
    assert (f"estimate: about {minutes:.0f} min with 14 processes at once, from the times of {with_own} of these 21 "
            f"runs (results/gpu/paper_tables_gpu.json, or the same runs' finished seeds in WORK); 9 more from the "
            f"finished runs of their family and kind") in line


def test_a_presets_rows_stay_when_tasks_are_chosen_and_new_rows_without_a_time_are_said_aloud(tmp_path, capsys):
    """--tasks changes the preset's tasks, not its rows (it used to drop them: 158 runs of every experiment instead of
    the preset's 64); --only chooses other experiments whole, with the preset's tasks. A pending run with no time of its own takes the mean of
    the finished runs of its family and kind; a family with none is counted aloud, not guessed."""
    from palm_tools.experiments import cli

    work = tmp_path / "w"
    with pytest.raises(SystemExit):
        cli.main(["--plan-only", "--prepare-only", "--work", str(work)])
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("palm-experiments: error: --plan-only and "
                                                                "--prepare-only: give one of them")
    common = ["--preset", "gpu", "--work", str(work), "--plan-only", "--jobs", "1", "--scale", f"data={tmp_path / 'd'}"]
    assert cli.main(common + ["--tasks", "gen"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("plan: 64 of 64 runs to run (39 gen, 24 "
                                                                         "pretrain, 1 unigram)")
    assert cli.main(common + ["--only", "unilm"]) == 0  # mix, bidirectional, none: 3 seeds, the preset's task
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("plan: 16 of 16 runs to run (9 gen, 6 "
                                                                         "pretrain, 1 unigram)")
    for name, seconds in (("pre-pmlm_ae-s1", 150), ("gen-unilm2-pmlm_ae-s1", 30)):
        (work / "runs" / name).mkdir(parents=True)
        (work / "runs" / name / "result.json").write_text(json.dumps({"seconds": seconds}))
    assert cli.main(common + ["seeds=1", "--rows", "unilm2/ae", "unilm2/ar", "unilm/mix"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    # pending: pmlm AR's pre-training (150 s, as AE's) and fine-tuning (30 s), UniLM's two and the unigram (no time)
    assert line.startswith("plan: 5 of 7 runs to run (2 gen, 2 pretrain, 1 unigram)")
    assert "estimate: about 3 min with 1 process at once, from the times of 0 of these 5 runs (" in line
    assert line.endswith("paper_tables.json, or the same runs' finished seeds in WORK); 2 more from the finished runs "
                         "of their family and kind; 3 runs have no time to go by and are not counted")


def test_a_work_folder_refuses_data_other_than_its_runs_were_made_from(tmp_path):
    """palm-data's output changed with its version (sotu's split: 237 training addresses at 124d9d3, 235 now), and
    a card builds or carries its own copy under the same folder name: the work folder records the sha256 of the data
    files its runs read and refuses a seed made from others, in one line that names the files and the record."""
    from palm_tools.experiments.prepare import check_data_files

    data, work = tmp_path / "card_data", tmp_path / "work"
    (data / "tok").mkdir(parents=True)
    (data / "dict.txt").write_text("a 3\nb 2\n")
    (data / "tok" / "chitchat.test.src").write_text("a b\n")
    plan = Plan(PRESETS["gpu"].with_overrides([f"data={data}"]), work, select(rows=["unilm/scratch"], tasks=[GEN]))
    work.mkdir()
    check_data_files(plan)
    record = json.loads((work / "data.json").read_text())
    assert record == {"dict.txt": hashlib.sha256(b"a 3\nb 2\n").hexdigest(),
                      "tok/chitchat.test.src": hashlib.sha256(b"a b\n").hexdigest()}
    (data / "tok" / "chitchat.test.tgt").write_text("b\n")  # a file the record lacks joins it
    check_data_files(plan)
    assert set(json.loads((work / "data.json").read_text())) == {"dict.txt", "tok/chitchat.test.src",
                                                                 "tok/chitchat.test.tgt"}
    (data / "tok" / "chitchat.test.src").write_text("a a\n")
    with pytest.raises(SystemExit) as stop:
        check_data_files(plan)
    assert str(stop.value) == (f"palm-experiments: {work}'s runs were made from other data than {data} "
                               f"(tok/chitchat.test.src differ from the sha256 in {work / 'data.json'}); give the data "
                               f"folder they were made with, or another --work folder")
    assert set(json.loads((work / "data.json").read_text())) == {"dict.txt", "tok/chitchat.test.src",
                                                                 "tok/chitchat.test.tgt"}  # the record kept


def test_a_work_folder_of_other_data_is_refused_before_anything_is_prepared(tmp_path, monkeypatch):
    """palm-experiments checks the data record before prepare: a WORK/prepared made from the recorded data would
    otherwise be reused (or palm-data run) for a seed of other data. prepare is replaced by a stop, so the
    refusal must come first. --plan-only checks it too, and writes nothing."""
    from palm_tools.experiments import cli

    data, work = tmp_path / "card_data", tmp_path / "work"
    (data / "tok").mkdir(parents=True)
    (data / "dict.txt").write_text("a 3\nb 2\n")
    work.mkdir()
    (work / "data.json").write_text(json.dumps({"dict.txt": hashlib.sha256(b"other\n").hexdigest()}))
    monkeypatch.setattr(cli, "prepare", lambda *args: pytest.fail("prepare ran before the data check"))
    argv = ["--preset", "gpu", "--work", str(work), "--out", str(tmp_path / "out"), "--only", "unilm", "--rows",
            "unilm/scratch", "--tasks", "gen", "--scale", f"data={data}", "--jobs", "1"]
    # --plan-only, how a card command is checked before the card is lent (session 21 built such a folder and saw it
    # only by hashing the files by hand): refused the same, and nothing written
    for extra in (["--plan-only"], []):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv + extra)
        assert str(stop.value).startswith(f"palm-experiments: {work}'s runs were made from other data than {data} "
                                          f"(dict.txt differ"), extra
    (data / "tok" / "chitchat.test.src").write_text("a b\n")  # a file the record lacks: --plan-only does not add it
    (work / "data.json").write_text(json.dumps({"dict.txt": hashlib.sha256(b"a 3\nb 2\n").hexdigest()}))
    record = (work / "data.json").read_text()
    assert cli.main(argv + ["--plan-only"]) == 0 and (work / "data.json").read_text() == record


@pytest.mark.parametrize("page, argv", [
    ("paper_tables_gpu", ["--preset", "gpu", "--device", "cuda", "--jobs", "14", "--work", "results/gpu", "--scale",
                          "data=card_data", "seeds=1,2,3"]),
    ("paper_tables_real", ["--only", "real", "--scale", "corpus=all", "seeds=1,2,3", "--work", "results/real",
                           "--jobs", "2"]),
])
def test_a_committed_tables_page_is_what_its_committed_runs_make(tmp_path, capsys, page, argv):
    """docs/PAGE.md and .json say what the committed runs of their work folder say: written again from those runs
    (--report-only), every table and value is the same; only the header differs (the command, the time of a run
    that ran). A record edited, or a report change, that would move a published number fails here until the page is
    written again."""
    from palm_tools.experiments import cli

    assert cli.main(argv + ["--out", str(tmp_path / page), "--report-only"]) == 0

    def body(text):  # the page without its header paragraphs
        return [p for p in text.split("\n\n") if not p.startswith(("`palm-experiments", "Where the runs ran"))]

    assert body((tmp_path / f"{page}.md").read_text()) == body((REPO / "docs" / f"{page}.md").read_text())
    written, committed = (json.loads(p.read_text()) for p in (tmp_path / f"{page}.json",
                                                              REPO / "docs" / f"{page}.json"))
    assert written["experiments"] == committed["experiments"] and written["scale"] == committed["scale"]
    assert written["run_seconds"] == committed["run_seconds"]


# README.md's result rows measured here, by the start of the row's first cell: the record (docs/NAME.json) and,
# in the order of the "here" cell's numbers, each value's (experiment key, row label, task); None where the cell
# shows "—" (a row the record has no run of)
README_CELLS = [
    ("`make tables`: PALM / - pointer-generator", "paper_tables", [
        ("palm", label, "gen")
        for label in ("PALM", "- pointer-generator", "- autoregression (decoder re-initialised)", "- pre-training")]),
    ("gpu preset on a card (256 dims", "paper_tables_gpu",
     [("palm", "PALM", "gen"), ("palm", "- pre-training", "gen")]),
    ("real weights ([docs/real_weights.md](docs/real_weights.md)): all-MiniLM-L6-v2's encoder", "paper_tables_real", [
        ("real", f"PALM: {label}", "gen") for label in (
            "MiniLM encoder -> PALM's pre-training -> fine-tune", "MiniLM encoder -> fine-tune",
            "PALM's pre-training from scratch -> fine-tune", "from scratch")]),
    ("`make tables`: objective mix", "paper_tables", [
        ("unilm", label, "gen")
        for label in ("mix (bidirectional, seq2seq, L2R, R2L)", "bidirectional only (BERT-like)", "no pre-training")]),
    ("gpu preset on a card (as above): objective mix", "paper_tables_gpu", [
        ("unilm", label, "gen")
        for label in ("mix (bidirectional, seq2seq, L2R, R2L)", "bidirectional only (BERT-like)", "no pre-training")]),
    ("`make tables`: chitchat response selection", "paper_tables_minilm", [
        ("minilm", "UniLM from all-MiniLM-L6-v2", "sel"), ("minilm", "same network from scratch", "sel")]),
    ("real weights ([docs/real_weights.md](docs/real_weights.md)): all-MiniLM-L6-v2 -> the objective mix",
     "paper_tables_real", [("real", f"UniLM: MiniLM -> {label}", "gen") for label in (
         "the four-objective mix -> fine-tune", "bidirectional only -> fine-tune", "fine-tune")]),
    ("`make tables`: AE / AE+PAR", "paper_tables", [
        ("unilm2", label, "gen") for label in ("AE", "AE+PAR", "no pre-training")]),
    ("gpu preset on a card (as above): AE / AE+PAR", "paper_tables_gpu", [
        ("unilm2", label, "gen") for label in ("AE", "AE+PAR", "no pre-training")]),
    ("real weights ([docs/real_weights.md](docs/real_weights.md)): all-MiniLM-L6-v2 -> pmlm AE+PAR",
     "paper_tables_real", [("real", f"UniLMv2: {label}", "gen") for label in (
         "MiniLM -> pmlm AE+PAR -> fine-tune", "MiniLM -> pmlm AE -> fine-tune",
         "MiniLM -> only the MLM head trained (AE), the rest frozen -> fine-tune (control)", "MiniLM -> fine-tune",
         "from scratch", "MiniLM -> pmlm AE+PAR -> fine-tune, --target-mask-prob 0.1",
         "MiniLM -> pmlm AE -> fine-tune, --target-mask-prob 0.1")]
     + [None] + [("real", "UniLMv2: MiniLM -> fine-tune, --target-mask-prob 0.1", "gen")]),
]


def test_the_readmes_result_cells_are_their_records_rounded():
    """Each number of README.md's results that was measured here is its record's mean (and sd where the cell gives
    one), rounded as the cell shows it: a page written again from new runs, or a row edited by hand, that leaves the
    README behind fails here."""
    rows = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[-1]
            for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| ")}
    for start, page, cells in README_CELLS:
        (row,) = [first for first in rows if first.startswith(start)]
        shown = re.findall(r"—|(\d+(?:\.\d+)?)(?: ± (\d+(?:\.\d+)?))?", re.sub(r"`[^`]*`", "", rows[row]))
        assert len(shown) == len(cells), (row, shown)
        record = {(e["key"], r["label"], task): cell for e in json.loads((REPO / "docs" / f"{page}.json").read_text())[
            "experiments"] for r in e.get("rows", []) for task, cell in r.get("tasks", {}).items()}
        for (mean, sd), where in zip(shown, cells):
            if where is None:
                assert mean == "", (row, mean)
                continue
            value = record[where]
            for text, measured in ((mean, value["mean"]), (sd, value["sd"])):
                if text:
                    decimals = len(text.partition(".")[2])
                    assert f"{measured:.{decimals}f}" == text, (row, where, text, measured)
