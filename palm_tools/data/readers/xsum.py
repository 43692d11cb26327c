"""XSum (Narayan et al., 2018): BBC articles with their one-sentence introduction as the summary.

Two layouts of the release are read, chosen per file:

* the original summary data (``bbc-summary-data/<id>.summary``): sections marked ``[SN]URL[SN]``,
  ``[SN]TITLE[SN]``, ``[SN]FIRST-SENTENCE[SN]`` (the summary) and ``[SN]RESTBODY[SN]`` (the document);
* the preprocessed pairs: ``<id>.document`` and ``<id>.summary`` plain text files (in one directory or two).

The split is the release's JSON file ``XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json`` (``{"train": [ids],
"validation": [ids], "test": [ids]}``).
"""
import json
import os
import re

from palm_tools.data.readers.common import ReaderError, malformed, read_text

_SECTION = re.compile(r"\[SN\](URL|TITLE|FIRST-SENTENCE|RESTBODY)\[SN\]")


def parse_summary_data(text, path):
    """``(document, summary)`` of a ``[SN]``-sectioned file; a missing section is an error naming the file."""
    parts = _SECTION.split(text)
    sections = dict(zip(parts[1::2], parts[2::2]))
    for name in ("FIRST-SENTENCE", "RESTBODY"):
        if name not in sections:
            raise malformed(f"{path}: no [SN]{name}[SN] section")
    return sections["RESTBODY"], sections["FIRST-SENTENCE"]


def split_ids(split_file, split):
    try:
        splits = json.loads(read_text(split_file))
    except json.JSONDecodeError as e:
        raise malformed(f"{split_file} is not JSON: {e}") from e
    if not isinstance(splits, dict) or split not in splits:
        keys = sorted(splits) if isinstance(splits, dict) else type(splits).__name__
        raise ReaderError(f"{split_file} has no split {split!r} (it has {keys})")
    return [str(i) for i in splits[split]]


def read_xsum(data_dir, split_file, split, counts, document_dir=None, skip_missing=False):
    """Yield (document, summary) pairs of ``split``. A listed id without a file is an error, or, with
    ``skip_missing``, a dropped example counted as such."""
    document_dir = document_dir or data_dir
    for bbc_id in split_ids(split_file, split):
        counts.read += 1
        summary_path = os.path.join(data_dir, f"{bbc_id}.summary")
        if not os.path.isfile(summary_path):
            if skip_missing:
                counts.drop("missing file")
                continue
            raise ReaderError(f"{split_file}: {split} id {bbc_id} has no file {summary_path}: pass --skip-missing to "
                                  "count the missing ids as dropped")
        text = read_text(summary_path)
        if "[SN]RESTBODY[SN]" in text or "[SN]URL[SN]" in text:
            document, summary = parse_summary_data(text, summary_path)
        else:
            document_path = os.path.join(document_dir, f"{bbc_id}.document")
            if not os.path.isfile(document_path):
                if skip_missing:
                    counts.drop("missing file")
                    continue
                raise ReaderError(f"{split_file}: {split} id {bbc_id} has no file {document_path}: pass --skip-missing to "
                                  "count the missing ids as dropped")
            document, summary = read_text(document_path), text
        yield document, summary
