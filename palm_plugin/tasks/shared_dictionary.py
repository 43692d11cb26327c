"""The dictionary plumbing every task of the plugin shares: one vocabulary for source and target, with ``<mask>``."""
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_NAME_REGISTRY
from fairseq.tasks import TASK_REGISTRY, FairseqTask

from palm_plugin.data.symbols import MASK_SYMBOL
from palm_plugin.errors import InputValueError

# the plugin's tasks of each model (fairseq's registered name)
FAMILY_TASKS = {"unilm": "unilm_pretraining, pmlm or unilm_seq2seq",
                "palm": "continuation_pair (pre-training) or translation (fine-tuning)"}


def task_name(task) -> str:
    """The name ``task`` was registered under, as --task gives it."""
    # a task set up from fairseq's legacy Namespace holds a config without _name: ask the registry
    registered = [name for name, cls in TASK_REGISTRY.items() if cls is type(task)]
    return getattr(task.cfg, "_name", None) or (registered[0] if registered else type(task).__name__)


def check_positions(model, tokens_per_sample):
    """``model``; stops when its positions cannot hold ``--tokens-per-sample`` tokens (fairseq stopped on the first
    longer block with advice to skip it, or skipped them all and then named the translation tasks' options)."""
    if tokens_per_sample > model.max_positions():
        raise InputValueError(f"--tokens-per-sample {tokens_per_sample}: the model has {model.max_positions()} "
                              f"positions (--max-positions): give --tokens-per-sample {model.max_positions()} or less, "
                              "or raise --max-positions")
    return model


class SharedDictionaryTask(FairseqTask):
    """A task over one dictionary (source = target) holding ``<mask>``: like fairseq's ``masked_lm``, the existing
    index when ``dict.txt`` lists it, else appended (subclasses append their own symbols after it)."""

    model_name = "unilm"  # the model whose batches this task makes

    def __init__(self, cfg, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.mask_idx = dictionary.add_symbol(MASK_SYMBOL)

    def build_model(self, cfg, from_checkpoint=False):
        # the other family's model takes other batches: it failed on its first one (IndexError, missing arguments)
        arch = getattr(cfg, "_name", None) or getattr(cfg, "arch", None)
        family = ARCH_MODEL_NAME_REGISTRY.get(arch, arch)
        if arch is not None and family != self.model_name:
            archs = ", ".join(a for a, model in ARCH_MODEL_NAME_REGISTRY.items() if model == self.model_name)
            raise InputValueError(
                f"--task {task_name(self)} makes batches for a {self.model_name} model, and --arch {arch} is a "
                f"{family} model: give a {self.model_name} arch ({archs})"
                + (f", or train {family} with --task {FAMILY_TASKS[family]}" if family in FAMILY_TASKS else ""))
        return super().build_model(cfg, from_checkpoint)

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
