"""What all readers share: the error type, example counts, one-line text, and writing the pair files atomically."""
import collections

from palm_tools.atomic_files import atomic_open
from palm_tools.text_files import not_utf8


class ReaderError(Exception):
    """Malformed raw input. The message names the file, the record and what is wrong."""


def malformed(message):
    """The error of a file that is not laid out as the benchmark's release: the message, and what to do."""
    return ReaderError(f"{message}; palm-prepare reads each benchmark's files as released (docs/recipes.md says "
                       "where each comes from): use the original file (a download cut short?), or correct it")


class Counts:
    """Examples read, kept and dropped (by reason), printed after a conversion so that nothing is skipped
    silently."""

    def __init__(self):
        self.read = 0
        self.kept = 0
        self.dropped = collections.Counter()

    def drop(self, reason):
        self.dropped[reason] += 1

    def summary(self, name):
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.dropped.items()))
        dropped = sum(self.dropped.values())
        return f"{name}: read {self.read}, kept {self.kept}, dropped {dropped}" + (f" ({reasons})" if reasons else "")


def one_line(text):
    """``text`` with every run of whitespace (newlines, tabs, Unicode line separators) turned into one space, so
    that an example stays on one line of the output files."""
    return " ".join(text.split())


def read_text(path, encoding="utf-8"):
    """The whole text of ``path``, line ends untranslated (a line is what ``\n`` ends, as for ``wc -l``); a
    missing or undecodable file is a :class:`ReaderError` naming it."""
    try:
        with open(path, encoding=encoding, newline="") as f:
            return f.read()
    except OSError as e:
        raise ReaderError(f"cannot read {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        what, todo = not_utf8(path)
        if what == "not valid UTF-8":
            raise malformed(f"{path} is not {encoding} text ({e.reason} at byte {e.start})") from e
        # MS MARCO (train_v2.1.json.gz) and Gigaword's training files are released compressed: the step that gives
        # the text, not "use the original file"
        raise ReaderError(f"{path} is {what} ({e.reason} at byte {e.start}); {todo}") from e


def write_pairs(prefix, pairs, counts, suffixes=("src", "tgt")):
    """Write ``pairs`` to ``<prefix>.src`` and ``<prefix>.tgt`` (one example a line), counting kept pairs in
    ``counts``. A pair with an empty side is dropped and counted. Both files are written to temporary files in the
    same directory and renamed into place only when all pairs were read, so an error leaves no partial output."""
    with atomic_open(f"{prefix}.{suffixes[0]}") as source_file, atomic_open(f"{prefix}.{suffixes[1]}") as target_file:
        for source, target in pairs:
            source, target = one_line(source), one_line(target)
            if not source or not target:
                counts.drop("empty source" if not source else "empty target")
                continue
            source_file.write(source + "\n")
            target_file.write(target + "\n")
            counts.kept += 1
