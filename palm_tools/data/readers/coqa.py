"""CoQA generative question answering (UniLM section 3.2): the source is the conversation history (earlier
questions and their free-form answers), the current question and the passage; the target is the free-form
answer (``input_text``)."""
import json

from palm_tools.data.readers.common import malformed, read_text


def read_coqa(path, counts, max_history=None, separator=" [SEP] "):
    """Yield ("Q: q1 A: a1 ... Q: q [separator] story", answer) for every turn of every conversation, with at most
    ``max_history`` earlier turns (all when None). Questions and answers must pair up by ``turn_id``."""
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise malformed(f"{path} is not JSON: {e}") from e
    if not isinstance(data, dict) or "data" not in data:
        raise malformed(f"{path}: missing field 'data' (is it a CoQA file?)")
    for c, conversation in enumerate(data["data"]):
        where = f"conversation {conversation.get('id', c) if isinstance(conversation, dict) else c}"
        for name in ("story", "questions", "answers"):
            if not isinstance(conversation, dict) or name not in conversation:
                raise malformed(f"{path}: {where}: missing field {name!r}")
        questions, answers = conversation["questions"], conversation["answers"]
        if len(questions) != len(answers):
            raise malformed(f"{path}: {where}: {len(questions)} questions but {len(answers)} answers")
        history = []
        for question, answer in zip(questions, answers):
            for record, kind in ((question, "question"), (answer, "answer")):
                if "input_text" not in record or "turn_id" not in record:
                    raise malformed(f"{path}: {where}: a {kind} lacks 'input_text' or 'turn_id'")
            if question["turn_id"] != answer["turn_id"]:
                raise malformed(
                    f"{path}: {where}: question turn {question['turn_id']} is paired with answer turn "
                    f"{answer['turn_id']}"
                )
            counts.read += 1
            kept = history if max_history is None else history[max(0, len(history) - max_history) :]
            turns = kept + [f"Q: {question['input_text']}"]
            yield " ".join(turns) + separator + conversation["story"], answer["input_text"]
            history.append(f"Q: {question['input_text']} A: {answer['input_text']}")
