"""Bad input stops with the file named and what to do: a missing split or dictionary for the pre-training tasks, a
checkpoint decoded on data binarized with another dictionary (palm and unilm), a broken or unusable split; a source
the model cannot read is warned about."""
import argparse
import os
import random
import re

import pytest

from palm_plugin.modules.dictionary_check import DictionaryMismatchError
from tests.conftest import PRETRAINING, USER_DIR, binarize_pairs, run_cli
from tests.test_determinism import OURS, build_dataset


@pytest.mark.parametrize("task", OURS)
def test_missing_split_names_the_path(task, mono_data):
    import palm_plugin  # noqa: F401
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [str(mono_data), "--user-dir", str(USER_DIR),
                                                                          *PRETRAINING[task]])
    loaded = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    with pytest.raises(FileNotFoundError, match=rf"no binarized split 'nosuch' at {mono_data}/nosuch.*fairseq-preprocess"):
        loaded.load_dataset("nosuch")


@pytest.mark.parametrize("task", OURS)
def test_missing_dictionary_names_the_file(task, tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path}/dict.txt: no dictionary"):
        build_dataset(tmp_path, task, seed=1)


def build_model(arch, words, reverse=False, **overrides):
    """A model of ``arch`` (with ``overrides`` of its options) over a dictionary of ``words`` word types (in reverse
    order with ``reverse``), plus the specials and <mask>."""
    import palm_plugin  # noqa: F401  (registers the archs)
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    dictionary = Dictionary()
    for index in (reversed(range(words)) if reverse else range(words)):
        dictionary.add_symbol(f"w{index}")
    dictionary.add_symbol("<mask>")
    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    model_class = ARCH_MODEL_REGISTRY[arch]
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return model_class.build_model(model_class.__dataclass.from_namespace(args), task)


@pytest.mark.parametrize("arch", ["palm_tiny", "unilm_tiny"])
def test_state_dict_of_another_dictionary_is_a_dictionary_error(arch):
    """Both models check a checkpoint's embedding against their dictionary, before torch's "size mismatch"."""
    trained = build_model(arch, words=20)
    with pytest.raises(DictionaryMismatchError, match=r"embedding has 25 rows but the model built from this "
                                                      r"dictionary has 35 \(35 entries, <mask> present\): .*fairseq-preprocess --srcdict"):
        build_model(arch, words=30).load_state_dict(trained.state_dict())


@pytest.mark.parametrize("arch", ["palm_tiny", "unilm_tiny"])
def test_state_dict_of_a_reordered_dictionary_is_a_dictionary_error(arch):
    """A dictionary of the same size but another order fits the embedding: the record of its symbols catches it and
    names the rows. Without a record (a converted checkpoint) the model's own is adopted; fairseq's checkpoint
    averaging (sum, then floor division of integer tensors) keeps the record."""
    from palm_plugin.modules.dictionary_check import FINGERPRINT

    trained = build_model(arch, words=20).state_dict()
    with pytest.raises(DictionaryMismatchError, match=r"other symbols: 20 of its 25 rows name another symbol in this "
                                                      r"dictionary, the first at rows 4 \('w19' here\), 5 \('w18' here\)"):
        build_model(arch, words=20, reverse=True).load_state_dict(dict(trained))
    model = build_model(arch, words=20, reverse=True)
    model.load_state_dict({k: v for k, v in trained.items() if k != FINGERPRINT})
    assert model.state_dict()[FINGERPRINT].equal(build_model(arch, words=20, reverse=True).state_dict()[FINGERPRINT])
    # fairseq's scripts/average_checkpoints.py sums the models' tensors, then floor-divides integer ones
    models = [build_model(arch, words=20).state_dict() for _ in range(8)]
    summed = models[0][FINGERPRINT].clone()
    for state in models[1:]:
        summed += state[FINGERPRINT]
    averaged = dict(trained, **{FINGERPRINT: summed // len(models)})
    assert averaged[FINGERPRINT].equal(trained[FINGERPRINT]) and trained[FINGERPRINT].unique().numel() == 25
    build_model(arch, words=20).load_state_dict(averaged)


def test_one_embedding_row_more_is_named_as_unilm2s_pseudo_only_where_it_can_be():
    """One row more than the dictionary is UniLMv2's <pseudo> only for a unilm model whose dictionary lacks it. A
    PALM checkpoint with one row more than a dictionary that holds <mask> (the row PALM drops for fine-tuning) was
    trained with another dictionary: PALM has no <pseudo>, and --pseudo-masks is no option of its tasks."""
    import torch
    from fairseq.data import Dictionary

    from palm_plugin.modules.dictionary_check import check_embedding_rows

    other = ("the data was binarized with another dictionary than the checkpoint was trained with. Binarize it with "
             "the checkpoint's dictionary (the dictionary of the data it was trained on): fairseq-preprocess "
             "--srcdict DICT --tgtdict DICT, or --only-source --srcdict DICT for monolingual data")
    with pytest.raises(DictionaryMismatchError) as refused:
        build_model("palm_tiny", words=20).load_state_dict(build_model("palm_tiny", words=21).state_dict())
    assert str(refused.value) == ("the checkpoint's token embedding has 26 rows but the model built from this "
                                  f"dictionary has 25 (25 entries, <mask> present): {other}")
    with pytest.raises(DictionaryMismatchError) as refused:
        build_model("unilm_tiny", words=20).load_state_dict(build_model("unilm_tiny", words=21).state_dict())
    assert str(refused.value) == (
        "the checkpoint's token embedding has 26 rows, one more than the 25 of this dictionary: it was trained with "
        "UniLMv2's <pseudo> symbol (pmlm, or unilm_seq2seq --pseudo-masks); add --pseudo-masks to fine-tune or decode "
        "it with unilm_seq2seq")
    # a unilm dictionary that holds <pseudo> already: one row more is another dictionary; and the message says
    # whether <mask> is in the dictionary
    for symbols, rows, mask in ((("w0", "<mask>", "<pseudo>"), 8, "present"), (("w0", "w1", "<pseudo>"), 9, "absent")):
        dictionary = Dictionary()
        for symbol in symbols:
            dictionary.add_symbol(symbol)
        with pytest.raises(DictionaryMismatchError) as refused:
            check_embedding_rows({"tokens": torch.zeros(rows, 4)}, "tokens", torch.nn.Embedding(7, 4), dictionary)
        assert str(refused.value) == (f"the checkpoint's token embedding has {rows} rows but the model built from "
                                      f"this dictionary has 7 (7 entries, <mask> {mask}): {other}")


def write_pairs(directory, words, seed=0):
    rng = random.Random(seed)
    directory.mkdir()
    for split, count in (("train", 24), ("valid", 4)):
        lines = [" ".join(f"w{rng.randrange(words)}" for _ in range(rng.randint(3, 8))) for _ in range(count)]
        for side in ("src", "tgt"):
            (directory / f"{split}.{side}").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def two_dictionaries(tmp_path_factory):
    """The same kind of pairs binarized three times: ``small`` (30 word types), ``large`` (60: a larger dictionary)
    and ``reordered`` (small's text with small's dictionary in reverse order)."""
    root = tmp_path_factory.mktemp("dictionaries")
    for name, words in (("small", 30), ("large", 60)):
        write_pairs(root / name, words)
        binarize_pairs(root / name / "bin", root / name / "train", root / name / "valid")
    entries = (root / "small" / "bin" / "dict.src.txt").read_text().splitlines()
    (root / "reversed.txt").write_text("\n".join(reversed(entries)) + "\n")
    run_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "small" / "train",
            "--validpref", root / "small" / "valid", "--destdir", root / "reordered" / "bin", "--joined-dictionary",
            "--srcdict", root / "reversed.txt", "--workers", 1)
    return root


SEQ2SEQ = {
    "palm": ["--task", "translation", "--arch", "palm_tiny", "--criterion", "label_smoothed_cross_entropy"],
    "unilm": ["--task", "unilm_seq2seq", "--arch", "unilm_tiny", "--criterion", "unilm_cloze"],
}


@pytest.mark.slow
@pytest.mark.parametrize("model", SEQ2SEQ)
def test_generate_on_another_dictionary_names_checkpoint_and_dictionaries(model, two_dictionaries, tmp_path):
    """fairseq-generate (and loading without a task) name the checkpoint, the data's dictionaries and the ones the
    checkpoint was trained with, and say how to binarize; no raw torch "size mismatch". A dictionary of the same size
    in another order is caught as well (it used to decode in the wrong words with exit 0)."""
    small, large = two_dictionaries / "small" / "bin", two_dictionaries / "large" / "bin"
    run_cli("fairseq-train", small, "--user-dir", USER_DIR, *SEQ2SEQ[model], "--optimizer", "adam", "--lr", "1e-3",
            "--max-update", 1, "--batch-size", 8, "--required-batch-size-multiple", 1, "--disable-validation",
            "--cpu", "--save-dir", tmp_path, "--no-epoch-checkpoints")
    checkpoint = tmp_path / "checkpoint_last.pt"
    result = run_cli("fairseq-generate", large, "--user-dir", USER_DIR, *SEQ2SEQ[model][:2], "--path", checkpoint,
                     "--gen-subset", "valid", "--cpu", check=False)
    message = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert message.startswith(f"error: {checkpoint}: "), message
    expected = [f"{large}/dict.src.txt and {large}/dict.tgt.txt", "--srcdict DICT --tgtdict DICT",
                f"trained with {small}/dict.src.txt and {small}/dict.tgt.txt"]
    assert all(part in message for part in expected), message
    assert "size mismatch" not in result.stderr
    reordered = two_dictionaries / "reordered" / "bin"
    result = run_cli("fairseq-generate", reordered, "--user-dir", USER_DIR, *SEQ2SEQ[model][:2], "--path", checkpoint,
                     "--gen-subset", "valid", "--cpu", check=False)
    message = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and f"{checkpoint}: does not fit the dictionary {reordered}/dict.src.txt" in message
    assert "trained with a dictionary of other symbols" in message and "--srcdict DICT --tgtdict DICT" in message
    # fine-tuning it on that data: the plugin's diagnosis is the last word, not fairseq's "architectures match"
    result = run_cli("fairseq-train", large, "--user-dir", USER_DIR, *SEQ2SEQ[model], "--optimizer", "adam", "--lr",
                     "1e-3", "--max-update", 1, "--batch-size", 8, "--disable-validation", "--cpu", "--save-dir",
                     tmp_path / "tuned", "--finetune-from-model", checkpoint, check=False)
    message = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr and message.startswith(
        f"error: {checkpoint}: the checkpoint's token "
        "embedding has"), message
    assert "fairseq-preprocess --srcdict DICT" in message and not (tmp_path / "tuned" / "checkpoint_last.pt").exists()
    result = run_cli("fairseq-train", reordered, "--user-dir", USER_DIR, *SEQ2SEQ[model], "--optimizer", "adam",
                     "--lr", "1e-3", "--max-update", 1, "--batch-size", 8, "--disable-validation", "--cpu",
                     "--save-dir", tmp_path / "tuned", "--finetune-from-model", checkpoint, check=False)
    message = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr and message.startswith(
        f"error: {checkpoint}: the checkpoint was trained with "
        "a dictionary of other symbols"), message
    assert not (tmp_path / "tuned" / "checkpoint_last.pt").exists()

    from fairseq import checkpoint_utils

    # without a task (hub loading), fairseq sets one up from the checkpoint's configuration and the overrides
    with pytest.raises(DictionaryMismatchError, match=f"{checkpoint}: does not fit the dictionary {large}/dict"):
        checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={"data": str(large)})


@pytest.mark.parametrize("arch, option, value, message", [
    ("unilm_tiny", "encoder_layers", 0, r"^--encoder-layers 0: must be at least 1$"),
    ("palm_tiny", "decoder_layers", 0, r"^--decoder-layers 0: must be at least 1$"),
    ("unilm_tiny", "encoder_attention_heads", 3, r"^--encoder-embed-dim 64 is not divisible by --encoder-attention"),
    ("palm_tiny", "decoder_attention_heads", 5, r"^--encoder-embed-dim 64 is not divisible by --decoder-attention"),
])
def test_sizes_that_cannot_build_a_network_name_the_option(arch, option, value, message):
    """--encoder-layers 0 used to train a network with no layers; a width the heads do not divide stopped in an
    assertion inside fairseq."""
    with pytest.raises(ValueError, match=message):
        build_model(arch, words=4, **{option: value})


def broken_split(root, kind):
    """A copy of small/bin with its training source split broken: ``empty`` (fairseq-preprocess of an empty file),
    ``bin`` (the .bin cut short by 20 bytes) or ``idx`` (the .idx cut short by 5 bytes)."""
    import shutil

    broken = root / f"broken-{kind}"
    shutil.rmtree(broken, ignore_errors=True)
    shutil.copytree(root / "small" / "bin", broken)
    prefix = broken / "train.src-tgt.src"
    if kind == "empty":
        for name in ("src", "tgt"):
            (root / f"empty.{name}").write_text("")
        shutil.rmtree(root / "empty-bin", ignore_errors=True)
        run_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "empty",
                "--destdir", root / "empty-bin", "--srcdict", broken / "dict.src.txt", "--joined-dictionary",
                "--workers", 1)
        for suffix in (".bin", ".idx"):
            shutil.copy(root / "empty-bin" / f"train.src-tgt.src{suffix}", f"{prefix}{suffix}")
    else:
        path = prefix.with_suffix(prefix.suffix + f".{kind}")
        cut = {"bin": 20, "idx": 5}[kind]
        path.write_bytes(path.read_bytes()[:-cut])
    return prefix


@pytest.mark.parametrize("kind, message", [
    ("empty", r"^error: {prefix}.bin: the split has no examples \(fairseq-preprocess was given an empty file\)"),
    ("bin", r"^error: {prefix}.bin: \d+ bytes, but its index {prefix}.idx needs \d+: the file was cut short .*"
            r"binarize the split again with fairseq-preprocess"),
    ("idx", r"^error: {prefix}.idx: not a complete fairseq index \(buffer is smaller than requested size\); "
            r"binarize the split again"),
])
def test_broken_split_names_the_file(kind, message, two_dictionaries, capfd):
    """An empty split, a .bin or .idx cut short: fairseq failed inside numpy (or read garbage later); now opening
    the split stops with the file named and what to do, and the destructor of the half-opened dataset is quiet."""
    import gc

    import palm_plugin  # noqa: F401  (installs the fixes)
    from fairseq.data import data_utils

    from palm_plugin.fixes.data_checks import BinarizedDataError

    prefix = broken_split(two_dictionaries, kind)
    with pytest.raises(BinarizedDataError) as stopped:
        data_utils.load_indexed_dataset(str(prefix), None)
    assert isinstance(stopped.value, SystemExit)  # the command ends with the message as its last line, no traceback
    assert re.match(message.format(prefix=re.escape(str(prefix))), str(stopped.value.code)), stopped.value.code
    gc.collect()
    assert "Exception ignored" not in capfd.readouterr().err
    # the intact split still opens
    assert len(data_utils.load_indexed_dataset(str(two_dictionaries / "small" / "bin" / "train.src-tgt.src"), None)) == 24


@pytest.mark.slow
def test_commands_on_unusable_data_end_with_one_clear_line(two_dictionaries, tmp_path):
    """Real processes: fairseq-train on an empty split, and on data none of whose pairs fits --max-source-positions
    (fairseq dropped them all and failed on an empty batch list), stop with one line naming the file or split and
    what to do; nothing is saved. A second run into a save dir another run owns, and a run of another task and
    model into a save dir (fairseq resumed it silently), stop and leave the checkpoint as it was. fairseq-interactive
    warns about an empty line, a line of unknown words and a line it cuts, and still answers every line."""
    empty = broken_split(two_dictionaries, "empty").parent
    train = ["--optimizer", "adam", "--lr", "1e-3", "--max-update", 1, "--batch-size", 8, "--cpu",
             "--disable-validation", "--no-epoch-checkpoints"]
    result = run_cli("fairseq-train", empty, "--user-dir", USER_DIR, *SEQ2SEQ["unilm"], *train, "--save-dir",
                     tmp_path / "empty", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (f"error: {empty}/train.src-tgt.src.bin: the split has no "
                                                      "examples (fairseq-preprocess was given an empty file); give it "
                                                      "a text file with at least one line")
    small = two_dictionaries / "small" / "bin"
    result = run_cli("fairseq-train", small, "--user-dir", USER_DIR, *SEQ2SEQ["palm"], *train, "--save-dir",
                     tmp_path / "long", "--max-source-positions", 2, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: split 'train': none of its 24 examples fits the model's positions (at most source 2, target 512); raise "
        "--max-source-positions / --max-target-positions (or the task's length options), or split the examples "
        "into shorter ones")
    assert not (tmp_path / "empty").exists() or not list((tmp_path / "empty").iterdir())
    assert not list((tmp_path / "long").glob("*.pt"))

    run_cli("fairseq-train", small, "--user-dir", USER_DIR, *SEQ2SEQ["unilm"], *train, "--save-dir", tmp_path / "ok")
    last = (tmp_path / "ok" / "checkpoint_last.pt").read_bytes()
    # a second run into a save dir another live run owns (this process stands in for it): refused, nothing saved
    from palm_plugin.fixes import save_dir_guard
    from palm_plugin.folder_lock import release_folder

    save_dir_guard.lock(tmp_path / "ok")
    result = run_cli("fairseq-train", small, "--user-dir", USER_DIR, *SEQ2SEQ["unilm"], *train, "--max-update", 3,
                     "--save-dir", tmp_path / "ok", check=False)
    release_folder(tmp_path / "ok")
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        f"error: --save-dir {tmp_path}/ok is in use by another fairseq-train (process {os.getpid()}); this run would "
        f"overwrite its checkpoints: wait for it to end, or give this run another --save-dir"), result.stderr[-3000:]
    # PALM into the UniLM run's save dir: fairseq alone resumed it silently
    result = run_cli("fairseq-train", small, "--user-dir", USER_DIR, *SEQ2SEQ["palm"], *train, "--save-dir",
                     tmp_path / "ok", check=False)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path}/ok/checkpoint_last.pt was saved by another run than this one: --arch palm_tiny (checkpoint: "
        f"unilm_tiny); --task translation (checkpoint: unilm_seq2seq). Resuming would continue that run under these "
        f"options; give this run another --save-dir; to start from these weights there, pass --finetune-from-model "
        f"{tmp_path}/ok/checkpoint_last.pt"), result.stderr[-3000:]
    assert (tmp_path / "ok" / "checkpoint_last.pt").read_bytes() == last
    result = run_cli("fairseq-interactive", small, "--user-dir", USER_DIR, *SEQ2SEQ["unilm"][:2], "--path",
                     tmp_path / "ok" / "checkpoint_last.pt", "--cpu", "--beam", 2, "--max-len-b", 3,
                     input="w1 w2 w3\n\nzebra quokka\n" + "w1 w2 " * 250 + "\n")
    warnings = [line for line in result.stderr.splitlines() if "the output will not depend on it" in line]
    assert len(warnings) == 2 and "an input is empty" in warnings[0], result.stderr[-3000:]
    assert "the input 'zebra quokka' has no symbol of the dictionary" in warnings[1]
    # a line longer than --max-source-positions (384 by default): cut, and said
    assert ("1 of 1 inputs longer than --max-source-positions 384 ([SOS] and [EOS] included; the longest has 501 "
            "tokens): only their first tokens are read") in result.stderr, result.stderr[-3000:]
    assert sorted(line.split("\t")[0] for line in result.stdout.splitlines() if line.startswith("H-")) == \
        ["H-0", "H-1", "H-2", "H-3"]


@pytest.mark.parametrize("fp32", [False, True])
def test_ema_copies_the_dictionary_record_and_decays_the_weights(fp32):
    """--store-ema decayed every state entry in place, and torch refuses that for an integer tensor (the dictionary
    record): training stopped at the first EMA step. The record is copied; the weights still decay."""
    import palm_plugin  # noqa: F401  (installs the fixes)
    import torch
    from fairseq.dataclass.configs import EMAConfig
    from fairseq.models.ema import EMA

    from palm_plugin.modules.dictionary_check import FINGERPRINT

    model = build_model("unilm_tiny", words=20)
    ema = EMA(model, EMAConfig(store_ema=True, ema_decay=0.9, ema_fp32=fp32))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    ema.step(model)
    averaged = ema.get_model().state_dict()
    assert averaged[FINGERPRINT].dtype == torch.long and averaged[FINGERPRINT].equal(before[FINGERPRINT])
    key = "encoder.stack.layers.0.fc1.bias"
    assert torch.allclose(averaged[key], before[key] + 0.1, atol=1e-6)


def test_inference_inputs_that_are_all_too_long_are_skipped_not_fatal(two_dictionaries):
    """The all-too-long check stops a command on a loaded split only: fairseq-interactive's lines and the API's
    sentences built for inference are skipped with --skip-invalid-size-inputs-valid-test, as fairseq does."""
    import palm_plugin  # noqa: F401
    import torch
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    dictionary = Dictionary.load(str(two_dictionaries / "small" / "bin" / "dict.src.txt"))
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    tokens = [torch.tensor([4, 5, 6, 7, 2])]
    dataset = task.build_dataset_for_inference(tokens, [5])
    assert len(task.filter_indices_by_size(torch.arange(1).numpy(), dataset, (2, 2), True)) == 0


def test_a_source_the_dictionary_cannot_read_is_named_in_its_warning(caplog):
    """The warning of an empty or unreadable source says which input it is (in process: mutmut's selection reads
    this; the fairseq-interactive test above sees the same lines through a process)."""
    import torch
    from fairseq.data import Dictionary

    from palm_plugin.modules.dictionary_check import warn_if_unknown

    dictionary = Dictionary()
    hello = dictionary.add_symbol("hello")
    tail = ": the output will not depend on it; check the input, and its tokenizer and BPE, which must be the ones " \
           "the model was trained with"
    with caplog.at_level("WARNING", logger="palm_plugin.modules.dictionary_check"):
        warn_if_unknown(" \t", torch.tensor([dictionary.eos()]), dictionary)
        warn_if_unknown("zebra " * 20, torch.tensor([dictionary.unk()] * 20 + [dictionary.eos()]), dictionary)
        warn_if_unknown("hello zebra", torch.tensor([hello, dictionary.unk(), dictionary.eos()]), dictionary)
    assert [r.getMessage() for r in caplog.records] == [
        "an input is empty" + tail, f"the input {('zebra ' * 10)!r} has no symbol of the dictionary" + tail]


def test_stage_joint_without_a_loss_weight_names_both_options():
    """--mlm-weight 0 --lm-weight 0 in stage joint trained nothing (a loss of 0, exit 0); a weight on either loss
    alone is a loss to train, and stage ae reads neither (in process: mutmut's selection reads this;
    test_bad_input_open builds the same through fairseq's options)."""
    from palm_plugin.criterions.palm_mlm_lm import PalmMlmLmCriterion

    task = argparse.Namespace(target_dictionary=None)  # what FairseqCriterion reads
    with pytest.raises(ValueError, match=r"^--mlm-weight 0 and --lm-weight 0: stage joint would train nothing; give "
                                         r"one of them a weight above 0$"):
        PalmMlmLmCriterion(task, "joint", 0.0, 0.0)
    for mlm_weight, lm_weight in ((1.0, 0.0), (0.0, 1.0)):
        criterion = PalmMlmLmCriterion(task, "joint", mlm_weight, lm_weight)
        assert (criterion.mlm_weight, criterion.lm_weight) == (mlm_weight, lm_weight)
    assert PalmMlmLmCriterion(task, "ae", 0.0, 0.0).stage == "ae"
