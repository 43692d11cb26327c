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


def test_timeout_stops_the_tool_and_what_it_started(tmp_path):
    log = tmp_path / "log.txt"
    marker = tmp_path / "child-still-running"
    child = f"import time; time.sleep(3); open({str(marker)!r}, 'w')"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(30)"
    status, wall, _ = run_logged([sys.executable, "-c", parent], log, timeout=1)
    assert status == 124 and wall < 20 and "stopped after 1 s" in log.read_text()
    time.sleep(4)
    assert not marker.exists(), "the child of a stopped tool went on"
