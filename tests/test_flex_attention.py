"""--attention-impl flex (palm_plugin/modules/flex_attention.py) on the CPU: FlexAttention's forward equals the SDPA
path for every mask of the UniLM family, with and without UniLMv2's relative position bias; the tiles each block
mask skips match a count from the dense mask of attention_masks.py; what FlexAttention cannot do on the CPU stops
with one line naming the option to use. The backward is CUDA-only: tests/test_gpu.py checks it on a card.

Every forward here has one shape (6 rows of 299 tokens, 4 heads of 16): compiling FlexAttention on the CPU takes
about 20 s per shape and per score_mod, so the file compiles twice (with and without the bias) and shares them.
"""
import argparse
import os
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask

from palm_plugin.modules import flex_attention
from palm_plugin.modules.attention_masks import Objective, mask_from_fields
from palm_plugin.modules.unilm_transformer import UniLMTransformer
from palm_tools.bench.kernel_instructions import pmlm_layout

BATCH, LENGTH = 6, 299  # three tiles of 128 along each side, the last one partly outside the sequence
LENGTHS = torch.tensor([299, 260, 131, 127, 200, 57])  # unequal, odd and even, across tile boundaries
PAD = 1  # as pmlm_layout pads


def padding_of(lengths):
    return torch.arange(LENGTH).unsqueeze(0) >= lengths.unsqueeze(1)


def pmlm_fields(append_pseudo=True, predict_masked_slots=True, text_lengths=(229, 200, 101, 98, 150, 44),
                length=LENGTH):
    """A pseudo-masked LM batch as the pmlm dataset lays it out (Figure 5 of UniLMv2; :func:`pmlm_layout`): texts of
    unequal lengths, padded to ``length``. Returns the fields and the position ids."""
    return pmlm_layout(text_lengths, length, append_pseudo, predict_masked_slots)


def pseudo_seq2seq_fields():
    """UniLMv2's fine-tuning layout [source | target | pseudo target]: target token i and its pseudo token share a
    position."""
    source, target = torch.tensor([200, 180, 71, 63, 120, 21]), torch.tensor([49, 40, 30, 32, 40, 18])
    column = torch.arange(LENGTH).unsqueeze(0)
    s, t = source.unsqueeze(1), target.unsqueeze(1)
    positions = torch.where(column >= s + t, column - t, column).where(column < s + 2 * t, 0)
    return dict(padding_mask=column >= s + 2 * t, source_lengths=source, target_lengths=target), positions


def unilm_fields(objectives):
    return dict(padding_mask=padding_of(LENGTHS), objectives=torch.tensor([int(o) for o in objectives]),
                source_lengths=torch.tensor([150, 101, 64, 127, 129, 30]))


def default_positions():
    return torch.arange(LENGTH).expand(BATCH, -1).contiguous()


O = Objective
CASES = {
    "bidirectional, no padding": (dict(padding_mask=torch.zeros(BATCH, LENGTH, dtype=torch.bool)), default_positions()),
    "bidirectional": (dict(padding_mask=padding_of(LENGTHS)), default_positions()),
    "left-to-right": (unilm_fields([O.LEFT_TO_RIGHT] * BATCH), default_positions()),
    "right-to-left": (unilm_fields([O.RIGHT_TO_LEFT] * BATCH), default_positions()),
    "seq2seq": (unilm_fields([O.SEQ2SEQ] * BATCH), default_positions()),
    # the pre-training mix of UniLM (1/3 bidirectional, 1/3 seq2seq, 1/6 each direction)
    "unilm pre-training mix": (unilm_fields([O.BIDIRECTIONAL, O.SEQ2SEQ, O.LEFT_TO_RIGHT, O.BIDIRECTIONAL,
                                             O.SEQ2SEQ, O.RIGHT_TO_LEFT]), default_positions()),
    "pmlm AE": pmlm_fields(append_pseudo=False),
    "pmlm AE+PAR": pmlm_fields(),
    "pmlm PAR": pmlm_fields(predict_masked_slots=False),
    "pseudo-mask seq2seq": pseudo_seq2seq_fields(),
}


def make_stack(relative_position_buckets):
    torch.manual_seed(0)
    stack = UniLMTransformer(vocab_size=40, padding_idx=PAD, dim=64, ffn_dim=128, layers=2, num_heads=4,
                             max_positions=512, num_segments=2, dropout=0.0, attention_dropout=0.0,
                             relative_position_buckets=relative_position_buckets)
    with torch.no_grad():  # sharper attention than the default init, so that a wrong mask or bias shows
        for parameter in stack.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.15)
    return stack.eval()


@pytest.fixture(scope="module")
def stacks():
    return {buckets: make_stack(buckets) for buckets in (0, 32)}


def tokens_of(padding):
    tokens = torch.randint(6, 40, padding.shape, generator=torch.Generator().manual_seed(1))
    return tokens.masked_fill(padding, PAD)


@pytest.mark.parametrize("buckets", [0, 32], ids=["unilm", "unilm2 relative bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_flex_forward_equals_sdpa(stacks, case, buckets):
    fields, positions = CASES[case]
    stack = stacks[buckets]
    tokens = tokens_of(fields["padding_mask"])
    with torch.no_grad():
        stack.attention_impl = "sdpa"
        _, expected = stack(tokens, mask_from_fields(**fields), positions, return_all_hiddens=True)
        stack.attention_impl = "flex"
        _, actual = stack(tokens, flex_attention.MaskFields(**fields), positions, return_all_hiddens=True)
    stack.attention_impl = "sdpa"
    for layer, (a, e) in enumerate(zip(actual, expected)):  # H^0 .. H^L, padding rows included (they see themselves)
        assert float((a - e).abs().max()) <= 1e-5, f"layer {layer}"


def test_no_mask_attends_as_a_batch_without_padding(stacks):
    """A stack called without a mask (None: every row sees every column) under flex gives the states of sdpa without
    a mask; its block mask shows every pair (a batch without padding, in the kernel's boolean fields)."""
    from torch.nn.attention.flex_attention import create_mask

    stack = stacks[0]
    positions = default_positions()
    tokens = tokens_of(torch.zeros(BATCH, LENGTH, dtype=torch.bool))
    with torch.no_grad():
        expected = stack(tokens, None, positions)
        stack.attention_impl = "flex"
        try:
            mask = stack.flex_mask(positions, None, torch.float32).block_mask
            actual = stack(tokens, None, positions)
        finally:
            stack.attention_impl = "sdpa"
    assert bool(create_mask(mask.mask_mod, BATCH, None, LENGTH, LENGTH, "cpu").all())
    assert float((actual - expected).abs().max()) <= 1e-5


def dense_tiles(mask, block=flex_attention.BLOCK_SIZE):
    """How many visible pairs each ``block`` x ``block`` tile of a dense ``(B, T, S)`` mask holds ``(B, tiles,
    tiles)`` (outside the sequence counts as hidden). Written from the mask, not from the BlockMask."""
    b, t, s = mask.shape
    padded = torch.zeros(b, -(-t // block) * block, -(-s // block) * block, dtype=torch.bool)
    padded[:, :t, :s] = mask
    return padded.view(b, padded.size(1) // block, block, padded.size(2) // block, block).sum((2, 4))


@pytest.mark.parametrize("case", list(CASES))
def test_block_mask_skips_the_tiles_the_dense_mask_hides(case):
    fields, _ = CASES[case]
    mask = mask_from_fields(**fields)
    mask_mod = flex_attention.MaskFields(**fields).mask_mod()
    assert torch.equal(create_mask(mask_mod, BATCH, None, LENGTH, LENGTH, "cpu")[:, 0], mask)  # the rule, pair by pair
    visible = dense_tiles(mask)
    block_mask = flex_attention.block_mask(mask_mod, BATCH, LENGTH, "cpu")
    assert torch.equal(block_mask.to_dense()[:, 0].bool(), visible > 0)  # the tiles computed, one by one
    skipped, full = int((visible == 0).sum()), int((visible == flex_attention.BLOCK_SIZE ** 2).sum())
    assert flex_attention.block_counts(block_mask) == {
        "total": visible.numel(), "skipped": skipped, "partial": visible.numel() - skipped - full, "full": full}


def test_the_cpu_builds_block_masks_without_compiling():
    """On the CPU block_mask runs create_block_mask eagerly, as the module promises: compiling it would cost a
    compilation per batch shape. Dynamo counts every graph it compiles; the shape is one no other test uses, so that
    no graph compiled before could serve it."""
    batch, length = 3, 133
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    block_mask = flex_attention.block_mask(lambda b, h, q, k: q >= k, batch, length, "cpu")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    causal = torch.ones(length, length, dtype=torch.bool).tril().expand(batch, -1, -1)
    assert torch.equal(block_mask.to_dense()[:, 0].bool(), dense_tiles(causal) > 0)


def test_flex_attention_compiled_for_the_cpu_warns_once_what_it_costs(monkeypatch):
    """Compiling FlexAttention for the CPU (inference) warns, once, that each batch shape compiles anew and which
    option to use instead; compiling it for CUDA does not. torch.compile is stubbed: nothing compiles here."""
    monkeypatch.setattr(torch, "compile", lambda function, **options: function)
    monkeypatch.setattr(flex_attention, "_COMPILED", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert flex_attention._compiled(flex_attention.flex_attention, torch.device("cuda")) is \
            flex_attention.flex_attention
    with pytest.warns(UserWarning) as warned:
        flex_attention._compiled(flex_attention.flex_attention, torch.device("cpu"))
        flex_attention._compiled(flex_attention.flex_attention, torch.device("cpu"))
    assert [str(w.message) for w in warned] == [
        "--attention-impl flex on the CPU compiles FlexAttention once per batch shape (about 20 s each, inference "
        "only); for CPU work use --attention-impl sdpa"]
    # from a layer's call of FlexMask.attend, the warning points at that call (here this file), the line Python
    # prints with it, not at the plugin's internals (not under mutmut, whose trampolines add frames in between)
    monkeypatch.setattr(flex_attention, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", lambda function, **options: lambda q, k, v, **rest: q)
    q = torch.zeros(1, 1, 4, 8)
    with pytest.warns(UserWarning) as warned:
        flex_attention.FlexMask(None).attend(q, q, q)
    assert [w.filename for w in warned] == [__file__] or "MUTANT_UNDER_TEST" in os.environ


def test_block_counts_of_a_mask_without_full_tiles():
    """A BlockMask may carry no full tiles at all (full_kv_num_blocks None: BlockMask.from_kv_blocks without them,
    every computed tile runs the mask_mod): then none is counted as full and the rest are partial."""
    fields, _ = CASES["left-to-right"]
    computed = dense_tiles(mask_from_fields(**fields)) > 0  # (B, tiles, tiles)
    kv_indices = torch.argsort((~computed).int(), dim=-1, stable=True).to(torch.int32)  # computed tiles first
    block_mask = BlockMask.from_kv_blocks(computed.sum(-1, dtype=torch.int32)[:, None], kv_indices[:, None],
                                          BLOCK_SIZE=flex_attention.BLOCK_SIZE,
                                          mask_mod=flex_attention.MaskFields(**fields).mask_mod(),
                                          seq_lengths=(LENGTH, LENGTH))
    assert block_mask.full_kv_num_blocks is None
    assert torch.equal(block_mask.to_dense()[:, 0].bool(), computed)
    assert flex_attention.block_counts(block_mask) == {
        "total": computed.numel(), "skipped": int((~computed).sum()), "partial": int(computed.sum()), "full": 0}


def test_a_wrong_mask_is_far_outside_the_tolerance(stacks):
    """The forward comparisons above can fail: the left-to-right batch under the flex kernel against SDPA with the
    bidirectional mask of the same padding differs by orders of magnitude more than 1e-5."""
    fields, positions = CASES["left-to-right"]
    tokens = tokens_of(fields["padding_mask"])
    stack = stacks[32]
    with torch.no_grad():
        expected = stack(tokens, mask_from_fields(fields["padding_mask"]), positions)
        stack.attention_impl = "flex"
        actual = stack(tokens, flex_attention.MaskFields(**fields), positions)
    stack.attention_impl = "sdpa"
    assert float((actual - expected).abs().max()) > 0.1


def build(arch, dictionary, for_training, **overrides):
    """``arch`` built as fairseq builds it: to train (fairseq-train), or from a checkpoint's configuration for use
    (fairseq-generate, hub loading: ``from_checkpoint=True``)."""
    import palm_plugin  # noqa: F401  (registers the archs, installs the build fixes)
    from fairseq import models
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(_name="unilm", **overrides)  # the model's name: fairseq fills in its defaults
    ARCH_CONFIG_REGISTRY[arch](args)
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return models.build_model(args, task, from_checkpoint=not for_training)


@pytest.mark.parametrize("arch, case", [("unilm_tiny", "unilm pre-training mix"), ("unilm2_tiny", "pmlm AE+PAR"),
                                        ("unilm2_tiny", "pseudo-mask seq2seq")])
def test_model_builds_the_block_mask_from_the_batch_fields(arch, case):
    """UniLMModel.forward with a batch's net_input fields: --attention-impl flex (built for inference, as hub
    loading builds it) gives the hidden states of the sdpa model with the same weights."""
    from tests.test_unilm_decoding import tiny_dictionary

    dictionary = tiny_dictionary()
    assert dictionary.pad() == PAD
    torch.manual_seed(0)
    reference = build(arch, dictionary, for_training=True, dropout=0.0, attention_dropout=0.0).eval()
    flex = build(arch, dictionary, for_training=False, attention_impl="flex").eval()
    flex.load_state_dict(reference.state_dict())
    fields, positions = CASES[case]
    net_input = {key: value for key, value in fields.items() if key != "padding_mask"}
    net_input.update(src_tokens=tokens_of(fields["padding_mask"]).clamp(max=len(dictionary) - 1),
                     position_ids=positions, features_only=True)
    with torch.no_grad():
        expected, _ = reference(**net_input)
        actual, _ = flex(**net_input)
    assert flex.stack.attention_impl == "flex" and reference.stack.attention_impl == "sdpa"
    assert float((actual - expected).abs().max()) <= 1e-5


def test_training_with_flex_where_it_cannot_run_stops_with_one_line(monkeypatch):
    """Where FlexAttention cannot train (no CUDA: its backward is not implemented on the CPU; attention dropout,
    which it lacks; a torch without it), building the model for training stops with one line that names the
    option to use; a model built for inference on the CPU is fine. A forward recording a graph on the CPU stops
    the same way, before FlexAttention would fail inside its compiled backward."""
    from tests.test_unilm_decoding import tiny_dictionary

    dictionary = tiny_dictionary()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(flex_attention.FlexAttentionError) as stopped:
        build("unilm2_tiny", dictionary, for_training=True, attention_impl="flex", attention_dropout=0.0)
    assert isinstance(stopped.value, SystemExit)  # the command ends with the message as its last line, no traceback
    assert stopped.value.code == (
        f"error: --attention-impl flex: FlexAttention's backward runs only on CUDA and no CUDA device is available "
        f"(torch {torch.__version__}); to train on the CPU, use --attention-impl sdpa")
    model = build("unilm2_tiny", dictionary, for_training=False, attention_impl="flex")
    assert model.stack.attention_impl == "flex"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(flex_attention.FlexAttentionError, match=r"^error: --attention-impl flex: FlexAttention has "
                       r"no dropout on the attention probabilities; train with --attention-dropout 0, or keep "
                       r"--attention-dropout 0.1 and use --attention-impl sdpa$"):
        build("unilm_tiny", dictionary, for_training=True, attention_impl="flex")
    build("unilm_tiny", dictionary, for_training=True, attention_impl="flex", attention_dropout=0.0)

    monkeypatch.setattr(flex_attention, "flex_attention", None)
    with pytest.raises(flex_attention.FlexAttentionError, match=r"^error: --attention-impl flex: torch .* has no torch."
                       r"nn.attention.flex_attention \(torch 2.5 and later have it\); use --attention-impl sdpa$"):
        build("unilm_tiny", dictionary, for_training=False, attention_impl="flex")
    monkeypatch.undo()

    fields, positions = CASES["seq2seq"]
    model.train()
    for module in model.modules():  # a stack given attention dropout after the build's check is stopped at its call
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.1
    with torch.no_grad(), pytest.raises(flex_attention.FlexAttentionError, match=r"^error: --attention-impl flex: "
                                        r"FlexAttention has no attention dropout; set attention_dropout 0 \(now 0.1\) "
                                        r"or use --attention-impl sdpa$"):
        model.stack(tokens_of(fields["padding_mask"]).clamp(max=len(dictionary) - 1),
                    flex_attention.MaskFields(**fields), positions)
    for module in model.modules():  # the dropout check is the build's; here the gradient check alone
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.0
    with pytest.raises(flex_attention.FlexAttentionError, match=r"backward runs only on CUDA, and this forward on "
                       r"cpu records a graph for one; run inference under torch.no_grad\(\), or use --attention-impl "
                       r"sdpa$"):
        model.stack(tokens_of(fields["padding_mask"]).clamp(max=len(dictionary) - 1),
                    flex_attention.MaskFields(**fields), positions)


def test_an_explicit_mask_goes_through_sdpa_with_a_warning(stacks):
    """A mask given as a tensor has no fields to build a block mask from: the flex stack warns and runs SDPA."""
    from palm_plugin.modules import unilm_transformer

    fields, positions = CASES["pmlm AE+PAR"]
    mask = mask_from_fields(**fields)
    tokens = tokens_of(fields["padding_mask"])
    stack = stacks[32]
    with torch.no_grad():
        expected = stack(tokens, mask, positions)
        stack.attention_impl = "flex"
        unilm_transformer._warn_explicit_mask.cache_clear()
        with pytest.warns(UserWarning, match="a mask given as a tensor .* goes through the sdpa path"):
            actual = stack(tokens, mask, positions)
    stack.attention_impl = "sdpa"
    assert torch.equal(actual, expected)


def test_the_compiled_block_mask_builder_takes_one_graph_per_family():
    """On CUDA the block mask is built by a compiled create_block_mask (dynamic shapes), guarded on the mask_mod and
    the tensors it reads. Each family's mask_mod carries its own rule only, so a family compiles one graph that
    serves all of its batches (every UniLM objective, pmlm AE / AE+PAR / PAR and the pseudo-mask seq2seq layout,
    padded or not): a training run never recompiles (the stance raises), and a field defaulted to another dtype
    would. Three families, three graphs. Dynamo's graphs alone (backend eager), as the CPU cannot run inductor's CUDA
    kernels; their tiles equal the eager build's."""
    def family(fields):
        return ("pmlm" if fields.get("steps") is not None or fields.get("target_lengths") is not None
                else "unilm" if fields.get("objectives") is not None else "bidirectional")

    torch._dynamo.reset()
    build = torch.compile(create_block_mask, backend="eager", dynamic=True, fullgraph=True)
    seen = set()
    for name, (fields, _) in sorted(CASES.items(), key=lambda case: family(case[1][0])):
        mask_mod = flex_attention.MaskFields(**fields).mask_mod()
        with torch.compiler.set_stance("default" if family(fields) not in seen else "fail_on_recompile"):
            compiled = build(mask_mod, BATCH, None, LENGTH, LENGTH, device="cpu", BLOCK_SIZE=flex_attention.BLOCK_SIZE)
        seen.add(family(fields))
        eager = flex_attention.block_mask(mask_mod, BATCH, LENGTH, "cpu")
        assert torch.equal(compiled.to_dense(), eager.to_dense()), name
    assert seen == {"pmlm", "unilm", "bidirectional"}
    # steps without kinds: every token CONTEXT, by a defaulted kinds field that the pmlm graph serves as it is
    fields, _ = CASES["pmlm AE+PAR"]
    no_kinds = flex_attention.MaskFields(fields["padding_mask"], steps=fields["steps"]).mask_mod()
    with torch.compiler.set_stance("fail_on_recompile"):
        compiled = build(no_kinds, BATCH, None, LENGTH, LENGTH, device="cpu", BLOCK_SIZE=flex_attention.BLOCK_SIZE)
    context = flex_attention.MaskFields(fields["padding_mask"], steps=fields["steps"],
                                        kinds=torch.zeros_like(fields["kinds"])).mask_mod()
    eager = flex_attention.block_mask(context, BATCH, LENGTH, "cpu")
    assert torch.equal(compiled.to_dense(), eager.to_dense())
