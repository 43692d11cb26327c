"""palm-demo's road on its quick path (small real text, a tiny BERT in all-MiniLM-L6-v2's vocabulary): the table's
rows beside their direct fine-tuning, the continued row really continued from the checkpoint, the replies, the
summary; a killed demo resumes and a rerun reuses every run; a second demo, an unwritable folder and a full disk
end in one clear line."""
import errno
import fcntl
import json
import os
import signal
import subprocess
import time

import pytest
import torch

import palm_tools.demo
from tests.conftest import BIN, run_cli, tool_env
from tests.test_experiments import tiny_bert_with_minilm_vocabulary


def _last_line(result):
    return (result.stdout + result.stderr).strip().splitlines()[-1]


def _largest_change(before, after):
    """Max |after - before| over the parameters both hold (a grown embedding compared on its first rows), and the
    number of values compared."""
    largest, compared = 0.0, 0
    for name, old in before.items():
        if name in after and old.is_floating_point():
            new = after[name][tuple(slice(0, n) for n in old.shape)]
            largest = max(largest, (new - old).abs().max().item())
            compared += old.numel()
    return largest, compared


@pytest.mark.slow
def test_quick_demo_continues_the_checkpoint_and_resumes(tmp_path, small_palm_data, monkeypatch, capsys):
    minilm = tiny_bert_with_minilm_vocabulary(tmp_path / "bert")
    out = tmp_path / "demo"
    arguments = ["--quick", "--families", "unilm2", "--contexts", 3, "--out", out, "--data", small_palm_data,
                 "--minilm", minilm]
    # killed while the continued pre-training runs: one clear last line, the run left unfinished (no result.json)
    pretraining = out / "runs" / "pre-minilm+pmlm_ae_par-s1"
    demo = subprocess.Popen([str(BIN / "palm-demo"), *map(str, arguments)], env=tool_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not ((pretraining / "log.txt").exists() and "$ " in (pretraining / "log.txt").read_text()):
        assert demo.poll() is None and time.time() < deadline, demo.stdout.read()
        time.sleep(0.2)
    demo.send_signal(signal.SIGTERM)
    output, _ = demo.communicate(timeout=60)
    assert demo.returncode != 0 and "stage 2/4" in output
    assert output.strip().splitlines()[-1] == ("palm-demo: stopped by SIGTERM; rerun the same command to resume: "
                                               "finished runs are kept, the unfinished ones start again")
    assert not (pretraining / "result.json").exists()
    # the rerun resumes: the data stage and the finished runs are reused (the unigram baseline; under load the
    # checkpoint fine-tuned directly, which runs beside the pre-training, may have finished too), the rest runs
    finished = sorted(p.parent.name for p in (out / "runs").glob("*/result.json"))
    assert 1 <= len(finished) <= 2 and pretraining.name not in finished, finished
    first = run_cli("palm-demo", *arguments, timeout=600)
    assert f"{len(finished)} of 4 runs already finished; {4 - len(finished)} to run" in first.stdout

    # the table: the continued row beside the checkpoint fine-tuned directly, as printed and in the summary
    summary = json.loads((out / "summary.json").read_text())
    [row] = summary["table"]
    assert row["family"] == "UniLMv2" and row["continued"]["run"] != row["direct"]["run"]
    for side in ("continued", "direct"):
        assert 1 < row[side]["ppl"] < 1e6
        assert f"{row[side]['ppl']:.1f}" in first.stdout
    assert "| UniLMv2 (pmlm AE+PAR) |" in first.stdout and "GNMT length penalty" in first.stdout
    # three fixed test contexts with their references, each answered by both models
    tests = set(zip(*((small_palm_data / "raw" / f"chitchat.test.{side}").read_text().splitlines()
                      for side in ("src", "tgt"))))
    assert len(row["replies"]) == 3 and len({r["context"] for r in row["replies"]}) == 3
    assert all((r["context"], r["reference"]) in tests and r["continued"] and r["direct"] for r in row["replies"])
    assert all(r["continued"] in first.stdout and r["direct"] in first.stdout for r in row["replies"])
    assert (out / "summary.md").read_text().startswith("# palm-demo")
    assert (out / "curves-unilm2.png").read_bytes()[:4] == b"\x89PNG"
    assert all(f"stage {n}/4" in first.stdout for n in range(1, 5)) and "expected" in first.stdout

    # continued from the checkpoint: after 2 Adam updates at a peak rate of 1e-4 every weight of the continued
    # pre-training is within 10 * 2 * 1e-4 of the converted checkpoint's (one Adam step moves a weight by about the
    # rate); a network built anew differs from the checkpoint's random N(0, 0.02) weights by ~0.03 per weight
    converted = torch.load(out / "prepared" / "minilm" / "model.pt", weights_only=False)["model"]
    continued = torch.load(pretraining / "checkpoints" / "checkpoint_last.pt", weights_only=False)["model"]
    assert converted["encoder.stack.embeddings.tokens.weight"].std() > 0.01  # so the bound below tells them apart
    largest, compared = _largest_change(converted, continued)
    assert compared > 0.99 * sum(v.numel() for v in converted.values() if v.is_floating_point())
    assert 0 < largest <= 2e-3, largest
    # and the continued row's fine-tuning started from that pre-training's checkpoint
    fine_tuning = (out / "runs" / row["continued"]["run"] / "log.txt").read_text()
    assert f"--finetune-from-model {pretraining / 'checkpoints' / 'checkpoint_last.pt'}" in fine_tuning

    # a second demo into the folder while one holds it
    with open(out / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)  # as a running demo does: its own (live) process id only
        held.write(f"{os.getpid()}\n")
        held.flush()
        second = run_cli("palm-demo", *arguments, check=False)
    assert second.returncode != 0
    assert _last_line(second) == (f"palm-demo: {out} is in use by another palm-demo (process {os.getpid()}); wait "
                                  f"for it to end, or give another --out")

    # a full disk, simulated in the demo's own process (every run and reply reused, so nothing else is written):
    # the summary's write fails with ENOSPC; the last run's summary stays whole, the line says what to do
    before = (out / "summary.json").read_bytes()

    def no_space(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(palm_tools.demo, "atomic_open", no_space)
    capsys.readouterr()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as stopped:
            palm_tools.demo.main([str(a) for a in arguments])
    finally:  # the demo's own handlers stop its runs and exit: not this test process's
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert stopped.value.code == (f"palm-demo: the disk is full (writing {out / 'summary.json'}); free space, then "
                                  f"rerun the same command: finished runs are kept")
    assert (out / "summary.json").read_bytes() == before
    assert "4 of 4 runs already finished; 0 to run" in capsys.readouterr().out  # a rerun reuses every run

    # an unwritable folder (under a file: refused to root too)
    (tmp_path / "a_file").write_text("")
    unwritable = run_cli("palm-demo", "--quick", "--out", tmp_path / "a_file" / "demo", check=False)
    assert unwritable.returncode != 0
    assert _last_line(unwritable) == (f"palm-demo: cannot write in {tmp_path / 'a_file' / 'demo'} (Not a directory); "
                                      f"give a writable folder with --out")


def test_demo_refuses_a_budget_below_one():
    result = run_cli("palm-demo", "--quick", "--finetune-updates", 0, check=False)
    assert result.returncode == 2
    assert _last_line(result).endswith("--finetune-updates 0: give a whole number of at least 1")
