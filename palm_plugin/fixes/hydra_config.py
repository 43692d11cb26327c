"""fairseq-hydra-train: the sizes of the architecture a configuration names, and fairseq-train's checks.

A configuration's ``model: {_name: unilm_tiny}`` reaches fairseq's ``add_defaults``, which fills every model field
from the model's dataclass (unilm's: the base sizes), and then the architecture function, which keeps every field
already set: the run trains a base-size model without a word (fairseq #4675; ``--arch`` on fairseq-train's command
line is right, since its parser leaves the fields unset). And
the checks the plugin runs on a parsed command line (:mod:`.parsed_arguments`: checkpoint paths and the sizes a
fine-tuned checkpoint fixes, option ranges, generation options) never see a configuration that no parser made.

:func:`install` wraps ``add_defaults`` where ``fairseq_cli.train.main`` calls it, right after importing the plugin.
On fairseq-hydra-train's road (its module is loaded; so in the processes it spawns too) and for a model of the
plugin named by an architecture, the architecture fills the fields the configuration does not set before the
dataclass fills the rest; then the checks run on the configuration flattened as fairseq-train's namespace, the
model and task fields the configuration sets counting as given, and what they adopt is written back.
"""
import argparse
import functools
import sys

from omegaconf import DictConfig, OmegaConf, open_dict

from palm_plugin.fixes import parsed_arguments

# the namespace attribute that holds a group's ``_name`` (fairseq's convert_namespace_to_omegaconf, reversed)
NAMED_GROUPS = {"model": "arch", "task": "task", "criterion": "criterion", "optimizer": "optimizer",
                "lr_scheduler": "lr_scheduler", "bpe": "bpe", "tokenizer": "tokenizer", "scoring": "scoring"}
# the groups whose fields a configuration sets count as given to the checks (sizes, segments: checkpoint_paths)
GIVEN_GROUPS = ("model", "task")


def on_hydra_road():
    return "fairseq_cli.hydra_train" in sys.modules


def _group(cfg, name):
    node = cfg.get(name)
    if isinstance(node, str):  # ``model: unilm_tiny``, which add_defaults reads as the _name
        node = DictConfig({"_name": node})
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_dict(node) else {}


def fill_from_architecture(cfg) -> None:
    """Set the model fields ``cfg`` leaves out to its architecture's values, for the plugin's models."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY

    model = _group(cfg, "model")
    arch = model.get("_name")
    family = ARCH_MODEL_NAME_REGISTRY.get(arch)
    if family is None or family == arch or not MODEL_REGISTRY[family].__module__.startswith("palm_plugin."):
        return
    args = argparse.Namespace(**model)
    ARCH_CONFIG_REGISTRY[arch](args)
    fields = MODEL_DATACLASS_REGISTRY[family].__dataclass_fields__
    with open_dict(cfg):
        cfg.model = {**model, **{k: v for k, v in vars(args).items() if k in fields}}


def flatten(cfg) -> argparse.Namespace:
    """``cfg``'s fields as fairseq-train's parser gives them: one namespace, each group's ``_name`` as ``--arch``,
    ``--task``, ... (a field in two groups, ``lr`` or ``fp16``, holds the same value in both)."""
    values = {}
    for group in cfg:
        fields = _group(cfg, group)
        for key, value in fields.items():
            if not key.startswith("_"):
                values.setdefault(key, value)
        if group in NAMED_GROUPS and fields.get("_name") is not None:
            values[NAMED_GROUPS[group]] = fields["_name"]
    return argparse.Namespace(**values)


def check(cfg, given) -> None:
    """Run fairseq-train's checks on ``cfg`` as if the fields ``given`` were its command line's flags, and write back
    what they change (the sizes and segments adopted from ``checkpoint.finetune_from_model``)."""
    args = flatten(cfg)
    before = dict(vars(args))
    parsed_arguments.run_checks(args, ["--" + name.replace("_", "-") for name in sorted(given)])
    changed = {k: v for k, v in vars(args).items() if k not in NAMED_GROUPS.values() and before.get(k, v) != v}
    with open_dict(cfg):
        for group in cfg:
            node = cfg[group]
            for key in changed.keys() & (node.keys() if OmegaConf.is_dict(node) else set()):
                node[key] = changed[key]


def _checked_defaults(add_defaults):
    @functools.wraps(add_defaults)
    def checked(cfg):
        if not on_hydra_road():
            return add_defaults(cfg)
        given = {key for group in GIVEN_GROUPS for key in _group(cfg, group) if not key.startswith("_")}
        fill_from_architecture(cfg)
        add_defaults(cfg)
        check(cfg, given)

    checked.__palm_plugin__ = True
    return checked


def install():
    """Wrap ``add_defaults`` in fairseq and in the commands that imported it (idempotent)."""
    from fairseq.dataclass import initialize

    for module in (initialize, sys.modules.get("fairseq_cli.train"), sys.modules.get("fairseq_cli.hydra_train")):
        add_defaults = getattr(module, "add_defaults", None)
        if add_defaults is not None and not getattr(add_defaults, "__palm_plugin__", False):
            module.add_defaults = _checked_defaults(add_defaults)
