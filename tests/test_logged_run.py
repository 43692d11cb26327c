"""palm_tools.experiments.logged_run: the runner palm-experiments and palm-gpu-check drive fairseq with."""
import sys
import time

from palm_tools.experiments.logged_run import run_logged


def test_output_status_and_cpu_time_of_a_run(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("earlier\n")
    status, wall, cpu = run_logged([sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS']); "
                                    "sum(range(3_000_000)); raise SystemExit(5)"], log, threads=3)
    lines = log.read_text().splitlines()
    assert status == 5 and lines[0] == "earlier" and lines[1].startswith("$ ") and lines[2] == "3"
    assert 0 < cpu <= wall + 1


def test_the_log_names_the_repository_files_relative_to_it(tmp_path):
    """A committed log names no folder of the machine that ran it: the repository's paths, in the command line and
    in what the tool prints, are relative (the runs start in the repository); earlier lines are left as they were."""
    from palm_tools.experiments.logged_run import REPO

    log = tmp_path / "log.txt"
    log.write_text(f"earlier {REPO}/kept\n")
    run_logged([sys.executable, "-c", "import os, sys; print('saving to', os.path.abspath('results/x.pt'), "
                "os.getcwd(), sys.argv[1])", f"{REPO}/palm_plugin"], log)
    lines = log.read_text().splitlines()
    assert lines[0] == f"earlier {REPO}/kept" and lines[1].endswith(" palm_plugin")
    assert lines[2] == "saving to results/x.pt . palm_plugin" and not (tmp_path / "log.txt.partial").exists()


def test_timeout_stops_the_tool_and_what_it_started(tmp_path):
    log = tmp_path / "log.txt"
    marker = tmp_path / "child-still-running"
    child = f"import time; time.sleep(3); open({str(marker)!r}, 'w')"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(30)"
    status, wall, _ = run_logged([sys.executable, "-c", parent], log, timeout=1)
    assert status == 124 and wall < 20 and "stopped after 1 s" in log.read_text()
    time.sleep(4)
    assert not marker.exists(), "the child of a stopped tool went on"


def test_a_terminated_driver_stops_its_runs_and_what_they_started(tmp_path):
    """palm-experiments stopped with SIGTERM used to leave its fairseq processes running (each leads a session of its
    own); the runs going on, and their children, now stop with it."""
    import signal
    import subprocess

    started, marker = tmp_path / "started", tmp_path / "child-still-running"
    child = f"import time; time.sleep(3); open({str(marker)!r}, 'w')"
    run = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
           f"open({str(started)!r}, 'w'); time.sleep(30)")
    driver = ("import sys; from palm_tools.experiments import logged_run; logged_run.stop_runs_on_termination(); "
              f"logged_run.run_logged([sys.executable, '-c', {run!r}], {str(tmp_path / 'log.txt')!r})")
    process = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.time() + 30
    while not started.exists() and time.time() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 128 + signal.SIGTERM
    time.sleep(4)
    assert not marker.exists(), "a run of a terminated driver went on"


def test_a_run_that_starts_while_the_driver_is_stopped_stops_and_none_starts_after(tmp_path, monkeypatch):
    """The runs go on in threads: one whose process started just after the stop handler read the runs going on ran
    to its end while the driver waited for its thread, and wrote its result (CI saw palm-demo's killed pre-training
    finish). It now stops itself, and a run asked for after the stop starts nothing."""
    import signal
    import subprocess

    from palm_tools.experiments import logged_run

    stopping = logged_run._STOPPING
    popen = subprocess.Popen

    def popen_then_stop(*args, **kwargs):  # the signal arrives as the process starts, before it is recorded
        process = popen(*args, **kwargs)
        stopping.set()
        return process

    monkeypatch.setattr(subprocess, "Popen", popen_then_stop)
    try:
        log = tmp_path / "log.txt"
        status, wall, _ = run_logged([sys.executable, "-c", "import time; time.sleep(30)"], log)
        assert status == -signal.SIGTERM and wall < 20
        monkeypatch.setattr(subprocess, "Popen", popen)
        assert run_logged([sys.executable, "-c", "open('x', 'w')"], tmp_path / "after.txt") == (
            128 + signal.SIGTERM, 0.0, 0.0)
        assert not (tmp_path / "after.txt").exists()
    finally:
        stopping.clear()
