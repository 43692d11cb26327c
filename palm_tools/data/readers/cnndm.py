"""CNN/DailyMail, non-anonymised (See et al., 2017): ``.story`` files of the CNN and DailyMail releases.

A story file holds the article's paragraphs, then each highlight as an ``@highlight`` line followed by the
highlight sentence. As in See et al.'s preparation, a line that does not end in sentence-final punctuation gets a
period (highlights have none), and the splits are lists of URLs (``all_train.txt``, ``all_val.txt``,
``all_test.txt``) whose SHA-1 hex digest names the story file. Text stays cased and untokenized (the tokenizer of
each model comes later). Source = the article's lines joined by spaces; target = the highlights joined by
``<q>`` markers, which ``palm-score rouge`` splits on for ROUGE-L.
"""
import hashlib
import os

from palm_tools.data.readers.common import ReaderError, read_text

# See et al.'s list; \u2019 and \u201d are the DailyMail's closing quotes
SENTENCE_END = (".", "!", "?", "...", "'", "`", '"', "\u2019", "\u201d", ")")


def parse_story(text):
    """``(article lines, highlights)`` of one story file's text."""
    article, highlights, next_is_highlight = [], [], False
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        if line == "@highlight":
            next_is_highlight = True
            continue
        if not line.endswith(SENTENCE_END):
            line += "."
        (highlights if next_is_highlight else article).append(line)
    return article, highlights


def story_files(stories_dirs, url_list=None):
    """The story paths of a split, in the order of ``url_list``, or every ``.story`` file of the directories in
    name order when no list is given. A URL whose story is in none of the directories is an error."""
    if url_list is None:
        paths = []
        for directory in stories_dirs:
            try:
                names = sorted(n for n in os.listdir(directory) if n.endswith(".story"))
            except OSError as e:
                raise ReaderError(f"cannot list the stories directory {directory}: {e.strerror}; pass the cnn/stories "
                                  "and dailymail/stories directories with --stories-dir") from e
            paths.extend(os.path.join(directory, n) for n in names)
        return paths
    paths = []
    for number, url in enumerate(read_text(url_list).splitlines(), 1):
        url = url.strip()
        if not url:
            continue
        name = hashlib.sha1(url.encode("utf-8")).hexdigest() + ".story"
        found = [os.path.join(d, name) for d in stories_dirs if os.path.isfile(os.path.join(d, name))]
        if not found:
            raise ReaderError(
                f"{url_list}:{number}: no story file {name} for {url} in {', '.join(stories_dirs)} "
                "(pass the cnn/stories and dailymail/stories directories with --stories-dir)"
            )
        paths.append(found[0])
    return paths


def read_cnndm(stories_dirs, counts, url_list=None, sentence_separator=" <q> "):
    """Yield (article, summary) pairs of a split; stories with an empty article or no highlight are dropped and
    counted (the CNN release has a few hundred stories without article text)."""
    for path in story_files(stories_dirs, url_list):
        counts.read += 1
        article, highlights = parse_story(read_text(path))
        if not article:
            counts.drop("story without article")
        elif not highlights:
            counts.drop("story without highlights")
        else:
            yield " ".join(article), sentence_separator.join(highlights)
