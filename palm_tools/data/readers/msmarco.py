"""MS MARCO v2.1 question answering (Q&A task) and well-formed answers (NLG task).

The v2.1 JSON files are column-oriented: ``{"query": {key: text}, "passages": {key: [{"is_selected",
"passage_text", "url"}]}, "answers": {key: [text]}, "wellFormedAnswers": {key: [text] or "[]"}, "query_id": ...}``.
PALM's input is the passage text followed by the question (section 3.3); the passages are those the annotators
marked as used (``is_selected``), or all of them.
"""
import json

from palm_tools.data.readers.common import malformed, read_text

NO_ANSWER = "No Answer Present."


def read_msmarco(path, counts, task="qa", passages="selected", separator=" [SEP] "):
    """Yield (passages [separator] question, answer) pairs. For ``task="qa"`` the target is the first answer and
    queries answered "No Answer Present." are dropped; for ``task="nlg"`` it is the first well-formed answer and
    queries without one are dropped. A record missing a column is an error naming the file and the record key."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise malformed(f"{path} is not JSON: {e}") from e
    column_names = ("query", "passages", "answers") + (("wellFormedAnswers",) if task == "nlg" else ())
    for name in column_names:
        if not isinstance(data, dict) or name not in data:
            raise malformed(f"{path}: missing column {name!r} (is it an MS MARCO v2.1 file with answers?)")
    columns = {name: data[name] for name in column_names}
    for key in columns["query"]:
        counts.read += 1
        for name, column in columns.items():
            if key not in column:
                raise malformed(f"{path}: record {key}: missing field {name!r}")
        question, candidates = columns["query"][key], columns["passages"][key]
        try:
            texts = [p["passage_text"] for p in candidates if passages == "all" or p["is_selected"]]
        except (KeyError, TypeError) as e:
            raise malformed(f"{path}: record {key}: a passage lacks 'passage_text' or 'is_selected'") from e
        if task == "nlg":
            answers = columns["wellFormedAnswers"][key]
            if not isinstance(answers, list) or not answers:
                counts.drop("no well-formed answer")
                continue
        else:
            answers = [a for a in columns["answers"][key] if a != NO_ANSWER]
            if not answers:
                counts.drop("no answer present")
                continue
        if not texts:
            counts.drop("no selected passage")
            continue
        yield " ".join(texts) + separator + question, answers[0]
