"""A rule-based English sentence splitter for preparing corpora.

Written by hand because the usual splitters need data that cannot be installed offline (NLTK's punkt models are
downloaded at run time). The rule: a sentence ends at ``.``, ``!`` or ``?`` (optionally followed by closing quotes
or brackets) when whitespace and then an upper-case letter, a digit or an opening quote follows, unless the word
before the period is a known abbreviation (``Mr.``, ``U.S.``, ``Jan.``) or a single capital initial (``J. Smith``).
"""
import re

_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "gen", "gov", "sen", "rep", "hon", "rev", "col", "lt",
    "capt", "cmdr", "adm", "sgt", "messrs", "no", "nos", "vs", "etc", "inc", "co", "corp", "ltd", "dept", "jan",
    "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.s.a", "u.k", "d.c",
    "e.g", "i.e", "a.m", "p.m", "art", "sec", "vol", "fig", "ft", "mt",
}
_BOUNDARY = re.compile(r"""([.!?]+["')\]]*)\s+(?=["'(\[]?[A-Z0-9])""")


def split_sentences(text: str) -> list:
    """Split a paragraph into sentences; whitespace inside a sentence is collapsed to single spaces."""
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        end = match.end(1)
        words = text[start:match.start(1)].split()
        last_word = words[-1].lower().rstrip(".") if words else ""
        if match.group(1).startswith(".") and (
            last_word in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isalpha())
        ):
            continue
        sentences.append(text[start:end].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]
