"""Binarized data a command cannot use stops it with the file and what to do, as its last line.

fairseq reads a split's ``.idx`` / ``.bin`` pair without checking it, and fails deep inside numpy or its batching:
- an empty split (fairseq-preprocess of an empty file writes an empty ``.bin``): numpy's "cannot mmap an empty
  file", followed by an AttributeError from the dataset's destructor (it closes a buffer it never opened);
- a ``.bin`` cut short (a copy or a download interrupted): "buffer is smaller than requested size" when the first
  example past the end is read, or a broken ``.idx``: an AssertionError or a struct error;
- a split none of whose examples fit the model's positions: fairseq's training iterator drops the examples it
  cannot take (with a warning) and then fails on an empty list in ``batch_by_size`` (IndexError);
- a split that is not there (``--gen-subset nosuch``): ``translation``'s "Dataset not found: nosuch (DATA)" says
  neither which splits there are nor what to do.
:func:`install` checks the pair when a dataset is opened, makes the destructors safe, names the split and the
options when every example is dropped, and names the splits there are when one is missing (:func:`missing_split`,
which ``unilm_seq2seq`` raises too). And a ``fairseq-interactive`` line that is empty or has no symbol of the
dictionary, which every model answers without a word, is warned about
(:func:`palm_plugin.modules.dictionary_check.warn_if_unknown`), and so is one the task cuts to its source length
(:func:`warn_if_truncated`).
"""
import functools
import os
import struct

from palm_plugin.errors import CommandError, InputFileNotFoundError
from palm_plugin.modules.dictionary_check import warn_if_unknown


class BinarizedDataError(CommandError):
    """A fairseq binarized split that cannot be used."""


def check_split(path):
    """Raise :class:`BinarizedDataError` when the ``path``.idx / ``path``.bin pair is broken, empty or cut short."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset, data_file_path, index_file_path

    index_path, data_path = index_file_path(path), data_file_path(path)
    again = "binarize the split again with fairseq-preprocess (the same dictionary: --srcdict)"
    try:
        index = MMapIndexedDataset.Index(index_path)
    except (AssertionError, struct.error, ValueError, KeyError) as error:
        raise BinarizedDataError(f"{index_path}: not a complete fairseq index ({error or type(error).__name__}); "
                                 f"{again}") from None
    if len(index) == 0:
        raise BinarizedDataError(f"{data_path}: the split has no examples (fairseq-preprocess was given an empty "
                                 "file); give it a text file with at least one line")
    needed = int(index._pointers[-1]) + int(index._sizes[-1]) * index._dtype_size
    if not os.path.isfile(data_path):
        raise BinarizedDataError(f"{data_path}: missing beside its index {index_path}; {again}")
    actual = os.path.getsize(data_path)
    if actual < needed:
        raise BinarizedDataError(f"{data_path}: {actual:,} bytes, but its index {index_path} needs {needed:,}: the "
                                 f"file was cut short (an interrupted copy or download?); {again}")


def missing_split(data, split, source, target):
    """The error (an :class:`~palm_plugin.errors.InputFileNotFoundError`) of a ``split`` of language pair
    ``source``-``target`` that ``data`` does not hold: it names the splits fairseq-preprocess wrote there (either
    direction of the pair) and what to do."""
    suffixes = (f".{source}-{target}.{source}.idx", f".{target}-{source}.{source}.idx")
    found = sorted({name[: -len(suffix)] for name in (os.listdir(data) if os.path.isdir(data) else [])
                    for suffix in suffixes if name.endswith(suffix)})
    return InputFileNotFoundError(
        f"{os.path.join(data, f'{split}.{source}-{target}.{source}')}.idx: dataset not found (fairseq-preprocess "
        f"output); " + (f"{data} holds {', '.join(found)}: give one of those splits (--gen-subset, --valid-subset), "
                        f"or " if found else "")
        + f"binarize '{split}' into {data} with fairseq-preprocess"
    )


def _name_the_splits_there(load_langpair_dataset):
    """Wrap ``translation``'s loader (PALM's task) so that a missing split raises :func:`missing_split`."""

    @functools.wraps(load_langpair_dataset)
    def load(data_path, split, src, src_dict, tgt, *args, **kwargs):
        try:
            return load_langpair_dataset(data_path, split, src, src_dict, tgt, *args, **kwargs)
        except FileNotFoundError as error:
            if not str(error).startswith("Dataset not found:"):
                raise
            raise missing_split(data_path, split, src, tgt) from None

    load.__palm_plugin__ = True
    return load


def _safe_destructor(cls):
    """fairseq's ``__del__`` closes the buffer ``__init__`` opens last: after a failed ``__init__`` it raises."""
    del_ = cls.__del__

    def __del__(self):
        if "_bin_buffer_mmap" in self.__dict__:
            del_(self)

    cls.__del__ = __del__


def _positions(max_positions):
    """fairseq's max_positions (a number, or a tuple of source and target) in words."""
    if isinstance(max_positions, tuple) and len(max_positions) == 2:
        return f"source {max_positions[0]}, target {max_positions[1]}"
    return str(max_positions)


def _name_the_split(filter_indices_by_size):
    def filter_keeping_one(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        kept = filter_indices_by_size(self, indices, dataset, max_positions, ignore_invalid_inputs)
        # only a loaded split: inputs built for inference (fairseq-interactive's lines, the API's sentences) that
        # are all too long are skipped, as fairseq does with --skip-invalid-size-inputs-valid-test
        split = next((name for name, d in getattr(self, "datasets", {}).items() if d is dataset), None)
        if len(kept) == 0 and len(indices) > 0 and split is not None:
            raise BinarizedDataError(
                f"split {split!r}: none of its {len(indices):,} examples fits the model's positions (at most "
                f"{_positions(max_positions)}); raise --max-source-positions / --max-target-positions (or the task's "
                "length options), or split the examples into shorter ones"
            )
        return kept

    return filter_keeping_one


def warn_if_truncated(task, tokens):
    """Warn when the task's inference dataset cuts some of ``tokens`` (the sources of fairseq-interactive or the
    API): a task that truncates counts it as ``truncated_sources`` (``unilm_seq2seq``: ``--max-source-positions``);
    fairseq's own tasks refuse or skip an input that is too long, and say so."""
    import logging

    cut = getattr(task.build_dataset_for_inference(tokens, [len(t) for t in tokens]), "truncated_sources", 0)
    if cut:
        limit = getattr(task.cfg, "max_source_positions", None)
        logging.getLogger("palm_plugin").warning(
            f"{cut} of {len(tokens)} inputs longer than --max-source-positions {limit} ([SOS] and [EOS] included; the "
            f"longest has {max(len(t) for t in tokens)} tokens): only their first tokens are read; raise "
            f"--max-source-positions (within the model's positions) or split the input")


def _warn_on_unknown_lines(get_interactive_tokens_and_lengths):
    def tokens_and_lengths(self, lines, encode_fn):
        tokens, lengths = get_interactive_tokens_and_lengths(self, lines, encode_fn)
        for line, encoded in zip(lines, tokens):
            warn_if_unknown(line, encoded, self.source_dictionary)
        warn_if_truncated(self, tokens)
        return tokens, lengths

    return tokens_and_lengths


def install():
    """Patch fairseq's MMapIndexedDataset, FairseqTask.filter_indices_by_size,
    FairseqTask.get_interactive_tokens_and_lengths and translation's load_langpair_dataset (idempotent)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset
    from fairseq.tasks import FairseqTask, translation

    if not getattr(translation.load_langpair_dataset, "__palm_plugin__", False):
        translation.load_langpair_dataset = _name_the_splits_there(translation.load_langpair_dataset)

    do_init = MMapIndexedDataset._do_init
    if getattr(do_init, "__palm_plugin__", False):
        return

    def checked_init(self, path):
        check_split(path)
        do_init(self, path)

    checked_init.__palm_plugin__ = True
    MMapIndexedDataset._do_init = checked_init
    _safe_destructor(MMapIndexedDataset)
    _safe_destructor(MMapIndexedDataset.Index)
    FairseqTask.filter_indices_by_size = _name_the_split(FairseqTask.filter_indices_by_size)
    FairseqTask.get_interactive_tokens_and_lengths = _warn_on_unknown_lines(
        FairseqTask.get_interactive_tokens_and_lengths
    )
