"""End to end: fairseq-preprocess -> fairseq-train --task pmlm --criterion pmlm_ae_par --arch unilm2_tiny.

On i.i.d. uniform tokens nothing is predictable, so a model without leakage stays at chance (log2 of the number of
word types) on held-out data; a leak (a [P] token seeing its own original token, directly or through a chain of
attentions) would let the loss fall towards 0. On text with repeated structure (a document repeats one random
sentence) the same training brings both losses well below chance.

[M] slots hold the [M] symbol only here (``--leave-unmasked-prob 0 --random-token-prob 0``): with BERT's 10%
unchanged tokens the [M] slot itself carries the answer now and then, and chance would not be the floor.
"""
import json
import math
import random

import pytest

WORDS = 50
CHANCE = math.log2(WORDS)


def write_corpus(path, documents, document, rnd):
    with open(path, "w") as f:
        for _ in range(documents):
            f.write("\n".join(document(rnd)) + "\n\n")  # a blank line ends a document


def iid_document(rnd):
    return [" ".join(f"w{rnd.randrange(WORDS)}" for _ in range(rnd.randint(10, 20))) for _ in range(4)]


def repeated_sentence_document(rnd):
    """Four lines repeating one random five-word sentence: a masked token is the word five positions away."""
    sentence = [f"w{rnd.randrange(WORDS)}" for _ in range(5)]
    return [" ".join(sentence * rnd.randint(2, 4)) for _ in range(4)]


def train_and_validate(cli, tmp_path, document):
    rnd = random.Random(0)
    write_corpus(tmp_path / "train.txt", 5000, document, rnd)
    write_corpus(tmp_path / "valid.txt", 100, document, rnd)
    cli(
        "fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "train.txt",
        "--validpref", tmp_path / "valid.txt", "--destdir", tmp_path / "data", "--workers", "1",
    )
    result = cli(
        "fairseq-train", tmp_path / "data", "--user-dir", "palm_plugin", "--task", "pmlm",
        "--criterion", "pmlm_ae_par", "--arch", "unilm2_tiny", "--tokens-per-sample", "64",
        "--leave-unmasked-prob", "0", "--random-token-prob", "0", "--dropout", "0", "--attention-dropout", "0",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-3", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "100", "--max-update", "400", "--batch-size", "16", "--seed", "1",
        "--log-format", "json", "--log-interval", "100", "--no-save", "--cpu",
        "--save-dir", tmp_path / "checkpoints",
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "| valid |" in line]
    assert lines, "fairseq-train printed no validation line"
    stats = json.loads(lines[-1].split("| valid |", 1)[1])
    assert int(stats["valid_num_updates"]) == 400
    return float(stats["valid_ae_loss"]), float(stats["valid_par_loss"])


@pytest.mark.slow
def test_iid_tokens_stay_at_chance(cli, tmp_path):
    ae_loss, par_loss = train_and_validate(cli, tmp_path, iid_document)
    for loss in (ae_loss, par_loss):
        assert loss > CHANCE - 0.05, f"below chance ({CHANCE:.3f} bits) on unpredictable tokens: leakage"
        assert loss < CHANCE + 0.2, "the model did not even learn the unigram distribution"


@pytest.mark.slow
def test_structured_text_falls_well_below_chance(cli, tmp_path):
    ae_loss, par_loss = train_and_validate(cli, tmp_path, repeated_sentence_document)
    assert ae_loss < 0.4 * CHANCE
    assert par_loss < 0.4 * CHANCE
