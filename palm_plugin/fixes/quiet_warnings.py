"""Silence the warnings every fairseq command prints although nothing is wrong.

fairseq-fixed composes its configuration with hydra's deprecated ``hydra.experimental`` API and a 1.0-style config
package, so hydra >= 1.1 prints six deprecation warnings on every run; its data loaders pass ``pin_memory=True``,
about which torch warns on a machine without an accelerator; its training step and attention call torch APIs that
torch >= 2.4 deprecates (``torch.cuda.amp.autocast``, a float attention mask beside a boolean padding mask). None of
these concerns the user. Only these exact
messages are filtered; any other warning still shows.

(fairseq's "Please install tensorboardX" notice is printed while fairseq imports its own tasks, before any plugin
is loaded: installing ``tensorboardX``, as requirements.txt does, removes it; ``--tensorboard-logdir`` itself
writes through ``torch.utils.tensorboard``, which needs the ``tensorboard`` package.)
"""
import warnings

MESSAGES = (
    r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental",
    r"\s*The version_base parameter is not specified",
    r"In 'config': Usage of deprecated keyword in package header",
    r"\s*'config' is validated against ConfigStore schema with the same name",
    r"\s*The strict flag in the compose API is deprecated",
    r"'pin_memory' argument is set as true but no accelerator is found",
    r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated",
    r"Support for mismatched key_padding_mask and attn_mask is deprecated",
)


def install():
    """Add the warning filters (idempotent: ``warnings`` drops duplicate filters)."""
    for message in MESSAGES:
        warnings.filterwarnings("ignore", message=message)
