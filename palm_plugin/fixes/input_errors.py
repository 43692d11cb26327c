"""fairseq's commands end the plugin's errors of bad input below a traceback.

The tasks, models, criterions and checkpoint loaders check what they are given and raise an
:class:`~palm_plugin.errors.InputError` whose message says what, where and what to do; fairseq's commands let it
through, and Python prints thirty frames of traceback above that line. :func:`install` ends fairseq's commands
(``fairseq-train``, ``fairseq-generate``, ``fairseq-interactive``, ``fairseq-validate``, ``fairseq-hydra-train``, ...)
on such an error with ``error: {message}``, one line and exit status 1, as the checks of a command line end
(:class:`~palm_plugin.errors.CommandError`): Python's ``sys.excepthook`` prints it. Any other exception keeps its
traceback (a bug shows where it is), and so does a program that is not one of fairseq's commands (a Python script, a
test: Python code catches the built-in kind each error also is), and any run with ``PALM_PLUGIN_TRACEBACK=1`` (for a
bug report).

On a machine with several GPUs fairseq starts one process a GPU with ``torch.multiprocessing.spawn``; the error of
a child reaches the parent as torch's ``ProcessRaisedException``, the child's traceback as its text. When that
traceback ends in an InputError, the parent ends with its message the same way. Under ``torchrun`` each process
prints the line and also leaves it in the error file torchrun names it (``TORCHELASTIC_ERROR_FILE``), so that the
failure summary torchrun prints last shows the message where it showed a link to its documentation.

hydra catches the exceptions of fairseq-hydra-train itself and prints a shortened traceback, then a line about
``HYDRA_FULL_ERROR``, below the message; with that variable set it lets them through. So on that command's road the
plugin sets ``HYDRA_FULL_ERROR=1`` (unless the user set it): the plugin's errors end as one line, others with
Python's whole traceback.
"""
import json
import os
import sys
import time
from typing import Optional

from palm_plugin.errors import InputError
from palm_plugin.fixes.hydra_config import on_hydra_road

TRACEBACK = "PALM_PLUGIN_TRACEBACK"  # set to 1 to keep Python's traceback above the message


def on_fairseq_command() -> bool:
    """Whether this process runs one of fairseq's commands: its console script, or ``python -m fairseq_cli.X``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (os.path.basename(sys.argv[0] if sys.argv else "").startswith("fairseq-")
            or (spec is not None and spec.name.startswith("fairseq_cli.")))


def _kinds(kind=InputError):
    yield kind
    for subclass in kind.__subclasses__():
        yield from _kinds(subclass)


def spawned_input_error(error: BaseException) -> Optional[str]:
    """The message of the InputError that ended a process of ``torch.multiprocessing.spawn``, read from the child's
    traceback that the parent's exception carries (None for any other error)."""
    from torch.multiprocessing import ProcessRaisedException

    if not isinstance(error, ProcessRaisedException):
        return None
    last = str(error).rsplit("Traceback (most recent call last):", 1)[-1]  # the last of chained exceptions
    lines = last.strip("\n").splitlines()
    start = next((i for i, line in enumerate(lines) if line and not line.startswith(" ")), None)
    if start is None:
        return None
    kind, _, message = "\n".join(lines[start:]).partition(": ")
    names = {f"{k.__module__}.{k.__qualname__}" for k in _kinds()}
    return message if kind in names else None


def one_line(error: BaseException) -> Optional[str]:
    """The message that ends this process in one line when ``error`` is uncaught (None: it keeps its traceback)."""
    if not on_fairseq_command() or os.environ.get(TRACEBACK, "") not in ("", "0"):
        return None
    return str(error) if isinstance(error, InputError) else spawned_input_error(error)


def tell_torchrun(line: str) -> None:
    """Leave ``line`` where torchrun reads the failure of this process, in the format of its error files."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        with open(path, "w") as file:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                    "timestamp": str(int(time.time()))}}}, file)


def _one_line_excepthook(excepthook):
    def one_line_excepthook(kind, error, traceback):
        message = one_line(error)
        if message is not None:
            sys.stderr.write(f"error: {message}\n")
            tell_torchrun(f"error: {message}")
        else:
            excepthook(kind, error, traceback)

    one_line_excepthook.__palm_plugin__ = True
    return one_line_excepthook


def install() -> None:
    """Wrap Python's ``sys.excepthook``, and let hydra's errors through on fairseq-hydra-train's road (idempotent)."""
    if not getattr(sys.excepthook, "__palm_plugin__", False):
        sys.excepthook = _one_line_excepthook(sys.excepthook)
    if on_hydra_road():
        os.environ.setdefault("HYDRA_FULL_ERROR", "1")
