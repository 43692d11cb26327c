"""Bad input stops with the file named and what to do: a missing split or dictionary for the pre-training tasks, and
a checkpoint decoded on data binarized with another dictionary (palm and unilm)."""
import argparse
import random

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


def build_model(arch, words, **overrides):
    """A model of ``arch`` (with ``overrides`` of its options) over a dictionary of ``words`` word types (plus the
    specials and <mask>)."""
    import palm_plugin  # noqa: F401  (registers the archs)
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    dictionary = Dictionary()
    for index in range(words):
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


def write_pairs(directory, words, seed=0):
    rng = random.Random(seed)
    directory.mkdir()
    for split, count in (("train", 24), ("valid", 4)):
        lines = [" ".join(f"w{rng.randrange(words)}" for _ in range(rng.randint(3, 8))) for _ in range(count)]
        for side in ("src", "tgt"):
            (directory / f"{split}.{side}").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def two_dictionaries(tmp_path_factory):
    """The same kind of pairs binarized twice: ``small`` (30 word types) and ``large`` (60: a larger dictionary)."""
    root = tmp_path_factory.mktemp("dictionaries")
    for name, words in (("small", 30), ("large", 60)):
        write_pairs(root / name, words)
        binarize_pairs(root / name / "bin", root / name / "train", root / name / "valid")
    return root


SEQ2SEQ = {
    "palm": ["--task", "translation", "--arch", "palm_tiny", "--criterion", "label_smoothed_cross_entropy"],
    "unilm": ["--task", "unilm_seq2seq", "--arch", "unilm_tiny", "--criterion", "unilm_cloze"],
}


@pytest.mark.slow
@pytest.mark.parametrize("model", SEQ2SEQ)
def test_generate_on_another_dictionary_names_checkpoint_and_dictionaries(model, two_dictionaries, tmp_path):
    """fairseq-generate (and loading without a task) name the checkpoint, the data's dictionaries and the ones the
    checkpoint was trained with, and say how to binarize; no raw torch "size mismatch"."""
    small, large = two_dictionaries / "small" / "bin", two_dictionaries / "large" / "bin"
    run_cli("fairseq-train", small, "--user-dir", USER_DIR, *SEQ2SEQ[model], "--optimizer", "adam", "--lr", "1e-3",
            "--max-update", 1, "--batch-size", 8, "--required-batch-size-multiple", 1, "--disable-validation",
            "--cpu", "--save-dir", tmp_path, "--no-epoch-checkpoints")
    checkpoint = tmp_path / "checkpoint_last.pt"
    result = run_cli("fairseq-generate", large, "--user-dir", USER_DIR, *SEQ2SEQ[model][:2], "--path", checkpoint,
                     "--gen-subset", "valid", "--cpu", check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"{DictionaryMismatchError.__module__}.DictionaryMismatchError: {checkpoint}: "), message
    expected = [f"{large}/dict.src.txt and {large}/dict.tgt.txt", "--srcdict DICT --tgtdict DICT",
                f"trained with {small}/dict.src.txt and {small}/dict.tgt.txt"]
    assert all(part in message for part in expected), message
    assert "size mismatch" not in result.stderr
    # fine-tuning it on that data: the plugin's diagnosis is the last word, not fairseq's "architectures match"
    result = run_cli("fairseq-train", large, "--user-dir", USER_DIR, *SEQ2SEQ[model], "--optimizer", "adam", "--lr",
                     "1e-3", "--max-update", 1, "--batch-size", 8, "--disable-validation", "--cpu", "--save-dir",
                     tmp_path / "tuned", "--finetune-from-model", checkpoint, check=False)
    message = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and message.startswith(
        f"{DictionaryMismatchError.__module__}.DictionaryMismatchError: {checkpoint}: the checkpoint's token "
        "embedding has"), message
    assert "fairseq-preprocess --srcdict DICT" in message and not (tmp_path / "tuned" / "checkpoint_last.pt").exists()

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
