"""The dictionary plumbing every task of the plugin shares: one vocabulary for source and target, with ``<mask>``."""
from fairseq.data import Dictionary
from fairseq.tasks import FairseqTask

from palm_plugin.data.symbols import MASK_SYMBOL


class SharedDictionaryTask(FairseqTask):
    """A task over one dictionary (source = target) holding ``<mask>``: like fairseq's ``masked_lm``, the existing
    index when ``dict.txt`` lists it, else appended (subclasses append their own symbols after it)."""

    def __init__(self, cfg, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.mask_idx = dictionary.add_symbol(MASK_SYMBOL)

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
