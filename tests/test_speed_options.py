"""The speed levers of issue 24, each off by default: switched on, each computes what the plain path computes
(here on the CPU; whether each pays is measured on a GPU by ``palm-bench --preset gpu-sweep``)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from fairseq import optim
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig
from omegaconf import OmegaConf

from palm_plugin.criterions.unilm_cloze import UniLMClozeCriterion
from palm_plugin.fixes import saved_model_build
from palm_plugin.modules import activation_checkpoints, compiled_layers, unilm_transformer
from palm_plugin.modules.copy_generator import PointerGenerator
from palm_plugin.modules.relative_position import RelativePositionBias, masked_offset_bias
from palm_plugin.optim.torch_adamw import TorchAdamW
from palm_tools.bench.models import TRAIN_SPECS, build, load_batch
from palm_tools.bench.train import TrainStep
from tests.conftest import mutmut_stats_pass

LENGTH = 32
SPECS = {spec.key: spec for spec in TRAIN_SPECS}
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0"]


@pytest.fixture(scope="module")
def corpus(synthetic_corpus):
    return synthetic_corpus


def built_with(corpus, key, extra=(), sequences=4, precision="fp32", device="cpu"):
    spec = SPECS[key]
    built = build(corpus.path(spec.layout, LENGTH, sequences), spec.args("tiny", LENGTH) + NO_DROPOUT + list(extra),
                  precision=precision, device=device)  # fmt: skip
    return built, load_batch(built, sequences)


def loss_and_gradients(model, criterion, batch):
    model.zero_grad()
    loss, sample_size, logged = criterion(model, batch)
    loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    logged = {k: float(v) if torch.is_tensor(v) else v for k, v in logged.items()}
    return loss.detach(), sample_size, logged, gradients


@pytest.mark.parametrize("key, extra", [("unilm_pretraining", []), ("unilm_seq2seq", []), ("pmlm_ae_par", []),
                                        ("pmlm_mlm", [])])
def test_syncs_at_start_give_the_same_loss_counts_and_gradients(corpus, key, extra, monkeypatch):
    """--syncs-at-start: indices taken before the model runs select the same rows as the boolean masks did, so the
    loss, every logged count and every gradient are equal (bitwise); the model gets indices, not a mask."""
    built, batch = built_with(corpus, key, extra)
    option = built_with(corpus, key, ["--syncs-at-start"], sequences=1)[0].criterion
    assert option.syncs_at_start and not built.criterion.syncs_at_start
    plain = loss_and_gradients(built.model, built.criterion, batch)
    kwargs = {"label_smoothing": built.criterion.eps} if isinstance(built.criterion, UniLMClozeCriterion) else {}
    criterion = type(built.criterion)(built.task, syncs_at_start=True, **kwargs)
    seen = []
    forward = type(built.model).forward

    def recording_forward(self, *args, masked_tokens=None, **kw):
        seen.append(masked_tokens.dtype)
        return forward(self, *args, masked_tokens=masked_tokens, **kw)

    monkeypatch.setattr(type(built.model), "forward", recording_forward)
    synced_first = loss_and_gradients(built.model, criterion, batch)
    assert seen == [torch.long]
    assert torch.equal(plain[0], synced_first[0]) and plain[1] == synced_first[1] and plain[2] == synced_first[2]
    assert plain[3].keys() == synced_first[3].keys()
    assert all(torch.equal(plain[3][name], synced_first[3][name]) for name in plain[3])
    if key == "unilm_pretraining":
        assert plain[2]["next_sentence_rows"] > 0


@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "left_padding"])
@pytest.mark.parametrize("key", ["palm", "palm_pretrain"])
def test_palm_encoder_with_one_padding_check_gives_the_same_loss_and_gradients(corpus, key, padded):
    """palm --syncs-at-start: the encoder tests once per forward whether the batch has padding (fairseq's tests it in
    every layer: one host synchronisation each, counted as the reads of a tensor's value): the same loss and
    gradients, bitwise, with and without padding."""
    from tests.test_multi_tensor_optimizer import Calls

    built, batch = built_with(corpus, key)
    if padded:
        batch = dict(batch, net_input=dict(batch["net_input"], src_tokens=batch["net_input"]["src_tokens"].clone()))
        batch["net_input"]["src_tokens"][0, :3] = built.task.source_dictionary.pad()
    syncs = {}
    for one_check in (False, True):
        built.model.encoder.one_padding_check = one_check
        with torch.no_grad(), Calls() as calls:
            built.model.encoder(batch["net_input"]["src_tokens"])
        syncs[one_check] = calls.names.count("_local_scalar_dense")
    assert syncs == {False: 1 + len(built.model.encoder.layers), True: 1}, syncs
    built.model.encoder.one_padding_check = False
    plain = loss_and_gradients(built.model, built.criterion, batch)
    built.model.encoder.one_padding_check = True
    try:
        once = loss_and_gradients(built.model, built.criterion, batch)
    finally:
        built.model.encoder.one_padding_check = False
    option = built_with(corpus, key, ["--syncs-at-start"], sequences=1)[0]
    assert option.model.encoder.one_padding_check and not hasattr(option.criterion, "syncs_at_start")
    assert torch.equal(plain[0], once[0]) and plain[2] == once[2]
    assert all(torch.equal(plain[3][name], once[3][name]) for name in plain[3])


def test_drop_full_masks_gives_attention_no_mask_only_when_it_hides_nothing(corpus, monkeypatch):
    """--drop-full-masks: a batch of bidirectional rows without padding reaches scaled_dot_product_attention with no
    mask (torch may then take its flash kernel) and the same outputs; a batch with padding keeps its mask."""
    bidirectional = ["--objective-probs", "1,0,0,0"]
    built, batch = built_with(corpus, "unilm_pretraining", bidirectional)
    dropping, _ = built_with(corpus, "unilm_pretraining", bidirectional + ["--drop-full-masks"])
    dropping.model.load_state_dict(built.model.state_dict())
    masks = []
    sdpa = F.scaled_dot_product_attention

    def recording_sdpa(*args, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(unilm_transformer.F, "scaled_dot_product_attention", recording_sdpa)
    net_input = batch["net_input"]
    assert not net_input["src_tokens"].eq(built.task.dictionary.pad()).any()
    with torch.no_grad():
        expected = built.model.eval()(**net_input, features_only=True)[0]
        assert all(mask is not None for mask in masks)
        masks.clear()
        got = dropping.model.eval()(**net_input, features_only=True)[0]
        assert masks and all(mask is None for mask in masks)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        masks.clear()
        padded = dict(net_input, src_tokens=net_input["src_tokens"].clone())
        padded["src_tokens"][0, -3:] = built.task.dictionary.pad()
        dropping.model(**padded, features_only=True)
        assert masks and all(mask is not None for mask in masks)


def assert_trains_as(built, reference, batch, rtol, atol):
    """``built`` (given ``reference``'s parameters) gives the same loss (to ``rtol``) and gradients (to 10 x ``rtol``)
    as ``reference`` for one update on ``batch``."""
    built.model.load_state_dict(reference.model.state_dict())
    expected = loss_and_gradients(reference.model.train(), reference.criterion, batch)
    got = loss_and_gradients(built.model.train(), built.criterion, batch)
    torch.testing.assert_close(got[0], expected[0], rtol=rtol, atol=atol)
    for name, gradient in expected[3].items():
        torch.testing.assert_close(got[3][name], gradient, rtol=10 * rtol, atol=atol, msg=name)


@pytest.mark.parametrize("key", ["unilm_seq2seq", "palm"])
def test_compiled_layers_train_as_the_plain_ones(corpus, key, monkeypatch):
    """--compile-layers (and PALM's --compile-copy-attention): every layer compiled in place (same state dict names),
    the copy layer's scores on their compiled path, one update's loss and gradients equal the plain model's; nothing
    is compiled when a model is built from a checkpoint for use. The suite compiles with the aot_eager backend (the
    graphs inductor receives, without its code generation; tests/test_palm_copy_generator.py runs inductor)."""
    monkeypatch.setattr(compiled_layers, "BACKEND", "aot_eager")
    # a fresh recompile budget (8 per function, a hard stop with fullgraph): earlier tests of this process (the copy
    # layer's, FlexAttention's) compiled the same functions for other dtypes, shapes and models
    torch._dynamo.reset()
    plain, batch = built_with(corpus, key)
    # PALM's layers also checkpointed: the two levers compose (torch.compile traces torch.utils.checkpoint)
    options = ["--compile-layers"] + (["--compile-copy-attention", "--checkpoint-activations"] if key == "palm"
                                      else [])
    compiled, _ = built_with(corpus, key, options)
    layers = [m for m in compiled.model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    assert len(layers) == (2 if key == "unilm_seq2seq" else 4)
    impls = [m.scores_impl for m in compiled.model.modules() if isinstance(m, PointerGenerator)]
    assert impls == (["compiled"] if key == "palm" else [])
    assert list(compiled.model.state_dict()) == list(plain.model.state_dict())
    assert_trains_as(compiled, plain, batch, rtol=1e-5, atol=1e-6)
    token = saved_model_build._SAVED.set(True)
    try:
        assert compiled_layers.compile_layers([torch.nn.Linear(2, 2)]) == 0
    finally:
        saved_model_build._SAVED.reset(token)
    # as fairseq-generate builds it from the checkpoint's configuration (unilm_seq2seq: through the plugin's tasks,
    # which hand from_checkpoint on to fairseq's)
    for_use = compiled.task.build_model(compiled.cfg.model, from_checkpoint=True)
    assert [m for m in for_use.modules() if getattr(m, "_compiled_call_impl", None) is not None] == []
    if key == "palm":
        assert [m.scores_impl for m in for_use.modules() if isinstance(m, PointerGenerator)] == ["blocked"]
        with pytest.raises(SystemExit, match="--no-copy removes"):
            built_with(corpus, key, ["--compile-copy-attention", "--no-copy"])


def test_compiled_decoder_layers_share_one_graph_past_the_recompile_limit():
    """fixes/compiled_decoder_layers.py: ten of fairseq's decoder layers compiled in place as --compile-layers does
    (PALM base has more than torch's recompile limit of 8) reuse the first layer's graph, each layer's output equal
    to the uncompiled layer's. Without the fix each layer is guarded on its own incremental-state id: the second
    layer recompiles (the stance raises), and the ninth onwards would run uncompiled."""
    from fairseq.models.transformer import TransformerConfig
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = TransformerConfig()
    cfg.encoder.embed_dim = cfg.decoder.embed_dim = 16
    cfg.decoder.ffn_embed_dim, cfg.decoder.attention_heads = 32, 2
    layers = [TransformerDecoderLayerBase(cfg).eval() for _ in range(10)]
    x = torch.randn(7, 3, 16, requires_grad=True)  # (target, batch, dim), as every layer after the first sees it
    encoder_out = torch.randn(5, 3, 16)
    expected = [layer(x, encoder_out, None)[0] for layer in layers]
    for layer in layers:
        layer.compile(backend="eager")  # dynamo's graphs alone: the guards are what is tested
    for index, layer in enumerate(layers):
        with torch.compiler.set_stance("fail_on_recompile" if index else "default"):
            got = layer(x, encoder_out, None, incremental_state=None)[0]
        torch.testing.assert_close(got, expected[index])


def test_compiled_functions_take_other_batch_shapes_without_recompiling(monkeypatch):
    """compiled() (--compile-copy-attention's sums): shapes are symbolic from the first call, so a batch of other
    sizes (fairseq's change every update) reuses the code: with fullgraph, recompiling once per shape would stop
    training at torch's recompile limit. Values equal the float64 eager computation; one compilation per backend."""
    monkeypatch.setattr(compiled_layers, "BACKEND", "aot_eager")
    torch._dynamo.reset()

    def weighted_sums(memory, query, w):
        return (torch.sigmoid(memory.unsqueeze(1) + query.unsqueeze(2)) * w).sum(-1)

    function = compiled_layers.compiled(weighted_sums)
    assert compiled_layers.compiled(weighted_sums) is function
    torch.manual_seed(0)
    shapes = [(2, 5, 3, 4), (3, 7, 2, 4), (4, 2, 6, 4)]  # (B, S, T, A): every size but A changes
    for call, (batch, sources, steps, dim) in enumerate(shapes):
        memory, query, w = torch.randn(batch, sources, dim), torch.randn(batch, steps, dim), torch.randn(dim)
        with torch.compiler.set_stance("fail_on_recompile" if call else "default"):
            got = function(memory, query, w)
        torch.testing.assert_close(got, weighted_sums(memory.double(), query.double(), w.double()).float())



def test_compiled_functions_stop_where_torch_would_run_them_uncompiled(monkeypatch):
    """compiled() compiles the whole function or stops (fullgraph): a function torch cannot trace in one graph is
    refused, not run eagerly, which would allocate what the functions written to be fused avoid."""
    monkeypatch.setattr(compiled_layers, "BACKEND", "aot_eager")
    torch._dynamo.reset()

    def broken_sums(memory, query):
        torch._dynamo.graph_break()
        return (memory.unsqueeze(1) + query.unsqueeze(2)).sum(-1)

    function = compiled_layers.compiled(broken_sums)
    if mutmut_stats_pass():  # compiled functions run eagerly there (tests/conftest.py); the call above is recorded
        pytest.skip("mutmut's stats pass runs compiled functions eagerly")
    with pytest.raises(torch._dynamo.exc.Unsupported):
        function(torch.randn(2, 3, 4), torch.randn(2, 5, 4))


def test_compiled_layers_take_batches_of_other_lengths_after_one_recompile(monkeypatch):
    """--compile-layers under fairseq's batches, whose length and size change every update: the first shape compiles,
    the second once more with its sizes symbolic (torch's automatic dynamic shapes), and no later batch recompiles.
    A layer whose code branched on a length would recompile for each batch, and past torch's limit of 8 run
    uncompiled. A batch of one sentence compiles once more (torch specializes sizes of 1), and only once. UniLMv2's
    stack (its relative bias read by offset) in training, dropout on."""
    from palm_plugin.modules.flex_attention import MaskFields

    monkeypatch.setattr(compiled_layers, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    torch.manual_seed(0)
    stack = unilm_transformer.UniLMTransformer(vocab_size=50, padding_idx=1, dim=32, ffn_dim=64, layers=2, num_heads=4,
                                               max_positions=128, num_segments=2, dropout=0.1, attention_dropout=0.1,
                                               relative_position_buckets=32).train()
    assert compiled_layers.compile_layers(stack.layers) == 2
    shapes = [(3, 37), (2, 52), (4, 41), (3, 77), (5, 63), (1, 9), (1, 20), (2, 30)]
    compiles = {0, 1, 5}  # the first shape, the second (symbolic sizes), the first batch of one
    for call, (batch, length) in enumerate(shapes):
        tokens = torch.randint(4, 50, (batch, length))
        padding = torch.arange(length) >= torch.randint(length // 2, length + 1, (batch, 1))
        tokens[padding] = 1
        with torch.compiler.set_stance("default" if call in compiles else "fail_on_recompile"):
            states = stack(tokens, MaskFields(padding), torch.arange(length).expand(batch, length))
            states.square().sum().backward()
        assert torch.isfinite(states).all() and stack.relative_position.weight.grad is not None


def _updated_by(built, batch, make_optimizer, initial, updates=3):
    """The parameters after ``updates`` updates from ``initial`` with ``make_optimizer()`` (a fairseq optimizer,
    built after the parameters are reset: fairseq's FP16Optimizer copies them)."""
    built.model.load_state_dict(initial)
    built.optimizer = make_optimizer()
    step = TrainStep(SPECS["unilm_seq2seq"], built, batch)
    for _ in range(updates):
        step()
    return {name: p.detach().float().clone() for name, p in built.model.named_parameters()}


def _adamw(built, impl):
    cfg = OmegaConf.merge(built.cfg.optimizer, {"adamw_impl": impl})
    params = [p for p in built.model.parameters() if p.requires_grad]
    if built.precision == "fp32":
        return TorchAdamW(cfg, params)
    return optim.FP16Optimizer.build_optimizer(OmegaConf.merge(built.cfg, {"optimizer": cfg}), params)


def test_torch_adamw_implementations_agree_and_follow_fairseq_adam(corpus):
    """--optimizer torch_adamw: fused, foreach and for-loop give the same parameters after three updates. Their
    update points where fairseq's Adam's does (cosine > 0.99); it is not equal: epsilon is added after the bias
    correction of the second moment in torch and before it in fairseq, which matters where gradients are near
    epsilon (here a few per cent of the update)."""
    built, batch = built_with(corpus, "unilm_seq2seq", ["--optimizer", "torch_adamw"])
    assert isinstance(built.optimizer, TorchAdamW) and built.cfg.optimizer.adamw_impl == "fused"
    initial = copy.deepcopy(built.model.state_dict())
    params = [p for p in built.model.parameters() if p.requires_grad]
    reference = _updated_by(built, batch, lambda: _adamw(built, "for-loop"), initial)
    for impl in ("fused", "foreach"):
        got = _updated_by(built, batch, lambda: _adamw(built, impl), initial)
        for name, value in reference.items():
            torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7, msg=f"{impl} {name}")
    fairseq_cfg = OmegaConf.structured(FairseqAdamConfig(lr=[1e-4], tpu=False))
    fairseq_adam = _updated_by(built, batch, lambda: FairseqAdam(fairseq_cfg, params), initial)

    def update(parameters):
        return torch.cat([(parameters[name] - initial[name].float()).flatten() for name in parameters])

    ours, theirs = update(reference), update(fairseq_adam)
    assert theirs.norm() > 0 and F.cosine_similarity(ours, theirs, dim=0) > 0.99


def test_torch_adamw_updates_fairseqs_fp32_master_weights_under_bf16(corpus):
    """--bf16: fairseq's FP16Optimizer keeps an fp32 master copy of each parameter (it flattens them into one tensor
    under --fp16 only) and hands those to the optimizer; fused and for-loop AdamW update them alike."""
    built, batch = built_with(corpus, "unilm_seq2seq", ["--optimizer", "torch_adamw"], precision="bf16")
    master = built.optimizer.fp32_params
    assert type(built.optimizer).__name__ == "FP16Optimizer" and len(master) == len(list(built.model.parameters()))
    initial = copy.deepcopy(built.model.state_dict())
    masters = {}
    for impl in ("fused", "for-loop"):
        parameters = _updated_by(built, batch, lambda: _adamw(built, impl), initial)
        masters[impl] = [p.detach().clone() for p in built.optimizer.fp32_params]
        assert any(not torch.equal(parameters[name], initial[name].float()) for name in parameters)
    for fused, loop in zip(masters["fused"], masters["for-loop"]):
        torch.testing.assert_close(fused, loop, rtol=1e-6, atol=1e-7)


def test_relative_bias_rows_from_the_table_equal_the_bias_computed_from_positions():
    """Training and decoding read the relative position bias from a table of every offset (decoding computes it
    once per batch of sentences): the same values as bucketing each offset (near, far, before and after the query,
    the table's two ends)."""
    torch.manual_seed(0)
    bias = RelativePositionBias(num_heads=3, num_buckets=32, max_distance=16)
    table = bias.table(100)
    query = torch.tensor([[0, 99], [50, 51]])
    keys = torch.tensor([[0, 1, 5, 20, 40, 98, 99], [0, 30, 49, 50, 51, 52, 99]])
    assert torch.equal(masked_offset_bias(table, query, keys), bias(query, keys))


PRODUCTS = {"mm", "addmm", "bmm", "baddbmm"}


def product_widths(run):
    """The sizes of the results of every matrix product while ``run()`` runs (forward and backward)."""
    from tests.test_multi_tensor_optimizer import Calls

    with Calls() as calls:
        run()
    return {size for name, shape in zip(calls.names, calls.shapes) if name in PRODUCTS for size in shape}


def test_vocabulary_products_pad_the_matrix_to_64_rows_and_give_the_plain_products_values_and_gradients(monkeypatch):
    """lm_head.vocabulary_logits where it pads (training on CUDA; forced here): every product sees 1024 rows for a
    vocabulary of 1001, never 1001, and the logits and the gradients of the states, the matrix and the bias are the
    plain product's (float64); a vocabulary already a multiple of 64 and, on this CPU, the default take the plain
    product; so does a call without gradients, where CUDA would copy the matrix for a few rows."""
    from palm_plugin.modules import lm_head

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(3, 7, 24, dtype=torch.float64, generator=generator)
    weight = torch.randn(1001, 24, dtype=torch.float64, generator=generator)
    bias = torch.randn(1001, dtype=torch.float64, generator=generator)
    upstream = torch.randn(3, 7, 1001, dtype=torch.float64, generator=generator)

    def logits_and_gradients(with_bias):
        inputs = [t.detach().clone().requires_grad_() for t in (features, weight, bias)]
        logits = lm_head.vocabulary_logits(inputs[0], inputs[1], inputs[2] if with_bias else None)
        (logits * upstream).sum().backward()
        return [logits.detach()] + [t.grad for t in inputs[: 3 if with_bias else 2]]

    assert not lm_head.pads_vocabulary(features.clone().requires_grad_())  # the CPU: as it is
    plain = {b: logits_and_gradients(b) for b in (True, False)}
    assert 1001 in product_widths(lambda: logits_and_gradients(True))
    monkeypatch.setattr(lm_head, "pads_vocabulary", lambda states: True)
    for with_bias in (True, False):
        padded = logits_and_gradients(with_bias)
        assert padded[0].shape == (3, 7, 1001)
        assert len(padded) == (4 if with_bias else 3) and all(t is not None for t in padded + plain[with_bias])
        for got, expected in zip(padded, plain[with_bias]):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        widths = product_widths(lambda: logits_and_gradients(with_bias))
        assert 1024 in widths and 1001 not in widths
    widths = product_widths(lambda: lm_head.vocabulary_logits(features, weight[:960], bias[:960]))
    assert 960 in widths and 1024 not in widths
    monkeypatch.undo()
    with torch.no_grad():
        assert 1001 in product_widths(lambda: lm_head.vocabulary_logits(features.cuda() if torch.cuda.is_available()
                                                                         else features, weight, bias))


@pytest.mark.parametrize("key", ["pmlm_ae_par", "unilm_pretraining", "palm", "palm_pretrain"])
def test_every_vocabulary_head_multiplies_by_the_padded_matrix_and_trains_as_the_plain_one(corpus, key, monkeypatch):
    """Each model's products onto its vocabulary (UniLM's masked-LM head, PALM's equation (2) and its encoder's MLM
    head) go through lm_head.vocabulary_logits: with the padding forced on this CPU no product of a training step has
    the dictionary's size (not a multiple of 64 here) as a side; the loss and every gradient are the plain step's."""
    from palm_plugin.modules import lm_head

    built, batch = built_with(corpus, key)
    types = len(built.task.source_dictionary)
    assert types % lm_head.ROW_MULTIPLE
    plain = loss_and_gradients(built.model, built.criterion, batch)
    assert types in product_widths(lambda: loss_and_gradients(built.model, built.criterion, batch))
    monkeypatch.setattr(lm_head, "pads_vocabulary", lambda states: True)
    widths = product_widths(lambda: loss_and_gradients(built.model, built.criterion, batch))
    assert types not in widths and types + -types % lm_head.ROW_MULTIPLE in widths
    padded = loss_and_gradients(built.model, built.criterion, batch)
    torch.testing.assert_close(padded[0], plain[0], rtol=1e-6, atol=1e-6)
    assert padded[1:3] == plain[1:3] and padded[3].keys() == plain[3].keys()
    for name, expected in plain[3].items():  # float32 sums in another order: 1e-5 of each tensor's scale (k's bias: 0)
        atol = 1e-5 * float(expected.abs().max()) + 1e-9
        torch.testing.assert_close(padded[3][name], expected, rtol=0, atol=atol, msg=lambda m: f"{name}: {m}")


def test_compile_layers_compiles_each_layer_in_place_and_counts_them(monkeypatch):
    """--compile-layers: each layer compiled in place (its parameters stay where the optimizer has them), the count
    returned; none while a model is built from a checkpoint for use (decoding compiles nothing)."""
    layers = [torch.nn.Linear(2, 2) for _ in range(3)]
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **options: compiled.append(self))
    assert compiled_layers.compile_layers(layers) == 3 and compiled == layers
    monkeypatch.setattr(compiled_layers, "compiling", lambda: False)
    assert compiled_layers.compile_layers(layers) == 0 and len(compiled) == 3


@pytest.mark.parametrize("key", ["pmlm_ae_par", "unilm_seq2seq", "palm"])
def test_checkpointed_layers_keep_only_their_inputs_and_train_as_the_plain_ones(corpus, key, monkeypatch):
    """--checkpoint-activations: each layer wrapped in place (the same state dict names) keeps only its inputs for the
    backward pass, so far fewer bytes are saved during the forward; with dropout on, one update's loss and gradients
    equal the plain model's (the random state is restored for the recomputation, so the masks are the same); without
    gradients the layers run plainly, and a model built from a checkpoint for use is not wrapped."""
    dropout = ["--dropout", "0.1", "--attention-dropout", "0.1"]
    plain, batch = built_with(corpus, key, dropout)
    wrapped, _ = built_with(corpus, key, dropout + ["--checkpoint-activations"])
    wrapped.model.load_state_dict(plain.model.state_dict())
    assert list(wrapped.model.state_dict()) == list(plain.model.state_dict())
    calls = []
    monkeypatch.setattr(activation_checkpoints, "checkpoint",
                        lambda *a, **k: calls.append(k["use_reentrant"]) or checkpoint(*a, **k))

    def update(built):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            torch.manual_seed(7)
            result = loss_and_gradients(built.model.train(), built.criterion, batch)
        return result, sum(saved)

    (expected, plain_bytes), (got, checkpointed_bytes) = update(plain), update(wrapped)
    print(f"{key}: {checkpointed_bytes} bytes saved for the backward pass with checkpoints, {plain_bytes} without")
    layers = 2 if key.startswith(("unilm", "pmlm")) else 4
    assert checkpointed_bytes < 0.3 * plain_bytes and calls == [False] * layers
    with torch.no_grad():
        wrapped.model(**batch["net_input"])
    assert len(calls) == layers
    assert torch.equal(got[0], expected[0]) and got[2] == expected[2] and got[3].keys() == expected[3].keys()
    for name, gradient in expected[3].items():
        torch.testing.assert_close(got[3][name], gradient, rtol=1e-6, atol=1e-7, msg=name)
    for_use = wrapped.task.build_model(wrapped.cfg.model, from_checkpoint=True)
    assert all("forward" not in vars(m) for m in for_use.modules())
