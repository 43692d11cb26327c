"""What the UniLM family's own attention kernels share (``--attention-impl flex`` and ``triton``,
:mod:`palm_plugin.modules.attention_impl`): the object every layer of one forward receives in place of a dense mask,
and the refusals that name the option to use instead."""
import abc

import torch

from palm_plugin.errors import CommandError

SDPA_INSTEAD = "use --attention-impl sdpa"


class TritonAttentionError(CommandError):
    """What ``--attention-impl triton`` cannot do, with the option to use instead."""

    prefix = "--attention-impl triton: "


class FusedMask(abc.ABC):
    """What every layer of one forward shares under ``flex`` or ``triton``: the mask (and UniLMv2's bias) in the form
    the kernel reads; :meth:`attend` is the layer's attention."""

    @abc.abstractmethod
    def attend(self, q, k, v, dropout_p: float = 0.0) -> torch.Tensor:
        """``dropout(softmax(q k^T / sqrt(d) + bias, masked), dropout_p) v`` for ``q``, ``k``, ``v``
        ``(B, h, T, d)``."""
