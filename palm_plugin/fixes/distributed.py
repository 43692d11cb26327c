"""Multi-process training with ``torchrun`` on machines without GPUs (and the same flags with GPUs).

fairseq's launcher support has two gaps on CPU, both fixed here when the plugin is imported (before fairseq's
``call_main`` decides how to start):

* ``_infer_torch_distributed_launch_init`` sets ``device_id = rank % torch.cuda.device_count()``, a division by
  zero without GPUs; on CPU the device id must stay 0 (any other value makes fairseq select a CUDA device).
* ``infer_init_method`` ignores torchrun's environment unless ``--distributed-world-size`` is also given, and its
  default on CPU is 1: every process then trains alone on the whole data and the run looks healthy. Under torchrun
  the world size is known (``WORLD_SIZE``), so it is taken from there.

With these, one invocation works everywhere::

    torchrun --nproc_per_node 2 $(which fairseq-train) --cpu --distributed-backend gloo ...   # CPU
    torchrun --nproc_per_node 8 $(which fairseq-train) ...                                    # one node, 8 GPUs
    torchrun --nnodes 2 --node_rank R --master_addr HOST --nproc_per_node 8 $(which fairseq-train) ...
"""
import logging
import os

import torch

logger = logging.getLogger(__name__)

_TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def _launched_by_torchrun() -> bool:
    return all(name in os.environ for name in _TORCHRUN_VARIABLES)


def install():
    """Patch fairseq's launcher inference (idempotent)."""
    from fairseq.distributed import utils

    if getattr(utils.infer_init_method, "__palm_plugin__", False):
        return
    infer_init_method = utils.infer_init_method
    infer_torchrun_init = utils._infer_torch_distributed_launch_init

    def infer_init_method_from_torchrun(cfg, force_distributed=False):
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if _launched_by_torchrun() and cfg.distributed_world_size == 1 and world_size > 1:
            logger.info(f"torchrun started {world_size} processes: using --distributed-world-size {world_size}")
            cfg.distributed_world_size = world_size
        return infer_init_method(cfg, force_distributed)

    def infer_torchrun_init_without_gpus(cfg):
        if torch.cuda.device_count() > 0:
            return infer_torchrun_init(cfg)
        cfg.distributed_init_method = "env://"
        cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
        cfg.distributed_rank = int(os.environ["RANK"])
        cfg.device_id = 0
        cfg.distributed_no_spawn = True  # torchrun created the processes

    infer_init_method_from_torchrun.__palm_plugin__ = True
    utils.infer_init_method = infer_init_method_from_torchrun
    utils._infer_torch_distributed_launch_init = infer_torchrun_init_without_gpus
