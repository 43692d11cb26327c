"""palm-prepare encode --bpe wordpiece: the casing comes with the checkpoint (tokenizer_config.json beside
vocab.txt, else the vocabulary itself), and text that turns into [UNK] more than 1% of the time is reported."""
import json

from palm_tools.data import prepare

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "."]
TEXT = "The Cat sat on the Mat .\nthe cat sat .\n"  # 11 words; cased: The, Cat, Mat are not in the vocabulary


def encode(tmp_path, *flags):
    (tmp_path / "in.txt").write_text(TEXT)
    assert prepare.main(["encode", "--bpe", "wordpiece", "--model", str(tmp_path / "vocab.txt"), *flags,
                         "--inputs", str(tmp_path / "in.txt"), "--outputs", str(tmp_path / "out.txt")]) == 0
    return (tmp_path / "out.txt").read_text()


def test_casing_from_tokenizer_config_and_unknown_words_warned(tmp_path, capsys):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    assert encode(tmp_path) == "the cat sat on the mat .\nthe cat sat .\n"
    err = capsys.readouterr().err
    assert "lower-cased WordPiece (from" in err and "tokenizer_config.json do_lower_case" in err and "[UNK]" not in err

    assert encode(tmp_path, "--cased").startswith("[UNK] [UNK] sat on the [UNK] .")
    err = capsys.readouterr().err
    assert (f"warning: {tmp_path / 'in.txt'}: 3 of 11 words (27.3%) became [UNK]; likely cause: the text was "
            "encoded cased; if the vocabulary is uncased, pass --uncased") in err


def test_without_tokenizer_config_the_vocabulary_decides(tmp_path, capsys):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    assert encode(tmp_path) == "the cat sat on the mat .\nthe cat sat .\n"
    assert "the vocabulary (has no upper-case WordPiece)" in capsys.readouterr().err
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB + ["The"]) + "\n")
    assert encode(tmp_path).startswith("The [UNK] sat")
    assert "cased WordPiece (from the vocabulary (has upper-case WordPiece))" in capsys.readouterr().err
