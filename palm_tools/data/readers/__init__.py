"""Readers of the raw benchmark formats, one module per format. Each ``read_*`` function yields
``(source, target)`` text pairs (one line each) and records in a :class:`~.common.Counts` how many examples it read,
kept and dropped (with the reason); malformed input raises :class:`~.common.ReaderError` naming the file and the
record. :mod:`palm_tools.data.prepare` is the command line over them."""
