"""Awkward data through every task: blank lines and documents too short to use (monolingual tasks), empty sources
and targets, and sources and targets longer than the limits or the model's positions (sequence-to-sequence tasks).
Nothing crashes; whatever is dropped, truncated or skipped is counted in a warning."""
import argparse
import logging
import random
import re

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from palm_plugin.data.token_masking import TokenMaskingPolicy
from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset
from palm_plugin.models.unilm import UniLMConfig, UniLMModel
from tests.conftest import PRETRAINING, USER_DIR, binarize_pairs, run_cli
from tests.test_determinism import OURS
from tests.test_unilm_decoding import ARCHS, net_input, sources, tiny_dictionary
from tests.test_unilm_leakage import dictionary as words_dictionary
from tests.test_unilm_leakage import indexed

REGULAR_DOCUMENTS = 6  # each of a SHORT and a LONG sentence
SHORT, LONG = 3, 10
ONE_SENTENCE = 5  # words of the one-sentence document
WORDS = REGULAR_DOCUMENTS * (SHORT + LONG) + ONE_SENTENCE + 1  # + the one-word document
DOCUMENTS = REGULAR_DOCUMENTS + 2


def sentence(rng, words):
    return " ".join(f"w{rng.randrange(40)}" for _ in range(words))


def binarize_monolingual(root, lines):
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", root / "train.txt", "--validpref",
            root / "train.txt", "--destdir", root / "bin", "--workers", 1)
    return root / "bin"


@pytest.fixture(scope="module")
def blank_lines(tmp_path_factory):
    """Monolingual data with blank lines wherever they can be: two before the first document, three in a row, three
    at the end; and two documents too short for some tasks: one sentence, and one word."""
    rng = random.Random(0)
    lines = ["", ""]
    for index in range(REGULAR_DOCUMENTS):
        lines += [sentence(rng, SHORT), sentence(rng, LONG), ""] + (["", ""] if index == 2 else [])
    lines += [sentence(rng, ONE_SENTENCE), "", "w1", "", "", ""]
    return binarize_monolingual(tmp_path_factory.mktemp("blank_lines"), lines)


def load_train(data, args):
    """The task's ``train`` split, loaded as fairseq-train does."""
    import palm_plugin  # noqa: F401
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parsed = options.parse_args_and_arch(options.get_training_parser(), [str(data), "--user-dir", str(USER_DIR), *args])
    task = tasks.setup_task(convert_namespace_to_omegaconf(parsed).task)
    task.load_dataset("train")
    return task.dataset("train")


def warnings(caplog):
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


@pytest.mark.parametrize("task, extra, expected", [
    # sentence mode: the one-sentence and the one-word documents give no pair; every LONG target is cut to 6 tokens
    ("continuation_pair", ["--max-target-tokens", "6"],
     [f"train: 2 of {DOCUMENTS} documents dropped: shorter than two sentences",
      f"train: 0 of {REGULAR_DOCUMENTS} sources truncated to --max-source-tokens 40 and {REGULAR_DOCUMENTS} targets "
      "truncated"]),
    ("continuation_pair", ["--split-mode", "fraction"],
     [f"train: 1 of {DOCUMENTS} documents dropped: shorter than two tokens"]),
    ("unilm_pretraining", [], ["train: 1 one-token sentences dropped"]),
    ("pmlm", [], []),
])  # fmt: skip
def test_blank_lines_separate_documents_and_drops_are_counted(task, extra, expected, blank_lines, caplog):
    """Blank lines anywhere only separate documents; what a task cannot use is counted in a warning; every item of
    what is left can be read and batched."""
    with caplog.at_level(logging.WARNING):
        dataset = load_train(blank_lines, PRETRAINING[task] + extra)
    assert all(any(message.startswith(e) for message in warnings(caplog)) for e in expected), warnings(caplog)
    assert len(warnings(caplog)) == len(expected), warnings(caplog)
    batch = dataset.collater([dataset[index] for index in range(len(dataset))])
    assert batch["nsentences"] == len(dataset) > 0


def test_pmlm_blocks_keep_every_word(blank_lines):
    """fairseq's complete_doc blocks skip the blank lines but no word, the one-word document included."""
    dataset = load_train(blank_lines, PRETRAINING["pmlm"])
    blocks, nspecial = dataset.dataset, dataset.dictionary.nspecial
    assert sum(int((blocks[index] >= nspecial).sum()) for index in range(len(blocks))) == WORDS


@pytest.fixture(scope="module")
def only_blank_lines(tmp_path_factory):
    return binarize_monolingual(tmp_path_factory.mktemp("only_blank_lines"), ["", "", ""])


@pytest.mark.parametrize("task", OURS)
def test_corpus_of_blank_lines_names_the_file(task, only_blank_lines):
    """A split with no text at all stops every monolingual task at loading, with the file and what to do."""
    with pytest.raises(ValueError) as stopped:
        load_train(only_blank_lines, PRETRAINING[task])
    assert str(stopped.value) == (f"{only_blank_lines}/train.bin: no text: its 3 lines are all blank. Binarize a text "
                                  "file with one sentence a line and a blank line between documents "
                                  "(fairseq-preprocess --only-source)")


@pytest.fixture(scope="module")
def one_word_documents(tmp_path_factory):
    return binarize_monolingual(tmp_path_factory.mktemp("one_word_documents"), ["w1", "", "w2", ""])


@pytest.mark.parametrize("task, extra, message", [
    ("continuation_pair", [], "no pairs: none of its 2 documents has two sentences. Put one sentence per line and a "
     "blank line between documents (or use --split-mode fraction)"),
    ("continuation_pair", ["--split-mode", "fraction"], "no pairs: none of its 2 documents has two tokens. Put one "
     "sentence per line and a blank line between documents"),
    ("unilm_pretraining", [], "no chunk of two text tokens: every document is a single one-token sentence. Give "
     "documents of several words, one sentence a line"),
])  # fmt: skip
def test_corpus_too_short_for_a_task_names_the_file(task, extra, message, one_word_documents):
    """Text from which a task can make no example at all stops it at loading, with the split's path and what to do."""
    with pytest.raises(ValueError) as stopped:
        load_train(one_word_documents, PRETRAINING[task] + extra)
    assert str(stopped.value) == f"{one_word_documents}/train: {message}"


@pytest.mark.parametrize("extra, truncated", [
    (["--max-target-tokens", 6], "0 of 6 sources truncated to --max-source-tokens 40 and 6 targets truncated (to 6 "
     "tokens)"),
    # a fragment is cut at max-source + max-target tokens: every LONG sentence here (10 words + [EOS] > 4 + 2)
    (["--split-mode", "fraction", "--max-source-tokens", 4, "--max-target-tokens", 2], "0 of 13 sources truncated to "
     "--max-source-tokens 4 and 6 fragments truncated (to max-source + max-target tokens)"),
], ids=["sentence", "fraction"])  # fmt: skip
def test_continuation_pair_says_what_it_truncated_to_in_each_mode(extra, truncated, blank_lines, caplog):
    """The truncation warning names the limit of its mode: --max-target-tokens for a sentence-mode target, both
    limits together for a fraction-mode fragment."""
    with caplog.at_level(logging.WARNING):
        load_train(blank_lines, PRETRAINING["continuation_pair"] + [str(value) for value in extra])
    assert warnings(caplog)[-1] == f"train: {truncated}: sentences longer than the limits"


def test_pmlm_takes_the_least_tokens_per_sample_that_holds_a_token_on_each_side(blank_lines, caplog):
    """--tokens-per-sample 5 is [SOS] S1 [EOS] S2 [EOS] with blocks of 2 tokens: each of the 14 lines is a block, cut
    to its first 2 tokens (the one-word document keeps its [EOS]), and every example batches."""
    with caplog.at_level(logging.WARNING):
        dataset = load_train(blank_lines, PRETRAINING["pmlm"] + ["--tokens-per-sample", "5"])
    assert warnings(caplog) == ["train: 13 lines are longer than a block (2 tokens) and lose their end; "
                                "--sample-break-mode none packs text across lines without cutting"]
    assert [len(dataset.dataset[index]) for index in range(len(dataset))] == [2] * 14
    assert dataset.collater([dataset[index] for index in range(len(dataset))])["nsentences"] == 14


# What each task's log says about the blank-lines corpus.
TRAINING_LOG = {
    "continuation_pair": f"train: 2 of {DOCUMENTS} documents dropped",
    "unilm_pretraining": "train: 1 one-token sentences dropped",
    "pmlm": f"loaded {DOCUMENTS} blocks from",
}


@pytest.mark.slow
@pytest.mark.parametrize("task", OURS)
def test_training_goes_through_blank_lines(task, blank_lines, tmp_path):
    """One epoch of real fairseq-train over every item (the short ones included)."""
    result = run_cli("fairseq-train", blank_lines, "--user-dir", USER_DIR, *PRETRAINING[task], "--optimizer", "adam",
                     "--lr", "1e-3", "--max-epoch", 1, "--batch-size", 4, "--required-batch-size-multiple", 1, "--cpu",
                     "--save-dir", tmp_path, "--no-save")
    log = result.stdout + result.stderr
    assert TRAINING_LOG[task] in log and "done training" in log, log[-3000:]


@pytest.fixture(scope="module")
def awkward_pairs(tmp_path_factory):
    """16 pairs of 3-8 words, binarized for train and valid, among them: an empty source (pair 2), an empty target
    (5), both empty (7), targets of 40 words (9, 10), a source of 80 words (11), and both as long (12)."""
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("awkward_pairs")
    source, target = [], []
    for index in range(16):
        source.append(sentence(rng, 80 if index in (11, 12) else 0 if index in (2, 7) else rng.randint(3, 8)))
        target.append(sentence(rng, 40 if index in (9, 10, 12) else 0 if index in (5, 7) else rng.randint(3, 8)))
    (root / "train.src").write_text("\n".join(source) + "\n")
    (root / "train.tgt").write_text("\n".join(target) + "\n")
    binarize_pairs(root / "bin", root / "train", root / "train")
    return root / "bin"


@pytest.fixture(scope="module")
def one_long_source_one_long_target(tmp_path_factory):
    """4 pairs of 3-4 words but for a source of 20 words (pair 1) and a target of 20 (pair 2); no empty line."""
    root = tmp_path_factory.mktemp("long_pairs")
    lengths = [(3, 3), (20, 3), (3, 20), (4, 4)]
    (root / "train.src").write_text("\n".join(" ".join(["w1"] * s) for s, _ in lengths) + "\n")
    (root / "train.tgt").write_text("\n".join(" ".join(["w2"] * t) for _, t in lengths) + "\n")
    binarize_pairs(root / "bin", root / "train", root / "train")
    return root / "bin"


@pytest.mark.parametrize("limit, level, truncated", [(16, logging.WARNING, 1), (32, logging.INFO, 0)],
                         ids=["truncated", "unchanged"])
def test_unilm_seq2seq_counts_its_changes_in_a_warning_and_nothing_else(limit, level, truncated,
                                                                      one_long_source_one_long_target, caplog):
    """The counts of what loading changed are a warning when it changed anything (here one source of 20 words + [SOS]
    and [EOS], one target of 20 + [EOS], both over 16), else the same line at info level."""
    with caplog.at_level(logging.INFO, logger="palm_plugin.tasks.unilm_seq2seq"):
        load_train(one_long_source_one_long_target, ["--task", "unilm_seq2seq", "--arch", "unilm_tiny", "--criterion",
                                                     "unilm_cloze", "--max-source-positions", str(limit),
                                                     "--max-target-positions", str(limit)])
    [record] = [r for r in caplog.records if r.getMessage().startswith("train:")]
    assert (record.levelno, record.getMessage()) == (level, (
        f"train: 4 pairs; truncated {truncated} sources to --max-source-positions {limit} and {truncated} targets to "
        f"--max-target-positions {limit}; kept 0 empty sources and 0 empty targets"))


COMMON = ["--optimizer", "adam", "--lr", "1e-3", "--max-epoch", 1, "--batch-size", 4, "--required-batch-size-multiple",
          1, "--cpu", "--skip-invalid-size-inputs-valid-test", "--no-epoch-checkpoints"]
UNILM_LAYOUTS = {
    "unilm": ["--arch", "unilm_tiny"],
    "unilm2": ["--arch", "unilm2_tiny", "--pseudo-masks", "--source-segment", 0, "--target-segment", 1],
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", UNILM_LAYOUTS)
def test_unilm_seq2seq_truncates_keeps_empty_lines_and_skips_what_exceeds_the_model(layout, awkward_pairs, tmp_path):
    """Sources over --max-source-positions and targets over --max-target-positions are cut, empty lines kept, and
    the one pair still longer than the model's 64 positions (48 + 32 after cutting) skipped: all counted, and one
    epoch trains. fairseq-generate then decodes every other pair, the empty sources included."""
    task = ["--task", "unilm_seq2seq", *UNILM_LAYOUTS[layout], "--max-source-positions", 48,
            "--max-target-positions", 32]
    trained = run_cli("fairseq-train", awkward_pairs, "--user-dir", USER_DIR, *task, "--max-positions", 64,
                      "--criterion", "unilm_cloze", "--save-dir", tmp_path, *COMMON)
    log = trained.stdout + trained.stderr
    assert ("train: 16 pairs; truncated 2 sources to --max-source-positions 48 and 3 targets to --max-target-positions "
            "32; kept 2 empty sources and 2 empty targets") in log, log[-3000:]
    assert "1 samples have invalid sizes and will be skipped, max_positions=64, first few sample ids=[12]" in log
    assert "done training" in log
    generated = run_cli("fairseq-generate", awkward_pairs, "--user-dir", USER_DIR, *task, "--path",
                        tmp_path / "checkpoint_last.pt", "--gen-subset", "valid", "--beam", 2, "--batch-size", 4,
                        "--required-batch-size-multiple", 1, "--skip-invalid-size-inputs-valid-test", "--cpu")
    hypotheses = sorted(int(i) for i in re.findall(r"^H-(\d+)\t", generated.stdout, flags=re.M))
    assert hypotheses == [i for i in range(16) if i != 12]


# Limits on fairseq's translation task with the palm arch -> the pairs skipped. --truncate-source cuts sources to the
# task's --max-source-positions, so a source longer than the model's own positions (pair 11) is skipped instead.
PALM_LIMITS = {
    "task": (["--max-source-positions", 32, "--max-target-positions", 16], [9, 10, 12]),
    "model": (["--encoder-max-positions", 32, "--decoder-max-positions", 16], [9, 10, 11, 12]),
}


@pytest.mark.slow
@pytest.mark.parametrize("limits", PALM_LIMITS)
def test_palm_translation_skips_pairs_over_the_limits_with_a_count(limits, awkward_pairs, tmp_path):
    """With --truncate-source, the pairs over the limits are skipped with fairseq's count and one epoch trains."""
    arguments, skipped_ids = PALM_LIMITS[limits]
    result = run_cli("fairseq-train", awkward_pairs, "--user-dir", USER_DIR, "--task", "translation", "--arch",
                     "palm_tiny", "--criterion", "label_smoothed_cross_entropy", *arguments, "--truncate-source",
                     "--save-dir", tmp_path, *COMMON)
    log = result.stdout + result.stderr
    skipped = re.findall(r"(\d+) samples have invalid sizes and will be skipped.*ids=\[(.*)\]", log)
    # once for train, once for valid (the same pairs); fairseq lists the ids in batching order
    assert {(int(count), tuple(sorted(map(int, ids.split(", "))))) for count, ids in skipped} == {
        (len(skipped_ids), tuple(skipped_ids))
    }, log[-3000:]
    assert "done training" in log


@pytest.mark.parametrize("limits", [(2, 16), (16, 1), (0, 0)])
def test_unilm_seq2seq_limits_too_small_for_a_token_are_refused_naming_both_options(limits):
    """--max-source-positions below 3 leaves no room for a source token between [SOS] and [EOS], and
    --max-target-positions below 2 none before the target's [EOS] (the command line only checks for >= 1): the
    dataset refuses them with the two options and their least values. At those least values each side keeps its
    first token."""
    d = words_dictionary()
    source, target = indexed([[5, 6, 7, 8], [9]], d), indexed([[10, 11, 12], [13, 14]], d)

    def build(max_source, max_target):
        return UniLMSeq2SeqDataset(source, target, d, max_source, max_target, TokenMaskingPolicy(mask_prob=0.5),
                                   d.index("<mask>"), source_segment=4, target_segment=5, seed=1)

    with pytest.raises(ValueError, match="--max-source-positions must be >= 3 and --max-target-positions >= 2"):
        build(*limits)
    smallest = build(3, 2)
    assert [smallest[i]["source"].tolist() for i in range(2)] == [[d.bos(), 5, d.eos()], [d.bos(), 9, d.eos()]]
    assert [smallest[i]["target"].tolist() for i in range(2)] == [[10, d.eos()], [13, d.eos()]]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_unilm_decoding_ends_at_the_models_last_position(arch):
    """A source that leaves fewer positions than --max-len-b asks for ends its hypotheses at the model's last
    position with [EOS] (no position error), on the cached and the recomputing decoder."""
    dictionary = tiny_dictionary()
    namespace = argparse.Namespace(max_positions=16)
    ARCHS[arch][0](namespace)
    torch.manual_seed(0)
    task = argparse.Namespace(source_dictionary=dictionary)
    model = UniLMModel.build_model(UniLMConfig.from_namespace(namespace), task)
    with torch.no_grad():
        model.lm_head.bias[dictionary.eos()] = -1e4  # never [EOS] by choice: every hypothesis runs to the limit
    model.eval()
    lengths = [14, 6, 11]
    sample = {"net_input": net_input(arch, sources(dictionary, lengths))}
    generator = SequenceGenerator([model], dictionary, beam_size=2, max_len_b=30)
    for incremental in (True, False):
        generator.model.has_incremental = incremental
        with torch.no_grad():
            hypotheses = generator.generate([model], sample)
        for length, best in zip(lengths, hypotheses):
            # the placeholders take positions length .. 15: 16 - length decoded tokens, the last one [EOS]
            assert len(best[0]["tokens"]) == 16 - length and best[0]["tokens"][-1] == dictionary.eos()


def test_an_empty_data_path_says_so_and_a_folder_without_a_dictionary_names_its_file(tmp_path):
    """``fairseq-train "$DATA"`` with DATA unset gives the pre-training tasks an empty path, which fairseq splits into
    [""]: the task says DATA is empty rather than looking for ./dict.txt; a folder without dict.txt is named."""
    from palm_plugin.data.monolingual import load_dictionary

    with pytest.raises(ValueError, match=r"^DATA is empty: give the data directory written by fairseq-preprocess "):
        load_dictionary("")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path}/dict.txt: no dictionary")):
        load_dictionary(str(tmp_path))


def test_a_loaded_split_without_an_example_that_fits_is_refused_and_inference_inputs_are_skipped():
    """fixes/data_checks.py over fairseq's FairseqTask.filter_indices_by_size, in this process: the split is named
    when it is one the task loaded; the inputs of fairseq-interactive or the API (not a loaded split) are skipped.
    Both as installed at the plugin's import and as ``_name_the_split`` wraps a filter now (what mutmut can see)."""
    import numpy as np
    from fairseq.data import FairseqDataset
    from fairseq.tasks import FairseqTask

    from palm_plugin.fixes.data_checks import BinarizedDataError, _name_the_split

    class Lengths(FairseqDataset):
        def __init__(self, sizes):
            self.sizes = np.array(sizes)

        def __len__(self):
            return len(self.sizes)

    task = FairseqTask.__new__(FairseqTask)  # the filter reads no configuration
    too_long, some_fit = Lengths([7, 9, 12]), Lengths([7, 3, 12, 4])
    task.datasets = {"valid": too_long, "train": some_fit}

    def fitting(self, indices, dataset, max_positions, ignore_invalid_inputs):  # fairseq's, skipping what is too long
        return indices[dataset.sizes[indices] <= max_positions]

    for name, filter_indices in (("installed", FairseqTask.filter_indices_by_size),
                                 ("wrapped", _name_the_split(fitting))):
        with pytest.raises(BinarizedDataError) as stop:
            filter_indices(task, np.arange(3), too_long, 6, ignore_invalid_inputs=True)
        assert stop.value.code == (
            "error: split 'valid': none of its 3 examples fits the model's positions (at most 6); raise "
            "--max-source-positions / --max-target-positions (or the task's length options), or split the examples "
            "into shorter ones"), name
        assert filter_indices(task, np.arange(4), some_fit, 6, ignore_invalid_inputs=True).tolist() == [1, 3], name
        inference = Lengths([7, 9])
        assert filter_indices(task, np.arange(2), inference, 6, ignore_invalid_inputs=True).tolist() == [], name


def test_inputs_cut_by_the_task_are_counted_with_the_limit_that_cut_them(caplog):
    """fairseq-interactive and the API: a unilm_seq2seq task truncates a long source (its dataset counts it); the
    warning names the limit to raise (the interactive half runs in a fairseq process: test_bad_input.py)."""
    import types

    from palm_plugin.fixes.data_checks import warn_if_truncated

    built = []

    def build_dataset_for_inference(tokens, lengths):
        built.append(lengths)
        return types.SimpleNamespace(truncated_sources=sum(length > 8 for length in lengths))

    task = types.SimpleNamespace(cfg=types.SimpleNamespace(max_source_positions=8),
                                 build_dataset_for_inference=build_dataset_for_inference)
    tokens = [torch.ones(n, dtype=torch.long) for n in (12, 5, 9)]
    warn_if_truncated(task, tokens)
    warn_if_truncated(task, tokens[1:2])  # nothing cut: nothing said
    assert built == [[12, 5, 9], [5]]
    assert warnings(caplog) == [
        "2 of 3 inputs longer than --max-source-positions 8 ([SOS] and [EOS] included; the longest has 12 tokens): "
        "only their first tokens are read; raise --max-source-positions (within the model's positions) or split the "
        "input"]
