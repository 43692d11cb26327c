"""``--eval-bleu``: the validation splits decoded at each validation and their corpus BLEU logged, so that
``--best-checkpoint-metric bleu`` keeps the checkpoint that decodes best: UniLM's ``unilm_seq2seq`` has the options of
fairseq's ``translation`` task (palm_plugin/tasks/bleu_validation.py), and PALM, fine-tuned with that task, has
fairseq's own; the checkpoints of such runs keep numpy arrays, which the plugin's safe loading refused."""
import json
import random
import re

import numpy as np
import pytest
import sacrebleu
import torch

import palm_plugin  # noqa: F401  (weights-only loading of fairseq checkpoints)
from palm_plugin.data.pseudo_seq2seq_dataset import PseudoSeq2SeqDataset
from palm_plugin.data.token_masking import TokenMaskingPolicy
from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset
from palm_plugin.errors import InputValueError
from palm_plugin.fixes.generation_options import decoding_options, eval_bleu_problem
from tests.conftest import USER_DIR, binarize_pairs, run_cli

DECODING = {"beam": 2, "max_len_b": 12}
FAMILIES = {
    "unilm": ["--task", "unilm_seq2seq", "--arch", "unilm_tiny", "--criterion", "unilm_cloze", "--mask-prob", "0.5",
              "--max-source-positions", 16, "--max-target-positions", 16],
    "palm": ["--task", "translation", "--arch", "palm_tiny", "--criterion", "label_smoothed_cross_entropy"],
}


@pytest.fixture(scope="module")
def copy_pairs(tmp_path_factory):
    """Pairs whose target copies the source, 2 to 7 words of 20: a tiny model learns them in 150 updates."""
    root = tmp_path_factory.mktemp("copy")
    rng = random.Random(0)
    for split, count in (("train", 300), ("valid", 24)):
        lines = [" ".join(f"w{rng.randrange(20)}" for _ in range(rng.randint(2, 7))) for _ in range(count)]
        for side in ("src", "tgt"):
            (root / f"{split}.{side}").write_text("\n".join(lines) + "\n")
    binarize_pairs(root / "bin", root / "train", root / "valid")
    return root / "bin"


def _validation_bleus(log: str):
    return [float(b) for b in re.findall(r"valid on 'valid' subset \|.*? \| bleu ([\d.]+) \|", log)]


@pytest.mark.parametrize("family", FAMILIES)
def test_validation_bleu_is_fairseq_generates_and_keeps_the_best_checkpoint(family, copy_pairs, tmp_path):
    """The BLEU logged at the last validation is sacrebleu's BLEU of what fairseq-generate decodes from the last
    checkpoint with the same options; checkpoint_best.pt holds the best of the logged values; the run resumes from
    its checkpoint, and fairseq-generate loads it (both refused the numpy arrays of the BLEU meters)."""
    train = ["fairseq-train", copy_pairs, "--user-dir", USER_DIR, *FAMILIES[family], "--optimizer", "adam", "--lr",
             "3e-3", "--batch-size", 32, "--dropout", 0, "--attention-dropout", 0, "--cpu", "--seed", 1,
             "--save-dir", tmp_path / "ck", "--no-epoch-checkpoints", "--validate-interval", 5, "--eval-bleu",
             "--eval-bleu-args", json.dumps(DECODING), "--best-checkpoint-metric", "bleu",
             "--maximize-best-checkpoint-metric"]
    log = run_cli(*train, "--max-update", 150).stdout
    bleus = _validation_bleus(log)
    assert len(bleus) == 3 and bleus[-1] > 1, log[-3000:]  # the model decodes better than nothing
    assert f"best_bleu {max(bleus):g}" in log.splitlines()[[i for i, line in enumerate(log.splitlines())
                                                              if "valid on 'valid'" in line][-1]]
    last, best = (torch.load(tmp_path / "ck" / f"checkpoint_{name}.pt", weights_only=True) for name in ("last", "best"))
    assert last["extra_state"]["val_loss"] == bleus[-1] and best["extra_state"]["val_loss"] == max(bleus)

    generated = run_cli("fairseq-generate", copy_pairs, "--user-dir", USER_DIR, *FAMILIES[family][:2],
                        *FAMILIES[family][6:], "--path", tmp_path / "ck" / "checkpoint_last.pt", "--gen-subset",
                        "valid", "--beam", DECODING["beam"], "--max-len-b", DECODING["max_len_b"], "--batch-size", 5,
                        "--cpu").stdout
    lines = {kind: {} for kind in "HT"}
    for line in generated.splitlines():
        if line[:2] in ("H-", "T-"):
            fields = line.split("\t")
            lines[line[0]][int(fields[0][2:])] = fields[-1]
    ids = sorted(lines["T"])
    assert len(ids) == 24 and sorted(lines["H"]) == ids
    reference = sacrebleu.corpus_bleu([lines["H"][i] for i in ids], [[lines["T"][i] for i in ids]]).score
    assert abs(reference - bleus[-1]) < 0.006, (reference, bleus[-1])

    resumed = run_cli(*train, "--max-update", 160).stdout
    assert "Loaded checkpoint" in resumed and "@ 150 updates" in resumed and len(_validation_bleus(resumed)) == 1, \
        resumed[-3000:]


def _datasets(cls, tmp_path):
    """A small parallel dataset of unequal lengths (as fairseq's indexed datasets read: items end with </s>)."""
    from fairseq.data import Dictionary, ListDataset

    dictionary = Dictionary()
    for i in range(30):
        dictionary.add_symbol(f"w{i}")
    mask = dictionary.add_symbol("<mask>")
    if cls is PseudoSeq2SeqDataset:
        dictionary.add_symbol("<pseudo>")
    rng = random.Random(3)
    sides = [[torch.tensor([rng.randrange(4, 34) for _ in range(rng.randint(1, 9))] + [dictionary.eos()])
              for _ in range(7)] for _ in range(2)]
    source, target = (ListDataset(items, sizes=[len(t) for t in items]) for items in sides)
    masking = TokenMaskingPolicy(mask_prob=0.5)

    def dataset(generation):
        return cls(source, target, dictionary, 8, 6, masking, mask, 0, 1, seed=5, generation=generation)
    return dataset


@pytest.mark.parametrize("cls", [UniLMSeq2SeqDataset, PseudoSeq2SeqDataset], ids=["unilm", "pseudo"])
def test_a_validation_batch_carries_its_pairs_generation_view_beside_the_training_view(cls, tmp_path):
    """What --eval-bleu decodes is the batch fairseq-generate would make of the same pairs (whole references), and
    the training view the loss reads is unchanged."""
    dataset = _datasets(cls, tmp_path)
    plain, validated, generation = dataset(False), dataset(False), dataset(True)
    validated.with_generation_view = True
    ids = [5, 0, 3, 6]
    batch = validated.collater([validated[i] for i in ids])
    expected = plain.collater([plain[i] for i in ids])
    decoded = generation.collater([generation[i] for i in ids])
    assert batch["generation"]["target"].size(1) == 9 > 6  # the longest reference whole, past --max-target-positions

    def same(a, b):
        assert type(a) is type(b)
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for key in a:
                same(a[key], b[key])
        elif torch.is_tensor(a):
            assert torch.equal(a, b)
        else:
            assert a == b

    same({k: v for k, v in batch.items() if k != "generation"}, expected)
    same(batch["generation"], decoded)
    assert "generation" not in expected


def test_eval_bleu_options_that_fairseq_would_ignore_or_fail_on_stop_with_what_to_do():
    from fairseq import options

    assert vars(decoding_options(json.dumps({"beam": 4, "lenpen": 0.6, "lenpen_style": "gnmt"}))) == {
        "beam": 4, "lenpen": 0.6, "lenpen_style": "gnmt"}
    cases = {
        "{beam: 4}": "--eval-bleu-args '{beam: 4}': not JSON (Expecting property name enclosed in double quotes: line 1 "
                     "column 2 (char 1)); write it as '{\"beam\": 4}', names and strings in double quotes",
        "[4]": "--eval-bleu-args '[4]': a JSON object of options is needed, e.g. '{\"beam\": 4}'",
        '{"beam_size": 4, "lenpen": 1, "max_len": 9}': "--eval-bleu-args: beam_size, max_len: not a decoding option; "
                                                       "give fairseq-generate's names with underscores (beam, lenpen, "
                                                       "max_len_a, max_len_b, min_len, no_repeat_ngram_size, "
                                                       "lenpen_style, ...)",
    }
    for given, message in cases.items():
        with pytest.raises(InputValueError) as stop:
            decoding_options(given)
        assert str(stop.value) == message

    def parse(task, *arguments):
        return options.parse_args_and_arch(options.get_training_parser(), [
            "data", "--user-dir", str(USER_DIR), "--task", task, "--arch", "unilm_tiny", *arguments])

    for task in ("unilm_seq2seq", "translation"):  # fairseq's translation task read the names it knew, no others
        with pytest.raises(SystemExit) as stop:
            parse(task, "--eval-bleu", "--eval-bleu-args", '{"beam_size": 4}')
        assert stop.value.code.startswith("error: --eval-bleu-args: beam_size: not a decoding option")
        with pytest.raises(SystemExit) as stop:
            parse(task, "--eval-bleu", "--eval-bleu-detok-args", "moses")
        assert stop.value.code.startswith("error: --eval-bleu-detok-args 'moses': not JSON")
        assert eval_bleu_problem(parse(task, "--eval-bleu-args", "not read without --eval-bleu")) is None
    with pytest.raises(SystemExit) as stop:  # fairseq's post_process raised NotImplementedError at the first validation
        parse("translation", "--eval-bleu", "--eval-bleu-remove-bpe", " ##")
    assert stop.value.code == (
        "error: --eval-bleu-remove-bpe ' ##': fairseq joins '@@ ', '@@', 'subword_nmt', 'sentencepiece', 'wordpiece', "
        "'letter', 'silence', '_EOW', 'none'; leave it out to count BPE pieces (GPT-2's, BERT's WordPiece)")
    args = parse("unilm_seq2seq", "--eval-bleu", "--eval-bleu-remove-bpe")
    assert (args.eval_bleu_remove_bpe, args.eval_bleu_detok, args.eval_tokenized_bleu) == ("@@ ", "space", False)


def test_a_checkpoint_holding_numeric_numpy_arrays_loads_weights_only_and_one_of_objects_does_not(tmp_path):
    """fairseq keeps --eval-bleu's n-gram counts as numpy arrays in the meters it saves; an array of Python objects
    would unpickle anything, and stays refused."""
    from palm_plugin.fixes.safe_loading import UnsafeCheckpointError, load_state

    numeric = {"counts": np.array([12, 7, 3, 1]), "lengths": np.arange(3, dtype=np.float32),
               "flags": np.array([True, False])}
    torch.save({"extra_state": {"metrics": numeric}}, tmp_path / "numeric.pt")
    loaded = load_state(tmp_path / "numeric.pt")["extra_state"]["metrics"]
    assert all(np.array_equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in numeric.items())
    torch.save({"extra_state": {"metrics": np.array([{"a": 1}], dtype=object)}}, tmp_path / "objects.pt")
    with pytest.raises(UnsafeCheckpointError, match="objects.pt: refused to load this checkpoint: it references "
                                                    "numpy.dtypes.ObjectDType, which fairseq checkpoints never"):
        load_state(tmp_path / "objects.pt")


def test_the_statistics_of_batches_add_up_to_the_corpus_bleu_of_the_text_fairseq_generate_prints():
    """Two validation batches: BLEU from their summed statistics is sacrebleu's corpus BLEU of all the sentences,
    subwords joined (--eval-bleu-remove-bpe), <unk> never matching <unk>, and sacrebleu's 13a tokenization unless
    --eval-bleu-tokenized (a stand-in task returns the hypotheses; the decoding itself is the test above's)."""
    import types

    from fairseq import metrics
    from fairseq.data import Dictionary

    from palm_plugin.tasks.bleu_validation import BleuValidation, BleuValidationConfig, reduce_bleu

    dictionary = Dictionary()
    for word in ("the", "cat", "sat", "sat.", "play@@", "ing", "a", ",", "b", "."):
        dictionary.add_symbol(word)
    pad, eos, unk = dictionary.pad(), dictionary.eos(), dictionary.unk()

    def row(text, width):
        ids = [dictionary.index(w) if w != "<unk>" else unk for w in text.split()] + [eos]
        return ids + [pad] * (width - len(ids))

    batches = [(["the cat sat.", "play@@ ing <unk>"], ["the cat sat .", "play@@ ing <unk>"]),
               (["a , b", "the cat sat , a b"], ["a , b", "the cat sat , a b ."])]
    generator = types.SimpleNamespace(symbols_to_strip_from_output={eos})

    def statistics(tokenized):
        cfg = BleuValidationConfig(eval_bleu=True, eval_bleu_remove_bpe="@@ ", eval_tokenized_bleu=tokenized)
        validation = BleuValidation(cfg, generator)
        logs = []
        for hypotheses, references in batches:
            task = types.SimpleNamespace(target_dictionary=dictionary, inference_step=lambda g, m, s, h=hypotheses: [
                [{"tokens": torch.tensor(row(text, 0)[:len(text.split()) + 1])}] for text in h])
            target = torch.tensor([row(text, 9) for text in references])
            logs.append(validation.logging_output(task, {"target": target}, model=None))
        with metrics.aggregate() as aggregated:
            reduce_bleu(logs)
        return aggregated.get_smoothed_values()["bleu"]

    hypotheses = ["the cat sat.", "playing UNKNOWNTOKENINHYP", "a , b", "the cat sat , a b"]
    references = ["the cat sat .", "playing UNKNOWNTOKENINREF", "a , b", "the cat sat , a b ."]
    scores = {tokenized: statistics(tokenized) for tokenized in (False, True)}
    for tokenized, score in scores.items():
        expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none" if tokenized else "13a").score
        assert score == round(expected, 2)
    assert scores[False] > scores[True] > 0  # 13a splits "sat." as the reference is split
