"""matplotlib as every tool draws with it: the file backend (no display on a server or a card), and its own
loggers kept at WARNING: importing fairseq leaves the root logger at DEBUG, under which matplotlib's font search
printed about 2,000 lines in the middle of palm-demo's output."""
import logging


def pyplot():
    """``matplotlib.pyplot``, set up as the module docstring says."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # before the import, which logs too
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
