"""The papers' lengths in the recipes: UniLM v1 (CNN/DM) and UniLMv2 (CNN/DM, XSum) fine-tune at 768 positions.
With CNN/DM-like pairs (synthetic, 700+ source words of real text) the unilm and unilm2 recipes skip no training
pair, say what they truncated, and train a model with 768 positions (SMOKE=1: tiny models, a few updates)."""
import pytest

from palm_plugin.fixes import safe_loading
from tests.test_recipes import run_recipe


def long_pairs(raw, words):
    """Rewrite the recipe's raw splits: sources of 700+ words, targets of 60, from the smoke files' real text."""
    for split in ("train", "valid", "test"):
        sources = (raw / f"{split}.src").read_text(encoding="utf-8").splitlines()
        lines = []
        for index in range(len(sources)):
            start = (97 * index) % max(1, len(words) - 800)
            lines.append(words[start:start + 720 + index % 40])
        (raw / f"{split}.src").write_text("".join(" ".join(line) + "\n" for line in lines), encoding="utf-8")
        (raw / f"{split}.tgt").write_text("".join(" ".join(line[-60:]) + "\n" for line in lines), encoding="utf-8")
        assert min(len(line) for line in lines) >= 700


@pytest.mark.slow
@pytest.mark.parametrize("benchmark,model,max_source,max_target", [("cnndm", "unilm", 640, 128),
                                                                   ("xsum", "unilm2", 720, 48)])
def test_recipes_at_the_papers_lengths_skip_no_pair_and_have_768_positions(tmp_path, benchmark, model, max_source,
                                                                           max_target):
    run_recipe(benchmark, tmp_path, "download convert", model=model)
    work = tmp_path / benchmark / model
    text = " ".join((work / "raw" / f"{s}.src").read_text(encoding="utf-8") for s in ("train", "valid", "test"))
    long_pairs(work / "raw", text.split() * (1 + 2000 // len(text.split())))
    lengths = dict(MAX_SOURCE=str(max_source), MAX_TARGET=str(max_target))
    result = run_recipe(benchmark, tmp_path, "tokenize binarize train", model=model, **lengths)
    summary = [line for line in result.stderr.splitlines() if "training data:" in line]
    assert summary and summary[-1].endswith("skipped 0 pairs longer than the model's positions"), result.stderr[-3000:]
    assert f"truncated {len((work / 'raw' / 'train.src').read_text().splitlines())} sources" in summary[-1]
    state = safe_loading.load_state(str(work / "checkpoints" / "checkpoint_last.pt"))
    assert state["cfg"]["model"]["max_positions"] == 768
    assert state["model"]["encoder.stack.embeddings.positions.weight"].size(0) == 768
