"""Shared test helpers: paths, and real fairseq command-line processes with the plugin on their path."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# One thread in every process of the suite: make test runs two xdist workers on the machine's two cores, and torch's
# default (a thread per core) in both made the in-process training tests wait on each other (a tiny classifier's 1,200
# steps took 257 s in a CI run against 45 s on one thread). Tool processes inherit the setting from the environment.
os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
USER_DIR = REPO / "palm_plugin"
BIN = Path(sys.executable).parent
# sitecustomize.py of the suite's tool processes: scikit-learn and scipy.stats load on first use (its docstring)
STARTUP = REPO / "tests" / "startup"


def binarize(prefix, lines, dictionary):
    """What fairseq-preprocess writes at ``prefix`` (.bin / .idx): one item per line of token ids, ending with [EOS]
    (a blank line is [EOS] alone)."""
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=len(dictionary))
    for line in lines:
        builder.add_item(torch.tensor([*line, dictionary.eos()], dtype=torch.int32))
    builder.finalize(f"{prefix}.idx")


def python_path(*folders):
    """PYTHONPATH of a tool process the suite starts: ``folders``, then :data:`STARTUP`."""
    return os.pathsep.join([*map(str, folders), str(STARTUP)])


# The test files that take longest (minutes of real training), longest first. pytest-xdist hands out whole files
# (--dist loadfile), in collection order with --no-loadscope-reorder (make test); by default it starts with the files
# of most tests, and the 18-minute test_selection.py ran last, alone, while the other worker sat idle for 9 minutes.
LONGEST_FILES = ("test_readme_commands.py", "test_selection.py", "test_experiments.py", "test_unilm_classification.py")


def mutmut_stats_pass() -> bool:
    """Whether this is mutmut's stats pass (``make mutation``, docs/mutation.md): the selected tests run once to record
    which functions each one calls, through trampolines that read a ContextVar, which torch.compile's fullgraph
    tracing cannot follow."""
    return os.environ.get("MUTANT_UNDER_TEST") == "stats"


@pytest.fixture(autouse=True)
def signal_handlers_restored():
    """A tool's main run in this process (palm-experiments, palm-demo) installs SIGTERM / SIGHUP / SIGINT handlers;
    left in place, the processes later tests fork (a multiprocessing pool) inherit them."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def eager_in_mutmut_stats_pass():
    """In mutmut's stats pass, compiled functions run eagerly: the pass needs only the calls. The mutant runs compile
    as usual, so a mutant of a compiled function is still tested compiled."""
    if not mutmut_stats_pass():
        yield
        return
    import torch

    with torch.compiler.set_stance("force_eager"):
        yield


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: each file keeps its order
    if os.environ.get("PALM_REFERENCE_TESTS") != "1":
        skip = pytest.mark.skip(reason="measures a recorded reference value: PALM_REFERENCE_TESTS=1 runs it")
        for item in items:
            if "reference" in item.keywords:
                item.add_marker(skip)


# A tool process whose locale encoding is ASCII: the C locale without Python's UTF-8 mode or its C-locale coercion
# (PEP 540, 538), as on a machine without a UTF-8 locale. A file opened for text without encoding= then fails on the
# first non-ASCII character (Windows would write it in its code page, cp1252 for English).
ASCII_LOCALE = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def tool_env(**extra):
    """The environment of a tool's process: this checkout on the path, one thread (each xdist worker has one core)."""
    return dict(os.environ, PYTHONPATH=python_path(REPO), **extra)


def run_interpreted(test_file, tests: int, timeout=900):
    """Run ``test_file`` again in a process that imports triton with TRITON_INTERPRET=1 (Triton decides whether it
    interprets when it is imported), where its tests marked for the interpreter run; assert that ``tests`` of them
    passed."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)], cwd=REPO,
                            env=tool_env(TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1].startswith(f"{tests} passed"), result.stdout[-3000:]


def run_cli(tool, *args, cwd=None, check=True, timeout=900, env_extra=None, input=None):
    """Run ``tool`` (a fairseq console script such as ``fairseq-train``, or a path to a Python script) as a real
    process with this interpreter's environment (``input``: its standard input); return the completed process. On
    failure the captured output is shown in the assertion message."""
    env = tool_env(**(env_extra or {}))
    command = [sys.executable, str(tool)] if str(tool).endswith(".py") else [str(BIN / tool)]
    result = subprocess.run(
        command + [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
        input=input,
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"{tool} exited {result.returncode}\n--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
        )
    return result


def subcommand_help(main, parser, tool, capsys):
    """What ``TOOL COMMAND --help`` prints for each subcommand of ``parser`` (``main``: the tool's entry point), each
    run of whitespace as one space: it exits 0, is headed with the command a user types and shows every option's help
    text. Returns {command: text}."""
    import argparse

    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    texts = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "1000")  # unwrapped: argparse breaks lines at hyphens too
        for name, command in commands.items():
            with pytest.raises(SystemExit) as stop:
                main([name, "--help"])
            text = " ".join(capsys.readouterr().out.split())
            assert stop.value.code == 0 and text.startswith(f"usage: {tool} {name} "), text
            for action in command._actions:
                assert action.help and " ".join(action.help.split()) in text, (name, action.option_strings)
            texts[name] = text
    return texts


@pytest.fixture(scope="module")
def synthetic_corpus(tmp_path_factory):
    """palm-bench's synthetic binarized data (300 documents), made once per test module, with hydra's warnings and
    fairseq's info logging quiet while the module runs."""
    import logging
    import warnings

    from palm_tools.bench.data import SyntheticCorpus

    warnings.filterwarnings("ignore", module="hydra")
    logging.disable(logging.INFO)
    yield SyntheticCorpus(str(tmp_path_factory.mktemp("synthetic")), 300)
    logging.disable(logging.NOTSET)


@pytest.fixture
def cli():
    return run_cli


def binarize_pairs(destdir, train, valid, test=None):
    """fairseq-preprocess of parallel text (PREFIX.src / PREFIX.tgt for each split) into ``destdir`` with one joined
    dictionary, as the plugin's tasks read it."""
    splits = ["--trainpref", train, "--validpref", valid] + (["--testpref", test] if test else [])
    return run_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", *splits, "--destdir", destdir,
                   "--joined-dictionary", "--workers", 1)


# fairseq-train arguments of each pre-training objective on tiny models, with dropout off so that runs on
# different processes can be compared exactly. fairseq's own masked_lm is the reference for the mechanisms.
PRETRAINING = {
    "masked_lm": ["--task", "masked_lm", "--arch", "roberta_base", "--encoder-layers", "2", "--encoder-embed-dim",
                  "64", "--encoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--criterion",
                  "masked_lm", "--tokens-per-sample", "64", "--dropout", "0", "--attention-dropout", "0"],
    "continuation_pair": ["--task", "continuation_pair", "--arch", "palm_tiny", "--criterion", "palm_mlm_lm",
                          "--stage", "joint", "--max-source-tokens", "40", "--max-target-tokens", "16",
                          "--dropout", "0", "--attention-dropout", "0"],
    "pmlm": ["--task", "pmlm", "--arch", "unilm2_tiny", "--criterion", "pmlm_ae_par", "--tokens-per-sample", "64",
             "--dropout", "0", "--attention-dropout", "0"],
    "unilm_pretraining": ["--task", "unilm_pretraining", "--arch", "unilm_tiny", "--criterion", "unilm_cloze",
                          "--tokens-per-sample", "64", "--dropout", "0", "--attention-dropout", "0"],
}


@pytest.fixture(scope="session")
def mono_data(tmp_path_factory):
    """Tiny binarized monolingual data: 30 documents of 6 sentences of random words, blank lines between
    documents (fairseq-preprocess stores a blank line as an item holding only EOS)."""
    import random

    root = tmp_path_factory.mktemp("mono")
    rng = random.Random(0)
    lines = []
    for _ in range(30):
        lines += [" ".join(f"w{rng.randrange(50)}" for _ in range(rng.randint(4, 12))) for _ in range(6)] + [""]
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    (root / "valid.txt").write_text("\n".join(lines[:21]) + "\n")
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", root / "train.txt", "--validpref",
            root / "valid.txt", "--destdir", root / "bin", "--workers", "1")
    return root / "bin"


@pytest.fixture(scope="session")
def small_palm_data(tmp_path_factory):
    """palm-data's layout (dictionary, bin/chitchat10k, bin/sotu, ...) made from small real text in seconds: the
    smoke recipe's chitchat dialogues and pre-training text, a 200-piece vocabulary, 300 training pairs."""
    download, data = tmp_path_factory.mktemp("download"), tmp_path_factory.mktemp("palm_data") / "data"
    run_cli(REPO / "examples" / "smoke_data.py", "chitchat", download)
    run_cli("palm-data", "--out", data, "--dialog-json", download / "dialog.json", "--pretrain-text",
            download / "pretrain.txt", "--vocab-size", 200, "--small-train-pairs", 300, "--workers", 1)
    return data


def save_untrained_checkpoint(root, name, arguments, drop=()):
    """A tiny model (random weights) of ``arguments`` saved as fairseq-train saves one, its configuration without the
    model options ``drop`` (as a checkpoint from before they existed), with the dictionaries beside it."""
    import palm_plugin  # noqa: F401
    import torch
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    words = "".join(f"w{i} {100 - i}\n" for i in range(30))
    for dictionary in ("dict.src.txt", "dict.tgt.txt", "dict.txt"):
        (root / dictionary).write_text(words)
    args = options.parse_args_and_arch(options.get_training_parser(), [str(root), "--user-dir", str(USER_DIR), "--cpu",
                                                                        *arguments])
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(0)
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    saved = OmegaConf.to_container(cfg)
    for option in drop:
        del saved["model"][option]
    checkpoint_utils.torch_persistent_save({"cfg": saved, "model": model.state_dict(), "args": None,
                                            "extra_state": {}, "optimizer_history": [
                                                {"criterion_name": "UniLMClozeCriterion", "best_loss": None}]},
                                           str(root / name))
    return model
