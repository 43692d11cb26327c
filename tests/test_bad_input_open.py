"""The bad inputs of issue 39 that were silent, lost work or ended in a traceback, each tried in this process (no
training): the clear last line (what, where, what to do) or the correct result. The real-process cases (two
fairseq-train runs, a resume of another task, a long fairseq-interactive line) are in
``test_bad_input.py::test_commands_on_unusable_data_end_with_one_clear_line``."""
import argparse
import ast
import gzip
import json
import multiprocessing
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, USER_DIR, save_untrained_checkpoint


def last_line(capsys):
    return capsys.readouterr().err.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------- fairseq option ranges
def parse_training(*arguments):
    import palm_plugin  # noqa: F401
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), ["data", "--user-dir", str(USER_DIR),
                                                                        *map(str, arguments)])


UNILM = ["--task", "unilm_seq2seq", "--arch", "unilm_tiny", "--criterion", "unilm_cloze"]
PALM = ["--task", "translation", "--arch", "palm_tiny", "--criterion", "label_smoothed_cross_entropy"]


@pytest.mark.parametrize("arguments, message", [
    (UNILM + ["--label-smoothing", 1.5], r"--label-smoothing 1.5: outside \[0, 1\) \(the share of probability moved "
                                         r"off the true token .*\); give a value in that range"),
    (UNILM + ["--label-smoothing", 1.0], r"--label-smoothing 1.0: outside \[0, 1\)"),
    (PALM + ["--label-smoothing", -0.1], r"--label-smoothing -0.1: outside \[0, 1\)"),  # fairseq's own criterion
    (UNILM + ["--mask-prob", 0], r"--mask-prob 0.0: outside \(0, 1\] \(a share of the tokens \(0 would leave nothing "
                                 r"to predict\)\)"),
    (UNILM + ["--max-tokens", 0], r"--max-tokens 0: outside \[1, infinity\) \(a size or a count\)"),
    (UNILM + ["--update-freq", "2,0"], r"--update-freq 0: outside \[1, infinity\)"),
    (UNILM + ["--dropout", 1.2], r"--dropout 1.2: outside \[0, 1\)"),
    (["--task", "pmlm", "--arch", "unilm2_tiny", "--criterion", "pmlm_ae_par", "--min-block-length", 4,
      "--max-block-length", 3], r"--min-block-length 4 is above --max-block-length 3; give min <= max"),
    # issue 39's second round: fairseq-train with the plugin's own options
    (UNILM + ["--lr", -1], r"--lr -1.0: outside \(0, infinity\) \(a learning rate\)"),  # it exited 0, untrained
    (UNILM + ["--optimizer", "adam", "--adam-eps", -1], r"--adam-eps -1.0: outside \[0, infinity\)"),
    (UNILM + ["--optimizer", "torch_adamw", "--adam-betas", "0.9"],
     r"--adam-betas '0.9': not a pair of numbers; give two numbers in \[0, 1\), e.g. '\(0.9, 0.98\)'$"),
    (UNILM + ["--optimizer", "adam", "--adam-betas", "(0.9, 1.5)"], r"--adam-betas '\(0.9, 1.5\)': outside \[0, 1\)"),
    (UNILM + ["--leave-unmasked-prob", 0.6, "--random-token-prob", 0.6],
     r"--leave-unmasked-prob 0.6 and --random-token-prob 0.6 sum to 1.2: they are shares of the masked tokens \(the "
     r"rest becomes <mask>\); give a sum <= 1$"),
    (PALM + ["--copy-attention-dim", 0], r"--copy-attention-dim 0: outside \[1, infinity\)"),  # 0 meant the model size
    (PALM + ["--no-copy", "--copy-attention-dim", 32],
     r"--copy-attention-dim 32 sizes the copy layer, which --no-copy removes: leave out one$"),
    (PALM + ["--reinit-encoder", "--save-dir", REPO / "tests" / "no-such-run"],  # it trained from scratch
     r"--reinit-encoder re-initialises the encoder of the pre-trained PALM that --finetune-from-model loads, and this "
     r"run loads no checkpoint \(its model starts random anyway\): add --finetune-from-model PALM.pt, or leave out "
     r"--reinit-encoder$"),
])
def test_numeric_options_out_of_range_stop_at_the_command_line(arguments, message):
    with pytest.raises(SystemExit) as stop:
        parse_training(*arguments)
    assert re.match("error: " + message, str(stop.value.code)), stop.value.code


@pytest.mark.parametrize("cuda, arguments, reason", [(True, ["--cpu"], "--cpu"), (False, [], "no CUDA device")],
                         ids=["cpu-asked", "no-cuda"])
def test_fp16_without_a_cuda_device_to_train_on_stops(monkeypatch, cuda, arguments, reason):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)  # either one alone leaves FP16Optimizer no device
    with pytest.raises(SystemExit) as stop:
        parse_training(*UNILM, "--fp16", *arguments)
    assert stop.value.code == (f"error: --fp16: fairseq's FP16Optimizer keeps its fp32 copy of the weights on a CUDA "
                               f"device, and this run has none ({reason}): train without --fp16 on the CPU (or with "
                               f"--bf16)")


def test_numeric_options_in_range_and_at_their_bounds_are_taken():
    args = parse_training(*UNILM, "--label-smoothing", 0, "--mask-prob", 1, "--dropout", 0)
    assert (args.label_smoothing, args.mask_prob, args.dropout) == (0.0, 1.0, 0.0)
    assert parse_training(*PALM, "--label-smoothing", 0.1).label_smoothing == 0.1
    # the copy layer's size, or no copy layer: each alone is taken (only both together are refused)
    assert parse_training(*PALM, "--no-copy").no_copy
    assert parse_training(*PALM, "--copy-attention-dim", 1).copy_attention_dim == 1


def test_the_cloze_criterion_built_in_python_checks_its_smoothing():
    from palm_plugin.criterions.unilm_cloze import UniLMClozeCriterion

    task = argparse.Namespace(target_dictionary=argparse.Namespace(pad=lambda: 1))
    with pytest.raises(ValueError, match=r"^--label-smoothing 1.5: outside \[0, 1\)"):
        UniLMClozeCriterion(task, 1.5)
    assert UniLMClozeCriterion(task, 0.1).eps == 0.1


def test_generation_options_out_of_range():
    import palm_plugin  # noqa: F401
    from fairseq import options

    cases = ((["--beam", "0"], "error: --beam 0: outside [1, infinity) (a size or a count); give a value in that "
                               "range"),
             (["--beam", "2", "--nbest", "3"], "error: --nbest 3 is above --beam 2: beam search keeps only 2 "
                                               "hypotheses; give nbest <= beam"))
    for arguments, message in cases:
        with pytest.raises(SystemExit) as stop:
            options.parse_args_and_arch(options.get_generation_parser(), ["data", "--user-dir", str(USER_DIR),
                                                                          "--task", "unilm_seq2seq", *arguments])
        assert stop.value.code == message


# ------------------------------------------------------------------------------------------- --save-dir: one run
def _own_and_wait(folder, ready, done):
    from palm_plugin.fixes import save_dir_guard

    save_dir_guard.lock(folder)
    ready.set()
    done.wait(30)


def test_a_save_dir_is_owned_by_one_run_and_a_dead_owner_blocks_nothing(tmp_path):
    from palm_plugin.fixes import save_dir_guard
    from palm_plugin.folder_lock import release_folder

    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    owner = context.Process(target=_own_and_wait, args=(str(tmp_path), ready, done))
    owner.start()
    try:
        assert ready.wait(30)
        with pytest.raises(SystemExit) as stop:
            save_dir_guard.lock(tmp_path)
        assert stop.value.code == (
            f"error: --save-dir {tmp_path} is in use by another fairseq-train (process {owner.pid}); this run would "
            f"overwrite its checkpoints: wait for it to end, or give this run another --save-dir")
    finally:
        done.set()
        owner.join(30)
    # the owner is gone (its id still in the file): the folder is free
    assert (tmp_path / save_dir_guard.LOCK_NAME).read_text().strip() == str(owner.pid)
    save_dir_guard.lock(tmp_path)
    assert (tmp_path / save_dir_guard.LOCK_NAME).read_text().strip() == str(os.getpid())
    release_folder(tmp_path)


def _own_and_leave_a_worker(folder, ready):
    """Own the folder, fork a worker (it inherits the lock, as a data loader's does) that outlives this process by
    a second, and end."""
    import time

    from palm_plugin.fixes import save_dir_guard

    save_dir_guard.lock(folder)
    if os.fork() == 0:
        time.sleep(1.0)
        os._exit(0)
    ready.set()


def test_a_worker_left_by_a_dead_owner_is_waited_for(tmp_path):
    import time

    from palm_plugin.fixes import save_dir_guard
    from palm_plugin.folder_lock import release_folder

    context = multiprocessing.get_context("fork")
    ready = context.Event()
    owner = context.Process(target=_own_and_leave_a_worker, args=(str(tmp_path), ready))
    owner.start()
    assert ready.wait(30)
    owner.join(30)
    started = time.monotonic()
    save_dir_guard.lock(tmp_path)  # the owner is dead; its worker ends within a second, and the lock is ours
    assert time.monotonic() - started < 10
    release_folder(tmp_path)


def checkpoint_state(task="unilm_seq2seq", arch="unilm_tiny", rows=40, **task_options):
    """What check_resume reads of a checkpoint: its configuration and its parameters' shapes."""
    task_cfg = {"_name": task, "data": "/somewhere", "mask_prob": 0.7, **task_options}
    return {"cfg": {"model": {"_name": arch, "encoder_layers": 2}, "task": task_cfg},
            "model": {"embed.weight": torch.zeros(rows, 8), "layer.weight": torch.zeros(8, 8)}}


def resume(theirs, ours, resets=False):
    from palm_plugin.fixes.save_dir_guard import check_resume

    check_resume("SAVE/checkpoint_last.pt", theirs, ours["model"], ours["cfg"]["model"], ours["cfg"]["task"], resets)


def test_a_resume_of_the_same_run_with_other_training_options_goes_on():
    # lr, max-update, logging are not in the model or task configuration; the data's folder may move
    resume(checkpoint_state(), checkpoint_state(data="/elsewhere"))
    # another task over the same model, with every --reset-*: a new training from these weights
    resume(checkpoint_state(task="unilm_pretraining"), checkpoint_state(), resets=True)


@pytest.mark.parametrize("ours, resets, message", [
    (checkpoint_state(task="translation", arch="palm_tiny", rows=41), False,
     r"--arch palm_tiny \(checkpoint: unilm_tiny\); --task translation \(checkpoint: unilm_seq2seq\)\. Resuming would "
     r"continue that run under these options; give this run another --save-dir; to start from these weights there, "
     r"pass --finetune-from-model SAVE/checkpoint_last.pt$"),
    (checkpoint_state(task="unilm_pretraining"), False,
     r"--task unilm_pretraining \(checkpoint: unilm_seq2seq\)\. .*, or keep this --save-dir and pass "
     r"--reset-optimizer --reset-lr-scheduler --reset-meters --reset-dataloader$"),
    (checkpoint_state(mask_prob=0.5), False, r"--mask-prob 0.5 \(checkpoint: 0.7\)\. "),
    # a model without a dataclass (fairseq's lstm): its configuration, a Namespace, names the architecture "arch"
    ({"cfg": {"model": {"arch": "lstm", "encoder_layers": 1}, "task": checkpoint_state()["cfg"]["task"]},
      "model": {"encoder.weight": torch.zeros(8, 8)}}, False, r"--arch lstm \(checkpoint: unilm_tiny\)\. "),
    # --pseudo-masks adds <pseudo> to the dictionary: the same arch with one more embedding row
    (checkpoint_state(rows=41, pseudo_masks=True), True,
     r"the model's parameters \(the task's dictionary\); --pseudo-masks True \(checkpoint: None\)\. .*"
     r"--finetune-from-model SAVE/checkpoint_last.pt$"),
])
def test_a_resume_of_another_task_model_or_data_is_refused_with_what_differs(ours, resets, message):
    with pytest.raises(SystemExit) as stop:
        resume(checkpoint_state(), ours, resets)
    assert re.match(r"error: SAVE/checkpoint_last.pt was saved by another run than this one: " + message,
                    stop.value.code), stop.value.code


def test_the_checkpoint_checked_before_a_resume_is_the_one_fairseq_resumes_from(tmp_path):
    """fairseq's load_checkpoint resumes from --save-dir's checkpoint_last{suffix}.pt for the default --restore-file
    (when there is one), and from the --restore-file given otherwise, with the shard's suffix before .pt."""
    from palm_plugin.fixes.save_dir_guard import _resume_path

    def cfg(restore_file="checkpoint_last.pt"):
        return argparse.Namespace(restore_file=restore_file, save_dir=str(tmp_path))

    assert _resume_path(cfg(), "") is None  # a new run
    (tmp_path / "checkpoint_last-shard0.pt").write_bytes(b"")
    assert _resume_path(cfg(), "-shard0") == str(tmp_path / "checkpoint_last-shard0.pt")
    assert _resume_path(cfg(), "") is None
    assert _resume_path(cfg("other/c.pt"), "") == "other/c.pt"
    assert _resume_path(cfg("other/c.pt"), "-shard1") == "other/c-shard1.pt"


def test_a_checkpoint_decoded_with_another_familys_task_is_refused():
    from palm_plugin.fixes.checkpoint_paths import check_decoding_task

    generate = argparse.Namespace(task="translation", beam=5)
    with pytest.raises(SystemExit) as stop:
        check_decoding_task(generate, checkpoint_state(), "u.pt")
    assert stop.value.code == ("error: --path u.pt is a unilm model (trained with --task unilm_seq2seq), which --task "
                               "translation cannot decode; decode it with --task unilm_seq2seq")
    with pytest.raises(SystemExit, match="decode it with --task translation"):
        check_decoding_task(argparse.Namespace(task="unilm_seq2seq", beam=5),
                            checkpoint_state("translation", "palm_tiny"), "p.pt")
    check_decoding_task(argparse.Namespace(task="unilm_seq2seq", beam=5), checkpoint_state(), "u.pt")
    # a checkpoint of fairseq's legacy format names the arch and the task in its argparse "args", with no "cfg"
    legacy = {"args": argparse.Namespace(arch="unilm_tiny", task="unilm_seq2seq"), "model": checkpoint_state()["model"]}
    with pytest.raises(SystemExit) as stop:
        check_decoding_task(generate, legacy, "old.pt")
    assert stop.value.code == ("error: --path old.pt is a unilm model (trained with --task unilm_seq2seq), which "
                               "--task translation cannot decode; decode it with --task unilm_seq2seq")
    # fairseq-validate scores a checkpoint under any task (no --beam): left alone
    check_decoding_task(argparse.Namespace(task="translation"), checkpoint_state(), "u.pt")


def test_a_checkpoint_path_that_is_no_checkpoint_file_names_what_to_give(tmp_path):
    """The in-process half of test_checkpoint_journey's traps (real fairseq-train runs there)."""
    from palm_plugin.fixes.checkpoint_paths import CheckpointPathError, read_checkpoint

    hf, run, empty = tmp_path / "hf", tmp_path / "run", tmp_path / "empty"
    bert = tmp_path / "bert"
    for folder in (hf, run, empty, bert):
        folder.mkdir()
    torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(2, 2)}, bert / "pytorch_model.bin")
    torch.save([torch.zeros(2)], bert / "list.pt")
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "checkpoint1.pt", "checkpoint2.pt"):
        (run / name).write_bytes(b"")
    convert = "convert it first: palm-convert bert --input {} --output converted (or hf-roberta for RoBERTa), then " \
              "pass converted/model.pt"
    traps = [
        (hf, f"--path {hf}: a Hugging Face model directory, not a fairseq checkpoint; " + convert.format(hf)),
        (hf / "model.safetensors", f"--path {hf}/model.safetensors: Hugging Face weights, not a fairseq "
                                   "checkpoint; " + convert.format(hf)),
        (run, f"--path {run}: a directory; pass the checkpoint file in it ({run}/checkpoint1.pt, "
              f"{run}/checkpoint2.pt, {run}/checkpoint_best.pt)"),
        (empty, f"--path {empty}: a directory; pass the checkpoint file in it (it holds no .pt file)"),
        (run / "checkpoint3.pt", f"--path {run}/checkpoint3.pt: file not found; the checkpoints in {run}: "
                                 "checkpoint1.pt, checkpoint2.pt, checkpoint_best.pt, checkpoint_last.pt"),
        (empty / "c.pt", f"--path {empty}/c.pt: file not found; {empty} holds no .pt file"),
        (tmp_path / "gone" / "c.pt", f"--path {tmp_path}/gone/c.pt: file not found; there is no folder "
                                     f"{tmp_path}/gone"),
        (bert / "pytorch_model.bin", f"--path {bert}/pytorch_model.bin: an HF state dict (e.g. pytorch_model.bin); "
                                     + convert.format(bert)),
        (bert / "list.pt", f"--path {bert}/list.pt: not a fairseq checkpoint; " + convert.format(bert)),
    ]
    for path, message in traps:
        with pytest.raises(CheckpointPathError) as stop:
            read_checkpoint(str(path), "--path")
        assert str(stop.value) == "error: " + message  # CommandError's last line


def test_a_checkpoint_whose_memory_mapped_read_fails_names_the_file_and_torchs_error(tmp_path, monkeypatch):
    """The memory-mapped read fails with an error that is not the legacy format's RuntimeError (here a filesystem
    that cannot map files), and the whole-file read, whose errors name the file, does not fail: the message names the
    file and what torch said."""
    import errno

    from palm_plugin.fixes.checkpoint_paths import CheckpointPathError, read_checkpoint

    path = tmp_path / "checkpoint_last.pt"
    torch.save({"model": {}, "cfg": {}}, path)
    load = torch.load

    def load_without_mmap(f, *args, mmap=None, **kwargs):
        if mmap:
            raise OSError(errno.ENODEV, "No such device")
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load_without_mmap)
    with pytest.raises(CheckpointPathError) as stop:
        read_checkpoint(str(path), "--path")
    assert str(stop.value) == f"error: {path}: cannot read ([Errno {errno.ENODEV}] No such device)"


def test_a_checkpoints_configuration_reads_the_same_in_each_form_fairseq_saves():
    """A section as fairseq writes it (a dict), as a trainer holds it (an omegaconf container) or as old checkpoints
    keep it (``args``, a namespace); and whether a checkpoint is of the model --arch names."""
    from omegaconf import OmegaConf

    from palm_plugin.fixes.checkpoint_paths import _config, _same_model

    model = {"_name": "unilm", "encoder_layers": 2, "dropout": 0.1}
    for state in ({"cfg": {"model": model}}, {"cfg": OmegaConf.create({"model": model})},
                  {"cfg": None, "args": argparse.Namespace(**model)}, {"args": argparse.Namespace(**model)}):
        assert _config(state, "model") == model
    assert _config({"cfg": {"model": None}}, "model") == {} and _config({}, "task") == {}
    assert _same_model(argparse.Namespace(arch="unilm_base"), model)  # an arch of the model
    assert _same_model(argparse.Namespace(arch="unilm_base"), {"arch": "unilm_tiny"})  # old checkpoints: the arch
    # a checkpoint that names its model rather than an arch: bart has no arch of that name (its archs: bart_base, ...)
    assert _same_model(argparse.Namespace(arch="bart_large"), {"_name": "bart"})
    assert not _same_model(argparse.Namespace(arch="palm_base"), model)
    assert not _same_model(argparse.Namespace(), model)  # fairseq-generate's arguments name no --arch
    assert not _same_model(argparse.Namespace(arch="unilm_base"), {})


def test_decoding_adopts_the_task_layout_of_the_first_checkpoint_in_either_form(tmp_path):
    """fairseq-generate --path: a checkpoint fine-tuned with other segment ids or --pseudo-masks decodes with them
    (an ensemble with its first checkpoint's), whether it keeps its configuration as ``cfg`` or, as old fairseq
    did, as ``args``; what the command line sets stays."""
    from palm_plugin.fixes.checkpoint_paths import check

    task = {"_name": "unilm_seq2seq", "source_segment": 2, "target_segment": 3, "pseudo_masks": True}
    torch.save({"model": {}, "cfg": {"model": {"_name": "unilm"}, "task": task}}, tmp_path / "cfg.pt")
    torch.save({"model": {}, "args": argparse.Namespace(arch="unilm_tiny", task="unilm_seq2seq", source_segment=4,
                                                        target_segment=5, pseudo_masks=True)}, tmp_path / "args.pt")
    torch.save({"model": {}, "args": argparse.Namespace(arch="unilm2_tiny", task="pmlm")}, tmp_path / "pmlm.pt")

    def decode(*names, arguments=(), segments=(0, 1)):
        args = argparse.Namespace(task="unilm_seq2seq", source_segment=segments[0], target_segment=segments[1],
                                  pseudo_masks=False, path=os.pathsep.join(str(tmp_path / name) for name in names))
        check(args, list(arguments))
        return args.source_segment, args.target_segment, args.pseudo_masks

    assert decode("args.pt") == (4, 5, True)
    assert decode("cfg.pt", "args.pt") == (2, 3, True)
    assert decode("args.pt", "cfg.pt") == (4, 5, True)
    assert decode("cfg.pt", arguments=["--source-segment", "0"]) == (0, 3, True)
    # pre-trained by another task: the segments of its S1 / S2, nothing of the fine-tuning task's
    assert decode("pmlm.pt", segments=(4, 5)) == (0, 1, False)


# ------------------------------------------------------------------------------------------- the Python API
@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A tiny unilm_seq2seq model (random weights) saved as fairseq saves a checkpoint, and a pre-training one."""
    from palm_plugin.models.hub_interface import from_pretrained

    root = tmp_path_factory.mktemp("hub")
    for name, arguments in (("seq2seq", UNILM), ("pretrain", ["--task", "unilm_pretraining", "--arch", "unilm_tiny",
                                                              "--criterion", "unilm_cloze"])):
        save_untrained_checkpoint(root, f"{name}.pt", arguments)
    return from_pretrained(root, checkpoint_file="seq2seq.pt", data_name_or_path=str(root)), root


def test_one_string_is_one_item_for_score_and_generate(hub):
    model, _ = hub
    one = model.score("w1 w2", "w2 w1")
    listed = model.score(["w1 w2", "w3 w4 w5"], ["w2 w1", "w5"])
    assert isinstance(one, dict) and len(listed) == 2  # not one result per character
    assert torch.equal(one["tokens"], listed[0]["tokens"]) and one["tokens"].numel() == 3  # two words and </s>
    assert one["log_prob"] == pytest.approx(listed[0]["log_prob"], abs=1e-5)
    generated = model.generate("w1 w2 w3", beam=2, max_len_b=3)
    assert isinstance(generated, str) and generated == model.generate(["w1 w2 w3"], beam=2, max_len_b=3)[0]


@pytest.mark.parametrize("call, error, message", [
    (lambda m: m.generate([["w1", "w2"]]), TypeError, r"generate: expected a string or a list of strings, got list "
                                                      r"\['w1', 'w2'\]; give text"),
    (lambda m: m.generate([None]), TypeError, r"generate: expected a string or a list of strings, got NoneType None"),
    (lambda m: m.generate(Path("w1")), TypeError, r"got PosixPath"),
    (lambda m: m.generate("w1", beam=0), ValueError, r"^beam=0: outside \[1, infinity\) \(a size or a count\); give a "
                                                     r"value in that range$"),
    (lambda m: m.score("w1", ["w2"]), TypeError, r"score: one source string but a list of targets"),
    (lambda m: m.score(["w1", None], ["w2", "w3"]), TypeError, r"score: expected a string or a list of strings, got "
                                                               r"NoneType"),
])
def test_wrong_types_for_the_api_name_what_to_give(hub, call, error, message):
    with pytest.raises(error, match=message):
        call(hub[0])


def test_from_pretrained_paths_and_a_pretraining_checkpoint(hub):
    from palm_plugin.models.hub_interface import from_pretrained

    _, root = hub
    with pytest.raises(TypeError, match=r"from_pretrained: model_name_or_path is a int; give a path"):
        from_pretrained(3)
    with pytest.raises(ValueError, match=rf"{root}/pretrain.pt: a checkpoint of the task unilm_pretraining "
                                         r"\(pre-training\), which neither generates nor scores text; fine-tune it "
                                         r"first"):
        from_pretrained(root, checkpoint_file=Path("pretrain.pt"), data_name_or_path=root)


# ------------------------------------------------------------------------------------------- palm-data
def small_dialogs(path):
    conversations = {f"c{i}": {"messages": [[{"text": f"hello number {i} {j}"}] for j in range(3)]} for i in range(6)}
    path.write_text(json.dumps(conversations))
    return path


def raw_stage(tmp_path, *arguments):
    from palm_tools.data import corpora
    from palm_tools.data.stages import Stage

    args, _ = corpora.parse_args(["--out", str(tmp_path / "out"), "--dialog-json",
                                  str(small_dialogs(tmp_path / "d.json")), *map(str, arguments)])
    args.out.mkdir(exist_ok=True)
    recipes = corpora.stage_recipes(args)
    corpora.stage_raw(args, args.out, lambda name: Stage(args.out, name, recipes[name], False))
    return [[d for d in (args.out / "raw" / f"sotu.{split}.txt").read_text().split("\n\n") if d.strip()]
            for split in ("train", "valid")]


def test_held_out_by_size_keeps_training_whole(tmp_path):
    from palm_tools.data.corpora import held_out

    rng = np.random.default_rng(0)
    sizes = [5000, 40, 70, 10, 300, 90, 25, 60, 35, 80]
    for fraction in (0.05, 0.1, 0.3):
        chosen = held_out(sizes, fraction, rng)
        assert chosen and sum(sizes[i] for i in chosen) <= max(fraction * sum(sizes), min(sizes))
        assert 0 not in chosen  # the huge document stays in training
    assert held_out([1000, 3], 0.05, rng) == [1]  # none fits: the smallest
    # a huge and a tiny document, and a text with a byte-order mark: the huge one is trained on, the mark is not text
    huge = " ".join(f"Sentence number {i} is here." for i in range(300))
    (tmp_path / "t.txt").write_bytes(b"\xef\xbb\xbf" + f"{huge}\n\nA tiny document.\n".encode())
    train, valid = raw_stage(tmp_path, "--pretrain-text", tmp_path / "t.txt")
    assert valid == ["A tiny document."] and len(train) == 1 and train[0].count("\n") == 299
    assert not train[0].startswith("\ufeff")


def test_a_huge_conversation_stays_in_training_and_usual_splits_stay_by_count(capsys):
    from palm_tools.data.corpora import split_conversations

    # nine conversations of 2 pairs and one of 300: by count alone (1 each at 0.1) the huge one is held out for 2
    # seeds of 10; it stays in training for all, which keeps at least 80% of the pairs
    conversations = [(f"c{i}", ["turn"] * (301 if i == 4 else 3)) for i in range(10)]
    fallbacks = 0
    for seed in range(10):
        splits = split_conversations(conversations, 0.1, np.random.default_rng(seed))
        assert sorted(np.concatenate(list(splits.values())).tolist()) == list(range(10))
        assert 4 in splits["train"] and splits["valid"] and splits["test"]
        assert sum(300 if i == 4 else 2 for i in splits["train"]) >= 0.8 * 318
        order = np.random.default_rng(seed).permutation(10)
        fallbacks += 4 in order[:2]
    assert fallbacks == 2 and capsys.readouterr().out.count("1 left to training, each would have held out") == 2
    # conversations of unequal but ordinary sizes: the count split, exactly as it was
    conversations = [(f"c{i}", ["turn"] * (2 + i % 7)) for i in range(60)]
    splits = split_conversations(conversations, 0.05, np.random.default_rng(3))
    order = np.random.default_rng(3).permutation(60)
    assert [list(splits[k]) for k in ("valid", "test", "train")] == [list(order[:3]), list(order[3:6]),
                                                                     list(order[6:])]
    # two conversations: one each for valid and test is more than the bound; each split still gets one
    splits = split_conversations([("a", ["t"] * 4), ("b", ["t"] * 3)], 0.05, np.random.default_rng(0))
    assert len(splits["valid"]) == len(splits["test"]) == 1 and not splits["train"]


def test_a_repeated_document_is_kept_once_and_counted(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("First document here. Yes.\n\nSecond one. Also.\n\nFirst document here. Yes.\n\n"
                                    "Third text. Fine.\n")
    train, valid = raw_stage(tmp_path, "--pretrain-text", tmp_path / "t.txt")
    assert sorted(train + valid) == ["First document here.\nYes.", "Second one.\nAlso.", "Third text.\nFine."]
    assert ("warning: dropped 1 repeated documents of --pretrain-text (the same text twice would be in training and "
            "validation)") in capsys.readouterr().out


def run_palm_data(capsys, *arguments):
    from palm_tools.data import corpora

    try:
        status = corpora.main([str(a) for a in arguments])
    except SystemExit as stop:
        status = stop.code
    return status, last_line(capsys)


def test_palm_data_refusals(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("One sentence here. And another.\n\nA second document. It has words.\n")
    (tmp_path / "copy.txt").write_bytes(text.read_bytes())
    out = ["--out", tmp_path / "out", "--dialog-json", small_dialogs(tmp_path / "d.json")]
    assert run_palm_data(capsys, *out, "--pretrain-text", text, tmp_path / "copy.txt") == (
        2, f"palm-data: error: --pretrain-text {tmp_path}/copy.txt is given twice (the same content as {text}): its "
           f"documents would be held out and trained on at once; give each file once")
    for value in ("-0.1", "0.5", "1"):
        status, line = run_palm_data(capsys, *out, "--pretrain-text", text, "--valid-fraction", value)
        assert status == 2 and line.endswith(f"argument --valid-fraction: {float(value):g} is outside (0, 0.5): the "
                                             f"share of the text held out for validation (of conversations: for "
                                             f"validation and for test each); give e.g. 0.05"), line
    assert run_palm_data(capsys, *out, "--vocab-size", "0") == (
        2, "palm-data: error: argument --vocab-size: 0 is below 2; give a whole number of at least 2")
    packed = tmp_path / "a.txt.gz"
    packed.write_bytes(gzip.compress(text.read_bytes()))
    assert run_palm_data(capsys, *out, "--pretrain-text", packed)[1] == (
        f"palm-data: error: {packed}:1: gzip-compressed, not UTF-8 text (byte 0x8b at column 2); first run "
        f"`gunzip -k {packed}` and give the text")
    assert not (tmp_path / "out" / "raw").exists()


def _own_out_and_wait(folder, ready, done):
    from palm_plugin.folder_lock import own_folder

    own_folder(folder, ".palm-data.lock", "palm-data", "unused")
    ready.set()
    done.wait(30)


def test_two_palm_data_runs_into_one_folder(tmp_path, capsys):
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    first = context.Process(target=_own_out_and_wait, args=(str(tmp_path / "out"), ready, done))
    first.start()
    try:
        assert ready.wait(30)
        assert run_palm_data(capsys, "--out", tmp_path / "out") == (
            2, f"palm-data: error: --out {tmp_path}/out is in use by another palm-data (process {first.pid}); two "
               f"runs would build the same stages at once: wait for it to end, or give this run another --out")
    finally:
        done.set()
        first.join(30)


# ------------------------------------------------------------------------------------------- palm-score, palm-prepare
def test_palm_score_reads_a_byte_order_mark_as_nothing(tmp_path, capsys):
    from palm_tools.scoring import cli as score

    (tmp_path / "ref").write_text("the cat sat on the mat\na dog barked\n")
    (tmp_path / "hyp").write_text("the cat sat on the mat\na dog barked\n")
    (tmp_path / "bom").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "hyp").read_bytes())
    scores = []
    for hyp in ("hyp", "bom"):
        assert score.main(["bleu", "--hyp", str(tmp_path / hyp), "--ref", str(tmp_path / "ref")]) == 0
        scores.append(capsys.readouterr().out)
    assert scores[0] == scores[1] and "100" in scores[0]


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    import sentencepiece

    root = tmp_path_factory.mktemp("tokenizers")
    (root / "text.txt").write_text("\n".join(["the cat sat on the mat", "a dog runs fast"] * 50))
    sentencepiece.SentencePieceTrainer.train(input=str(root / "text.txt"), model_prefix=str(root / "sp"),
                                             vocab_size=18, minloglevel=2)
    (root / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\n##s\n")
    (root / "in.txt").write_text("the cats\n")
    return root


@pytest.mark.parametrize("bpe, model, message", [
    ("sentencepiece", "vocab.txt", "--model {tmp}/vocab.txt is a WordPiece vocab.txt, but --bpe sentencepiece takes a "
                                   "sentencepiece model there; for this file pass --bpe wordpiece"),
    ("wordpiece", "sp.model", "--model {tmp}/sp.model is a sentencepiece model, but --bpe wordpiece takes a WordPiece "
                              "vocab.txt there; for this file pass --bpe sentencepiece"),
    ("sentencepiece", "sp.vocab", "--model {tmp}/sp.vocab is a sentencepiece .vocab, but --bpe sentencepiece takes a "
                                  "sentencepiece model there; for this file pass --bpe sentencepiece with the .model "
                                  "file beside it"),
])
def test_palm_prepare_names_a_tokenizer_file_of_another_kind(tokenizer_files, bpe, model, message, capsys):
    from palm_tools.data import prepare

    assert prepare.main(["encode", "--bpe", bpe, "--model", str(tokenizer_files / model), "--inputs",
                         str(tokenizer_files / "in.txt"), "--outputs", str(tokenizer_files / "out.txt")]) == 1
    assert last_line(capsys) == "palm-prepare: error: " + message.format(tmp=tokenizer_files)
    assert not (tokenizer_files / "out.txt").exists()


@pytest.mark.parametrize("options, message", [
    (dict(bpe="sentencepiece", sentencepiece_model="vocab.txt"),
     "--sentencepiece-model {tmp}/vocab.txt is a WordPiece vocab.txt, but --bpe sentencepiece takes a sentencepiece "
     "model there; for this file pass --bpe bert --bpe-vocab-file {tmp}/vocab.txt"),
    (dict(bpe="bert", bpe_vocab_file="sp.model"),
     "--bpe-vocab-file {tmp}/sp.model is a sentencepiece model, but --bpe bert takes a WordPiece vocab.txt there; for "
     "this file pass --bpe sentencepiece --sentencepiece-model {tmp}/sp.model"),
    (dict(bpe="sentencepiece", sentencepiece_model="sp.vocab"),
     "--sentencepiece-model {tmp}/sp.vocab is a sentencepiece .vocab, but --bpe sentencepiece takes a sentencepiece "
     "model there; for this file pass --bpe sentencepiece with the .model file beside it"),
    (dict(bpe="sentencepiece", sentencepiece_model="missing.model"),
     "--sentencepiece-model {tmp}/missing.model: no such file; give a sentencepiece model, the one the text was "
     "encoded with (--bpe sentencepiece)"),
])
def test_the_api_names_a_bpe_file_of_another_kind(hub, tokenizer_files, options, message):
    """fairseq's --bpe files, as the Python API and fairseq-interactive build them (sentencepiece's `could not parse
    ModelProto` and a UnicodeDecodeError before); the right files still build their BPE."""
    from palm_plugin.models.hub_interface import from_pretrained

    _, root = hub
    options = {key: str(tokenizer_files / value) if key != "bpe" else value for key, value in options.items()}
    with pytest.raises(SystemExit) as stopped:
        from_pretrained(root, checkpoint_file="seq2seq.pt", data_name_or_path=str(root), **options)
    assert str(stopped.value) == "error: " + message.format(tmp=tokenizer_files)
    for right in (dict(bpe="sentencepiece", sentencepiece_model="sp.model"), dict(bpe="bert",
                                                                               bpe_vocab_file="vocab.txt")):
        right = {key: str(tokenizer_files / value) if key != "bpe" else value for key, value in right.items()}
        assert from_pretrained(root, checkpoint_file="seq2seq.pt", data_name_or_path=str(root), **right).bpe


def test_fairseq_interactive_names_a_bpe_file_of_another_kind(hub, tokenizer_files):
    from tests.conftest import run_cli

    _, root = hub
    result = run_cli("fairseq-interactive", root, "--user-dir", USER_DIR, "--task", "unilm_seq2seq", "--path",
                     root / "seq2seq.pt", "--bpe", "sentencepiece", "--sentencepiece-model",
                     tokenizer_files / "vocab.txt", "--cpu", input="the cats\n", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --sentencepiece-model {tokenizer_files}/vocab.txt is a WordPiece vocab.txt, but --bpe sentencepiece "
        f"takes a sentencepiece model there; for this file pass --bpe bert --bpe-vocab-file {tokenizer_files}/vocab.txt")


def test_palm_prepare_writes_through_a_link_and_reads_no_mark(tokenizer_files, tmp_path, capsys):
    from palm_tools.data import prepare

    (tmp_path / "marked.txt").write_bytes(b"\xef\xbb\xbfthe cats\n")
    (tmp_path / "real.txt").write_text("old\n")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    assert prepare.main(["encode", "--bpe", "wordpiece", "--model", str(tokenizer_files / "vocab.txt"), "--inputs",
                         str(tokenizer_files / "in.txt"), str(tmp_path / "marked.txt"), "--outputs",
                         str(tmp_path / "plain.txt"), str(tmp_path / "link.txt")]) == 0
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "the cat ##s\n"
    assert (tmp_path / "plain.txt").read_text() == "the cat ##s\n"


# ------------------------------------------------------------------------------------------- palm-convert
def test_palm_convert_bert_refuses_fewer_segments_than_the_checkpoint_has(tmp_path):
    transformers = pytest.importorskip("transformers")
    from palm_tools.convert import cli as convert
    from tests.test_convert_checkpoint import tiny_bert_config, write_bert_dir

    config = tiny_bert_config()
    source = write_bert_dir(tmp_path / "bert", transformers.BertModel(config), config)
    with pytest.raises(SystemExit, match=r"error: --num-segments 1: the converted model needs at least 2 segment types "
                                         r"\(the checkpoint's 2 trained rows, and the fine-tuning target's segment "
                                         r"1\); drop --num-segments or give 2 or more$"):
        convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "out"), "--num-segments", "1"])
    assert not (tmp_path / "out" / "model.pt").exists()


# ------------------------------------------------------------------------------------------- repeated options, plans
def test_every_repeatable_option_of_every_tool_accumulates():
    """argparse's nargs="+" without action="extend" keeps only the last of a repeated option (--scale A=1 --scale
    B=2 kept B=2): every such option of the tools extends (or appends)."""
    def calls(node):
        # mutmut's copies of a function (name__mutmut_N) are its mutants, not the tools' code
        for child in ast.iter_child_nodes(node):
            if not (isinstance(child, ast.FunctionDef) and "__mutmut_" in child.name):
                yield from calls(child)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            yield node

    offending, counted = [], 0
    for path in sorted((REPO / "palm_tools").rglob("*.py")):
        for call in calls(ast.parse(path.read_text())):
            keywords = {k.arg: k.value for k in call.keywords}
            flag = getattr(call.args[0], "value", "") if call.args else ""
            if flag.startswith("-") and getattr(keywords.get("nargs"), "value", None) in ("+", "*"):
                counted += 1
                if "action" not in keywords:
                    offending.append(f"{path.relative_to(REPO)}:{call.lineno}: {ast.unparse(call)[:60]}")
    assert not offending, offending
    assert counted > 10, counted  # the scan sees the tools' options


def test_palm_experiments_and_gpu_check_accumulate_repeats(tmp_path):
    from palm_tools.experiments.cli import parse_args
    from palm_tools.experiments.gpu_check import parse_args as gpu_check_args

    assert parse_args(["--scale", "dim=32", "--scale", "heads=2", "seeds=1"]).scale == ["dim=32", "heads=2",
                                                                                        "seeds=1"]
    for corpus in ("chitchat10k", "sotu"):
        (tmp_path / "bin" / corpus).mkdir(parents=True)
    args = gpu_check_args(["--out", "x", "--data", str(tmp_path), "--device", "cpu", "--configs", "palm_ft",
                           "--configs", "unilm_s2s,unilm_pre", "--precisions", "fp32", "--precisions", "bf16"])
    assert (args.configs, args.precisions) == (["palm_ft", "unilm_s2s", "unilm_pre"], ["fp32", "bf16"])


def test_palm_bench_only_bounds_every_part_and_the_plan_says_so():
    from palm_tools.bench.cli import parse_args, plan

    lines = plan(parse_args(["--preset", "gpu-sweep", "--device", "cpu", "--only", "roberta", "pmlm_ae_par"]))
    assert lines[0].startswith("sweep: pmlm_ae_par, roberta at lengths ")
    # gpu-sweep's levers run on the configurations --only names, and no other
    assert {part.split(":")[0] for part in lines[1].removeprefix("levers: ").split("; ")} == {"pmlm_ae_par", "roberta"}
    assert re.fullmatch(r"estimate: \d+ timed rows of \d+ updates each \(plus a warm-up\); rows not started after 17 "
                        r"min are skipped", lines[2])
    assert lines[3] == "decoding: none (--only names no decoder)"
    lines = plan(parse_args(["--quick", "--only", "palm", "unilm_seq2seq"]))
    assert lines[0].startswith("training: palm, unilm_seq2seq at lengths") and "transformer, palm" in lines[1]


def test_palm_bench_from_json_of_a_file_that_is_not_its_record(tmp_path):
    from palm_tools.bench.cli import read_record

    (tmp_path / "other.json").write_text('{"experiments": []}')
    (tmp_path / "table.md").write_text("| a |\n")
    with pytest.raises(SystemExit, match=r"^palm-bench: --from-json .*other.json: not a palm-bench record \(it lacks "
                                         r"settings, machine, training and decoding\); give the .json a palm-bench "
                                         r"run wrote"):
        read_record(tmp_path / "other.json", "--from-json")
    with pytest.raises(SystemExit, match=r"table.md: not JSON \(.*\); give the .json a palm-bench run wrote .*not its "
                                         r"\.md or \.png$"):
        read_record(tmp_path / "table.md", "--from-json")
    assert read_record(REPO / "docs" / "benchmarks.json", "--from-json")["settings"]


def test_committed_reports_name_no_folder_of_this_machine():
    from palm_tools.experiments.cli import shown

    assert shown(REPO / "results" / "real" / "prepared") == "results/real/prepared"
    for path in sorted(p for p in (REPO / "docs").glob("paper_tables*") if p.suffix in (".md", ".json")):
        assert str(REPO) not in path.read_text(), path


# ------------------------------------------------------------------------------------------- task data, ensembles
def test_unilm_seq2seq_without_a_dictionary_names_the_missing_file(tmp_path):
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = parse_training(*UNILM)
    args.data = str(tmp_path)
    task = convert_namespace_to_omegaconf(args).task
    for missing in ("src", "tgt"):
        with pytest.raises(FileNotFoundError) as stopped:
            tasks.setup_task(task)
        assert str(stopped.value) == (f"{tmp_path}/dict.{missing}.txt: no dictionary; run fairseq-preprocess "
                                      f"(translation layout) first")
        (tmp_path / f"dict.{missing}.txt").write_text("w1 5\nw2 3\n")
    assert tasks.setup_task(task).dictionary.symbols[4:6] == ["w1", "w2"]


@pytest.mark.parametrize("second, message", [
    ("missing.pt", "--path {tmp}/missing.pt: file not found; the checkpoints in {tmp}: a.pt, palm.pt"),
    ("palm.pt", "--path {tmp}/palm.pt is a palm model (trained with --task translation), which --task unilm_seq2seq "
                "cannot decode; decode it with --task translation"),
], ids=["missing", "another-family"])
def test_every_checkpoint_of_an_ensemble_is_checked(tmp_path, second, message):
    """fairseq-generate --path a.pt:b.pt: the second file is checked as the first is, and named."""
    import palm_plugin  # noqa: F401
    from fairseq import options

    torch.save(checkpoint_state(), tmp_path / "a.pt")
    torch.save(checkpoint_state("translation", "palm_tiny"), tmp_path / "palm.pt")

    def generate(paths):
        return options.parse_args_and_arch(options.get_generation_parser(), [
            str(tmp_path), "--user-dir", str(USER_DIR), "--task", "unilm_seq2seq", "--path",
            os.pathsep.join(str(tmp_path / name) for name in paths)])

    with pytest.raises(SystemExit) as stop:
        generate(["a.pt", second])
    assert stop.value.code == "error: " + message.format(tmp=tmp_path)
    assert generate(["a.pt", "a.pt"]).path.count(os.pathsep) == 1


# ------------------------------------------------------------------------------------------- tasks, models, criteria
@pytest.fixture(scope="module")
def dictionaries(tmp_path_factory):
    """A data folder of dictionaries only (every task's layout): enough to set up a task and build its model."""
    root = tmp_path_factory.mktemp("dictionaries")
    for name in ("dict.txt", "dict.src.txt", "dict.tgt.txt"):
        (root / name).write_text("".join(f"w{i} {100 - i}\n" for i in range(30)))
    return root


def build_training(data, *arguments, model=True):
    """The task, model and criterion of a fairseq-train command line, built as fairseq-train builds them (the task
    alone without ``model``)."""
    import palm_plugin  # noqa: F401
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [str(data), "--user-dir", str(USER_DIR), "--cpu",
                                                                       *map(str, arguments)])
    if not model:
        return tasks.setup_task(args)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)


PMLM = ["--task", "pmlm", "--arch", "unilm2_tiny", "--criterion", "pmlm_ae_par"]
UNILM_PRE = ["--task", "unilm_pretraining", "--arch", "unilm_tiny", "--criterion", "unilm_cloze"]
PALM_PRE = ["--task", "continuation_pair", "--arch", "palm_tiny", "--criterion", "palm_mlm_lm"]
UNILM_ARCHS = "unilm, unilm_base, unilm_large, unilm_tiny, unilm2_base, unilm2_tiny"


@pytest.mark.parametrize("arguments, error, message", [
    # a task, model and criterion that do not go together failed at the first batch (IndexError, KeyError, ...)
    (PMLM[:2] + ["--arch", "palm_tiny"], ValueError,
     f"--task pmlm makes batches for a unilm model, and --arch palm_tiny is a palm model: give a unilm arch "
     f"({UNILM_ARCHS}), or train palm with --task continuation_pair (pre-training) or translation (fine-tuning)"),
    (PALM_PRE[:2] + ["--arch", "unilm_tiny"], ValueError,
     "--task continuation_pair makes batches for a palm model, and --arch unilm_tiny is a unilm model: give a palm "
     "arch (palm, palm_base, palm_large, palm_tiny), or train unilm with --task unilm_pretraining, pmlm or "
     "unilm_seq2seq"),
    (UNILM[:2] + ["--arch", "palm_tiny", "--pseudo-masks"], ValueError,
     f"--task unilm_seq2seq makes batches for a unilm model, and --arch palm_tiny is a palm model: give a unilm arch "
     f"({UNILM_ARCHS}), or train palm with --task continuation_pair (pre-training) or translation (fine-tuning)"),
    (UNILM[:4] + ["--criterion", "pmlm_ae_par"], ValueError,
     "--criterion pmlm_ae_par is the loss of --task pmlm's pseudo-masked batches, not of --task unilm_seq2seq: train "
     "the other UniLM tasks with --criterion unilm_cloze"),
    (PALM_PRE[:4] + ["--criterion", "unilm_cloze"], ValueError,
     "--criterion unilm_cloze is UniLM's loss (tasks unilm_seq2seq, unilm_pretraining, pmlm), not one for --task "
     "continuation_pair: train PALM with --criterion palm_mlm_lm"),
    (PALM[:4] + ["--criterion", "unilm_cloze", "-s", "src", "-t", "tgt"], ValueError,
     "--criterion unilm_cloze is UniLM's loss (tasks unilm_seq2seq, unilm_pretraining, pmlm), not one for --task "
     "translation: train PALM with --criterion label_smoothed_cross_entropy"),
    (PALM[:4] + ["--criterion", "palm_mlm_lm", "-s", "src", "-t", "tgt"], ValueError,
     "--criterion palm_mlm_lm is PALM's pre-training loss (--task continuation_pair), not one for --task "
     "translation: fine-tune PALM with --criterion label_smoothed_cross_entropy"),
    # values the plugin took and trained on, or failed on deep inside
    (PALM_PRE + ["--lm-weight", 0], ValueError,  # a loss of 0: gnorm 0, exit 0
     "--mlm-weight 0 and --lm-weight 0: stage joint would train nothing; give one of them a weight above 0"),
    (PALM_PRE + ["--source-position-markers", 5], ValueError,  # it said to move <mask> before markers it lacks
     "--source-position-markers 5: the dictionary has 0 source position markers (<unk-0>, <unk-1>, ... at its end, "
     "as fairseq's examples/pointer_generator writes dict.txt): leave out --source-position-markers, or binarize "
     "with a dictionary that ends with them"),
    (PMLM + ["--tokens-per-sample", 4], ValueError,  # fairseq's TokenBlockDataset: "cannot reshape array of size 0"
     "--tokens-per-sample 4: must be at least 5 ([SOS] S1 [EOS] S2 [EOS], a token on each side)"),
    (PMLM + ["--tokens-per-sample", 128, "--max-positions", 64], ValueError,  # fairseq: "skip this example with ..."
     "--tokens-per-sample 128: the model has 64 positions (--max-positions): give --tokens-per-sample 64 or less, or "
     "raise --max-positions"),
    (UNILM_PRE + ["--tokens-per-sample", 128, "--max-positions", 64], ValueError,
     "--tokens-per-sample 128: the model has 64 positions (--max-positions): give --tokens-per-sample 64 or less, or "
     "raise --max-positions"),
    (PALM_PRE + ["--max-source-tokens", 100, "--encoder-max-positions", 64], ValueError,
     "--max-source-tokens 100 + [EOS]: up to 101 tokens, and the model reads at most --encoder-max-positions 64: "
     "lower --max-source-tokens or raise --encoder-max-positions"),
    (PALM_PRE + ["--max-source-tokens", 40, "--max-target-tokens", 100, "--decoder-max-positions", 64], ValueError,
     "--max-target-tokens 100 + [EOS]: up to 101 tokens, and the model reads at most --decoder-max-positions 64: "
     "lower --max-target-tokens or raise --decoder-max-positions"),
    (PALM_PRE + ["--objective", "masked_span", "--max-source-tokens", 40, "--max-target-tokens", 30,
                 "--encoder-max-positions", 64], ValueError,  # the span is cut from the source: 40 + 30 + [EOS]
     "--max-source-tokens 40 + --max-target-tokens 30 (--objective masked_span) + [EOS]: up to 71 tokens, and the "
     "model reads at most --encoder-max-positions 64: lower --max-source-tokens or raise --encoder-max-positions"),
    (UNILM_PRE + ["--span-length-probs", "0.5,0.1"], ValueError,  # it named no option
     "--span-length-probs 0.5,0.1: 2 values summing to 0.6; give the probabilities of spans of 1, 2, 3, ... tokens, "
     "none negative, that sum to 1"),
    (UNILM_PRE + ["--span-length-probs", "0.8;0.2"], ValueError,
     "--span-length-probs: expected comma-separated numbers or fractions, got '0.8;0.2'"),
    (UNILM_PRE + ["--objective-probs=-1,1,0.5,0.5"], ValueError,  # numpy at the first batch: "not non-negative"
     "--objective-probs -1,1,0.5,0.5: 4 values summing to 1; give 4 probabilities of bidirectional, seq2seq, "
     "left-to-right, right-to-left, none negative, that sum to 1"),
    (PALM_PRE + ["--roberta-path", "missing.pt"], SystemExit,  # FileNotFoundError: [Errno 2]
     "error: --roberta-path missing.pt: file not found; . holds no .pt file"),
    (UNILM_PRE[:2] + ["--arch", "unilm", "--encoder-layers", 1, "--encoder-embed-dim", 30, "--encoder-ffn-embed-dim",
                      60, "--encoder-attention-heads", 4, "--criterion", "unilm_cloze"], ValueError,
     "--encoder-embed-dim 30 is not divisible by --encoder-attention-heads 4: each head takes an equal share; give a "
     "width that is a multiple of the heads"),
], ids=["pmlm-palm", "continuation_pair-unilm", "unilm_seq2seq-palm", "pmlm_ae_par-unilm_seq2seq",
        "unilm_cloze-continuation_pair", "unilm_cloze-translation", "palm_mlm_lm-translation", "no-loss-weight", "no-markers",
        "pmlm-tokens-per-sample", "pmlm-positions", "unilm_pretraining-positions", "continuation_pair-positions",
        "continuation_pair-decoder-positions", "masked_span-positions",
        "span-length-probs", "span-length-probs-separator", "negative-objective-prob", "roberta-path-missing",
        "heads-do-not-divide"])
def test_training_options_that_cannot_train_name_the_option(dictionaries, monkeypatch, arguments, error, message):
    monkeypatch.chdir(dictionaries)
    with pytest.raises(error) as stopped:
        build_training(dictionaries, *arguments)
    assert str(stopped.value.code if error is SystemExit else stopped.value) == message


def test_the_other_familys_arch_is_refused_through_fairseqs_legacy_namespace_too(dictionaries):
    """task.build_model(args) with parse_args_and_arch's Namespace (fairseq's older API): --arch, no _name; the task
    is named as registered, or by its class where it is registered under no name (a subclass made in Python)."""
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(dictionaries), "--user-dir", str(USER_DIR), "--cpu", *PMLM[:2], "--arch", "palm_tiny"])
    task = tasks.setup_task(args)
    with pytest.raises(ValueError, match="^--task pmlm makes batches for a unilm model, and --arch palm_tiny is a palm "
                                         "model: give a unilm arch"):
        task.build_model(args)
    unregistered = type("MyPmlmTask", (type(task),), {}).setup_task(args)
    with pytest.raises(ValueError, match="^--task MyPmlmTask makes batches for a unilm model, and --arch palm_tiny"):
        unregistered.build_model(args)


def test_options_of_the_other_unilm_seq2seq_layout_are_named_as_unread(dictionaries, caplog):
    for layout in (["--target-mask-prob", 0.3, "--pseudo-mask-noise", "s2s_ft"], ["--pseudo-masks", "--mask-prob", 0.5],
                   ["--pseudo-masks", "--target-mask-prob", 0.1], ["--mask-prob", 0.5]):
        build_training(dictionaries, *UNILM, *layout, model=False)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "--target-mask-prob 0.3 and --pseudo-mask-noise s2s_ft: not read without --pseudo-masks (UniLM v1's layout "
        "predicts --mask-prob 0.7 of the target): add --pseudo-masks, or leave them out",
        "--mask-prob 0.5: not read with --pseudo-masks, which predicts every target token (the history's corrupted "
        "share is --target-mask-prob 0.5): leave it out"]


def test_block_options_are_named_as_unread_by_single_token_objectives(dictionaries, caplog):
    for objective in ("ar", "ae_par"):
        build_training(dictionaries, *PMLM, "--objective", objective, "--block-prob", 0.9, "--max-block-length", 3,
                       model=False)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "--block-prob 0.9 and --max-block-length 3: not read with --objective ar, whose factorization steps are single "
        "tokens (the spans of Algorithm 1 are ae_par's, ae's and par's): leave them out"]


# ------------------------------------------------------------------------------------------- fine-tuning another family
@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory):
    """Tiny untrained checkpoints of each family, as pre-training (or palm-convert bert: ``--arch unilm``) saves
    them."""
    root = tmp_path_factory.mktemp("families")
    save_untrained_checkpoint(root, "unilm.pt", UNILM_PRE)
    save_untrained_checkpoint(root, "pmlm.pt", PMLM)
    save_untrained_checkpoint(root, "palm.pt", PALM_PRE)
    # a converted MiniLM: the unilm arch with its own sizes
    save_untrained_checkpoint(root, "converted.pt", UNILM_PRE[:2] + [
        "--arch", "unilm", "--encoder-layers", "1", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--criterion", "unilm_cloze"])
    torch.save({"cfg": {"model": {"_name": "roberta_base"}, "task": {"_name": "masked_lm"}}, "model": {}},
               root / "roberta.pt")
    # fairseq's released RoBERTa checkpoints predate cfg: their options, --arch among them, are an argparse Namespace
    torch.save({"args": argparse.Namespace(arch="roberta_base", task="masked_lm"), "model": {}},
               root / "roberta-args.pt")
    return root


@pytest.mark.parametrize("checkpoint, arguments, message", [
    ("unilm.pt", PALM, f"is a unilm model (--arch unilm_tiny), and --arch palm_tiny is a palm model: give a unilm arch "
                       f"({UNILM_ARCHS}); to start PALM's encoder from a BERT-family or UniLM v1 checkpoint, pass it "
                       "as --roberta-path"),
    ("converted.pt", PALM_PRE, f"is a unilm model (--arch unilm), and --arch palm_tiny is a palm model: give a unilm "
                               f"arch ({UNILM_ARCHS}); to start PALM's encoder from a BERT-family or UniLM v1 "
                               "checkpoint, pass it as --roberta-path"),
    # --roberta-path refuses UniLMv2's relative position bias: no hint
    ("pmlm.pt", PALM, "is a unilm model (--arch unilm2_tiny), and --arch palm_tiny is a palm model: give a unilm arch "
                      f"({UNILM_ARCHS})"),
    ("palm.pt", UNILM, "is a palm model (--arch palm_tiny), and --arch unilm_tiny is a unilm model: give a palm arch "
                       "(palm, palm_base, palm_large, palm_tiny)"),
    ("palm.pt", PMLM, "is a palm model (--arch palm_tiny), and --arch unilm2_tiny is a unilm model: give a palm arch "
                      "(palm, palm_base, palm_large, palm_tiny)"),
    ("roberta.pt", PALM, "is a roberta model (--arch roberta_base), and --arch palm_tiny is a palm model: give a "
                         "roberta arch (roberta, roberta_prenorm, roberta_base, roberta_large, xlm); to start PALM's "
                         "encoder from a RoBERTa checkpoint, pass it as --roberta-path"),
    ("roberta-args.pt", PALM, "is a roberta model (--arch roberta_base), and --arch palm_tiny is a palm model: give a "
                              "roberta arch (roberta, roberta_prenorm, roberta_base, roberta_large, xlm); to start "
                              "PALM's encoder from a RoBERTa checkpoint, pass it as --roberta-path"),
], ids=["unilm-palm", "converted-palm", "unilm2-palm", "palm-unilm", "palm-unilm2", "roberta-palm",
        "roberta-args-palm"])
def test_a_checkpoint_of_the_other_family_to_fine_tune_is_refused(family_checkpoints, checkpoint, arguments, message):
    """fairseq-train --finetune-from-model: fairseq failed at loading, "please ensure that the architectures match"."""
    path = family_checkpoints / checkpoint
    with pytest.raises(SystemExit) as stop:
        parse_training(*arguments, "--finetune-from-model", path)
    assert stop.value.code == f"error: --finetune-from-model {path} {message}"


@pytest.mark.parametrize("checkpoint, arguments", [
    ("converted.pt", UNILM[:2] + ["--arch", "unilm_base", "--criterion", "unilm_cloze"]),  # a MiniLM of other sizes
    ("converted.pt", UNILM[:2] + ["--pseudo-masks", "--arch", "unilm2_base", "--criterion", "unilm_cloze"]),
    ("converted.pt", PMLM),
    ("pmlm.pt", UNILM[:2] + ["--pseudo-masks", "--arch", "unilm2_base", "--criterion", "unilm_cloze"]),
    ("unilm.pt", PMLM),
    ("palm.pt", PALM),
])
def test_a_checkpoint_of_the_same_family_fine_tunes_under_any_of_its_archs(family_checkpoints, checkpoint, arguments):
    args = parse_training(*arguments, "--finetune-from-model", family_checkpoints / checkpoint)
    assert args.encoder_layers in (1, 2)  # the checkpoint's sizes, adopted



# ----------------------------------------------------------------------------- PALM's released checkpoint (AliceMind)
# Parameter names of the checkpoint that PALM's released code (alibaba/AliceMind, PALM/models/model_builder.py's
# AbsSummarizer) saves, as its own classes name them (one layer of each stack shown): an HF RoBERTa under bert.model.,
# PreSumm's decoder, a generator tied to the decoder's embedding
RELEASED_PALM_NAMES = [
    "bert.model.embeddings.word_embeddings.weight", "bert.model.embeddings.position_embeddings.weight",
    "bert.model.embeddings.token_type_embeddings.weight", "bert.model.embeddings.LayerNorm.weight",
    "bert.model.encoder.layer.0.attention.self.query.weight", "bert.model.encoder.layer.0.output.dense.weight",
    "bert.model.pooler.dense.weight", "decoder.embeddings.weight", "decoder.pos_emb.pe",
    "decoder.transformer_layers.0.self_attn.linear_keys.weight",
    "decoder.transformer_layers.0.context_attn.linear_query.weight",
    "decoder.transformer_layers.0.feed_forward.w_1.weight", "decoder.transformer_layers.0.layer_norm_1.weight",
    "decoder.layer_norm.weight", "generator.0.weight", "generator.0.bias",
]


@pytest.fixture(scope="module")
def released_palm(tmp_path_factory):
    """The released checkpoint's layout: as its trainer saves it (with its optimiser objects, of a class of the
    released code's own module models.optimizers), re-saved without them (what the refusal of an unsafe file used to
    advise), and a PreSumm extractive checkpoint (bert.model. without the decoder), which is not PALM's."""
    import sys
    import types
    from unittest import mock

    root = tmp_path_factory.mktemp("released")
    model = {name: torch.zeros(2, 3) for name in RELEASED_PALM_NAMES}
    opt = argparse.Namespace(encoder="roberta", dec_layers=12, dec_hidden_size=768, dec_heads=8, dec_ff_size=2048)
    optimizers = types.ModuleType("models.optimizers")
    optimizers.Optimizer = type("Optimizer", (), {"__module__": "models.optimizers"})
    with mock.patch.dict(sys.modules, {"models": types.ModuleType("models"), "models.optimizers": optimizers}):
        torch.save({"model": model, "opt": opt, "optims": [optimizers.Optimizer()]}, root / "model_palm_en_base.pt")
    torch.save({"model": model, "opt": opt}, root / "resaved.pt")
    extractive = {name: tensor for name, tensor in model.items() if name.startswith("bert.")}
    torch.save({"model": {**extractive, "ext_layer.wo.weight": torch.zeros(1, 3)}, "opt": opt}, root / "ext.pt")
    return root


def released_palm_message(path):
    return (f"{path}: a checkpoint of PALM's released code (alibaba/AliceMind: PreSumm's bert.model.* and "
            "decoder.transformer_layers.*), not a fairseq one; its decoder and output layer are not the paper's PALM "
            "that the plugin builds, and nothing converts it (docs/palm-authors-code.md). Start PALM's encoder from "
            "RoBERTa instead: --roberta-path with a fairseq RoBERTa model.pt (palm-convert hf-roberta makes one from "
            "an HF RoBERTa folder)")


@pytest.mark.parametrize("name", ["model_palm_en_base.pt", "resaved.pt"])
def test_palms_released_checkpoint_is_named_with_what_to_do_wherever_it_is_given(released_palm, tmp_path, name):
    """fairseq-train --finetune-from-model and --roberta-path, fairseq-generate --path (the same reader as
    --finetune-from-model) and palm-convert roberta: each stops with what the file is and what to do. Before, the
    file as released was refused as unsafe, with the advice to re-save it as a plain state dict, and the re-saved one
    was sent to palm-convert bert, which cannot read it either."""
    from palm_tools.convert import cli

    path = released_palm / name
    for option, task in (("--finetune-from-model", PALM), ("--roberta-path", PALM_PRE)):
        with pytest.raises(SystemExit) as stop:
            parse_training(*task, option, path)
        assert stop.value.code == "error: " + released_palm_message(path)
    (tmp_path / "dict.txt").write_text("a 1\n")
    with pytest.raises(SystemExit) as stop:
        cli.main(["roberta", "--input", str(path), "--dict", str(tmp_path / "dict.txt"), "--output",
                  str(tmp_path / "out")])
    assert stop.value.code == "error: " + released_palm_message(path)
    assert not (tmp_path / "out" / "model.pt").exists()


def test_an_hf_roberta_under_bert_model_without_palms_decoder_is_not_called_palms(released_palm):
    """PreSumm's extractive checkpoints share the encoder's names: the general message, not PALM's."""
    path = released_palm / "ext.pt"
    with pytest.raises(SystemExit) as stop:
        parse_training(*PALM, "--finetune-from-model", path)
    assert stop.value.code.startswith(f"error: --finetune-from-model {path}: not a fairseq checkpoint; convert it")

# ------------------------------------------------------------------------------------------- fairseq under numpy 2
def test_translation_batches_in_length_buckets():
    """fairseq-train --task translation --num-batch-buckets N: fairseq 0.12 read ``np.compat.long`` and
    ``np.percentile(interpolation=)``, which numpy 2 lacks (:mod:`palm_plugin.fixes.numpy_compat`); pmlm's
    ``--sample-break-mode eos`` is in tests/test_pmlm_task.py."""
    import palm_plugin  # noqa: F401
    from fairseq.data import Dictionary, LanguagePairDataset

    dictionary = Dictionary()
    word = dictionary.add_symbol("w")
    sentences = [torch.tensor([word] * n + [dictionary.eos()]) for n in (1, 2, 3, 5, 8, 13)]
    sizes = np.array([len(s) for s in sentences])
    dataset = LanguagePairDataset(sentences, sizes, dictionary, sentences, sizes, dictionary, num_buckets=2)
    assert dataset.src.buckets.tolist() == [4, 14]  # the sizes at the 50th and 100th percentiles, the lower one
    assert dataset.bucketed_num_tokens.tolist() == [4, 4, 4, 14, 14, 14]
    batch = dataset.collater([dataset[i] for i in range(3)])
    assert batch["net_input"]["src_tokens"].shape == (3, 4)  # padded to the bucket
