"""How the plugin stops on bad input: one line, ``error: what, where, what to do``, as the last line of the output
and without a traceback. Each part of the plugin names its own subclass, so that a caller can tell the kinds apart.

Two kinds. The checks of a command line, which run before fairseq builds anything, raise :class:`CommandError` (a
SystemExit, which fairseq's commands and Python let through as such). The checks inside the tasks, models,
criterions and loaders, which Python code calls too, raise :class:`InputError` as the built-in exception a caller
expects (:class:`InputValueError` is a ValueError, ...); on fairseq's command lines
:mod:`palm_plugin.fixes.input_errors` ends the command with its message as the same one line."""


class CommandError(SystemExit):
    """Stops the command with ``error: {message}`` as its last line."""

    prefix = ""

    def __init__(self, message):
        super().__init__(f"error: {self.prefix}{message}")


class InputError(Exception):
    """Bad input that its user can correct: a file, a folder, an option or options that do not fit each other. The
    message says what, where, and what to do."""


class InputValueError(InputError, ValueError):
    """A value the user gave (an option, a file's contents) that does not fit."""


class InputFileNotFoundError(InputError, FileNotFoundError):
    """A file or folder the user named, or one that should be beside it, is not there."""
