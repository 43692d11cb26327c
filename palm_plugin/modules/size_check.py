"""Model sizes that cannot build a working network, refused with the option to change.

Without this, ``--encoder-layers 0`` trains a network without layers (an embedding and an output layer) and logs
losses as if nothing were wrong, and a width that the heads do not divide stops in an assertion inside fairseq or
torch that names no option.
"""

from palm_plugin.errors import InputValueError


def check_sizes(cfg, counts, width, heads):
    """Raise InputValueError when an option of ``counts`` (layers, feed-forward sizes, ...) is below 1, or ``width`` is
    not divided by each option of ``heads``; options are field names of ``cfg``."""
    for name in (*counts, width, *heads):
        if getattr(cfg, name) < 1:
            raise InputValueError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: must be at least 1")
    for name in heads:
        if getattr(cfg, width) % getattr(cfg, name):
            raise InputValueError(f"--{width.replace('_', '-')} {getattr(cfg, width)} is not divisible by "
                                  f"--{name.replace('_', '-')} {getattr(cfg, name)}: each head takes an equal share; "
                                  f"give a width that is a multiple of the heads")
