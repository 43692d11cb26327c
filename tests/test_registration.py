"""Importing the plugin registers every name of the design card with fairseq's registries."""
import subprocess
import sys

from tests.conftest import REPO, USER_DIR

TASKS = {"continuation_pair", "pmlm", "unilm_pretraining", "unilm_seq2seq"}
MODELS = {"palm", "unilm"}
ARCHS = {"palm_base", "palm_large", "palm_tiny", "unilm_base", "unilm_large", "unilm2_base", "unilm_tiny",
         "unilm2_tiny"}
CRITERIA = {"palm_mlm_lm", "pmlm_ae_par", "unilm_cloze"}


def test_import_registers_everything():
    import palm_plugin  # noqa: F401
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    assert TASKS <= set(TASK_REGISTRY)
    assert MODELS <= set(MODEL_REGISTRY)
    assert ARCHS <= set(ARCH_MODEL_REGISTRY)
    assert CRITERIA <= set(CRITERION_REGISTRY)
    assert {ARCH_MODEL_REGISTRY[a].__name__ for a in ARCHS} == {MODEL_REGISTRY[m].__name__ for m in MODELS}


def test_user_dir_registers_in_a_fresh_process():
    """`--user-dir` (fairseq's own import path) finds every name; `--help` of a task documents its options."""
    code = (
        "import sys; from fairseq import options, utils; "
        f"utils.import_user_module(type('A', (), {{'user_dir': {str(USER_DIR)!r}}})()); "
        "from fairseq.tasks import TASK_REGISTRY; from fairseq.models import ARCH_MODEL_REGISTRY; "
        "from fairseq.criterions import CRITERION_REGISTRY; "
        f"missing = ({sorted(TASKS)!r}, {sorted(ARCHS)!r}, {sorted(CRITERIA)!r}); "
        "reg = (TASK_REGISTRY, ARCH_MODEL_REGISTRY, CRITERION_REGISTRY); "
        "print([n for names, r in zip(missing, reg) for n in names if n not in r])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# DESIGN.md section 2 (and the tiny archs' docstrings): (encoder layers, decoder layers, hidden, feed-forward, heads)
PALM_SIZES = {"palm_base": (12, 12, 768, 3072, 12), "palm_large": (24, 6, 1024, 4096, 16),
              "palm_tiny": (2, 2, 64, 128, 2)}
# (layers, hidden, feed-forward, heads, segment types, relative position buckets); UniLM v1 checkpoints have 6
# segment types (DESIGN.md section 4), UniLMv2 2; unilm2 = relative position bias with 32 buckets
UNILM_SIZES = {"unilm_base": (12, 768, 3072, 12, 6, 0), "unilm_large": (24, 1024, 4096, 16, 6, 0),
               "unilm2_base": (12, 768, 3072, 12, 2, 32), "unilm_tiny": (2, 64, 256, 4, 6, 0),
               "unilm2_tiny": (2, 64, 256, 4, 2, 32)}


def build_on_meta(arch):
    """The registered arch's model as fairseq builds it (arch defaults, then the model's dataclass), with
    parameters on the meta device: shapes without memory or initialisation time."""
    import argparse

    import torch
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY

    import palm_plugin  # noqa: F401

    dictionary = Dictionary()
    dictionary.add_symbol("<mask>")

    class Task:
        source_dictionary = target_dictionary = dictionary
        trains_encoder_mlm = False

    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    config = MODEL_DATACLASS_REGISTRY["palm" if arch.startswith("palm") else "unilm"].from_namespace(args)
    with torch.device("meta"):
        return ARCH_MODEL_REGISTRY[arch].build_model(config, Task())


def test_every_arch_has_the_sizes_of_the_design(monkeypatch):
    # fairseq's init_bert_params copies through the CPU, which meta tensors cannot do; shapes do not depend on it
    monkeypatch.setattr("palm_plugin.models.palm.init_bert_params", lambda module: None)
    assert set(PALM_SIZES) | set(UNILM_SIZES) == ARCHS
    for arch, (encoder_layers, decoder_layers, dim, ffn, heads) in PALM_SIZES.items():
        model = build_on_meta(arch)
        for stack, layers in ((model.encoder, encoder_layers), (model.decoder, decoder_layers)):
            assert len(stack.layers) == layers, (arch, layers)
            for layer in stack.layers:
                assert (layer.embed_dim, layer.fc1.out_features, layer.self_attn.num_heads) == (dim, ffn, heads), arch
        assert model.encoder.embed_tokens.embedding_dim == dim, arch
    for arch, (layers, dim, ffn, heads, segments, buckets) in UNILM_SIZES.items():
        stack = build_on_meta(arch).stack
        assert len(stack.layers) == layers, arch
        assert all((layer.q_proj.out_features, layer.fc1.out_features) == (dim, ffn) for layer in stack.layers), arch
        assert stack.layers[0].num_heads == heads and stack.embeddings.tokens.embedding_dim == dim, arch
        assert stack.embeddings.segments.num_embeddings == segments, arch
        relative = stack.relative_position
        assert (tuple(relative.weight.shape) == (heads, buckets)) if buckets else relative is None, arch


def test_import_turns_cudnn_attention_off_in_a_fresh_process():
    """fixes/cudnn_attention.py: on by default in torch, off once the plugin is imported (a fresh process, so no
    earlier import in this one decides the outcome)."""
    code = ("import torch; before = torch.backends.cuda.cudnn_sdp_enabled(); import palm_plugin; "
            "print(before, torch.backends.cuda.cudnn_sdp_enabled())")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.split()[-2:] == ["True", "False"]
