"""A process whose fairseq batch-loading thread is inside a torch operation when the main thread ends exits cleanly
(palm_plugin/fixes/loader_exit.py): without the fix it aborts with "terminate called without an active exception"."""
import subprocess
import sys

import pytest

from tests.conftest import REPO, tool_env

# The thread makes each batch with torch operations, as a collater does. With a large buffer it is inside one when
# the main thread ends; with a buffer of one it waits in its queue's put.
SCRIPT = """
import atexit, sys, threading, torch

# Registered before the plugin's handler, so it runs after it: is a loading thread left for the shutdown?
atexit.register(lambda: print("threads left:", threading.active_count() - 1))
import palm_plugin
from fairseq.data.iterators import BufferedIterator

class Batches:
    def __len__(self):
        return 10_000

    def __iter__(self):
        a = torch.randn(1200, 1200)
        while True:
            a = torch.mm(a, a).clamp(-1, 1)
            yield a[0, :4].clone()

batches = BufferedIterator(int(sys.argv[1]), Batches())
next(batches)
next(batches)
"""


@pytest.mark.parametrize("buffer_size", [1, 1000])
def test_a_run_stopped_while_its_loading_thread_works_exits_cleanly(buffer_size):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(buffer_size)], cwd=REPO, env=tool_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "terminate called" not in result.stderr, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "threads left: 0"
