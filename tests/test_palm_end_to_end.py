"""PALM with real fairseq processes: preprocess -> RoBERTa (masked_lm) -> PALM stage ae -> stage joint ->
translation fine-tuning -> fairseq-generate, on tiny generated text."""
import argparse
import math
import random
import re
import shutil

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

import palm_plugin  # noqa: F401  (registers the plugin; weights-only checkpoint loading)
from palm_plugin.models.palm import PalmConfig, PalmModel, palm_tiny
from tests.conftest import USER_DIR, run_cli

TINY = ["--encoder-layers", 2, "--encoder-embed-dim", 64, "--encoder-ffn-embed-dim", 128, "--encoder-attention-heads", 2]
COMMON = ["--cpu", "--optimizer", "adam", "--lr", "1e-3", "--no-epoch-checkpoints", "--log-format", "simple",
          "--log-interval", 1, "--num-workers", 0, "--seed", 1]
pytestmark = pytest.mark.slow


def write_corpus(directory, seed, vocabulary=60, successors=3):
    """Documents of 'sentences' (one a line, blank line between documents) from a Markov chain in which each word
    has ``successors`` possible next words (so about log2(successors) bits per word can be learned, against
    log2(vocabulary) for a model that learned nothing), and source/target pairs whose target is the source's first
    words reversed."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocabulary)]
    following = {word: rng.sample(words, successors) for word in words}

    def sentence(low, high):
        chain = [rng.choice(words)]
        for _ in range(rng.randint(low, high) - 1):
            chain.append(rng.choice(following[chain[-1]]))
        return " ".join(chain)

    for split, documents in (("train", 60), ("valid", 8)):
        with open(directory / f"{split}.txt", "w") as f:
            f.write("\n\n".join("\n".join(sentence(3, 12) for _ in range(rng.randint(2, 6))) for _ in range(documents)))
            f.write("\n")
    for split, count in (("train", 200), ("valid", 20), ("test", 6)):
        with open(directory / f"{split}.src", "w") as src, open(directory / f"{split}.tgt", "w") as tgt:
            for _ in range(count):
                words_ = sentence(4, 9).split()
                src.write(" ".join(words_) + "\n")
                tgt.write(" ".join(words_[:4][::-1]) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Binarized monolingual data (dict.txt without <mask>, as roberta.base's) and pairs in the same dictionary."""
    root = tmp_path_factory.mktemp("palm_e2e")
    write_corpus(root, seed=0)
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", root / "train.txt", "--validpref",
            root / "valid.txt", "--destdir", root / "mono", "--workers", 1)
    run_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "train",
            "--validpref", root / "valid", "--testpref", root / "test", "--srcdict", root / "mono" / "dict.txt",
            "--tgtdict", root / "mono" / "dict.txt", "--destdir", root / "pairs", "--workers", 1)
    return root


@pytest.fixture(scope="module")
def roberta_checkpoint(corpus):
    """A real `fairseq-train --task masked_lm --arch roberta` run, tiny; its dictionary gains <mask> at the end."""
    run_cli("fairseq-train", corpus / "mono", "--task", "masked_lm", "--arch", "roberta", "--criterion", "masked_lm",
            *TINY, "--max-positions", 512, "--tokens-per-sample", 64, "--sample-break-mode", "none",
            "--batch-size", 8, "--max-update", 3, "--disable-validation", "--save-dir", corpus / "roberta", *COMMON)
    return corpus / "roberta" / "checkpoint_last.pt"


def build_palm(dictionary, roberta_path, trains_encoder_mlm):
    class Task:
        source_dictionary = target_dictionary = dictionary

    Task.trains_encoder_mlm = trains_encoder_mlm
    args = argparse.Namespace(roberta_path=str(roberta_path))
    palm_tiny(args)
    return PalmModel.build_model(PalmConfig.from_namespace(args), Task()).eval()


def test_roberta_checkpoint_initialises_the_encoder(roberta_checkpoint):
    [roberta], _, roberta_task = checkpoint_utils.load_model_ensemble_and_task([str(roberta_checkpoint)])
    roberta.eval()
    dictionary = roberta_task.source_dictionary  # dict.txt + <mask>, as the continuation_pair task builds it
    palm = build_palm(dictionary, roberta_checkpoint, trains_encoder_mlm=True)
    torch.manual_seed(0)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (3, 11))
    tokens[:, 0], tokens[:, -1] = dictionary.bos(), dictionary.eos()
    tokens[2, -3:] = dictionary.pad()
    masked = torch.rand(tokens.shape) < 0.3
    masked &= tokens.ne(dictionary.pad())
    with torch.no_grad():
        features = roberta(tokens, features_only=True)[0]
        palm_out = palm.encoder(tokens)["encoder_out"][0].transpose(0, 1)
        roberta_logits = roberta(tokens, masked_tokens=masked)[0]
        palm_logits = palm(tokens, None, masked_tokens=masked)[1]["mlm_logits"]
    real = tokens.ne(dictionary.pad())
    torch.testing.assert_close(palm_out[real], features[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(palm_logits, roberta_logits, atol=1e-5, rtol=1e-5)
    assert palm.decoder.embed_tokens.weight is palm.encoder.embed_tokens.weight


def test_roberta_mask_row_dropped_for_a_dictionary_without_mask(roberta_checkpoint, corpus):
    """roberta.base's case: dict.txt has no <mask>, the checkpoint's embedding one row more (fairseq BART's rule)."""
    [roberta], _, _ = checkpoint_utils.load_model_ensemble_and_task([str(roberta_checkpoint)])
    roberta.eval()
    dictionary = Dictionary.load(str(corpus / "pairs" / "dict.src.txt"))
    assert "<mask>" not in dictionary
    palm = build_palm(dictionary, roberta_checkpoint, trains_encoder_mlm=False)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(
            palm.encoder(tokens)["encoder_out"][0].transpose(0, 1), roberta(tokens, features_only=True)[0],
            atol=1e-5, rtol=1e-5,
        )


def test_roberta_path_with_wrong_dictionary_is_a_clear_error(roberta_checkpoint, tmp_path):
    write_corpus(tmp_path, seed=1, vocabulary=90)  # more word types: a larger dictionary
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "train.txt", "--validpref",
            tmp_path / "valid.txt", "--destdir", tmp_path / "mono", "--workers", 1)
    result = run_cli("fairseq-train", tmp_path / "mono", "--user-dir", USER_DIR, "--task", "continuation_pair",
                     "--arch", "palm_tiny", "--criterion", "palm_mlm_lm", "--roberta-path", roberta_checkpoint,
                     "--max-tokens", 2000, "--max-update", 1, "--save-dir", tmp_path / "ck", *COMMON, check=False)
    assert result.returncode != 0
    message = [line for line in result.stderr.splitlines() if str(roberta_checkpoint) in line and "rows" in line]
    assert message, result.stderr[-3000:]
    assert "dictionary" in message[-1] and "--srcdict" in message[-1]


def last_valid(log, key):
    values = re.findall(rf"valid on 'valid' subset \|.*?\| {key} ([0-9.]+)", log)
    assert values, log[-3000:]
    return float(values[-1])


def test_pretrain_finetune_generate(corpus, roberta_checkpoint, monkeypatch):
    palm = ["--user-dir", USER_DIR, "--task", "continuation_pair", "--arch", "palm_tiny", "--criterion", "palm_mlm_lm",
            "--max-source-tokens", 40, "--max-tokens", 1500, *COMMON]
    ae = run_cli("fairseq-train", corpus / "mono", *palm, "--stage", "ae", "--roberta-path", roberta_checkpoint,
                 "--max-target-tokens", 8, "--max-epoch", 2, "--save-dir", corpus / "ae")
    ae_log = ae.stdout + ae.stderr
    assert re.search(r"\bmlm_loss[ =]", ae_log) and not re.search(r"\blm_loss[ =]", ae_log)
    # sentences of 9 to 12 words exceed --max-target-tokens 8: truncated and counted, not fatal
    truncated = re.search(r"train: 0 of (\d+) sources truncated .* and (\d+) targets truncated", ae_log)
    assert truncated and 0 < int(truncated.group(2)) < int(truncated.group(1)), ae_log[-3000:]
    joint = run_cli("fairseq-train", corpus / "mono", *palm, "--stage", "joint", "--split-mode", "fraction",
                    "--max-target-tokens", 12, "--max-epoch", 12, "--mlm-weight", 1.0,
                    "--finetune-from-model", corpus / "ae" / "checkpoint_best.pt", "--save-dir", corpus / "joint")
    joint_log = joint.stdout + joint.stderr
    # A model that learned nothing pays log2(dictionary) bits a token; the Markov chain allows about log2(3)
    chance = math.log2(len(Dictionary.load(str(corpus / "mono" / "dict.txt"))))
    assert last_valid(joint_log, "lm_loss") < chance - 1.5 and last_valid(joint_log, "mlm_loss") < chance - 1.5

    finetune = run_cli("fairseq-train", corpus / "pairs", "--user-dir", USER_DIR, "--task", "translation",
                       "--arch", "palm_tiny", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1,
                       "--max-tokens", 1500, "--max-epoch", 3, "--save-dir", corpus / "finetune",
                       "--finetune-from-model", corpus / "joint" / "checkpoint_best.pt", *COMMON)
    finetune_log = finetune.stdout + finetune.stderr
    # fairseq loads the PALM checkpoint strictly (it raises on any missing or unexpected parameter)
    assert f"loading pretrained model from {corpus / 'joint' / 'checkpoint_best.pt'}" in finetune_log
    assert "Loaded checkpoint" in finetune_log
    generate = run_cli("fairseq-generate", corpus / "pairs", "--user-dir", USER_DIR, "--gen-subset", "test",
                       "--path", corpus / "finetune" / "checkpoint_best.pt", "--beam", 5, "--lenpen", 1.0,
                       "--no-repeat-ngram-size", 3, "--batch-size", 4, "--required-batch-size-multiple", 1, "--cpu")
    hypotheses = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", generate.stdout, flags=re.M)
    assert sorted(int(i) for i, _, _ in hypotheses) == list(range(6))
    assert all(float(score) <= 0 for _, score, _ in hypotheses)
    for _, _, text in hypotheses:  # --no-repeat-ngram-size 3 holds on CPU (the plugin's fix of fairseq's blocker)
        words = text.split()
        trigrams = list(zip(words, words[1:], words[2:]))
        assert len(trigrams) == len(set(trigrams)), text

    # A saved pre-training checkpoint loads for inference without reading its --roberta-path again.
    def refuse(model, path):
        raise AssertionError(f"read {path} while loading a saved PALM checkpoint")

    monkeypatch.setattr("palm_plugin.models.palm.load_roberta_encoder", refuse)
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(corpus / "ae" / "checkpoint_best.pt")])
    assert isinstance(model, PalmModel) and model.mlm_head is not None and task.cfg.split_mode == "sentence"



def test_generation_does_not_read_roberta_path_again(corpus, roberta_checkpoint, tmp_path):
    """Fine-tune palm with the translation task and --roberta-path, delete the RoBERTa file: fairseq-generate
    loads the fine-tuned checkpoint and scores the references exactly as the fine-tuned weights do (computed here
    from the checkpoint's state dict, in a model built without any RoBERTa)."""
    roberta = tmp_path / "roberta.pt"
    shutil.copy(roberta_checkpoint, roberta)
    run_cli("fairseq-train", corpus / "pairs", "--user-dir", USER_DIR, "--task", "translation", "--arch", "palm_tiny",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1, "--roberta-path", roberta,
            "--max-tokens", 1500, "--max-update", 4, "--save-dir", tmp_path / "ck", "--disable-validation", *COMMON)
    roberta.unlink()
    generate = run_cli("fairseq-generate", corpus / "pairs", "--user-dir", USER_DIR, "--gen-subset", "test",
                       "--path", tmp_path / "ck" / "checkpoint_last.pt", "--score-reference", "--batch-size", 2,
                       "--cpu")
    scores = {int(i): [float(x) for x in p.split()] for i, p in re.findall(r"^P-(\d+)\t(.*)$", generate.stdout, re.M)}
    assert sorted(scores) == list(range(6)), generate.stdout[-2000:]

    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "ck" / "checkpoint_last.pt"))
    dictionary = Dictionary.load(str(corpus / "pairs" / "dict.src.txt"))
    args = argparse.Namespace(dropout=0.0, attention_dropout=0.0)
    palm_tiny(args)

    class Task:
        source_dictionary = target_dictionary = dictionary
        trains_encoder_mlm = False

    model = PalmModel.build_model(PalmConfig.from_namespace(args), Task()).eval()
    model.load_state_dict(state["model"], strict=True)
    sources = (corpus / "test.src").read_text().splitlines()
    targets = (corpus / "test.tgt").read_text().splitlines()
    for index, (source, target) in enumerate(zip(sources, targets)):
        src = dictionary.encode_line(source, add_if_not_exist=False).long().unsqueeze(0)
        tgt = dictionary.encode_line(target, add_if_not_exist=False).long().unsqueeze(0)
        prev = torch.cat((tgt[:, -1:], tgt[:, :-1]), dim=1)
        with torch.no_grad():
            log_probs, _ = model(src, torch.tensor([src.size(1)]), prev)
        expected = log_probs[0].gather(1, tgt[0].unsqueeze(1)).squeeze(1) / math.log(2)
        torch.testing.assert_close(torch.tensor(scores[index]), expected, atol=2e-4, rtol=0)
