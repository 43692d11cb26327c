"""Multi-process training with ``torchrun`` on machines without GPUs (and the same flags with GPUs).

fairseq's launcher support has two gaps on CPU, both fixed here when the plugin is imported (before fairseq's
``call_main`` decides how to start):

* ``_infer_torch_distributed_launch_init`` sets ``device_id = rank % torch.cuda.device_count()``, a division by
  zero without GPUs; on CPU the device id must stay 0 (any other value makes fairseq select a CUDA device).
* ``infer_init_method`` ignores torchrun's environment unless ``--distributed-world-size`` is also given, and its
  default on CPU is 1: every process then trains alone on the whole data and the run looks healthy. Under torchrun
  the world size is known (``WORLD_SIZE``), so it is taken from there.

Without torchrun fairseq starts the processes itself, one a GPU, and on a machine with fewer GPUs than
``--distributed-world-size`` it fails or does nothing: an assertion under a traceback on one machine, a crash after
the model is built when ``--distributed-port`` is given without SLURM, and with ``--distributed-init-method`` and no GPU
no process at all, exit status 0. Each stops here with what to do instead (torchrun on CPU).

With these, one invocation works everywhere::

    torchrun --nproc_per_node 2 $(which fairseq-train) --cpu --distributed-backend gloo ...   # CPU
    torchrun --nproc_per_node 8 $(which fairseq-train) ...                                    # one node, 8 GPUs
    torchrun --nnodes 2 --node_rank R --master_addr HOST --nproc_per_node 8 $(which fairseq-train) ...
"""
import logging
import os
from typing import Optional

import torch

from palm_plugin.errors import InputValueError

logger = logging.getLogger(__name__)

_TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def _launched_by_torchrun() -> bool:
    return all(name in os.environ for name in _TORCHRUN_VARIABLES)


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def _torchrun_on_cpu(processes: int) -> str:
    return (f"torchrun --nproc_per_node {processes} $(which fairseq-train) ... --cpu --distributed-backend gloo "
            "--ddp-backend legacy_ddp (docs/training.md)")


def too_few_gpus(cfg) -> str:
    """Why one machine cannot run ``--distributed-world-size`` processes, one a GPU (fairseq's single-node road)."""
    processes, gpus = cfg.distributed_world_size, torch.cuda.device_count()
    advice = (f"to train on {processes} CPU processes, start them with {_torchrun_on_cpu(processes)}" if gpus == 0 else
              f"use --distributed-world-size {gpus} or fewer, or start the processes of several machines with "
              "torchrun (docs/training.md)")
    return (f"--distributed-world-size {processes} starts {processes} processes on this machine, one a GPU, and it "
            f"has {_gpus(gpus)}: {advice}")


def nothing_starts(cfg) -> Optional[str]:
    """Why the processes fairseq inferred from ``cfg`` would not train: none started, or one alone in a world of
    several (None when they would)."""
    if cfg.tpu or cfg.distributed_world_size <= 1:
        return None
    if cfg.distributed_init_method is None:
        return (f"--distributed-world-size {cfg.distributed_world_size}, and nothing starts the other processes: "
                "fairseq reads torchrun's variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK: unset here) or "
                f"SLURM's, and --distributed-port {cfg.distributed_port} alone names no machine. Start the processes "
                "with torchrun, or leave out --distributed-port to start one a GPU on this machine (docs/training.md)")
    if not cfg.distributed_no_spawn and torch.cuda.device_count() == 0:
        return (f"--distributed-init-method {cfg.distributed_init_method} makes fairseq start one process a GPU, "
                f"and this machine has none: nothing would train. On CPU start the processes with "
                f"{_torchrun_on_cpu(cfg.distributed_world_size)}, or start each yourself with --distributed-no-spawn "
                "--distributed-rank R")
    return None


def install():
    """Patch fairseq's launcher inference (idempotent)."""
    from fairseq.distributed import utils

    if getattr(utils.infer_init_method, "__palm_plugin__", False):
        return
    infer_init_method = utils.infer_init_method
    infer_torchrun_init = utils._infer_torch_distributed_launch_init
    infer_single_node_init = utils._infer_single_node_init
    call_main = utils.call_main

    def infer_init_method_from_torchrun(cfg, force_distributed=False):
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if _launched_by_torchrun() and cfg.distributed_world_size == 1 and world_size > 1:
            logger.info(f"torchrun started {world_size} processes: using --distributed-world-size {world_size}")
            cfg.distributed_world_size = world_size
        inferred = infer_init_method(cfg, force_distributed)
        problem = nothing_starts(cfg)
        if problem:
            raise InputValueError(problem)
        return inferred

    def infer_single_node_init_on_enough_gpus(cfg):
        if cfg.distributed_world_size > torch.cuda.device_count():
            raise InputValueError(too_few_gpus(cfg))
        return infer_single_node_init(cfg)

    def call_main_given_a_way_to_start(cfg, main, **kwargs):
        given = cfg.distributed_training  # fairseq infers the rest only when no init method is given
        problem = nothing_starts(given) if given.distributed_init_method is not None else None
        if problem:
            raise InputValueError(problem)
        return call_main(cfg, main, **kwargs)

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
    utils._infer_single_node_init = infer_single_node_init_on_enough_gpus
    utils.call_main = call_main_given_a_way_to_start
