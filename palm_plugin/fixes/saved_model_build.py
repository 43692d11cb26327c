"""Tell a model whether it is being built to receive a saved checkpoint.

fairseq builds a model from a checkpoint's configuration (``checkpoint_utils.load_model_ensemble_and_task``, used
by fairseq-generate, fairseq-interactive and hub loading) with ``task.build_model(cfg, from_checkpoint=True)``, but
``fairseq.models.build_model`` does not hand ``from_checkpoint`` on to ``Model.build_model(cfg, task)``. A model
that initialises itself from a file named in its configuration (PALM's ``--roberta-path``) would read that file
again at inference, failing once it has moved and overwriting the trained weights if it is found. Tasks of other
plugins and fairseq's own (``translation``) all go through ``fairseq.models.build_model``: :func:`install` wraps it
so that :func:`building_saved_model` is True while it builds a model with ``from_checkpoint=True``.

``fairseq-train`` has the same gap: it builds a new model, then replaces all its weights from
``checkpoint_last.pt`` (resuming), ``--restore-file`` or ``--finetune-from-model``. When the command line says one
of those will be loaded, :func:`building_saved_model` is True during that run's build too, so a resumed run does
not need the RoBERTa file either.
"""
import contextvars
import os
import sys

_SAVED = contextvars.ContextVar("palm_plugin_building_saved_model", default=False)
_TRAINING_WILL_LOAD = contextvars.ContextVar("palm_plugin_training_will_load_checkpoint", default=False)


def building_saved_model() -> bool:
    """True inside ``fairseq.models.build_model(..., from_checkpoint=True)``, and while ``fairseq-train`` builds a
    model whose weights it will then load from a checkpoint."""
    return _SAVED.get() or _TRAINING_WILL_LOAD.get()


def building_from_checkpoint() -> bool:
    """True inside ``fairseq.models.build_model(..., from_checkpoint=True)`` only: a model built from a checkpoint's
    configuration to be used (fairseq-generate, fairseq-interactive, hub loading), not to be trained on."""
    return _SAVED.get()


def training_will_load_checkpoint(checkpoint_cfg) -> bool:
    """Whether fairseq-train's ``checkpoint_utils.load_checkpoint`` will replace the built model's weights (its rules:
    ``checkpoint_last.pt`` in ``--save-dir`` if present, else ``--finetune-from-model``; a ``--restore-file`` that
    exists; a missing one trains from scratch)."""
    if checkpoint_cfg.restore_file == "checkpoint_last.pt":
        last = os.path.join(checkpoint_cfg.save_dir, "checkpoint_last.pt")
        return os.path.exists(last) or checkpoint_cfg.finetune_from_model is not None
    return os.path.exists(checkpoint_cfg.restore_file)


def _install_in_fairseq_train() -> None:
    """Wrap ``fairseq_cli.train.main`` when fairseq-train is the running command (its ``cli_main`` looks ``main`` up
    after the plugin is imported)."""
    train = sys.modules.get("fairseq_cli.train")
    if train is None or getattr(train.main, "__palm_plugin__", False):
        return
    main = train.main

    def main_telling_models_what_will_load(cfg, *args, **kwargs):
        token = _TRAINING_WILL_LOAD.set(training_will_load_checkpoint(cfg.checkpoint))
        try:
            return main(cfg, *args, **kwargs)
        finally:
            _TRAINING_WILL_LOAD.reset(token)

    main_telling_models_what_will_load.__palm_plugin__ = True
    train.main = main_telling_models_what_will_load


def install():
    """Wrap ``fairseq.models.build_model``, and fairseq-train's ``main`` when it runs (idempotent)."""
    from fairseq import models

    _install_in_fairseq_train()
    build_model = models.build_model
    if getattr(build_model, "__palm_plugin__", False):
        return

    def build_model_telling_origin(cfg, task, from_checkpoint=False):
        token = _SAVED.set(bool(from_checkpoint))
        try:
            return build_model(cfg, task, from_checkpoint)
        finally:
            _SAVED.reset(token)

    build_model_telling_origin.__palm_plugin__ = True
    models.build_model = build_model_telling_origin
