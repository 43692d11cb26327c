"""Running the console scripts a tool drives (fairseq-train, fairseq-generate, palm-data...): found in this
environment, their output appended to a log file, their exit status, wall time and CPU time returned."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_RUNNING = set()  # the process ids of the runs going on (each leads its own process group)
# set when the driver is stopped: a run whose process starts after the handler read _RUNNING (in another thread)
# stops itself, else it ran to its end while the driver waited for that thread, and wrote its result
_STOPPING = threading.Event()


def stop_runs_on_termination():
    """On SIGTERM or SIGHUP, stop every run going on (and what it started) before exiting: each runs in a session of
    its own, so the signal would not reach it."""
    def stop(signum, _frame):
        _STOPPING.set()
        for pid in list(_RUNNING):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        sys.exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)


def tool_path(name: str) -> str:
    """A console script of this environment: beside its Python, else on PATH (``pip install --target`` and
    ``--user`` put scripts elsewhere)."""
    beside = BIN / name
    return str(beside) if beside.exists() else (shutil.which(name) or str(beside))


def run_logged(command, log, threads: int = 1, timeout: float = None):
    """Run ``command`` (its first item a console script name or a path) from the repository with ``threads`` OpenMP
    threads, its output appended to ``log`` after the command line.

    Returns:
        (exit status, wall seconds, CPU seconds): a run stopped at ``timeout`` has status 124 and a line saying so
        in the log. CPU seconds are the user + system time of the process and its children, what the run costs
        whatever else the machine is doing (read with ``os.wait4``, per process, so runs in threads do not mix).
    """
    command = [tool_path(str(command[0])) if os.sep not in str(command[0]) else str(command[0])] + [
        str(a) for a in command[1:]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    started = time.time()
    if _STOPPING.is_set():  # the driver is stopping: start nothing more
        return 128 + signal.SIGTERM, 0.0, 0.0
    with open(log, "a") as output:
        offset = output.tell()
        output.write("$ " + " ".join(command) + "\n")
        output.flush()
        process = subprocess.Popen(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        _RUNNING.add(process.pid)
        if _STOPPING.is_set():  # stopped between the line above and the handler's reading of _RUNNING
            os.killpg(process.pid, signal.SIGTERM)
        try:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            while pid == 0 and (timeout is None or time.time() - started < timeout):
                time.sleep(0.2)
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        finally:
            _RUNNING.discard(process.pid)
        stopped = pid == 0
        if stopped:  # the tool and whatever it started (data loader workers)
            os.killpg(process.pid, signal.SIGKILL)
            _, status, usage = os.wait4(process.pid, 0)
            output.write(f"\n{Path(command[0]).name}: stopped after {timeout} s\n")
        process.returncode = 124 if stopped else os.waitstatus_to_exitcode(status)
    without_repository_folder(log, offset)
    return process.returncode, time.time() - started, usage.ru_utime + usage.ru_stime


def without_repository_folder(log, offset=0):
    """Name the repository's files relative to it in ``log`` from byte ``offset`` on (the command line and what
    fairseq prints: checkpoint paths, ``--user-dir``), so that a committed log names no folder of the machine that
    ran it; the runs start in the repository, so the relative paths are the ones they used."""
    data = Path(log).read_bytes()
    root = str(REPO).encode()
    if root not in data[offset:]:
        return
    tail = data[offset:].replace(root + b"/", b"").replace(root, b".")
    partial = Path(f"{log}.partial")
    partial.write_bytes(data[:offset] + tail)
    os.replace(partial, log)


def run_checked(tool, args, log):
    """Run a tool, its output appended to ``log``; return the CPU seconds it used (user + system: unlike wall time,
    what a run costs whatever else the machine is doing). A failure raises RuntimeError naming its last line."""
    returncode, _, cpu = run_logged([tool, *args], log)
    if returncode != 0:
        lines = [line for line in Path(log).read_text().splitlines() if line.strip()]
        # the first line names the cause (fairseq's and our tools' last line), the table shows it
        raise RuntimeError(f"{tool} failed (exit {returncode}): {lines[-1][:200]}; see {log}\n" +
                           "\n".join(lines[-15:]))
    return cpu
