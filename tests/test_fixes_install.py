"""The fixes' ``install`` functions (palm_plugin/fixes): each patches fairseq once however often it runs (fairseq
imports a --user-dir more than once in some commands, and a second wrap would check twice, or make a replaced
function its own original), and what it installs calls what fairseq had.

The plugin installs its fixes when it is imported, before any test runs, so the wrapping itself is checked here
in-process: once over the installed state, and once from stand-ins put where fairseq's functions were."""
import argparse
import importlib.util
import logging
import os
import sys
import types

import pytest
import torch

from palm_plugin import fixes
from palm_plugin.fixes import (
    checkpoint_copy, generation_options, multi_tensor_optimizer, parsed_arguments, saved_model_build,
)
from palm_plugin.fixes.parsed_arguments import check_after_parsing
from tests.conftest import binarize

FIXES_DIR = os.path.dirname(fixes.__file__)


def _from_the_fixes(value):
    function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    code = getattr(function, "__code__", None)
    return code is not None and code.co_filename.startswith(FIXES_DIR)


def install_twice(fix, patched):
    """``fix.install()`` run twice: what ``patched()`` reads (the functions it puts in fairseq) is the same after the
    second run as after the first, so fairseq is wrapped once. Returns it."""
    fix.install()
    first = patched()
    fix.install()
    assert patched() == first
    return first


def patched_fairseq():
    """Every attribute of fairseq's loaded modules and of their classes that holds a function of palm_plugin/fixes:
    ``{(owner, name): the object}``."""
    found, seen = {}, set()
    for name, module in list(sys.modules.items()):
        if module is None or id(module) in seen or not (name == "fairseq" or name.startswith(("fairseq.",
                                                                                               "fairseq_cli."))):
            continue
        seen.add(id(module))
        for attribute, value in list(vars(module).items()):
            if _from_the_fixes(value):
                found[(module.__name__, attribute)] = value
            if isinstance(value, type) and value.__module__ == module.__name__:
                for member, inner in list(vars(value).items()):
                    if _from_the_fixes(inner):
                        found[(f"{module.__name__}.{value.__qualname__}", member)] = inner
    return found


def test_installing_again_changes_nothing_in_fairseq(monkeypatch):
    from fairseq.dataclass.configs import GenerationConfig
    from fairseq.models import ARCH_CONFIG_REGISTRY

    train = types.ModuleType("fairseq_cli.train")  # fairseq-train's module as the command has it, not imported here
    train.main = train.add_defaults = lambda cfg: None
    monkeypatch.setitem(sys.modules, "fairseq_cli.train", train)
    fixes.install()  # what a command has by the time it imports the plugin again
    fixes.install_after_registration()
    before = patched_fairseq()
    registry, originals = dict(ARCH_CONFIG_REGISTRY), dict(multi_tensor_optimizer.ORIGINALS)
    fields = list(GenerationConfig.__dataclass_fields__)
    assert {("fairseq.options", "parse_args_and_arch"), ("fairseq.file_io.PathManager", "copy"),  # the scan sees them
            ("fairseq.models", "build_model"), ("fairseq_cli.train", "main"), ("fairseq_cli.train", "add_defaults"),
            ("fairseq.dataclass.initialize", "add_defaults"),
            ("fairseq.search.DiverseBeamSearch", "step"),
            ("fairseq.checkpoint_utils", "load_model_ensemble_and_task")} <= before.keys()

    fixes.install()
    fixes.install_after_registration()
    after = patched_fairseq()
    assert after.keys() == before.keys()
    assert [key for key in before if after[key] is not before[key]] == []
    assert [name for name, fn in ARCH_CONFIG_REGISTRY.items() if fn is not registry[name]] == []
    assert multi_tensor_optimizer.ORIGINALS == originals and list(GenerationConfig.__dataclass_fields__) == fields
    # fairseq's own functions stay the originals the replacements call
    assert all(not _from_the_fixes(fn) for fn in originals.values())


def test_parse_checks_wrap_fairseqs_parse_once_and_run_once_per_marker(monkeypatch):
    from fairseq import options

    def parse(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        args = argparse.Namespace(given=list(input_args or []), suppress_defaults=suppress_defaults)
        return (args, ["left over"]) if parse_known else args

    monkeypatch.setattr(options, "parse_args_and_arch", parse)
    monkeypatch.setattr(parsed_arguments, "CHECKS", {})  # the plugin's own checks stay registered
    seen = []
    check_after_parsing("__test_first__", lambda args, argv: seen.append(("first", args.given, argv)))
    wrapped = options.parse_args_and_arch
    check_after_parsing("__test_first__", lambda args, argv: seen.append(("again", args.given, argv)))
    assert options.parse_args_and_arch is wrapped and wrapped.__wrapped__ is parse and wrapped.__palm_plugin__

    assert wrapped(None, ["data", "--beam", "2"]).given == ["data", "--beam", "2"]
    args, rest = wrapped(None, ["data"], parse_known=True)
    assert args.given == ["data"] and rest == ["left over"]
    assert wrapped(None, ["data"], suppress_defaults=True).suppress_defaults  # fairseq's own first pass: unchecked
    monkeypatch.setattr(sys, "argv", ["fairseq-train", "from", "argv"])
    wrapped(None)
    assert seen == [("first", ["data", "--beam", "2"], ["data", "--beam", "2"]), ("first", ["data"], ["data"]),
                    ("first", [], ["from", "argv"])]

    # a second check runs in the same wrapper, after the first
    check_after_parsing("__test_second__", lambda args, argv: seen.append(("second", args.given, argv)))
    check_after_parsing("__test_first__", lambda args, argv: seen.append(("again", args.given, argv)))
    assert options.parse_args_and_arch is wrapped
    seen.clear()
    wrapped(None, ["x"])
    assert seen == [("first", ["x"], ["x"]), ("second", ["x"], ["x"])]
    # fairseq-hydra-train parses nothing: its configuration gets the same checks, once each, in the same order
    seen.clear()
    parsed_arguments.run_checks(argparse.Namespace(given=["cfg"]), ["--flag"])
    assert seen == [("first", ["cfg"], ["--flag"]), ("second", ["cfg"], ["--flag"])]


def test_help_wraps_fairseqs_parse_once_and_prints_the_options_added_while_parsing(monkeypatch, capsys):
    from fairseq import options

    from palm_plugin.fixes import option_help

    def parse(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
        # as fairseq's: a first parse (where --help acts) learns --task, whose options are added for the last parse
        if modify_parser is not None:
            modify_parser(parser)
        task = parser.parse_known_args(input_args)[0].task
        parser.add_argument(f"--{task}-option", default="x")
        if modify_parser is not None:
            modify_parser(parser)
        return parser.parse_known_args(input_args)[0] if parse_known else parser.parse_args(input_args)

    def command_parser():
        parser = argparse.ArgumentParser(prog="fairseq-train")
        parser.add_argument("data")
        parser.add_argument("--task", default="translation")
        return parser

    monkeypatch.setattr(options, "parse_args_and_arch", parse)
    wrapped = install_twice(option_help, lambda: options.parse_args_and_arch)
    assert wrapped is not parse
    assert vars(wrapped(command_parser(), ["data", "--task", "pmlm", "--pmlm-option", "y"])) == {
        "data": "data", "task": "pmlm", "pmlm_option": "y"}
    # the arguments given, not the command line's (the command line asks for no task's help); then the command line's
    for command_line, given in ((["fairseq-train", "--help"], ["--task", "pmlm", "--help"]),
                                (["fairseq-train", "--task", "pmlm", "--help"], None)):
        monkeypatch.setattr(sys, "argv", command_line)
        parser = command_parser()
        with pytest.raises(SystemExit) as stop:
            wrapped(parser, given)  # DATA left out
        assert stop.value.code == 0 and "--pmlm-option" in capsys.readouterr().out
        assert [action.nargs for action in parser._actions if action.dest == "data"] == [None]  # DATA required again


def test_saved_model_build_wraps_build_model_and_train_main_once(monkeypatch, tmp_path):
    from fairseq import models

    def build_model(cfg, task, from_checkpoint=False):
        return cfg, task, from_checkpoint, saved_model_build.building_saved_model(), \
            saved_model_build.building_from_checkpoint()

    keywords = []

    def main(cfg, **kwargs):  # fairseq's distributed_utils.call_main(cfg, main, **kwargs) hands main its keywords
        keywords.append(kwargs)
        return saved_model_build.building_saved_model(), saved_model_build.building_from_checkpoint()

    train = types.ModuleType("fairseq_cli.train")  # fairseq-train's module, loaded before the plugin
    train.main = main
    monkeypatch.setitem(sys.modules, "fairseq_cli.train", train)
    monkeypatch.setattr(models, "build_model", build_model)
    wrapped_build, wrapped_main = install_twice(saved_model_build, lambda: (models.build_model, train.main))
    assert wrapped_build is not build_model and wrapped_main is not main

    assert wrapped_build("cfg", "task") == ("cfg", "task", False, False, False)
    assert wrapped_build("cfg", "task", from_checkpoint=True) == ("cfg", "task", True, True, True)
    assert saved_model_build.building_saved_model() is False  # reset after the build

    def checkpoint(restore_file="checkpoint_last.pt", finetune_from_model=None):
        return types.SimpleNamespace(checkpoint=types.SimpleNamespace(
            save_dir=str(tmp_path), restore_file=restore_file, finetune_from_model=finetune_from_model))

    assert wrapped_main(checkpoint()) == (False, False)  # a new run
    assert wrapped_main(checkpoint(), passed="on") == (False, False) and keywords[-1] == {"passed": "on"}
    assert wrapped_main(checkpoint(finetune_from_model="roberta.pt")) == (True, False)
    assert wrapped_main(checkpoint(restore_file=str(tmp_path / "other.pt"))) == (False, False)  # missing: scratch
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    assert wrapped_main(checkpoint()) == (True, False)  # resuming
    assert saved_model_build.building_saved_model() is False


def test_multi_tensor_install_keeps_fairseqs_functions_as_its_originals(monkeypatch):
    """A second install that took the replacements for fairseq's functions would make Adam's step call itself."""
    from fairseq import utils
    from fairseq.optim.adam import Adam
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    stand_ins = {"adam_step": lambda self, closure=None: "adam",
                 "clip_grad_norm_": lambda params, max_norm, aggregate_norm_fn=None: ("norm", max_norm,
                                                                                      aggregate_norm_fn)}
    monkeypatch.setattr(multi_tensor_optimizer, "ORIGINALS", {})
    monkeypatch.setattr(multi_tensor_optimizer.clip_grad_norm_, "__palm_plugin__", True)
    monkeypatch.setattr(utils, "clip_grad_norm_", stand_ins["clip_grad_norm_"])
    monkeypatch.setattr(Adam, "step", stand_ins["adam_step"])
    for name in multi_tensor_optimizer.NAMES:
        stand_ins[name] = lambda self, *args, name=name: name
        monkeypatch.setattr(_FP16OptimizerMixin, name, stand_ins[name])

    multi_tensor_optimizer.install()
    multi_tensor_optimizer.install()
    assert multi_tensor_optimizer.ORIGINALS == stand_ins
    assert utils.clip_grad_norm_ is multi_tensor_optimizer.clip_grad_norm_
    assert Adam.step is multi_tensor_optimizer.adam_step
    assert [getattr(_FP16OptimizerMixin, name) for name in multi_tensor_optimizer.NAMES] == [
        getattr(multi_tensor_optimizer, name) for name in multi_tensor_optimizer.NAMES]
    # cases the replacement leaves to fairseq reach the stand-in: a single gradient's norm
    one = torch.nn.Parameter(torch.ones(3))
    one.grad = torch.ones(3)
    assert utils.clip_grad_norm_([one], 1.0) == ("norm", 1.0, None)
    # with the all-reduce of distributed training, which fairseq's norm must still apply
    assert utils.clip_grad_norm_([one], 0.5, aggregate_norm_fn=torch.sqrt) == ("norm", 0.5, torch.sqrt)


def test_atomic_copy_leaves_remote_and_kept_files_to_fairseqs_copy(monkeypatch, tmp_path):
    from fairseq.file_io import PathManager

    calls = []

    def copy(src_path, dst_path, overwrite=False):
        calls.append((src_path, dst_path, overwrite))
        return "fairseq's"

    monkeypatch.setattr(PathManager, "copy", staticmethod(copy))
    atomic = install_twice(checkpoint_copy, lambda: PathManager.copy)
    assert atomic is not copy

    src, dst = tmp_path / "checkpoint_3_30.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 100)
    assert atomic(str(src), str(dst)) is True and dst.read_bytes() == src.read_bytes() and calls == []
    dst.write_bytes(b"kept")
    assert atomic(str(src), str(dst)) == "fairseq's"  # an existing file without overwrite: fairseq decides
    assert calls == [(str(src), str(dst), False)] and dst.read_bytes() == b"kept"
    assert atomic(str(src), str(dst), overwrite=True) is True and dst.read_bytes() == src.read_bytes()
    monkeypatch.setattr(PathManager, "path_requires_pathmanager", staticmethod(lambda path: True))
    assert atomic(str(src), "manifold://bucket/checkpoint_last.pt", overwrite=True) == "fairseq's"
    assert calls[-1] == (str(src), "manifold://bucket/checkpoint_last.pt", True)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_3_30.pt", "checkpoint_last.pt"]  # no .tmp left


def test_bpe_files_are_checked_before_fairseqs_build_bpe(monkeypatch, tmp_path):
    from fairseq.data import encoders

    from palm_plugin.fixes import bpe_files

    calls = []

    def build_bpe(cfg, *rest, **kwargs):
        calls.append((cfg, rest, kwargs))
        return "bpe"

    monkeypatch.setattr(encoders, "build_bpe", build_bpe)
    wrapped = install_twice(bpe_files, lambda: encoders.build_bpe)
    assert wrapped.__wrapped__ is build_bpe

    gpt2 = argparse.Namespace(bpe="gpt2")  # fairseq's downloaded defaults: nothing to check
    assert wrapped(gpt2, "more", key=1) == "bpe" and calls == [(gpt2, ("more",), {"key": 1})]
    with pytest.raises(bpe_files.TokenizerFileError, match=r"^error: --sentencepiece-model \S+spm.model: no such file"):
        wrapped(argparse.Namespace(bpe="sentencepiece", sentencepiece_model=str(tmp_path / "spm.model")))
    assert len(calls) == 1


def test_model_overrides_wrap_fairseqs_loader_once(monkeypatch):
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    from palm_plugin.fixes import model_overrides

    loaded = ([torch.nn.Linear(1, 1)], OmegaConf.create({"model": {"dropout": 0.1}}),
              types.SimpleNamespace(cfg=types.SimpleNamespace(_name="unilm_seq2seq")))
    monkeypatch.setattr(checkpoint_utils, "load_model_ensemble_and_task",
                        lambda filenames, arg_overrides=None, *rest, **kwargs: loaded)
    monkeypatch.setattr(model_overrides, "_command_line_keys", set())
    wrapped = install_twice(model_overrides, lambda: checkpoint_utils.load_model_ensemble_and_task)
    assert wrapped.__palm_model_overrides__

    model_overrides._record(argparse.Namespace(model_overrides="{'dropout': 0.2}"), [])
    assert wrapped(["a.pt"], {"dropout": 0.2}) is loaded
    model_overrides._record(argparse.Namespace(model_overrides="{'dropuot': 0.2}"), [])
    with pytest.raises(model_overrides.ModelOverrideError, match=r"^error: --model-overrides 'dropuot': not an option "
                                                                 r"of a.pt \(task unilm_seq2seq, model Linear\)"):
        wrapped(["a.pt"], {"dropuot": 0.2})


def test_safe_loading_wraps_fairseqs_three_loaders_once(monkeypatch):
    """From fairseq's own loaders (no marker yet): each is wrapped once, and each wrapper returns what it loads."""
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    from palm_plugin.fixes import safe_loading

    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        return {"read": path}

    def load_checkpoint(self, filename, *rest, **kwargs):
        return ("restored", filename)

    def load_model_ensemble_and_task(filenames, arg_overrides=None, task=None, *rest, **kwargs):
        return ("ensemble", filenames)

    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu", load_checkpoint_to_cpu)
    monkeypatch.setattr(Trainer, "load_checkpoint", load_checkpoint)
    monkeypatch.setattr(checkpoint_utils, "load_model_ensemble_and_task", load_model_ensemble_and_task)
    to_cpu, restore, ensemble = install_twice(safe_loading, lambda: (checkpoint_utils.load_checkpoint_to_cpu,
                                                                     Trainer.load_checkpoint,
                                                                     checkpoint_utils.load_model_ensemble_and_task))
    assert (to_cpu.__wrapped__, restore.__wrapped__, ensemble.__wrapped__) == (
        load_checkpoint_to_cpu, load_checkpoint, load_model_ensemble_and_task)
    assert (to_cpu("a.pt"), restore(None, "b.pt"), ensemble(["c.pt"])) == (
        {"read": "a.pt"}, ("restored", "b.pt"), ("ensemble", ["c.pt"]))


def test_generation_options_wrap_fairseqs_generator_once(monkeypatch):
    from fairseq.sequence_generator import SequenceGenerator
    from fairseq.tasks.fairseq_task import FairseqTask

    def generate(self, sample, *rest, **kwargs):
        return "generated"

    penalties = []

    def finalize_hypos(self, step, *rest, **kwargs):
        penalties.append(self.len_penalty)

    monkeypatch.setattr(FairseqTask, "build_generator", lambda self, models, args, *rest, **kwargs: (self, models))
    monkeypatch.setattr(SequenceGenerator, "_generate", generate)
    monkeypatch.setattr(SequenceGenerator, "finalize_hypos", finalize_hypos)
    install_twice(generation_options,
                  lambda: (FairseqTask.build_generator, SequenceGenerator._generate, SequenceGenerator.finalize_hypos))
    assert SequenceGenerator._generate is not generate and SequenceGenerator.finalize_hypos is not finalize_hypos
    task = types.SimpleNamespace(target_dictionary=None)  # no SequenceGenerator built: returned as fairseq built it
    assert FairseqTask.build_generator(task, ["model"], argparse.Namespace()) == (task, ["model"])

    generator = types.SimpleNamespace(min_len=1, max_len_a=0, max_len_b=10, max_len=200, match_source_len=False,
                                      gnmt_length_penalty=True, len_penalty=0.6)
    sample = {"net_input": {"src_tokens": torch.ones(2, 5, dtype=torch.long)}}
    assert SequenceGenerator._generate(generator, sample) == "generated"
    generator.min_len = 11
    with pytest.raises(ValueError, match=r"--min-len 11 is above --max-len-a 0 x 5 \(this batch's source width\) \+ "
                                         r"--max-len-b 10 = 10"):
        SequenceGenerator._generate(generator, sample)

    # GNMT's ((5 + |Y|) / 6) ** alpha through fairseq's |Y| ** len_penalty, at step 3 (4 tokens); 1 at step 0
    SequenceGenerator.finalize_hypos(generator, 3)
    SequenceGenerator.finalize_hypos(generator, 0)
    assert 4 ** penalties[0] == pytest.approx((9 / 6) ** 0.6, rel=1e-12) and penalties[1] == 0.6
    assert generator.len_penalty == 0.6
    built_directly = types.SimpleNamespace(len_penalty=0.6)  # a SequenceGenerator not from build_generator: fairseq's
    SequenceGenerator.finalize_hypos(built_directly, 3)
    assert penalties[2] == 0.6


def test_bf16_install_wraps_each_architecture_once_and_turns_the_implied_tpu_off(monkeypatch, caplog):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from palm_plugin.fixes import bf16_without_xla

    def arch(args):
        args.encoder_layers = 2

    monkeypatch.setitem(ARCH_CONFIG_REGISTRY, "test_arch", arch)  # an architecture registered after the plugin
    wrapped = install_twice(bf16_without_xla, lambda: ARCH_CONFIG_REGISTRY["test_arch"])
    assert wrapped is not arch and wrapped.__wrapped__ is arch

    find_spec = importlib.util.find_spec  # a machine without torch_xla, whatever this one has
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "torch_xla" else
                        find_spec(name, *rest))
    with caplog.at_level(logging.INFO, logger=bf16_without_xla.__name__):
        for cpu in (False, True):
            args = argparse.Namespace(bf16=True, tpu=True, cpu=cpu)  # fairseq's post-processing set tpu
            wrapped(args)
            assert (args.tpu, args.encoder_layers) == (False, 2)
    assert [r.getMessage() for r in caplog.records if r.name == bf16_without_xla.__name__] == [
        f"--bf16: training in bfloat16 on the {where} (fairseq's implied --tpu is turned off: no torch_xla)"
        for where in ("GPU", "CPU")]
    args = argparse.Namespace(bf16=False, tpu=True, cpu=False)  # --tpu asked for without --bf16: fairseq's to handle
    wrapped(args)
    assert args.tpu is True


def test_numpy_compat_replaces_get_buckets_only_where_percentile_lacks_interpolation(monkeypatch):
    """fairseq's get_buckets stays where np.percentile takes ``interpolation`` (numpy 1, which fairseq was written
    for); where it does not (numpy 2.4 here), each module that holds get_buckets gets the one with ``method``."""
    import numpy as np
    from fairseq.data import bucket_pad_length_dataset, data_utils
    from fairseq.data.audio import raw_audio_dataset

    from palm_plugin.fixes import numpy_compat

    modules = (data_utils, bucket_pad_length_dataset, raw_audio_dataset)

    def fairseqs_get_buckets(sizes, num_buckets):
        return "fairseq's"

    for module in modules:
        monkeypatch.setattr(module, "get_buckets", fairseqs_get_buckets)
    percentile = np.percentile

    def numpy1_percentile(a, q, axis=None, out=None, overwrite_input=False, interpolation="linear", keepdims=False):
        return percentile(a, q, axis=axis, method=interpolation)

    monkeypatch.setattr(np, "percentile", numpy1_percentile)
    numpy_compat.install()
    assert [module.get_buckets for module in modules] == [fairseqs_get_buckets] * 3
    monkeypatch.setattr(np, "percentile", percentile)
    assert install_twice(numpy_compat, lambda: [module.get_buckets for module in modules]) == [
        numpy_compat.get_buckets] * 3
    # the lower data point at 0, 50 and 100%: 1, 5, 10 of 1..10, the first dropped
    assert data_utils.get_buckets(np.arange(1, 11), 2).tolist() == [5, 10]


def test_incremental_state_lookup_answers_none_without_a_state_and_asks_fairseq_with_one(monkeypatch):
    from fairseq.incremental_decoding_utils import FairseqIncrementalState

    from palm_plugin.fixes import compiled_decoder_layers

    calls = []

    def lookup(self, incremental_state, key):  # fairseq's: builds the key from the module's id first
        calls.append((self, incremental_state, key))
        return incremental_state.get(key)

    monkeypatch.setattr(FairseqIncrementalState, "get_incremental_state", lookup)
    patched = install_twice(compiled_decoder_layers, lambda: FairseqIncrementalState.get_incremental_state)
    assert patched is not lookup

    assert patched("layer", None, "attn_state") is None and calls == []  # training: no state, no key built
    state = {"attn_state": "buffer"}
    assert patched("layer", state, "attn_state") == "buffer" and calls == [("layer", state, "attn_state")]


def test_torchrun_without_gpus_takes_the_world_from_its_environment(monkeypatch):
    from fairseq.distributed import utils

    from palm_plugin.fixes import distributed

    def infer_init_method(cfg, force_distributed=False):
        cfg.distributed_init_method = "env://"  # as fairseq's torchrun road sets it
        return "fairseq's", cfg

    monkeypatch.setattr(utils, "infer_init_method", infer_init_method)
    monkeypatch.setattr(utils, "_infer_torch_distributed_launch_init", lambda cfg: "fairseq's torchrun")
    monkeypatch.setattr(utils, "_infer_single_node_init", lambda cfg: "fairseq's single node")
    monkeypatch.setattr(utils, "call_main", lambda cfg, main, **kwargs: ("fairseq's call_main", kwargs))
    install_twice(distributed, lambda: (utils.infer_init_method, utils._infer_torch_distributed_launch_init,
                                        utils._infer_single_node_init, utils.call_main))

    for name, value in (("MASTER_ADDR", "localhost"), ("MASTER_PORT", "29500"), ("WORLD_SIZE", "3"), ("RANK", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cfg = types.SimpleNamespace(distributed_world_size=1, tpu=False,  # fairseq's default on CPU
                                distributed_init_method=None, distributed_no_spawn=True)
    assert utils.infer_init_method(cfg) == ("fairseq's", cfg) and cfg.distributed_world_size == 3
    cfg = types.SimpleNamespace()
    utils._infer_torch_distributed_launch_init(cfg)
    assert vars(cfg) == {"distributed_init_method": "env://", "distributed_world_size": 3, "distributed_rank": 2,
                         "device_id": 0, "distributed_no_spawn": True}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # with GPUs: fairseq's
    assert utils._infer_torch_distributed_launch_init(types.SimpleNamespace()) == "fairseq's torchrun"


def test_processes_fairseq_cannot_start_stop_with_what_to_do(monkeypatch):
    """Without torchrun fairseq starts one process a GPU: with fewer GPUs than --distributed-world-size it failed on
    an assertion, crashed after building the model (--distributed-port without SLURM) or, given
    --distributed-init-method on a machine without GPUs, started nothing and exited with status 0."""
    from fairseq.dataclass.configs import DistributedTrainingConfig
    from fairseq.distributed import utils

    from palm_plugin.errors import InputValueError
    from palm_plugin.fixes import distributed

    monkeypatch.setattr(utils, "infer_init_method", lambda cfg, force_distributed=False: "fairseq's")
    monkeypatch.setattr(utils, "_infer_torch_distributed_launch_init", lambda cfg: "fairseq's torchrun")
    monkeypatch.setattr(utils, "_infer_single_node_init", lambda cfg: "fairseq's single node")
    monkeypatch.setattr(utils, "call_main", lambda cfg, main, **kwargs: ("fairseq's call_main", kwargs))
    install_twice(distributed, lambda: (utils.infer_init_method, utils._infer_single_node_init, utils.call_main))
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)

    def config(**values):
        return DistributedTrainingConfig(**{"distributed_world_size": 2, "tpu": False, **values})  # tpu: common.tpu

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(InputValueError) as stop:
        utils._infer_single_node_init(config())
    assert str(stop.value) == (
        "--distributed-world-size 2 starts 2 processes on this machine, one a GPU, and it has 0 GPUs: to train on 2 "
        "CPU processes, start them with torchrun --nproc_per_node 2 $(which fairseq-train) ... --cpu "
        "--distributed-backend gloo --ddp-backend legacy_ddp (docs/training.md)")
    with pytest.raises(InputValueError, match=r"^--distributed-world-size 2, and nothing starts the other processes: "
                                              r".* --distributed-port 29500 alone names no machine\. Start"):
        utils.infer_init_method(config(distributed_port=29500))  # fairseq's inference set no init method
    assert utils.infer_init_method(config(distributed_world_size=1)) == "fairseq's"  # one process: nothing to start
    assert utils.infer_init_method(config(tpu=True)) == "fairseq's"  # xla starts the processes
    given = types.SimpleNamespace(distributed_training=config(distributed_init_method="tcp://localhost:23456"))
    with pytest.raises(InputValueError, match=r"^--distributed-init-method tcp://localhost:23456 makes fairseq start "
                                              r"one process a GPU, and this machine has none: nothing would train\. "
                                              r"On CPU start the processes with torchrun --nproc_per_node 2 "):
        utils.call_main(given, print)
    given.distributed_training.distributed_no_spawn = True  # each process started by hand
    assert utils.call_main(given, print, start_rank=1) == ("fairseq's call_main", {"start_rank": 1})

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert utils._infer_single_node_init(config()) == "fairseq's single node"
    with pytest.raises(InputValueError, match=r"^--distributed-world-size 4 starts 4 processes on this machine, one a "
                                              r"GPU, and it has 2 GPUs: use --distributed-world-size 2 or fewer, or "):
        utils._infer_single_node_init(config(distributed_world_size=4))
    given.distributed_training.distributed_no_spawn = False
    assert utils.call_main(given, print)[0] == "fairseq's call_main"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(InputValueError, match="it has 1 GPU: use --distributed-world-size 1 or fewer"):
        utils._infer_single_node_init(config())


def test_ema_copies_a_models_integer_state_with_the_keys_it_skips(monkeypatch):
    from fairseq.models.ema import EMA

    from palm_plugin.fixes import ema_integer_state

    seen = []

    def init(self, model, config, device=None, skip_keys=None):
        seen.append((self, model, config, device, skip_keys))

    monkeypatch.setattr(EMA, "__init__", init)
    patched = install_twice(ema_integer_state, lambda: EMA.__init__)
    assert patched is not init

    model = torch.nn.BatchNorm1d(2)  # num_batches_tracked: an integer count, which EMA's in-place decay refuses
    emas = [EMA(model, "config", "cpu", skip_keys=["weight"]), EMA(model, "config")]
    assert seen == [(emas[0], model, "config", "cpu", {"weight", "num_batches_tracked"}),
                    (emas[1], model, "config", None, {"num_batches_tracked"})]


def test_data_checks_wrap_fairseqs_dataset_opening_once_and_quiet_its_destructors(monkeypatch, tmp_path):
    from fairseq.data import Dictionary
    from fairseq.data.indexed_dataset import MMapIndexedDataset
    from fairseq.tasks import FairseqTask, translation

    from palm_plugin.fixes import data_checks

    opened = []

    def destructor(self):  # fairseq's: closes the buffer __init__ opens last
        del self._bin_buffer_mmap

    monkeypatch.setattr(MMapIndexedDataset, "_do_init", lambda self, path: opened.append(path))
    for cls in (MMapIndexedDataset, MMapIndexedDataset.Index):
        monkeypatch.setattr(cls, "__del__", destructor)
    monkeypatch.setattr(translation, "load_langpair_dataset", lambda *args, **kwargs: "pairs")
    monkeypatch.setattr(FairseqTask, "filter_indices_by_size", lambda self, indices, *rest: indices)
    monkeypatch.setattr(FairseqTask, "get_interactive_tokens_and_lengths", lambda self, lines, encode_fn: ([], []))
    install_twice(data_checks, lambda: (MMapIndexedDataset._do_init, MMapIndexedDataset.__del__,
                                        MMapIndexedDataset.Index.__del__, translation.load_langpair_dataset,
                                        FairseqTask.filter_indices_by_size,
                                        FairseqTask.get_interactive_tokens_and_lengths))

    for cls in (MMapIndexedDataset, MMapIndexedDataset.Index):
        object.__new__(cls).__del__()  # an __init__ that failed before opening the buffer: fairseq's raised
        opened_buffer = object.__new__(cls)
        opened_buffer._bin_buffer_mmap = "buffer"
        opened_buffer.__del__()
        assert "_bin_buffer_mmap" not in vars(opened_buffer)  # fairseq's destructor ran
    for name, lines in (("empty", []), ("train", [[4, 5]])):
        binarize(tmp_path / name, lines, Dictionary())
    with pytest.raises(data_checks.BinarizedDataError, match=r"empty.bin: the split has no examples"):
        MMapIndexedDataset._do_init(object.__new__(MMapIndexedDataset), str(tmp_path / "empty"))
    MMapIndexedDataset._do_init(object.__new__(MMapIndexedDataset), str(tmp_path / "train"))
    assert opened == [str(tmp_path / "train")]


def test_diverse_beam_rows_wrap_fairseqs_step_once(monkeypatch):
    from fairseq.search import DiverseBeamSearch

    from palm_plugin.fixes import diverse_beam_rows

    def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
        return original_batch_idxs

    monkeypatch.setattr(DiverseBeamSearch, "step", step)
    patched = install_twice(diverse_beam_rows, lambda: DiverseBeamSearch.step)
    assert patched is not step
    search = types.SimpleNamespace()
    # sample ids become rows: their positions at the first step, the finished sentence (id 3) left out later
    assert patched(search, 0, None, None, None, torch.tensor([7, 3, 11, 5])).tolist() == [0, 1, 2, 3]
    assert patched(search, 1, None, None, None, torch.tensor([7, 11, 5])).tolist() == [0, 2, 3]
    assert patched(search, 2, None, None) is None  # no ids: fairseq's


def test_loader_exit_registers_its_stop_once(monkeypatch):
    from fairseq.data.iterators import BackgroundConsumer

    from palm_plugin.fixes import loader_exit

    registered = []
    monkeypatch.delattr(BackgroundConsumer, "__palm_plugin__")  # as before the plugin's first import
    monkeypatch.setattr(loader_exit.atexit, "register", registered.append)
    install_twice(loader_exit, lambda: list(registered))
    assert registered == [loader_exit.stop_loading_threads]  # once, however often fairseq imports the plugin
