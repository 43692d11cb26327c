"""palm_plugin: PALM, UniLM and UniLMv2 for fairseq (``--user-dir palm_plugin``).

Importing this package (directly, through ``--user-dir palm_plugin``, or through the path printed by
``python -c "import palm_plugin, os; print(os.path.dirname(palm_plugin.__file__))"``) does two things:

1. installs the plugin's fixes of fairseq (:mod:`palm_plugin.fixes`: weights-only checkpoint loading under
   torch >= 2.6, atomic checkpoint copies, no dropped last batch, ``--help`` with the task's options, n-gram blocking
   on CPU, torchrun without GPUs, ``--cpu --bf16``);
2. imports every module of ``criterions/``, ``models/``, ``optim/`` and ``tasks/``, whose decorators register the
   plugin's names with fairseq's registries.

The command-line tools (scoring, benchmark readers, checkpoint conversion, benchmarks) live beside this package in
``palm_tools`` and are not imported here.
"""
import importlib
import os

from palm_plugin import fixes

fixes.install()


def _import_submodules(subpackage: str) -> None:
    """Import every public module of ``palm_plugin.<subpackage>`` (registration happens on import)."""
    directory = os.path.join(os.path.dirname(__file__), subpackage)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py") and not name.startswith("_"):
            importlib.import_module(f"{__name__}.{subpackage}.{name[:-3]}")


for _subpackage in ("criterions", "models", "optim", "tasks"):
    _import_submodules(_subpackage)

fixes.install_after_registration()
