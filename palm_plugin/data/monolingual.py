"""Reading fairseq-preprocess'd monolingual data (``--only-source``): shared by the pre-training tasks
(``continuation_pair``, ``unilm_pretraining``, ``pmlm``).

``DATA`` may list several directories separated by ``:``; epoch ``e`` reads directory ``(e - 1) % n``, as
fairseq's own masked_lm task does, so a corpus can be sharded across epochs.
"""
import logging
import os

from fairseq import utils
from fairseq.data import Dictionary, data_utils

from palm_plugin.errors import InputFileNotFoundError, InputValueError

logger = logging.getLogger(__name__)


def load_dictionary(data: str) -> Dictionary:
    """The ``dict.txt`` of the first directory of ``data``; a clear error when there is none."""
    paths = utils.split_paths(data)
    if not paths[0]:  # an empty DATA ("$DATA" of an unset variable): fairseq splits it into [""]
        raise InputValueError("DATA is empty: give the data directory written by fairseq-preprocess --only-source "
                              "(fairseq-train DATA ...)")
    path = os.path.join(paths[0], "dict.txt")
    if not os.path.exists(path):
        raise InputFileNotFoundError(
            f"{path}: no dictionary; DATA must be a directory written by fairseq-preprocess --only-source"
        )
    dictionary = Dictionary.load(path)
    logger.info(f"dictionary: {len(dictionary)} types")
    return dictionary


def split_prefix(data: str, split: str, epoch: int) -> str:
    """The path of ``split`` for ``epoch``, without ``.bin`` / ``.idx``."""
    paths = utils.split_paths(data)
    return os.path.join(paths[(epoch - 1) % len(paths)], split)


def load_sentences(data: str, split: str, epoch: int, dictionary: Dictionary, combine: bool = False):
    """The indexed dataset of ``split`` for ``epoch`` (one item per line; a blank line is an EOS-only item).

    Blank lines separate documents, so any number of them in a row, at the start or at the end is allowed; a split
    with no text at all is an error naming the file (no task can make an example of it).
    """
    split_path = split_prefix(data, split, epoch)
    sentences = data_utils.load_indexed_dataset(split_path, dictionary, combine=combine)
    if sentences is None:
        raise InputFileNotFoundError(
            f"no binarized split {split!r} at {split_path}.{{bin,idx}}: run fairseq-preprocess --only-source "
            f"with --trainpref / --validpref, --destdir {os.path.dirname(split_path)}"
        )
    if not (sentences.sizes > 1).any():
        raise InputValueError(
            f"{split_path}.bin: no text: its {len(sentences)} lines are all blank. Binarize a text file with one "
            "sentence a line and a blank line between documents (fairseq-preprocess --only-source)"
        )
    return sentences
