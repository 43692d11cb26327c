"""fairseq-hydra-train with the plugin (palm_plugin/fixes/hydra_config.py): a configuration's ``model._name`` builds
that architecture's sizes, as ``--arch`` does on fairseq-train's command line (fairseq #4675 built the model's
dataclass defaults, the base sizes), and fairseq-train's checks and checkpoint sizes apply to its configuration."""
import random
import sys
import types

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import REPO, USER_DIR, binarize_pairs, run_cli, save_untrained_checkpoint

CONFIG = REPO / "examples" / "hydra"


def _argparse_model(data, *arguments):
    """The model configuration fairseq-train builds from its command line (the reference road)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", str(USER_DIR), "--task", "unilm_seq2seq", "--criterion", "unilm_cloze", "--cpu",
        *arguments])
    return OmegaConf.to_container(convert_namespace_to_omegaconf(args).model)


@pytest.fixture
def hydra_road(monkeypatch):
    """The state fairseq-hydra-train's process is in when fairseq_cli.train.main calls add_defaults."""
    monkeypatch.setitem(sys.modules, "fairseq_cli.hydra_train", types.ModuleType("fairseq_cli.hydra_train"))


def _configuration(model, **groups):
    """A configuration as hydra composes it from examples/hydra's file: the plugin's groups hold only what is set."""
    import palm_plugin  # noqa: F401  (registers the models and installs the fixes, as train.main's import does)
    from fairseq.dataclass.configs import FairseqConfig

    cfg = OmegaConf.structured(FairseqConfig)
    OmegaConf.set_struct(cfg, False)
    cfg.model = model
    cfg.task = groups.pop("task", {"_name": "unilm_seq2seq", "data": "DATA"})
    cfg.criterion = groups.pop("criterion", {"_name": "unilm_cloze"})
    for group, fields in groups.items():
        for key, value in fields.items():
            cfg[group][key] = value
    return cfg


def _add_defaults(cfg):
    from fairseq_cli import train

    train.add_defaults(cfg)
    return cfg


@pytest.mark.slow
def test_the_configuration_file_trains_the_architecture_it_names_as_fairseq_train_does(tmp_path):
    rng = random.Random(3)
    for split, count in (("train", 60), ("valid", 12)):
        for side, (low, high) in (("src", (4, 30)), ("tgt", (2, 12))):
            lines = (" ".join(f"w{rng.randrange(80)}" for _ in range(rng.randint(low, high))) for _ in range(count))
            (tmp_path / f"{split}.{side}").write_text("\n".join(lines) + "\n")
    binarize_pairs(tmp_path / "bin", tmp_path / "train", tmp_path / "valid")
    run_cli("fairseq-hydra-train", "--config-dir", CONFIG, "--config-name", "unilm_finetune",
            f"common.user_dir={USER_DIR}", "task.data=bin", "+task.source_segment=0", "+task.target_segment=1",
            "checkpoint.save_dir=ck", "model._name=unilm2_tiny", "+model.encoder_layers=3",
            "optimization.max_update=2", "dataset.batch_size=4", "common.cpu=true", cwd=tmp_path)
    state = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    hydra_model = dict(state["cfg"]["model"])
    assert hydra_model == _argparse_model(tmp_path / "bin", "--arch", "unilm2_tiny", "--encoder-layers", "3",
                                          "--source-segment", "0", "--target-segment", "1")
    # unilm2_tiny's 64 dimensions and relative position bias, three layers (not unilm_base's 12 x 768)
    assert state["model"]["encoder.stack.embeddings.tokens.weight"].shape[1] == 64
    assert {key.split(".")[3] for key in state["model"] if key.startswith("encoder.stack.layers.")} == {"0", "1", "2"}
    assert "encoder.stack.relative_position.weight" in state["model"]
    assert state["optimizer_history"][-1]["num_updates"] == 2


def test_an_architecture_fills_what_the_configuration_leaves_out(hydra_road):
    model = _add_defaults(_configuration({"_name": "unilm_tiny", "encoder_layers": 3})).model
    assert (model.encoder_layers, model.encoder_embed_dim, model.encoder_ffn_embed_dim,
            model.encoder_attention_heads, model.num_segments) == (3, 64, 256, 4, 6)
    assert model.dropout == 0.1 and model.max_positions == 512  # the dataclass's, which no architecture sets
    palm = _add_defaults(_configuration({"_name": "palm_tiny"}, task={"_name": "translation", "data": "DATA"},
                                        criterion={"_name": "label_smoothed_cross_entropy"})).model
    assert (palm.encoder_layers, palm.decoder_layers, palm.encoder_embed_dim, palm.decoder_ffn_embed_dim) == \
        (2, 2, 64, 128)
    # ``model: unilm_tiny``, the group given as its name alone
    assert _add_defaults(_configuration("unilm_tiny")).model.encoder_embed_dim == 64
    # a model named by itself (not an architecture) keeps the dataclass's values
    assert _add_defaults(_configuration({"_name": "unilm"})).model.encoder_layers == 12


def test_fairseq_trains_command_line_road_is_left_as_it_is(monkeypatch):
    monkeypatch.delitem(sys.modules, "fairseq_cli.hydra_train", raising=False)
    # fairseq's own add_defaults: every field from the dataclass (what --arch's parser had set before it)
    assert _add_defaults(_configuration({"_name": "unilm_tiny"})).model.encoder_layers == 12


def test_a_checkpoint_to_fine_tune_gives_the_sizes_the_configuration_leaves_out(hydra_road, tmp_path, caplog):
    save_untrained_checkpoint(tmp_path, "tiny.pt", ["--task", "unilm_seq2seq", "--arch", "unilm2_tiny",
                                                    "--encoder-layers", "3", "--source-segment", "0",
                                                    "--target-segment", "1", "--criterion", "unilm_cloze"])
    checkpoint = str(tmp_path / "tiny.pt")
    cfg = _add_defaults(_configuration({"_name": "unilm2_base"}, checkpoint={"finetune_from_model": checkpoint}))
    assert (cfg.model.encoder_layers, cfg.model.encoder_embed_dim, cfg.model.relative_position_buckets,
            cfg.model.num_segments) == (3, 64, 32, 2)
    assert (cfg.task.source_segment, cfg.task.target_segment) == (0, 1)  # the checkpoint's, not the task's 4 / 5
    # a size the configuration sets is given: one that differs from the checkpoint's stops, naming the flag
    with pytest.raises(SystemExit, match=r"encoder_layers|--encoder-layers"):
        _add_defaults(_configuration({"_name": "unilm2_base", "encoder_layers": 4},
                                     checkpoint={"finetune_from_model": checkpoint}))


def test_fairseq_trains_checks_stop_a_configuration_with_one_line(hydra_road, tmp_path):
    from palm_plugin.fixes.checkpoint_paths import CheckpointPathError
    from palm_plugin.fixes.option_ranges import OptionRangeError

    with pytest.raises(CheckpointPathError, match=r"--finetune-from-model .*: a directory; pass the checkpoint file"):
        _add_defaults(_configuration({"_name": "unilm_tiny"}, checkpoint={"finetune_from_model": str(tmp_path)}))
    with pytest.raises(OptionRangeError, match=r"--label-smoothing"):
        _add_defaults(_configuration({"_name": "unilm_tiny"},
                                     criterion={"_name": "unilm_cloze", "label_smoothing": 1.5}))
