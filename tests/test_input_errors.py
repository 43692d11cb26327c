"""The checks inside the plugin's tasks, models, criterions and loaders end fairseq's commands with one line, ``error:
what, where, what to do``, and no traceback (palm_plugin/fixes/input_errors.py); Python code still catches the
built-in exception each error is, and any other exception keeps its traceback."""
import os
import pickle
import sys
import types

import pytest

from palm_plugin.errors import InputError, InputFileNotFoundError, InputValueError
from palm_plugin.fixes import input_errors
from palm_plugin.fixes.safe_loading import CorruptCheckpointError, ForeignCheckpointError, UnsafeCheckpointError
from palm_plugin.modules.dictionary_check import DictionaryMismatchError
from tests.conftest import PRETRAINING, REPO, USER_DIR, run_cli


def test_each_error_of_bad_input_is_the_built_in_kind_python_code_catches():
    kinds = {InputValueError: ValueError, InputFileNotFoundError: FileNotFoundError,
             DictionaryMismatchError: ValueError, ForeignCheckpointError: ValueError,
             CorruptCheckpointError: RuntimeError, UnsafeCheckpointError: pickle.UnpicklingError}
    for error, built_in in kinds.items():
        assert issubclass(error, InputError) and issubclass(error, built_in), error
    assert str(InputFileNotFoundError("DATA/dict.txt: no dictionary")) == "DATA/dict.txt: no dictionary"


@pytest.fixture
def hook(monkeypatch):
    """The plugin's hook over a recording one; a process that runs ``fairseq-train`` without the traceback variable."""
    seen = []
    monkeypatch.delitem(sys.modules, "fairseq_cli.hydra_train", raising=False)
    monkeypatch.setattr(sys, "excepthook", lambda kind, error, traceback: seen.append(error))
    input_errors.install()
    installed = sys.excepthook
    input_errors.install()  # idempotent: one wrapper
    assert sys.excepthook is installed and installed.__palm_plugin__
    monkeypatch.setattr(sys, "argv", ["/env/bin/fairseq-train", "DATA"])
    monkeypatch.delenv(input_errors.TRACEBACK, raising=False)
    return types.SimpleNamespace(call=lambda error: installed(type(error), error, None), seen=seen)


def test_a_fairseq_command_ends_an_input_error_in_one_line_and_anything_else_as_python_does(hook, monkeypatch,
                                                                                           capsys):
    bad = InputValueError("--min-len 505: the longest source ...; give --min-len 501 or less")
    hook.call(bad)
    assert capsys.readouterr().err == "error: --min-len 505: the longest source ...; give --min-len 501 or less\n"
    assert hook.seen == []
    bug = ValueError("a bug of the plugin")  # not bad input: the traceback shows where it is
    hook.call(bug)
    assert hook.seen == [bug] and capsys.readouterr().err == ""
    monkeypatch.setenv(input_errors.TRACEBACK, "1")  # for a bug report
    hook.call(bad)
    assert hook.seen == [bug, bad]
    monkeypatch.setenv(input_errors.TRACEBACK, "0")
    hook.call(bad)
    assert hook.seen == [bug, bad] and capsys.readouterr().err.startswith("error: --min-len 505")


def test_only_fairseq_commands_end_in_one_line(hook, monkeypatch, capsys):
    bad = InputFileNotFoundError("DATA/dict.txt: no dictionary")
    monkeypatch.setattr(sys, "argv", ["my_script.py"])  # a Python program: its author wants the traceback
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    hook.call(bad)
    assert hook.seen == [bad]
    main = types.ModuleType("__main__")  # python -m fairseq_cli.generate
    main.__spec__ = types.SimpleNamespace(name="fairseq_cli.generate")
    monkeypatch.setattr(sys, "argv", ["/env/lib/python3.11/site-packages/fairseq_cli/generate.py"])
    monkeypatch.setitem(sys.modules, "__main__", main)
    hook.call(bad)
    assert hook.seen == [bad] and capsys.readouterr().err == "error: DATA/dict.txt: no dictionary\n"


def _child(rank, error):  # a process of torch.multiprocessing.spawn, as fairseq starts one a GPU
    try:
        raise KeyError("the error being handled")
    except KeyError:
        raise error


def test_the_parent_of_spawned_processes_ends_a_childs_input_error_in_one_line(hook, capsys):
    """On a machine with GPUs fairseq-train spawns a process per GPU; a child's error reaches the parent as torch's
    ProcessRaisedException, the child's traceback (here with an exception chained before it) as its text."""
    import torch.multiprocessing

    def parents_error(error):
        with pytest.raises(torch.multiprocessing.ProcessRaisedException) as raised:
            torch.multiprocessing.spawn(_child, args=(error,), nprocs=1)
        return raised.value

    bad = parents_error(DictionaryMismatchError("CKPT: its dictionary has 30 symbols, DATA/dict.txt 31: ...\nsecond"))
    hook.call(bad)
    assert hook.seen == [] and capsys.readouterr().err == (
        "error: CKPT: its dictionary has 30 symbols, DATA/dict.txt 31: ...\nsecond\n")
    bug = parents_error(ValueError("a bug: palm_plugin.errors.InputValueError: in its message"))
    hook.call(bug)
    assert hook.seen == [bug] and capsys.readouterr().err == ""
    assert input_errors.spawned_input_error(InputValueError("not from a child")) is None


def test_under_torchrun_the_line_is_what_torchruns_failure_summary_shows(hook, monkeypatch, tmp_path, capsys):
    """torchrun names each process an error file and prints a summary of the failures last; without the file it
    showed a link to its documentation there, the message scrolled away above its own traceback."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    error_file = tmp_path / "attempt_0" / "0" / "error.json"
    error_file.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    hook.call(ValueError("a bug"))  # keeps its traceback, and torch's own reporting
    assert not error_file.exists()
    hook.call(InputFileNotFoundError("DATA/dict.txt: no dictionary"))
    assert capsys.readouterr().err == "error: DATA/dict.txt: no dictionary\n"
    failure = ProcessFailure(local_rank=0, pid=123, exitcode=1, error_file=str(error_file))
    summary = ChildFailedError("fairseq-train", {0: failure}).format_msg()
    assert "  traceback : error: DATA/dict.txt: no dictionary\n" in summary, summary
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", "")  # torchrun's value when its logs go to /dev/null
    hook.call(InputFileNotFoundError("DATA/dict.txt: no dictionary"))
    assert capsys.readouterr().err == "error: DATA/dict.txt: no dictionary\n"


def test_hydra_lets_the_error_through_to_the_hook_unless_the_user_chose(monkeypatch):
    """hydra prints its own shortened traceback of what fairseq-hydra-train raises, unless HYDRA_FULL_ERROR is 1."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    input_errors.install()
    assert "HYDRA_FULL_ERROR" not in os.environ  # not on fairseq-hydra-train's road
    monkeypatch.setitem(sys.modules, "fairseq_cli.hydra_train", types.ModuleType("fairseq_cli.hydra_train"))
    input_errors.install()
    assert os.environ["HYDRA_FULL_ERROR"] == "1"
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    input_errors.install()
    assert os.environ["HYDRA_FULL_ERROR"] == "0"


def test_fairseq_train_stops_processes_it_cannot_start_in_one_line(tmp_path):
    """Real processes on this machine without GPUs: --distributed-world-size 2 ended on fairseq's assertion below a
    traceback; with --distributed-init-method, fairseq started no process at all and exited with status 0."""
    for given in ([], ["--distributed-init-method", "tcp://localhost:23456"]):
        result = run_cli("fairseq-train", tmp_path, "--user-dir", USER_DIR, *PRETRAINING["pmlm"], "--cpu",
                         "--distributed-world-size", 2, *given, "--save-dir", tmp_path / "ck", check=False)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: --distributed-") and last.endswith(
            "--cpu --distributed-backend gloo --ddp-backend legacy_ddp (docs/training.md)"
            + (", or start each yourself with --distributed-no-spawn --distributed-rank R" if given else "")), last
    assert not (tmp_path / "ck").exists()


def test_fairseq_train_and_hydra_train_end_a_tasks_error_in_one_line(tmp_path):
    """Real processes, where the task stops at a folder without fairseq-preprocess's dictionary: fairseq-train (the
    hook), and fairseq-hydra-train, whose hydra printed its own shortened traceback and a line about
    HYDRA_FULL_ERROR below the message."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("fairseq-train", empty, "--user-dir", USER_DIR, *PRETRAINING["pmlm"], "--optimizer", "adam",
                     "--lr", "1e-3", "--max-update", 1, "--batch-size", 2, "--cpu", "--save-dir", tmp_path / "ck",
                     check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {empty}/dict.txt: no dictionary; DATA must be a directory written by fairseq-preprocess --only-source")
    result = run_cli("fairseq-hydra-train", "--config-dir", REPO / "examples" / "hydra", "--config-name",
                     "unilm_finetune", f"task.data={empty}", f"common.user_dir={USER_DIR}",
                     f"checkpoint.save_dir={tmp_path / 'ck'}", f"hydra.run.dir={tmp_path}", "hydra.job.chdir=False",
                     check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {empty}/dict.src.txt: no dictionary; run fairseq-preprocess (translation layout) first")
