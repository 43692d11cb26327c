"""How the plugin stops a command on bad input: one line, ``error: what, where, what to do``, as the last line of
the output and without a traceback (a SystemExit, which fairseq's command-line tools and Python let through as
such). Each part of the plugin names its own subclass, so that a caller can tell the kinds apart."""


class CommandError(SystemExit):
    """Stops the command with ``error: {message}`` as its last line."""

    prefix = ""

    def __init__(self, message):
        super().__init__(f"error: {self.prefix}{message}")
