"""Tell a model whether it is being built to receive a saved checkpoint.

fairseq builds a model from a checkpoint's configuration (``checkpoint_utils.load_model_ensemble_and_task``, used
by fairseq-generate, fairseq-interactive and hub loading) with ``task.build_model(cfg, from_checkpoint=True)``, but
``fairseq.models.build_model`` does not hand ``from_checkpoint`` on to ``Model.build_model(cfg, task)``. A model
that initialises itself from a file named in its configuration (PALM's ``--roberta-path``) would read that file
again at inference, failing once it has moved and overwriting the trained weights if it is found. Tasks of other
plugins and fairseq's own (``translation``) all go through ``fairseq.models.build_model``: :func:`install` wraps it
so that :func:`building_saved_model` is True while it builds a model with ``from_checkpoint=True``.
"""
import contextvars

_SAVED = contextvars.ContextVar("palm_plugin_building_saved_model", default=False)


def building_saved_model() -> bool:
    """True inside ``fairseq.models.build_model(..., from_checkpoint=True)``."""
    return _SAVED.get()


def install():
    """Wrap ``fairseq.models.build_model`` (idempotent)."""
    from fairseq import models

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
