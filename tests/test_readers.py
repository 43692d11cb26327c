"""palm-prepare readers: small files in each benchmark's real raw format, exact expected outputs, named errors for
malformed input, printed counts, and no partial output after an error."""
import hashlib
import json

import pytest

from palm_tools.data import prepare
from palm_tools.data.readers.cornell import SMALL_TRAIN
from tests.conftest import run_cli, subcommand_help


def lines(path):
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def run(capsys, *argv):
    code = prepare.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------------------ CNN/DailyMail

STORY = """(CNN) -- The city council voted on Tuesday to close the old bridge

The vote was 7 to 2, officials said.

"It is not safe," the mayor said

@highlight

Council votes to close the old bridge

@highlight

The vote was 7 to 2!
"""


def write_story(directory, url, text, encoding="utf-8"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / (hashlib.sha1(url.encode()).hexdigest() + ".story")).write_bytes(text.encode(encoding))


def test_cnndm_story_to_pair_in_url_order(tmp_path, capsys):
    urls = ["http://www.cnn.com/2015/bridge.html", "http://www.dailymail.co.uk/news/article-1/empty.html",
            "http://www.dailymail.co.uk/news/article-2/second.html"]
    write_story(tmp_path / "cnn" / "stories", urls[0], STORY)
    write_story(tmp_path / "dm" / "stories", urls[1], "@highlight\n\nOnly a highlight\n")
    write_story(tmp_path / "dm" / "stories", urls[2], "By . Reporter .\n\nA line.\n\n@highlight\n\nIt rained\n")
    url_list = tmp_path / "all_test.txt"
    url_list.write_text("\n".join(urls) + "\n")
    code, out, _ = run(capsys, "cnndm", "--stories-dir", tmp_path / "cnn" / "stories", "--stories-dir",
                       tmp_path / "dm" / "stories", "--url-list", url_list, "--out", tmp_path / "out" / "test")
    assert code == 0
    assert lines(tmp_path / "out" / "test.src") == [
        "(CNN) -- The city council voted on Tuesday to close the old bridge. The vote was 7 to 2, officials said. "
        '"It is not safe," the mayor said.',
        "By . Reporter . A line.",
    ]
    assert lines(tmp_path / "out" / "test.tgt") == [
        "Council votes to close the old bridge. <q> The vote was 7 to 2!",
        "It rained.",
    ]
    assert "read 3, kept 2, dropped 1 (1 story without article)" in out


def test_cnndm_missing_and_unreadable_stories_are_named(tmp_path, capsys):
    stories = tmp_path / "stories"
    write_story(stories, "http://a/1", STORY)
    url_list = tmp_path / "all_val.txt"
    url_list.write_text("http://a/1\nhttp://a/2\n")
    code, _, err = run(capsys, "cnndm", "--stories-dir", stories, "--url-list", url_list, "--out", tmp_path / "v")
    missing = hashlib.sha1(b"http://a/2").hexdigest() + ".story"
    assert code == 1 and f"all_val.txt:2: no story file {missing} for http://a/2" in err
    write_story(stories, "http://a/2", "caf\xe9 article\n\n@highlight\n\nsummary\n", encoding="latin-1")
    code, _, err = run(capsys, "cnndm", "--stories-dir", stories, "--url-list", url_list, "--out", tmp_path / "v")
    assert code == 1 and f"{missing} is not utf-8 text" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all_val.txt", "stories"]  # nothing half-written


# ------------------------------------------------------------------------------------------------------- XSum

SUMMARY_DATA = """[SN]URL[SN]
http://web.archive.org/web/2017/http://www.bbc.co.uk/news/uk-1

[SN]TITLE[SN]
Bridge closes

[SN]FIRST-SENTENCE[SN]
A bridge in the city has been closed after a council vote.

[SN]RESTBODY[SN]
The council voted seven to two.
Officials said the bridge was not safe.
"""


def test_xsum_both_layouts_and_split_file(tmp_path, capsys):
    data = tmp_path / "bbc-summary-data"
    data.mkdir()
    (data / "101.summary").write_text(SUMMARY_DATA)
    (data / "102.summary").write_text("Rain is expected.\n")
    (data / "102.document").write_text("Forecasters said\nrain is expected.\n")
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": ["999"], "validation": [], "test": [101, "102"]}))
    code, out, _ = run(capsys, "xsum", "--data-dir", data, "--split-file", split, "--split", "test",
                       "--out", tmp_path / "test")
    assert code == 0 and "read 2, kept 2, dropped 0" in out
    assert lines(tmp_path / "test.src") == [
        "The council voted seven to two. Officials said the bridge was not safe.",
        "Forecasters said rain is expected.",
    ]
    assert lines(tmp_path / "test.tgt") == ["A bridge in the city has been closed after a council vote.",
                                           "Rain is expected."]
    code, _, err = run(capsys, "xsum", "--data-dir", data, "--split-file", split, "--split", "train",
                       "--out", tmp_path / "train")
    assert code == 1 and "train id 999 has no file" in err and "999.summary: pass --skip-missing" in err
    code, out, _ = run(capsys, "xsum", "--data-dir", data, "--split-file", split, "--split", "train",
                       "--skip-missing", "--out", tmp_path / "train")
    assert code == 0 and "read 1, kept 0, dropped 1 (1 missing file)" in out
    (data / "101.summary").write_text(SUMMARY_DATA.replace("[SN]RESTBODY[SN]", "[SN]BODY[SN]"))
    code, _, err = run(capsys, "xsum", "--data-dir", data, "--split-file", split, "--split", "test",
                       "--out", tmp_path / "test2")
    assert code == 1 and "101.summary: no [SN]RESTBODY[SN] section" in err
    code, _, err = run(capsys, "xsum", "--data-dir", data, "--split-file", split, "--split", "dev",
                       "--out", tmp_path / "dev")
    assert code == 1 and "has no split 'dev'" in err


# --------------------------------------------------------------------------------------------------- Gigaword


def test_gigaword_parallel_files(tmp_path, capsys):
    article = tmp_path / "test.article.txt"
    title = tmp_path / "test.title.txt"
    article.write_text("australia 's current account deficit shrunk by a record #.## billion dollars\n\nthird\n")
    title.write_text("australian current account deficit narrows sharply\nempty article\nUNK title\n")
    code, out, _ = run(capsys, "gigaword", "--source", article, "--target", title, "--out", tmp_path / "test")
    assert code == 0 and "read 3, kept 2, dropped 1 (1 empty source)" in out
    assert lines(tmp_path / "test.src") == [
        "australia 's current account deficit shrunk by a record #.## billion dollars", "third"]
    assert lines(tmp_path / "test.tgt") == ["australian current account deficit narrows sharply", "UNK title"]
    # Windows line ends and a U+2028 inside a line do not change the pairing
    title.write_bytes("australian current account deficit narrows sharply\r\nempty\u2028article\r\nUNK title\r\n"
                      .encode("utf-8"))
    code, out, _ = run(capsys, "gigaword", "--source", article, "--target", title, "--out", tmp_path / "crlf")
    assert code == 0 and lines(tmp_path / "crlf.tgt") == lines(tmp_path / "test.tgt")
    title.write_text("only one line\n")
    code, _, err = run(capsys, "gigaword", "--source", article, "--target", title, "--out", tmp_path / "t2")
    assert code == 1 and "test.article.txt has 3 lines but" in err and "test.title.txt has 1" in err


# ------------------------------------------------------------------------------------------------------ SQuAD


def squad_file(path, drop_field=None):
    paragraph = ("Architecturally, the school has a Catholic character. Atop the Main Building's gold dome is a "
                 "golden statue of the Virgin Mary.  Immediately in front of the Main Building is a copper statue "
                 "of Christ.")
    qas = [
        {"id": "q1", "question": "What sits on top of the Main Building?",
         "answers": [{"text": "a golden statue of the Virgin Mary", "answer_start": paragraph.index("a golden")}]},
        {"id": "q2", "question": "What is in front of the Main Building?",
         "answers": [{"text": "a copper statue of Christ", "answer_start": 3}]},
        {"id": "q3", "question": "What character does the school have?",
         "answers": [{"text": "Catholic", "answer_start": paragraph.index("Catholic")},
                     {"text": "a Catholic character", "answer_start": paragraph.index("a Catholic")}]},
        {"id": "q4", "question": "Who built the dome?", "answers": []},
    ]
    if drop_field:
        del qas[2][drop_field]
    data = {"version": "1.1", "data": [
        {"title": "University_of_Notre_Dame", "paragraphs": [{"context": paragraph, "qas": qas}]},
        {"title": "Beyonc\u00e9", "paragraphs": [{"context": "She sang. It was loud.", "qas": [
            {"id": "b1", "question": "Who sang?", "answers": [{"text": "She", "answer_start": 0}]}]}]},
    ]}
    path.write_text(json.dumps(data))
    return path


def test_squad_question_generation_sentence_and_paragraph(tmp_path, capsys):
    squad = squad_file(tmp_path / "train-v1.1.json")
    doclist = tmp_path / "doclist-test.txt"
    doclist.write_text("University_of_Notre_Dame\n")
    code, out, _ = run(capsys, "squad-qg", "--squad-json", squad, "--doclist", doclist, "--context", "sentence",
                       "--out", tmp_path / "test")
    assert code == 0 and "read 4, kept 2, dropped 2 (1 answer not at answer_start, 1 question without answer)" in out
    assert lines(tmp_path / "test.src") == [
        "Atop the Main Building's gold dome is a golden statue of the Virgin Mary. [SEP] "
        "a golden statue of the Virgin Mary",
        "Architecturally, the school has a Catholic character. [SEP] Catholic",
    ]
    assert lines(tmp_path / "test.tgt") == ["What sits on top of the Main Building?",
                                           "What character does the school have?"]
    # an article left out of the doclist before a listed one: the listed one is still read
    doclist.write_text("Beyonc\u00e9\n")
    code, out, err = run(capsys, "squad-qg", "--squad-json", squad, "--doclist", doclist, "--out", tmp_path / "b")
    assert code == 0, err
    assert lines(tmp_path / "b.src") == ["She sang. It was loud. [SEP] She"]
    assert lines(tmp_path / "b.tgt") == ["Who sang?"]
    code, out, _ = run(capsys, "squad-qg", "--squad-json", squad, "--no-answer", "--out", tmp_path / "all")
    assert code == 0 and "read 5, kept 3" in out
    assert lines(tmp_path / "all.src")[2] == "She sang. It was loud."
    assert lines(tmp_path / "all.src")[0].startswith("Architecturally, the school has a Catholic character. Atop")


def test_squad_sentence_context_with_a_repeated_sentence(tmp_path, capsys):
    """The sentence holding the answer is found where the answer is, also when the same sentence occurs again later in
    the paragraph: a repeated sentence does not move the search past the sentences between."""
    paragraph = "It rained. The bridge closed. It rained."
    qas = [{"id": "r1", "question": "What happened first?", "answers": [{"text": "rained", "answer_start": 3}]},
           {"id": "r2", "question": "What closed?",
            "answers": [{"text": "The bridge", "answer_start": paragraph.index("The bridge")}]}]
    squad = tmp_path / "s.json"
    squad.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [{"context": paragraph, "qas": qas}]}]}))
    code, _, err = run(capsys, "squad-qg", "--squad-json", squad, "--context", "sentence", "--out", tmp_path / "o")
    assert code == 0, err
    assert lines(tmp_path / "o.src") == ["It rained. [SEP] rained", "The bridge closed. [SEP] The bridge"]


def test_squad_malformed_records_are_named(tmp_path, capsys):
    squad = squad_file(tmp_path / "train-v1.1.json", drop_field="question")
    code, _, err = run(capsys, "squad-qg", "--squad-json", squad, "--out", tmp_path / "x")
    assert code == 1
    assert ("train-v1.1.json: article 'University_of_Notre_Dame' paragraph 0 question q3: missing field 'question'"
            in err)
    data = json.loads(squad_file(squad).read_text())
    for record, field, where in ((data["data"][1]["paragraphs"][0], "context", "article 'Beyonc\u00e9' paragraph 0"),
                                 (data["data"][1], "title", "article 1"),
                                 (data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0], "answer_start",
                                  "article 'University_of_Notre_Dame' paragraph 0 question q1 answer 0")):
        del record[field]
        squad.write_text(json.dumps(data))
        code, _, err = run(capsys, "squad-qg", "--squad-json", squad, "--out", tmp_path / "x")
        assert code == 1 and f"train-v1.1.json: {where}: missing field '{field}'" in err
    doclist = tmp_path / "doclist-dev.txt"
    doclist.write_text("Some_Other_Article\n")
    code, _, err = run(capsys, "squad-qg", "--squad-json", squad_file(tmp_path / "s.json"), "--doclist", doclist,
                       "--out", tmp_path / "y")
    assert code == 1 and "no article of" in err and "doclist-dev.txt" in err
    assert not list(tmp_path.glob("x.*")) and not list(tmp_path.glob("y.*"))


# ---------------------------------------------------------------------------------------------------- MS MARCO


def msmarco_file(path, drop=None):
    data = {
        "query": {"0": "what is a bridge", "1": "how tall is the tower", "2": "who built it"},
        "query_id": {"0": 10, "1": 11, "2": 12},
        "query_type": {"0": "DESCRIPTION", "1": "NUMERIC", "2": "PERSON"},
        "passages": {
            "0": [{"is_selected": 0, "passage_text": "Unrelated text.", "url": "u"},
                  {"is_selected": 1, "passage_text": "A bridge spans an obstacle.", "url": "v"}],
            "1": [{"is_selected": 0, "passage_text": "Towers are tall.", "url": "w"}],
            "2": [{"is_selected": 1, "passage_text": "Engineers built it in 1900.", "url": "x"}],
        },
        "answers": {"0": ["A structure spanning an obstacle."], "1": ["No Answer Present."], "2": ["Engineers"]},
        "wellFormedAnswers": {"0": ["A bridge is a structure spanning an obstacle."], "1": "[]", "2": "[]"},
    }
    if drop:
        del data[drop[0]][drop[1]]
    path.write_text(json.dumps(data))
    return path


def test_msmarco_qa_and_nlg(tmp_path, capsys):
    marco = msmarco_file(tmp_path / "dev_v2.1.json")
    code, out, _ = run(capsys, "msmarco", "--json", marco, "--out", tmp_path / "qa")
    assert code == 0 and "read 3, kept 2, dropped 1 (1 no answer present)" in out
    assert lines(tmp_path / "qa.src") == ["A bridge spans an obstacle. [SEP] what is a bridge",
                                         "Engineers built it in 1900. [SEP] who built it"]
    assert lines(tmp_path / "qa.tgt") == ["A structure spanning an obstacle.", "Engineers"]
    code, out, _ = run(capsys, "msmarco", "--json", marco, "--task", "nlg", "--passages", "all",
                       "--out", tmp_path / "nlg")
    assert code == 0 and "read 3, kept 1, dropped 2 (2 no well-formed answer)" in out
    assert lines(tmp_path / "nlg.src") == ["Unrelated text. A bridge spans an obstacle. [SEP] what is a bridge"]
    assert lines(tmp_path / "nlg.tgt") == ["A bridge is a structure spanning an obstacle."]
    code, _, err = run(capsys, "msmarco", "--json", msmarco_file(tmp_path / "bad.json", ("answers", "2")),
                       "--out", tmp_path / "bad")
    assert code == 1 and "bad.json: record 2: missing field 'answers'" in err
    assert not list(tmp_path.glob("bad.src"))


# ------------------------------------------------------------------------------------------------------- CoQA


def coqa_file(path, answer_turns=(1, 2, 3)):
    data = {"version": "1.0", "data": [{
        "id": "3zotghdk5ibi9cex97fepx7jetpso7", "source": "mctest", "filename": "mc160.test.41",
        "story": "Once upon a time, in a barn near a farm house, there lived a little white kitten named Cotton.",
        "questions": [{"input_text": "what color was cotton?", "turn_id": 1},
                      {"input_text": "where did she live?", "turn_id": 2},
                      {"input_text": "did she live alone?", "turn_id": 3}],
        "answers": [{"input_text": "white", "span_text": "white", "span_start": 59, "span_end": 93, "turn_id": t}
                    for t in answer_turns],
    }]}
    data["data"][0]["answers"][1]["input_text"] = "in a barn"
    data["data"][0]["answers"][2]["input_text"] = "no"
    path.write_text(json.dumps(data))
    return path


def test_coqa_history_question_passage(tmp_path, capsys):
    coqa = coqa_file(tmp_path / "coqa-dev-v1.0.json")
    code, out, _ = run(capsys, "coqa", "--json", coqa, "--max-history", "1", "--out", tmp_path / "dev")
    assert code == 0 and "read 3, kept 3, dropped 0" in out
    story = "Once upon a time, in a barn near a farm house, there lived a little white kitten named Cotton."
    assert lines(tmp_path / "dev.src") == [
        f"Q: what color was cotton? [SEP] {story}",
        f"Q: what color was cotton? A: white Q: where did she live? [SEP] {story}",
        f"Q: where did she live? A: in a barn Q: did she live alone? [SEP] {story}",
    ]
    assert lines(tmp_path / "dev.tgt") == ["white", "in a barn", "no"]
    code, _, _ = run(capsys, "coqa", "--json", coqa, "--out", tmp_path / "all")
    assert lines(tmp_path / "all.src")[2].startswith("Q: what color was cotton? A: white Q: where did she live?")
    code, _, err = run(capsys, "coqa", "--json", coqa_file(tmp_path / "bad.json", (1, 3, 2)), "--out", tmp_path / "b")
    assert code == 1
    assert "bad.json: conversation 3zotghdk5ibi9cex97fepx7jetpso7: question turn 2 is paired with answer turn 3" in err


# ----------------------------------------------------------------------------------------------------- Cornell

SEP = " +++$+++ "


def cornell_files(tmp_path, utterances, conversations):
    movie_lines = tmp_path / "movie_lines.txt"
    movie_lines.write_bytes("".join(
        f"L{i}{SEP}u{i % 2}{SEP}m0{SEP}{'BIANCA' if i % 2 else 'CAMERON'}{SEP}{text}\n"
        for i, text in enumerate(utterances)
    ).encode("iso-8859-1"))
    movie_conversations = tmp_path / "movie_conversations.txt"
    movie_conversations.write_text("".join(f"u0{SEP}u1{SEP}m0{SEP}{ids!r}\n" for ids in conversations),
                                   encoding="iso-8859-1")
    return movie_lines, movie_conversations


def test_cornell_pairs_filters_and_splits(tmp_path, capsys):
    utterances = [f"utterance number {i} caf\u00e9" for i in range(40)] + ["Hi", "x " * 30]
    conversations = [[f"L{i}", f"L{i + 1}", f"L{i + 2}"] for i in range(0, 39, 3)] + [["L39", "L40"], ["L41", "L0"]]
    movie_lines, movie_conversations = cornell_files(tmp_path, utterances, conversations)
    code, out, _ = run(capsys, "cornell", "--lines", movie_lines, "--conversations", movie_conversations,
                       "--out-dir", tmp_path / "raw", "--valid-size", "3", "--test-size", "4")
    assert code == 0
    assert "cornell pairs: read 28, kept 26, dropped 2 (2 utterance outside 2-25 words)" in out
    splits = {name: list(zip(lines(tmp_path / "raw" / f"{name}.src"), lines(tmp_path / "raw" / f"{name}.tgt")))
              for name in ("train", "valid", "test", "train10k")}
    expected = [(f"utterance number {i} caf\u00e9", f"utterance number {i + 1} caf\u00e9")
                for start in range(0, 39, 3) for i in (start, start + 1)]
    assert sorted(splits["train"] + splits["valid"] + splits["test"]) == sorted(expected)
    assert (len(splits["valid"]), len(splits["test"]), len(splits["train"])) == (3, 4, 19)
    assert splits["train10k"] == splits["train"][:SMALL_TRAIN]
    assert "cornell valid: read 3, kept 3" in out


def test_cornell_malformed_lines_are_named(tmp_path, capsys):
    movie_lines, movie_conversations = cornell_files(tmp_path, ["a b", "c d"], [["L0", "L7"]])
    code, _, err = run(capsys, "cornell", "--lines", movie_lines, "--conversations", movie_conversations,
                       "--out-dir", tmp_path / "raw")
    assert code == 1 and "movie_conversations.txt:1: line L7 is not in" in err
    movie_lines.write_text(f"L0{SEP}u0{SEP}m0 only three fields\n")
    code, _, err = run(capsys, "cornell", "--lines", movie_lines, "--conversations", movie_conversations,
                       "--out-dir", tmp_path / "raw")
    assert code == 1 and "movie_lines.txt:1: expected 5 fields" in err
    assert not (tmp_path / "raw").exists()


def test_cornell_requires_movie_lines(tmp_path, capsys):
    _, movie_conversations = cornell_files(tmp_path, ["a b", "c d"], [["L0", "L1"]])
    with pytest.raises(SystemExit) as stop:  # argparse's usage error, before anything is read
        run(capsys, "cornell", "--conversations", movie_conversations, "--out-dir", tmp_path / "raw")
    assert stop.value.code == 2
    assert "palm-prepare cornell: error: the following arguments are required: --lines" in capsys.readouterr().err
    assert not (tmp_path / "raw").exists()


def test_console_script_runs(tmp_path):
    """The installed `palm-prepare` entry point (setup.py) runs as a real process."""
    article, title = tmp_path / "a.txt", tmp_path / "t.txt"
    article.write_text("one sentence\n")
    title.write_text("one title\n")
    result = run_cli("palm-prepare", "gigaword", "--source", article, "--target", title, "--out", tmp_path / "o")
    assert "read 1, kept 1, dropped 0" in result.stdout
    assert (tmp_path / "o.tgt").read_text() == "one title\n"


def test_help_of_every_command(capsys):
    texts = subcommand_help(prepare.main, prepare.build_parser(), "palm-prepare", capsys)
    assert sorted(texts) == ["cnndm", "coqa", "cornell", "encode", "gigaword", "msmarco", "squad-qg", "xsum"]
    assert "--context {paragraph,sentence} the paragraph, or the sentence(s) holding the answer" in texts["squad-qg"]
    for name in ("squad-qg", "msmarco", "coqa"):  # the default the outputs above are written with, " [SEP] "
        assert "--separator SEPARATOR text between the parts of the source (default: ' [SEP] ')" in texts[name]


@pytest.mark.parametrize("benchmark", ["msmarco", "coqa", "squad-qg"])
def test_json_readers_reject_non_json(tmp_path, capsys, benchmark):
    bad = tmp_path / "broken.json"
    bad.write_text('{"data": [')
    option = "--squad-json" if benchmark == "squad-qg" else "--json"
    code, _, err = run(capsys, benchmark, option, bad, "--out", tmp_path / "o")
    assert code == 1 and "broken.json is not JSON" in err
