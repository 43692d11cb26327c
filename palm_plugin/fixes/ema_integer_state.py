"""``--store-ema`` on a model with integer state.

fairseq's EMA decays every entry of the model's state dict in place (``ema_param.mul_(decay)``), which torch refuses
for an integer tensor ("result type Float can't be cast to the desired output type Long"): training stops at the
first EMA step. An integer entry is a count or a record, not a weight (here the dictionary record of
:mod:`palm_plugin.modules.dictionary_check`; in torch's BatchNorm, ``num_batches_tracked``), so :func:`install` makes
EMA copy it, as it copies its ``skip_keys``.
"""


def install():
    """Patch ``fairseq.models.ema.EMA.__init__`` (idempotent)."""
    from fairseq.models.ema import EMA

    init = EMA.__init__
    if getattr(init, "__palm_plugin__", False):
        return

    def init_copying_integers(self, model, config, device=None, skip_keys=None):
        integers = {key for key, value in model.state_dict().items() if not value.is_floating_point()}
        init(self, model, config, device, set(skip_keys or ()) | integers)

    init_copying_integers.__palm_plugin__ = True
    EMA.__init__ = init_copying_integers
