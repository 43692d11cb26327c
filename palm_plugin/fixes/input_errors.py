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

hydra catches the exceptions of fairseq-hydra-train itself and prints a shortened traceback, then a line about
``HYDRA_FULL_ERROR``, below the message; with that variable set it lets them through. So on that command's road the
plugin sets ``HYDRA_FULL_ERROR=1`` (unless the user set it): the plugin's errors end as one line, others with
Python's whole traceback.
"""
import os
import sys

from palm_plugin.errors import InputError
from palm_plugin.fixes.hydra_config import on_hydra_road

TRACEBACK = "PALM_PLUGIN_TRACEBACK"  # set to 1 to keep Python's traceback above the message


def on_fairseq_command() -> bool:
    """Whether this process runs one of fairseq's commands: its console script, or ``python -m fairseq_cli.X``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (os.path.basename(sys.argv[0] if sys.argv else "").startswith("fairseq-")
            or (spec is not None and spec.name.startswith("fairseq_cli.")))


def ends_in_one_line(error: BaseException) -> bool:
    """Whether ``error``, uncaught, ends this process as one line rather than below a traceback."""
    return isinstance(error, InputError) and on_fairseq_command() and os.environ.get(TRACEBACK, "") in ("", "0")


def _one_line_excepthook(excepthook):
    def one_line_excepthook(kind, error, traceback):
        if ends_in_one_line(error):
            sys.stderr.write(f"error: {error}\n")
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
