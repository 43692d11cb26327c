"""Output files that appear whole or not at all: written beside their final name, renamed into place at the end."""
import contextlib
import os
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path in ``path``'s folder (created if missing); on success it is renamed onto ``path``
    with the permissions a plain ``open(path, "w")`` would give (``mkstemp``'s are 0600), on error removed."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
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
