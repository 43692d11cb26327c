"""``fairseq-interactive --task unilm_seq2seq`` decodes raw text read from stdin, through fairseq's own ``--bpe``,
and gives the hypotheses ``fairseq-generate`` gives on the same sources (unilm and unilm2, both layouts)."""
import subprocess

import pytest
import sentencepiece
import torch

from tests.conftest import BIN, REPO, binarize_pairs, tool_env


def raw_pairs(directory, lines_per_split, seed=0):
    """Copy pairs (target = source) of words ``w0 .. w11``: the raw text, a sentencepiece BPE model learnt on it
    and the text in its pieces (what fairseq-preprocess binarizes). Returns the raw and BPE directories and the
    model path."""
    generator = torch.Generator().manual_seed(seed)
    raw, bpe = directory / "raw", directory / "bpe"
    raw.mkdir(), bpe.mkdir()
    rows = {}
    for split, count in lines_per_split.items():
        rows[split] = []
        for _ in range(count):
            length = int(torch.randint(2, 5, (1,), generator=generator))
            rows[split].append(" ".join(f"w{int(i)}" for i in torch.randint(12, (length,), generator=generator)))
        (raw / f"{split}.src").write_text("\n".join(rows[split]) + "\n")
    model = directory / "spm"
    sentencepiece.SentencePieceTrainer.train(
        input=str(raw / "train.src"), model_prefix=str(model), vocab_size=24, model_type="bpe",
        hard_vocab_limit=False, minloglevel=2,
    )
    pieces = sentencepiece.SentencePieceProcessor(model_file=f"{model}.model")
    for split, lines in rows.items():
        encoded = "\n".join(" ".join(pieces.encode(line, out_type=str)) for line in lines) + "\n"
        for side in ("src", "tgt"):
            (bpe / f"{split}.{side}").write_text(encoded)
    return raw, bpe, f"{model}.model"


def hypotheses(output: str):
    """``{sentence id: detokenized best hypothesis}`` from the ``D-`` lines of fairseq-generate / -interactive."""
    found = {}
    for line in output.splitlines():
        if line.startswith("D-"):
            key, _, text = line.split("\t")
            found.setdefault(int(key[2:]), text)
    return found


LAYOUTS = {
    "unilm": ["--arch", "unilm_tiny"],
    "unilm2": ["--arch", "unilm2_tiny", "--pseudo-masks", "--source-segment", "0", "--target-segment", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_interactive_from_stdin_equals_generate(tmp_path, cli, layout):
    raw, bpe, spm = raw_pairs(tmp_path, {"train": 64, "valid": 8, "test": 8})
    data = tmp_path / "bin"
    binarize_pairs(data, bpe / "train", bpe / "valid", bpe / "test")
    task = ["--user-dir", REPO / "palm_plugin", "--task", "unilm_seq2seq", "--cpu", "--max-source-positions", "16",
            "--max-target-positions", "16"]
    arch = LAYOUTS[layout][2:]  # the task options of the layout (the arch is for training only)
    cli("fairseq-train", data, *task, *LAYOUTS[layout], "--criterion", "unilm_cloze", "--optimizer", "adam",
        "--lr", "1e-3", "--batch-size", "16", "--max-update", "8", "--save-dir", tmp_path / "ckpt",
        "--no-epoch-checkpoints", "--log-format", "simple")
    checkpoint = tmp_path / "ckpt" / "checkpoint_last.pt"
    decoding = ["--path", checkpoint, "--beam", "3", "--max-len-b", "12", "--batch-size", "1", "--bpe", "sentencepiece",
                "--sentencepiece-model", spm]
    generated = cli("fairseq-generate", data, *task, *arch, *decoding, "--gen-subset", "test")
    expected = hypotheses(generated.stdout)

    sources = (raw / "test.src").read_text()
    env = tool_env()
    command = [str(BIN / "fairseq-interactive"), str(data)] + [str(a) for a in (*task, *arch, *decoding)]
    interactive = subprocess.run(command + ["--buffer-size", "1", "--input", "-"], input=sources, env=env,
                                 capture_output=True, text=True, timeout=600)
    assert interactive.returncode == 0, interactive.stderr[-4000:]
    decoded = hypotheses(interactive.stdout)
    assert len(decoded) == len(sources.splitlines()) == len(expected) == 8
    assert decoded == expected
    # the raw text went through the BPE: the detokenized hypotheses are words again, not pieces
    assert decoded and not any("\u2581" in text for text in decoded.values()), decoded
