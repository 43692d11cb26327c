"""Gigaword headline generation (Rush et al., 2015): parallel text files, an article's first sentence a line in
one (``train.article.txt``, ``train.src.txt``) and its headline on the same line of the other."""
from palm_tools.data.readers.common import ReaderError, read_text


def read_gigaword(source_file, target_file, counts):
    """Yield (sentence, headline) pairs; files of different lengths are an error."""
    sources, targets = read_text(source_file).split("\n"), read_text(target_file).split("\n")
    for lines in (sources, targets):
        if lines and lines[-1] == "":
            lines.pop()
    if len(sources) != len(targets):
        raise ReaderError(
            f"{source_file} has {len(sources)} lines but {target_file} has {len(targets)}: the files must be parallel"
        )
    for source, target in zip(sources, targets):
        counts.read += 1
        yield source, target
