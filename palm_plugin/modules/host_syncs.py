"""The criteria's ``--syncs-at-start``: every host synchronisation of a training step before its first kernel.

Reading a count (``int(mask.sum())``) or indexing with a boolean mask (``x[mask]``: the result's size is on the
device) makes the host wait until the device has run everything queued before it. Inside a step, after the forward
pass was queued, that wait drains the queue and the host then launches the rest with the device idle. With
``--syncs-at-start`` a criterion turns each mask into indices (``nonzero``, one wait) before the model runs, when
nothing of the step is queued yet, and selects rows with ``index_select`` afterwards: the same rows in the same
order, so the same values (tests/test_speed_options.py), without a wait inside the step.
"""
import torch

SYNCS_AT_START_HELP = (
    "turn the step's masks into indices before the model runs, so that the host never waits for the device inside "
    "the step (palm_plugin/modules/host_syncs.py); same values, off by default (measured in docs/benchmarks-gpu.md)"
)


def flat_indices(mask: torch.Tensor) -> torch.Tensor:
    """Indices of the True entries of ``mask`` flattened, in order (one host synchronisation)."""
    return mask.reshape(-1).nonzero().squeeze(1)


def select(tensor: torch.Tensor, where: torch.Tensor, leading: int = 2) -> torch.Tensor:
    """``tensor[where]`` for a boolean mask over the first ``leading`` dimensions of ``tensor``; for indices from
    :func:`flat_indices`, the same rows taken from those dimensions flattened (no synchronisation)."""
    if where.dtype == torch.bool:
        return tensor[where]
    return tensor.flatten(0, leading - 1).index_select(0, where)


def count(where: torch.Tensor) -> int:
    """How many rows ``where`` selects: ``int(mask.sum())`` (a synchronisation) or the number of indices (none)."""
    return int(where.sum()) if where.dtype == torch.bool else where.numel()
