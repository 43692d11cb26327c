"""Cornell Movie-Dialogs Corpus (Danescu-Niculescu-Mizil and Lee, 2011) as context/response pairs.

``movie_lines.txt``: ``lineID +++$+++ characterID +++$+++ movieID +++$+++ character name +++$+++ text``;
``movie_conversations.txt``: ``character1 +++$+++ character2 +++$+++ movieID +++$+++ ['L1', 'L2', ...]``; both
ISO-8859-1. Every two consecutive utterances of a conversation make a pair (the first is the context, the second
the response). Following the preparation PALM cites (MASS, section 3.6), pairs whose utterances are shorter than 2
or longer than 25 words are dropped, which leaves about 140K pairs; 10K pairs are held out for validation and 20K
for test at random, and the 10K-pair training variant is the first 10K of the shuffled training pairs.
"""
import ast

import numpy as np

from palm_tools.data.readers.common import ReaderError, malformed, one_line, read_text

FIELD_SEPARATOR = " +++$+++ "
SMALL_TRAIN = 10_000  # PALM Table 5's low-resource training set
ENCODING = "iso-8859-1"


def read_movie_lines(path):
    """Line id -> utterance text."""
    lines = {}
    for number, line in enumerate(read_text(path, ENCODING).split("\n"), 1):
        if not line.strip():
            continue
        fields = line.rstrip("\r").split(FIELD_SEPARATOR)
        if len(fields) != 5:
            raise malformed(f"{path}:{number}: expected 5 fields separated by '{FIELD_SEPARATOR.strip()}', "
                              f"found {len(fields)}")
        lines[fields[0].strip()] = fields[4]
    return lines


def read_conversations(path):
    """Each conversation as its list of line ids."""
    conversations = []
    for number, line in enumerate(read_text(path, ENCODING).split("\n"), 1):
        if not line.strip():
            continue
        fields = line.rstrip("\r").split(FIELD_SEPARATOR)
        if len(fields) != 4:
            raise malformed(f"{path}:{number}: expected 4 fields separated by '{FIELD_SEPARATOR.strip()}', "
                              f"found {len(fields)}")
        try:
            ids = ast.literal_eval(fields[3].strip())
        except (ValueError, SyntaxError) as e:
            raise malformed(f"{path}:{number}: the last field must be a list like ['L1', 'L2']") from e
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise malformed(f"{path}:{number}: the last field must be a list like ['L1', 'L2']")
        conversations.append((number, ids))
    return conversations


def read_cornell_pairs(lines_file, conversations_file, counts, min_words=2, max_words=25):
    """All (context, response) pairs in corpus order; pairs with an utterance outside [min_words, max_words]
    words are dropped and counted. A conversation naming an unknown line id is an error."""
    lines = read_movie_lines(lines_file)
    pairs = []
    for number, ids in read_conversations(conversations_file):
        for line_id in ids:
            if line_id not in lines:
                raise malformed(f"{conversations_file}:{number}: line {line_id} is not in {lines_file}")
        for first, second in zip(ids, ids[1:]):
            counts.read += 1
            context, response = one_line(lines[first]), one_line(lines[second])
            lengths = (len(context.split()), len(response.split()))
            if min(lengths) < min_words or max(lengths) > max_words:
                counts.drop(f"utterance outside {min_words}-{max_words} words")
                continue
            counts.kept += 1
            pairs.append((context, response))
    return pairs


def split_pairs(pairs, valid_size, test_size, seed):
    """``{"train", "valid", "test", "train10k"}`` from one seeded permutation of ``pairs``; ``train10k`` is the
    first 10K pairs of ``train``."""
    if valid_size + test_size >= len(pairs):
        raise ReaderError(f"only {len(pairs)} pairs: cannot hold out {valid_size} + {test_size} for valid and test")
    order = np.random.RandomState(seed).permutation(len(pairs))
    shuffled = [pairs[i] for i in order]
    train = shuffled[valid_size + test_size :]
    return {
        "valid": shuffled[:valid_size],
        "test": shuffled[valid_size : valid_size + test_size],
        "train": train,
        "train10k": train[:SMALL_TRAIN],
    }
