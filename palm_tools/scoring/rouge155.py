"""Tokens exactly as ROUGE-1.5.5 (the Perl script behind files2rouge and pyrouge) makes them with ``-m``.

ROUGE-1.5.5 lower-cases the text, turns every character other than a letter or a digit into a space, and, with
``-m``, replaces each token longer than three characters by

1. its base form when the token is an irregular form listed in WordNet 2.0's exception lists ("children" ->
   "child", "went" -> "go"), else
2. its Porter stem, from Martin Porter's Perl implementation as modified by C.-Y. Lin in 2004: in step 4 the
   suffix rule, then ``-ment``, then ``-ent`` / ``-(s|t)ion`` are each tried in turn on the result of the previous
   one, where Porter's paper strips only one suffix ("representations" -> "represent" -> "repres").

The ``rouge-score`` package tokenizes the same way but stems with NLTK's Porter stemmer and knows no exceptions,
which moves averages by about 0.1 point; :class:`Rouge155Tokenizer` plugs the exact behaviour into its scorer.
"""
import functools
import os

from nltk.stem.porter import PorterStemmer
from rouge_score import tokenize

EXCEPTIONS_FILE = os.path.join(os.path.dirname(__file__), "wordnet-2.0-exceptions.txt")


@functools.lru_cache(maxsize=1)
def wordnet_exceptions():
    """Inflected form -> base form. A form listed twice keeps its last entry (adj, adv, noun, verb order)."""
    table = {}
    with open(EXCEPTIONS_FILE, encoding="ascii") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            fields = line.split()
            table[fields[0]] = fields[1]
    return table


class Rouge155Stemmer(PorterStemmer):
    """Porter's Perl stemmer (with his departures from the 1980 paper, NLTK's MARTIN_EXTENSIONS mode) and
    ROUGE-1.5.5's sequential step 4."""

    def __init__(self):
        super().__init__(mode=PorterStemmer.MARTIN_EXTENSIONS)

    def _step4(self, word):
        """Step 4 of ROUGE-1.5.5: three rules applied one after another, each needing measure m > 1 of the stem:
        (1) -al -ance -ence -er -ic -able -ible -ant -ement -ou -ism -ate -iti -ous -ive -ize, (2) -ment,
        (3) -ent, or else -ion after s or t (the s or t stays)."""
        for suffixes in (
            ("al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ou", "ism", "ate", "iti", "ous",
             "ive", "ize"),
            ("ment",),
        ):
            suffix = next((s for s in suffixes if word.endswith(s)), None)
            if suffix and self._measure(word[: -len(suffix)]) > 1:
                word = word[: -len(suffix)]
        if word.endswith("ent"):
            if self._measure(word[:-3]) > 1:
                word = word[:-3]
        elif word.endswith(("sion", "tion")) and self._measure(word[:-3]) > 1:
            word = word[:-3]
        return word


class _ExceptionsThenPorter:
    """The ``stem(word)`` object rouge-score's tokenizer calls (only for tokens longer than three characters)."""

    def __init__(self):
        self.exceptions = wordnet_exceptions()
        self.porter = Rouge155Stemmer()

    @functools.lru_cache(maxsize=200_000)
    def stem(self, word):
        return self.exceptions.get(word) or self.porter.stem(word)


class Rouge155Tokenizer:
    """A rouge-score tokenizer (``tokenize(text) -> list of str``) that gives ROUGE-1.5.5's tokens."""

    def __init__(self, stemming=True):
        self.stemmer = _ExceptionsThenPorter() if stemming else None

    def tokenize(self, text):
        return tokenize.tokenize(text, self.stemmer)
