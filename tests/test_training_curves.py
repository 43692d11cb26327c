"""--tensorboard-logdir and palm-plot on real fairseq-train runs: the event files hold what the log says, palm-plot
reads json logs, simple logs and tensorboard directories alike, and the runs print no import-time noise."""
import json

import pytest

from tests.conftest import PRETRAINING, USER_DIR, run_cli

TRAIN = ["--user-dir", USER_DIR, *PRETRAINING["unilm_pretraining"], "--optimizer", "adam", "--lr", "1e-3",
         "--batch-size", "4", "--max-update", "12", "--log-interval", "4", "--validate-interval-updates", "6",
         "--cpu", "--no-save", "--seed", "3"]


@pytest.fixture(scope="module")
def runs(mono_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("curves")
    json_run = run_cli("fairseq-train", mono_data, *TRAIN, "--log-format", "json", "--log-file", root / "json.log",
                       "--tensorboard-logdir", root / "tb")
    simple_run = run_cli("fairseq-train", mono_data, *TRAIN, "--log-format", "simple", "--log-file",
                         root / "simple.log")
    return root, json_run.stdout + json_run.stderr + simple_run.stdout + simple_run.stderr


def json_records(path, tag):
    """The json progress records of a --log-file (``train_inner`` ones have ``num_updates``, others prefix keys), one
    per update (fairseq's log file repeats the records of the second epoch)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.startswith('{"')]
    key = "num_updates" if tag == "train_inner" else f"{tag}_num_updates"
    return list({r[key]: r for r in records if key in r}.values())


@pytest.mark.slow
def test_tensorboard_events_hold_the_logged_losses(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, output = runs
    assert "Please install tensorboardX" not in output
    assert "Warning" not in output  # hydra deprecations, pin_memory on CPU, ... (palm_plugin/fixes/quiet_warnings.py)
    for tag, prefix in (("train_inner", ""), ("valid", "valid_")):
        logged = [(int(r[f"{prefix}num_updates"]), float(r[f"{prefix}loss"])) for r in json_records(root / "json.log", tag)]
        assert len(logged) >= 2
        events = EventAccumulator(str(root / "tb" / tag))
        events.Reload()
        stored = [(e.step, e.value) for e in events.Scalars("loss")]
        assert [s for s, _ in stored] == [s for s, _ in logged]
        assert [v for _, v in stored] == pytest.approx([v for _, v in logged], abs=6e-4)  # the log rounds to 3 places


@pytest.mark.slow
def test_palm_plot_reads_every_format_and_draws_one_chart(runs, tmp_path):
    from palm_tools.plot import read_run

    root, _ = runs
    from_json, from_simple, from_events = (read_run(str(p)) for p in (root / "json.log", root / "simple.log", root / "tb"))
    inner = json_records(root / "json.log", "train_inner")
    assert from_json["train"]["loss"] == [(float(r["num_updates"]), float(r["loss"])) for r in inner]
    assert from_json["train"]["ppl"] == [(float(r["num_updates"]), float(r["ppl"])) for r in inner]
    assert set(from_json) == set(from_simple) == set(from_events) == {"train", "valid"}
    for kind in ("train", "valid"):
        for metric in ("loss", "ppl"):
            assert from_simple[kind][metric] == from_json[kind][metric]  # same seed, same run
            steps, values = zip(*from_events[kind][metric])
            assert list(steps) == [s for s, _ in from_json[kind][metric]]
            assert list(values) == pytest.approx([v for _, v in from_json[kind][metric]], rel=1e-3)

    chart = tmp_path / "curves.png"
    result = run_cli(USER_DIR.parent / "palm_tools" / "plot.py", root / "json.log", root / "tb", "--labels", "log",
                     "events", "-o", chart)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    points = sum(len(series) for curves in (from_json, from_events) for kinds in curves.values() for series in kinds.values())
    assert f"2 run(s), {points} points" in result.stdout
    missing = run_cli(USER_DIR.parent / "palm_tools" / "plot.py", tmp_path / "curves.png", check=False)
    assert missing.returncode != 0 and "no 'loss' records found" in missing.stderr.strip().splitlines()[-1]
