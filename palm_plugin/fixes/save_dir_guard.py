"""A ``--save-dir`` owned by one training run at a time, and resumed only by a run of the same task and model.

fairseq-train takes whatever ``--save-dir`` it is given: two runs started into one folder both exit 0, each saving
over the other's checkpoints; and a run of another task or architecture started in the folder of an earlier run
silently resumes that run's ``checkpoint_last.pt`` (its epoch, its optimizer, its data position) under the new
options. :func:`install` wraps ``fairseq.checkpoint_utils.load_checkpoint``, which ``fairseq-train`` calls once,
after building the model and before the first save (it checks the resume first, and locks once the data loaded):

* :func:`lock` takes ``SAVE_DIR/.fairseq-train.lock`` (:func:`palm_plugin.folder_lock.own_folder`: an ``flock``
  the kernel releases when the process ends, however it ends, so a lock left by a killed run blocks nothing); a
  second run stops with the first one's process id and what to do.
* :func:`check_resume` compares the checkpoint it is about to resume with the run: the parameters' names and shapes
  (any option that changes the model: the architecture, its sizes, ``--pseudo-masks``), the task and the task's
  options (they make the data: masking rates, lengths, segments). Options of the optimisation or of logging (lr,
  max-update, dropout, log intervals) may differ: resuming with another learning rate is normal.
"""
import logging
import os

from palm_plugin.errors import CommandError

logger = logging.getLogger(__name__)

LOCK_NAME = ".fairseq-train.lock"
# Task fields that say where the data is or how it is batched, not what an example is: they may change on resume
# (a data folder moved to another disk, another validation subset).
TASK_FIELDS_FREE = {"data", "seed", "train_subset", "valid_subset", "dataset_impl", "num_batch_buckets", "tpu",
                    "combine_valid_subsets", "required_seq_len_multiple"}
RESETS = ("reset_optimizer", "reset_lr_scheduler", "reset_meters", "reset_dataloader")


class SaveDirError(CommandError):
    """A --save-dir owned by another run, or holding another task's or model's checkpoint."""


def lock(save_dir):
    """Own ``save_dir`` for the life of this process; stop if another live process owns it."""
    from palm_plugin.folder_lock import FolderInUseError, own_folder

    try:
        own_folder(save_dir, LOCK_NAME, "fairseq-train", "this run would overwrite its checkpoints: wait for it to "
                   "end, or give this run another --save-dir")
    except FolderInUseError as error:
        raise SaveDirError(f"--save-dir {error}") from None


def _flag(name):
    return "--" + name.replace("_", "-")


def _differences(theirs, ours, skip=()):
    names = sorted((set(theirs) | set(ours)) - set(skip))
    return [f"{_flag(n)} {ours.get(n)} (checkpoint: {theirs.get(n)})" for n in names
            if not n.startswith(("_", "eval_")) and theirs.get(n) != ours.get(n)]


def check_resume(path, state, model_state, model_cfg, task_cfg, resets):
    """Stop unless the checkpoint ``state`` at ``path`` was saved by a run of this model and task.

    ``model_state``: this run's ``state_dict``; ``model_cfg`` / ``task_cfg``: this run's configuration sections as
    dicts; ``resets``: whether the run resets the optimizer, scheduler, meters and data loader (it then starts a new
    training from the weights, so only the model must match)."""
    from palm_plugin.fixes.checkpoint_paths import _config

    theirs_model, theirs_task = _config(state, "model"), _config(state, "task")
    weights = state.get("model") or {}
    shapes = {name: tuple(tensor.shape) for name, tensor in weights.items()}
    mine = {name: tuple(tensor.shape) for name, tensor in model_state.items()}
    model_differs = shapes != mine
    task_name, their_task_name = task_cfg.get("_name"), theirs_task.get("_name")
    task_differences = ([f"--task {task_name} (checkpoint: {their_task_name})"] if task_name != their_task_name else
                        _differences(theirs_task, task_cfg, TASK_FIELDS_FREE))
    if not model_differs and (resets or not task_differences):
        return
    arch, their_arch = model_cfg.get("_name") or model_cfg.get("arch"), theirs_model.get("_name") or theirs_model.get(
        "arch")
    what = task_differences[:]
    if model_differs:
        what.insert(0, f"--arch {arch} (checkpoint: {their_arch})" if arch != their_arch else
                    "the model's parameters (" + (", ".join(_differences(theirs_model, model_cfg)) or
                                                  "the task's dictionary") + ")")
    advice = ("give this run another --save-dir; to start from these weights there, pass --finetune-from-model "
              f"{path}" + ("" if model_differs else
                           ", or keep this --save-dir and pass --reset-optimizer --reset-lr-scheduler "
                           "--reset-meters --reset-dataloader"))
    raise SaveDirError(f"{path} was saved by another run than this one: {'; '.join(what)}. Resuming would continue "
                       f"that run under these options; {advice}")


def _resume_path(cfg, suffix):
    """The checkpoint fairseq's ``load_checkpoint`` would resume from (not one it fine-tunes from), or None."""
    if cfg.restore_file == "checkpoint_last.pt":
        path = os.path.join(cfg.save_dir, f"checkpoint_last{suffix or ''}.pt")
        return path if os.path.isfile(path) else None
    return cfg.restore_file.replace(".pt", suffix + ".pt") if suffix else cfg.restore_file


def install():
    """Wrap ``fairseq.checkpoint_utils.load_checkpoint`` (idempotent)."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint
    if getattr(load, "__palm_plugin__", False):
        return

    def load_checkpoint(cfg, trainer, **passthrough_args):
        from palm_plugin.fixes.checkpoint_paths import _config, read_checkpoint

        path = _resume_path(cfg, trainer.checkpoint_suffix)
        if path is not None and os.path.isfile(path):
            ours = {"cfg": trainer.cfg}
            check_resume(path, read_checkpoint(path, "--restore-file"), trainer.get_model().state_dict(),
                         _config(ours, "model"), _config(ours, "task"), all(getattr(cfg, r) for r in RESETS))
        loaded = load(cfg, trainer, **passthrough_args)
        # after loading (a run that stops on its data leaves the folder as it was), before the first save
        if not cfg.no_save and trainer.data_parallel_rank == 0:
            lock(cfg.save_dir)
        return loaded

    load_checkpoint.__palm_plugin__ = True
    checkpoint_utils.load_checkpoint = load_checkpoint
