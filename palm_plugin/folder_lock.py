"""One process at a time in a folder: a run's save dir (fairseq-train, :mod:`palm_plugin.fixes.save_dir_guard`), a
palm-data output folder, a demo's folder. Shared by the plugin and the tools (the tools import it from here)."""
import os


class FolderInUseError(Exception):
    """Another live process owns the folder; the message names it and says what to do."""


_owned = {}  # folder -> its open lock file, kept for the life of the process


def own_folder(folder, lock_name, who, advice):
    """Own ``folder`` for the life of this process, or raise :class:`FolderInUseError` naming the live process
    (``who``, e.g. "fairseq-train") that owns it and ``advice``.

    The lock is an ``flock`` on ``folder/lock_name``, which holds the owner's process id: the kernel releases it
    when the process ends, however it ends, so a lock file left by a killed run blocks nothing. A process the owner
    forked holds it as well; when the recorded owner is dead, such a leftover is waited for (30 s at most)."""
    folder = os.path.abspath(folder)
    if folder in _owned:
        return
    os.makedirs(folder, exist_ok=True)
    handle = open(os.path.join(folder, lock_name), "a+")  # not "w": that would erase the owner's id
    os.set_inheritable(handle.fileno(), False)
    if not _take(handle):
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        # the owner is dead but a process it forked (a data-loader worker) still holds the lock: it ends soon
        if not (owner.isdigit() and not _alive(int(owner)) and _take(handle, wait=30)):
            handle.close()
            raise FolderInUseError(f"{folder} is in use by another {who} (process {owner}); {advice}")
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _owned[folder] = handle


def _take(handle, wait=0.0):
    """Whether this process got the ``flock`` of ``handle`` (trying for ``wait`` seconds)."""
    import fcntl
    import time

    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def release_folder(folder):
    """Give ``folder`` up, its lock file left empty (the end of the process releases the lock too, and leaves the
    last owner's id, which names no live process)."""
    handle = _owned.pop(os.path.abspath(folder), None)
    if handle is not None:
        handle.truncate(0)
        handle.close()
