"""Output files that appear whole or not at all: written beside their final name, renamed into place at the end.

Only a regular file (or a new name) is replaced that way. A symbolic link is followed, so the file it points to is
replaced and the link stays; a named pipe, a device (``/dev/stdout``) or a socket is written directly, since
replacing it would cut its reader off (and, as root, replace the device with a file).
"""
import contextlib
import os
import stat
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _is_special(path) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a folder (a pipe, a device, a socket)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path in ``path``'s folder (created if missing); on success it is renamed onto ``path``
    with the permissions a plain ``open(path, "w")`` would give (``mkstemp``'s are 0600), on error removed.
    A link is followed; a pipe or a device is yielded as it is (see the module's docstring)."""
    path = os.path.realpath(os.fspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a folder: give a file name (e.g. {os.path.join(path, 'out.txt')})")
    if _is_special(path):
        yield path
        return
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(handle)
    try:
        yield temporary
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


@contextlib.contextmanager
def atomic_open(path, mode="w", encoding="utf-8"):
    """``open`` a temporary file as :func:`atomic_path` does (text, UTF-8 by default)."""
    with atomic_path(path) as temporary, open(temporary, mode, encoding=encoding) as handle:
        yield handle


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
