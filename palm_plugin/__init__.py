"""palm_plugin: PALM, UniLM and UniLMv2 for fairseq.

Importing this package (directly, through ``--user-dir palm_plugin``, or through the path printed by
``python -c "import palm_plugin, os; print(os.path.dirname(palm_plugin.__file__))"``) does three things:

1. allow-lists, for torch's weights-only unpickler, exactly the types fairseq stores in checkpoints, so that
   fairseq-train / fairseq-generate load checkpoints safely under torch >= 2.6 (see :mod:`palm_plugin.safe_loading`);
2. fixes five fairseq behaviours: ``--help`` that lists no task, model or criterion options (see
   :mod:`palm_plugin.option_help`), torchrun without GPUs (see :mod:`palm_plugin.distributed`), the CPU n-gram
   blocker that blocks nothing (see :mod:`palm_plugin.modules.ngram_repeat_block`), non-atomic copies of
   checkpoint_last.pt / checkpoint_best.pt, so a killed run always leaves a loadable checkpoint
   (see :mod:`palm_plugin.checkpoint_copy`), and the last batch dropped when its size is not a multiple of
   ``--required-batch-size-multiple`` (see :mod:`palm_plugin.batch_remainder`);
3. imports every module of ``criterions/``, ``models/`` and ``tasks/``, whose decorators register the plugin's
   names with fairseq's registries.
"""
import importlib
import os

from palm_plugin import batch_remainder, checkpoint_copy, distributed, option_help, safe_loading

safe_loading.install()
checkpoint_copy.install()
batch_remainder.install()
option_help.install()


def _fix_cpu_ngram_blocking() -> None:
    """fairseq's CPU ``--no-repeat-ngram-size`` never blocks anything (see palm_plugin/modules/ngram_repeat_block.py);
    give every task's SequenceGenerator the fixed blocker, including fairseq's own translation task (PALM decoding)."""
    from fairseq import sequence_generator

    from palm_plugin.modules.ngram_repeat_block import PrefixNGramRepeatBlock

    sequence_generator.NGramRepeatBlock = PrefixNGramRepeatBlock


_fix_cpu_ngram_blocking()
distributed.install()


def _import_submodules(subpackage: str) -> None:
    """Import every public module of ``palm_plugin.<subpackage>`` (registration happens on import)."""
    directory = os.path.join(os.path.dirname(__file__), subpackage)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py") and not name.startswith("_"):
            importlib.import_module(f"{__name__}.{subpackage}.{name[:-3]}")


for _subpackage in ("criterions", "models", "tasks"):
    _import_submodules(_subpackage)
