"""SQuAD 1.1 for answer-aware question generation: (context containing the answer, answer) -> question.

Splits (UniLM section 3.4): Du and Cardie (2018) split the original training set into training and test sets by
article, listed in their ``doclist-train.txt`` / ``doclist-test.txt`` (one article title a line), and keep the
original development set; Zhao et al. (2018) reverse the dev/test roles. Both come from this reader: the SQuAD
JSON file plus, where the split is a subset of its articles, the doclist that selects them.

The context is the paragraph, or the sentence(s) that hold the answer; the source is the context, a separator and
the answer span. Each question uses its first answer, as Du et al. did.
"""
import json

from palm_tools.data.readers.common import ReaderError, malformed, one_line, read_text
from palm_tools.data.sentence_split import split_sentences


def _field(record, name, where, path):
    if not isinstance(record, dict) or name not in record:
        raise malformed(f"{path}: {where}: missing field {name!r}")
    return record[name]


def answer_sentences(context, answer_start, answer_text):
    """The sentences of ``context`` that overlap the answer span, joined by spaces. Sentences come from the
    rule-based splitter, which collapses whitespace; offsets are mapped into the collapsed text."""
    collapsed = one_line(context)
    before = context[:answer_start]
    start = len(one_line(before)) + (1 if before.strip() and before[-1].isspace() else 0)
    end = start + len(one_line(answer_text))
    chosen, position = [], 0
    for sentence in split_sentences(context):
        sentence_start = collapsed.index(sentence, position)
        position = sentence_start + len(sentence)
        if sentence_start < end and start < position:
            chosen.append(sentence)
    return " ".join(chosen)


def read_squad_qg(squad_json, counts, doclist=None, context="paragraph", separator=" [SEP] ", with_answer=True):
    """Yield (context [separator answer], question) pairs. A record without a required field is an error; a
    question whose answer text is not found at its ``answer_start`` is dropped and counted."""
    try:
        data = json.loads(read_text(squad_json))
    except json.JSONDecodeError as e:
        raise malformed(f"{squad_json} is not JSON: {e}") from e
    titles = None
    if doclist:
        titles = {line.strip() for line in read_text(doclist).splitlines() if line.strip()}
    articles = _field(data, "data", "top level", squad_json)
    found_titles = set()
    for a, article in enumerate(articles):
        title = _field(article, "title", f"article {a}", squad_json)
        if titles is not None and title not in titles:
            continue
        found_titles.add(title)
        for p, paragraph in enumerate(_field(article, "paragraphs", f"article {title!r}", squad_json)):
            where = f"article {title!r} paragraph {p}"
            text = _field(paragraph, "context", where, squad_json)
            for qa in _field(paragraph, "qas", where, squad_json):
                qid = _field(qa, "id", where + " question", squad_json)
                where_q = f"{where} question {qid}"
                question = _field(qa, "question", where_q, squad_json)
                answers = _field(qa, "answers", where_q, squad_json)
                counts.read += 1
                if not answers:
                    counts.drop("question without answer")
                    continue
                answer = _field(answers[0], "text", where_q + " answer 0", squad_json)
                start = _field(answers[0], "answer_start", where_q + " answer 0", squad_json)
                if text[start : start + len(answer)] != answer:
                    counts.drop("answer not at answer_start")
                    continue
                source = text if context == "paragraph" else answer_sentences(text, start, answer)
                if with_answer:
                    source = f"{source}{separator}{answer}"
                yield source, question
    if titles is not None and not found_titles:
        raise ReaderError(f"no article of {squad_json} is listed in {doclist}: is it the doclist of this file?")
