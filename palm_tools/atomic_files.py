"""Output files that appear whole or not at all: written beside their final name, renamed into place at the end.

Only a regular file (or a new name) is replaced that way. A symbolic link is followed, so the file it points to is
replaced and the link stays; a named pipe, a device (``/dev/stdout``) or a socket is written directly, since
replacing it would cut its reader off (and, as root, replace the device with a file).
"""
import contextlib
import os
import stat
import tempfile
from typing import Optional


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


def file_in_the_way(folder) -> Optional[str]:
    """The file that stops ``folder`` from being made: ``folder`` itself or the nearest existing path above it, when
    that is not a folder; None when ``folder`` exists or can be made below a folder."""
    existing = os.path.abspath(os.fspath(folder))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return None if os.path.isdir(existing) else existing


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
    in_the_way = file_in_the_way(directory)
    if in_the_way:  # makedirs would say only "File exists"
        raise NotADirectoryError(f"{path}: {in_the_way} is a file, not a folder; give a path in a folder")
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
