"""A run that ends as a crash after its checkpoints are saved.

fairseq's ``BufferedIterator`` loads batches ahead of training in a daemon thread (``BackgroundConsumer``). When
training stops before the epoch's end (``--max-update``, an error, Ctrl-C), that thread is still loading while the
interpreter shuts down, and Python ends a daemon thread where it next takes the GIL. Inside a torch operation (which
releases the GIL) that point is a C++ destructor, and the process aborts: "terminate called without an active
exception", exit status -6, after the run's work is done, so a script or a ``&&`` chain sees a failed run. How often
depends on timing (seen once in CI's ``fairseq-train --max-update 3``); a thread inside ``torch.mm`` at exit aborts
every time.

:func:`install` stops those threads at exit, before the shutdown, with fairseq's own stop: its length set to what it
has loaded, so it ends after the batch in hand, and its queue emptied so that its last ``put`` returns.
"""
import atexit
import logging
import queue
import threading
import time

logger = logging.getLogger(__name__)

# A batch in hand is loaded well within this; a thread still loading after it is left to the shutdown, with a warning.
STOP_SECONDS = 10.0


def stop_loading_threads(timeout: float = STOP_SECONDS) -> None:
    """End every live ``BackgroundConsumer`` after the batch it is loading; the batches it queued are dropped."""
    from fairseq.data.iterators import BackgroundConsumer

    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if not isinstance(thread, BackgroundConsumer):
            continue
        thread._max_len = 0  # its loop breaks after its next put
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                while True:
                    thread._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(0.05)
        if thread.is_alive():
            logger.warning(f"fairseq's batch-loading thread did not stop within {timeout:g} s of the exit; the "
                           f"process may abort as it shuts down (its checkpoints are written)")


def install() -> None:
    """Run :func:`stop_loading_threads` at exit (idempotent: the mark is on fairseq's class, which every import of
    the plugin shares)."""
    from fairseq.data.iterators import BackgroundConsumer

    if getattr(BackgroundConsumer, "__palm_plugin__", False):
        return
    BackgroundConsumer.__palm_plugin__ = True
    atexit.register(stop_loading_threads)
