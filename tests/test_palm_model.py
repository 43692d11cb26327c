"""The palm model in process: incremental decoding, decoder causality, learning to copy, state-dict upgrades."""
import argparse
import logging
import math
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary

from palm_plugin.criterions.palm_mlm_lm import PalmMlmLmConfig, PalmMlmLmCriterion
from palm_plugin.models.palm import REINIT_MARKER, SOURCE_FORMAT, PalmConfig, PalmModel, palm_tiny
from palm_plugin.modules.dictionary_check import FINGERPRINT
from tests.test_criterion_metrics import logged

WORDS = 24


def make_dictionary(words=WORDS, mask=True):
    dictionary = Dictionary()
    for i in range(words):
        dictionary.add_symbol(f"w{i}")
    if mask:
        dictionary.add_symbol("<mask>")
    return dictionary


class FakeTask:
    """What PalmModel.build_model reads from a task."""

    def __init__(self, dictionary, trains_encoder_mlm=True):
        self.source_dictionary = self.target_dictionary = dictionary
        self.trains_encoder_mlm = trains_encoder_mlm


def build(dictionary=None, trains_encoder_mlm=True, seed=0, **overrides):
    args = argparse.Namespace(dropout=0.0, attention_dropout=0.0, **overrides)
    palm_tiny(args)
    torch.manual_seed(seed)
    dictionary = dictionary or make_dictionary()
    return PalmModel.build_model(PalmConfig.from_namespace(args), FakeTask(dictionary, trains_encoder_mlm))


def test_incremental_decoding_equals_full_forward_with_reordered_beams():
    """Beam search reorders hypotheses within a sentence and, when sentences finish, removes theirs: the rows of
    the remaining sentences move up to other sentences' places. The cached copy memory must follow, or the
    incremental log-probabilities differ from a full forward over the same history (or its shape no longer fits)."""
    model = build(seed=3).eval()
    dictionary = model.encoder.dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    torch.manual_seed(0)
    batch, beam = 4, 2
    src_tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (batch, 7))
    src_tokens[1, :2] = pad  # left padding, as fairseq's translation task batches sources
    src_tokens[:, -1] = eos
    rows = batch * beam
    orders = [
        None,
        torch.tensor([1, 1, 2, 3, 5, 4, 7, 6]),  # within each sentence
        torch.tensor([0, 1, 4, 5, 6, 7]),  # sentence 1 finished: sentences 2 and 3 move up
        torch.tensor([2, 3, 4, 5]),  # sentence 0 finished: sentence 2 takes its rows
        torch.tensor([1, 0, 2, 2]),
        torch.tensor([2, 3]),  # sentence 2 finished: sentence 3 takes its rows
    ]
    with torch.no_grad():
        encoder_out = model.encoder(src_tokens, src_lengths=src_tokens.ne(pad).sum(1))
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, torch.arange(batch).repeat_interleave(beam))
        history = torch.full((rows, 1), eos)
        incremental_state = {}
        for new_order in orders:
            if new_order is not None:
                model.decoder.reorder_incremental_state_scripting(incremental_state, new_order)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
                history = history.index_select(0, new_order)
            step_log_probs, _ = model.decoder(history, encoder_out=encoder_out, incremental_state=incremental_state)
            full_log_probs, _ = model.decoder(history, encoder_out=encoder_out)
            torch.testing.assert_close(step_log_probs[:, 0], full_log_probs[:, -1], atol=1e-5, rtol=0)
            next_tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (history.size(0), 1))
            history = torch.cat((history, next_tokens), dim=1)
    cached = [value for key, value in incremental_state.items() if "copy_memory" in key]
    assert len(cached) == 1 and cached[0]["memory"].shape[:2] == (2, 8)  # <s> + the 7 source tokens


def train(model, make_batch, steps, lr=3e-3):
    """Adam on the joint PALM loss over fresh batches; returns the lm_loss (bits per token) of the last 20 steps."""
    criterion = PalmMlmLmCriterion(FakeTask(model.encoder.dictionary), stage="joint", mlm_weight=1.0, lm_weight=1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        loss, _, log = criterion(model, make_batch())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(log["lm_loss"]) / log["ntokens"] / math.log(2))
    return sum(losses[-20:]) / 20


def batch_maker(dictionary, copy_task, batch=16, length=8, types=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    pad, eos, first = dictionary.pad(), dictionary.eos(), dictionary.nspecial

    def make_batch():
        source = torch.randint(first, first + types, (batch, length), generator=generator)
        words = source if copy_task else torch.randint(first, first + types, (batch, length), generator=generator)
        eos_column = torch.full((batch, 1), eos)
        target = torch.cat((words, eos_column), 1)
        mlm_target = torch.full((batch, length + 1), pad)
        mlm_target[:, 0] = source[:, 0]
        return {
            "net_input": {
                "src_tokens": torch.cat((source, eos_column), 1),
                "src_lengths": torch.full((batch,), length + 1),
                "prev_output_tokens": torch.cat((eos_column, words), 1),
            },
            "target": target,
            "mlm_target": mlm_target,
            "ntokens": batch * (length + 1),
            "nsentences": batch,
        }

    return make_batch


@pytest.mark.parametrize("no_copy", [False, True])
def test_decoder_cannot_see_the_future(no_copy):
    """Perturbation: changing decoder input j changes no log-probability at positions < j (they predict targets
    up to j - 1) and does change those at j and after."""
    model = build(seed=2, no_copy=no_copy).eval()
    dictionary = model.encoder.dictionary
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(dictionary.nspecial, len(dictionary) - 1, (2, 9), generator=generator)
    prev = torch.randint(dictionary.nspecial, len(dictionary) - 1, (2, 8), generator=generator)
    prev[:, 0] = dictionary.eos()
    with torch.no_grad():
        reference, _ = model(source, torch.tensor([9, 9]), prev)
        for j in range(1, prev.size(1)):
            changed = prev.clone()
            changed[:, j] = dictionary.nspecial + (prev[:, j] - dictionary.nspecial + 1) % (len(dictionary) - 5)
            log_probs, _ = model(source, torch.tensor([9, 9]), changed)
            torch.testing.assert_close(log_probs[:, :j], reference[:, :j], atol=1e-6, rtol=0)
            assert (log_probs[:, j:] - reference[:, j:]).abs().amax() > 1e-4, j


def test_decoder_learns_to_copy_the_source():
    # From random weights this tiny model finds the copy alignment within these steps when target position t and
    # source position t coincide (about 0.02 bits); with <s> first (the default, for RoBERTa-initialised models)
    # it is still at 2.3 bits after 150 steps, and so is it with any other extra first token.
    model = build(seed=1, no_source_bos=True)
    lm_bits = train(model, batch_maker(model.encoder.dictionary, copy_task=True), steps=150)
    assert lm_bits < 0.3, f"lm_loss {lm_bits:.3f} bits on a copy task"


@pytest.mark.parametrize("impl", ["auto", "blocked"])
def test_no_copy_ablation_has_no_copy_parameters(impl):
    """--no-copy removes the copy layer, and builds with --copy-attention-impl left at auto (the default) or blocked."""
    full, ablated = build(), build(no_copy=True, copy_attention_impl=impl)
    names = {name for name, _ in ablated.named_parameters()}
    assert not any(part in name for name in names for part in ("memory_projection", "query_projection", "gate"))
    extra = sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in ablated.parameters())
    assert extra == 64 * 64 + (64 * 64 + 64) + 64 + (128 + 1)  # W_m, W_s + b_c, w_c, [w_z; w_s] + b_m


def test_criterion_loss_by_value():
    """The optimised loss against the definition, computed here from the model's outputs: stage joint =
    lm_weight * (mean -log P(target)) + mlm_weight * (mean MLM cross-entropy), stage ae = the MLM mean alone; the
    default second stage is the paper's (decoder log-likelihood only)."""
    assert PalmMlmLmConfig().mlm_weight == 0 and PalmMlmLmConfig().stage == "joint"
    model = build(seed=4).eval()
    dictionary = model.encoder.dictionary
    sample = batch_maker(dictionary, copy_task=False, batch=3, length=6, seed=2)()
    sample["target"][1, -2:] = dictionary.pad()  # padding is not predicted
    sample["mlm_target"][:, 2] = sample["net_input"]["src_tokens"][:, 2]
    with torch.no_grad():
        net = sample["net_input"]
        log_probs, _ = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
        # the encoder reads "<s> source </s>": the MLM predictions sit one position later
        with_bos = torch.cat((torch.full_like(net["src_tokens"][:, :1], dictionary.bos()), net["src_tokens"]), 1)
        model.encoder.source_bos = False
        features = model.encoder(with_bos)["encoder_out"][0].transpose(0, 1)[:, 1:]
        model.encoder.source_bos = True
        head = model.mlm_head
        hidden = head.layer_norm(head.activation_fn(head.dense(features)))
        mlm_log_probs = torch.log_softmax(hidden @ head.weight.T + head.bias, dim=-1)
    real = sample["target"].ne(dictionary.pad())
    lm = -log_probs.gather(2, sample["target"].unsqueeze(2)).squeeze(2)[real].mean()
    masked = sample["mlm_target"].ne(dictionary.pad())
    mlm = -mlm_log_probs.gather(2, sample["mlm_target"].unsqueeze(2)).squeeze(2)[masked].mean()
    sample["ntokens"] = int(real.sum())
    for stage, mlm_weight, lm_weight, expected in (
        ("joint", 0.0, 1.0, lm),
        ("joint", 1.0, 1.0, lm + mlm),
        ("joint", 0.5, 2.0, 2 * lm + 0.5 * mlm),
        ("joint", 0.0, 3.0, 3 * lm),
        ("ae", 0.0, 1.0, mlm),
    ):
        criterion = PalmMlmLmCriterion(FakeTask(dictionary), stage, mlm_weight, lm_weight)
        decoder_calls = []
        hook = model.decoder.register_forward_hook(lambda *_: decoder_calls.append(1))
        with torch.no_grad():
            loss, sample_size, log = criterion(model, sample)
        hook.remove()
        torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5, msg=f"{stage} {mlm_weight} {lm_weight}")
        torch.testing.assert_close(log["mlm_loss"] / log["mlm_tokens"], mlm, atol=1e-5, rtol=1e-5)
        assert sample_size == 1 and log["mlm_tokens"] == int(masked.sum())
        # fairseq's trainer logs the batch size ("bsz") from nsentences
        assert log["nsentences"] == 3 and log["ntokens"] == int(real.sum())
        torch.testing.assert_close(log["loss"], loss)
        # what fairseq's progress bar shows: the logged outputs reduced, in bits, to 3 decimals
        assert logged(PalmMlmLmCriterion, [log])["loss"] == pytest.approx(float(loss) / math.log(2), abs=6e-4)
        assert len(decoder_calls) == (stage == "joint")  # stage ae costs the encoder alone


def test_decoder_returns_the_attention_of_the_layer_asked_for():
    """``alignment_layer`` (fairseq's decoder interface, e.g. for alignments): the cross-attention of that layer, as
    fairseq's own decoder stack computes it, averaged over heads; by default the last layer's."""
    from fairseq.models.transformer import TransformerDecoderBase

    model = build(seed=5, decoder_layers=2).eval()
    sample = batch_maker(model.encoder.dictionary, copy_task=False, batch=2, length=5, seed=3)()
    net = sample["net_input"]
    with torch.no_grad():
        encoder_out = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        attention = {}
        for layer in (0, 1, None):
            _, extra = model.decoder(net["prev_output_tokens"], encoder_out=encoder_out, alignment_layer=layer)
            _, reference = TransformerDecoderBase.extract_features(
                model.decoder, net["prev_output_tokens"], encoder_out=encoder_out, alignment_layer=layer)
            torch.testing.assert_close(extra["attn"][0], reference["attn"][0], atol=0, rtol=0)
            torch.testing.assert_close(extra["attn"][0].sum(-1), torch.ones(2, 6))
            attention[layer] = extra["attn"][0]
    assert not torch.allclose(attention[0], attention[1], atol=1e-3)
    torch.testing.assert_close(attention[None], attention[1], atol=0, rtol=0)
    with torch.no_grad():  # alignment_heads: the average over the first heads only, as fairseq's
        _, one_head = model.decoder(net["prev_output_tokens"], encoder_out=encoder_out, alignment_heads=1)
        _, reference = TransformerDecoderBase.extract_features(
            model.decoder, net["prev_output_tokens"], encoder_out=encoder_out, alignment_heads=1)
    torch.testing.assert_close(one_head["attn"][0], reference["attn"][0], atol=0, rtol=0)
    assert not torch.allclose(one_head["attn"][0], attention[None], atol=1e-3)
    # full_context_alignment (fairseq's alignment training): no future mask, the states and attention fairseq's
    # own forward computes with it, which differ from the causal ones
    with torch.no_grad():
        states, full = model.decoder(net["prev_output_tokens"], encoder_out=encoder_out, features_only=True,
                                     full_context_alignment=True)
        reference, expected = TransformerDecoderBase.forward(
            model.decoder, net["prev_output_tokens"], encoder_out=encoder_out, features_only=True,
            full_context_alignment=True)
        causal, _ = model.decoder(net["prev_output_tokens"], encoder_out=encoder_out, features_only=True)
    torch.testing.assert_close(states, reference, atol=0, rtol=0)
    torch.testing.assert_close(full["attn"][0], expected["attn"][0], atol=0, rtol=0)
    assert not torch.allclose(states, causal, atol=1e-3)


def test_paper_second_stage_gives_the_mlm_head_no_gradient():
    model = build(seed=4)
    sample = batch_maker(model.encoder.dictionary, copy_task=False, batch=2, length=5)()
    loss, _, _ = PalmMlmLmCriterion(FakeTask(model.encoder.dictionary), "joint", 0.0, 1.0)(model, sample)
    loss.backward()
    assert all(p.grad is None for p in model.mlm_head.dense.parameters())
    assert model.encoder.layers[0].fc1.weight.grad.abs().sum() > 0


def finetuning_model(seed, **ablation):
    return build(make_dictionary(mask=False), trains_encoder_mlm=False, seed=seed, **ablation)


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_table6_reinit_replaces_one_part_of_the_pretrained_palm(part, caplog):
    """--reinit-encoder / --reinit-decoder: loading the pre-trained PALM (fairseq's load_state_dict, as
    --finetune-from-model does) gives that part a fresh initialisation (the same as a model built with the same
    seed) and the rest, the shared embedding included, the checkpoint's values."""
    pretrained = build(make_dictionary(mask=True), trains_encoder_mlm=True, seed=11)
    torch.manual_seed(12)  # "trained": every weight, layer norms included, away from its initial value
    checkpoint = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() and k != SOURCE_FORMAT else v.clone()
                  for k, v in pretrained.state_dict().items()}
    shared = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight",
              "decoder.pointer_generator.output_embedding", "mlm_head.weight"}  # one tensor, saved under each name
    for key in shared:
        checkpoint[key] = checkpoint["encoder.embed_tokens.weight"]
    fresh = finetuning_model(seed=5).state_dict()
    model = finetuning_model(seed=5, **{f"reinit_{part}": True})
    with caplog.at_level(logging.INFO, logger="palm_plugin.models.palm"):
        model.load_state_dict({k: v.clone() for k, v in checkpoint.items()}, strict=True)
    loaded = model.state_dict()
    embedding = "encoder.embed_tokens.weight"
    rows = fresh[embedding].size(0)
    reinitialised = [k for k in loaded if k.startswith(part + ".") and k not in shared | {SOURCE_FORMAT}]
    assert any("pointer_generator.gate" in k for k in reinitialised) == (part == "decoder")
    assert len(reinitialised) > 10
    assert f"{part} re-initialised ({len(reinitialised)} tensors; token embedding kept from the checkpoint)" in [
        r.getMessage() for r in caplog.records if r.name == "palm_plugin.models.palm"]
    for key, value in loaded.items():
        if key == REINIT_MARKER:
            continue
        # the record of the dictionary is this model's (the checkpoint's has <mask> more)
        own = key in reinitialised or key == FINGERPRINT
        expected = fresh[key] if own else checkpoint[key][:rows] if key in shared else checkpoint[key]
        torch.testing.assert_close(value, expected, atol=0, rtol=0, msg=key)
        if key in reinitialised and value.dtype.is_floating_point and value.numel() > 1:
            assert not torch.equal(value, checkpoint[key]), key

    # The fine-tuned checkpoint (marked) loads as it is: resuming or fairseq-generate does not re-initialise.
    resumed = finetuning_model(seed=8, **{f"reinit_{part}": True})
    saved = {k: v.clone() for k, v in loaded.items()}
    resumed.load_state_dict(saved, strict=True)
    for key, value in resumed.state_dict().items():
        torch.testing.assert_close(value, loaded[key], atol=0, rtol=0, msg=key)



@pytest.mark.parametrize("roberta_layers", [1, 2, 3])
def test_roberta_path_fills_the_encoder_or_names_what_does_not_fit(roberta_layers, tmp_path):
    """--roberta-path with fairseq's own RoBERTa of the same sizes gives its features; one layer fewer (parameters
    missing) or one more (parameters left over) is an error that names the parameters, never a partial load."""
    from fairseq.models.roberta import RobertaModel
    from fairseq.models.roberta.model import base_architecture

    dictionary = make_dictionary()
    args = argparse.Namespace(encoder_layers=roberta_layers, encoder_embed_dim=64, encoder_ffn_embed_dim=128,
                              encoder_attention_heads=2, max_positions=64, dropout=0.0, attention_dropout=0.0)
    base_architecture(args)
    torch.manual_seed(7)
    roberta = RobertaModel.build_model(args, argparse.Namespace(source_dictionary=dictionary)).eval()
    torch.save({"model": roberta.state_dict(), "cfg": {"model": vars(args)}}, tmp_path / "roberta.pt")

    def load():
        return build(dictionary, roberta_path=str(tmp_path / "roberta.pt"), encoder_max_positions=64).eval()

    if roberta_layers != 2:
        left = "Missing: \\['encoder.layers.1." if roberta_layers == 1 else "unexpected: \\['encoder.layers.2."
        # the message names the options that size the encoder, as they are spelled on the command line
        options = ("set --encoder-layers, --encoder-embed-dim, --encoder-ffn-embed-dim, --encoder-attention-heads and "
                   "--encoder-max-positions to the checkpoint's")
        with pytest.raises(ValueError, match=f"does not fit the PALM encoder; {options}.*{left}"):
            load()
        return
    tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (2, 7), generator=torch.Generator().manual_seed(8))
    tokens[:, 0], tokens[:, -1] = dictionary.bos(), dictionary.eos()
    palm, masked = load(), torch.rand(tokens.shape, generator=torch.Generator().manual_seed(9)) < 0.4
    masked[:, 0] = False
    with torch.no_grad():
        torch.testing.assert_close(palm.encoder(tokens[:, 1:])["encoder_out"][0].transpose(0, 1),
                                   roberta(tokens, features_only=True)[0], atol=1e-5, rtol=1e-5)
        # RoBERTa's MLM head (dense, layer norm, bias; the output weight is the shared embedding) comes along
        torch.testing.assert_close(palm(tokens[:, 1:], None, masked_tokens=masked[:, 1:])[1]["mlm_logits"],
                                   roberta(tokens, masked_tokens=masked)[0], atol=1e-5, rtol=1e-5)
    # the names of RoBERTa checkpoints before fairseq 0.10 ("decoder." for the encoder, "emb_layer_norm"), as the
    # published roberta.base of 2019 has them: the same model
    old = {k.replace("encoder.", "decoder.", 1).replace(".layernorm_embedding.", ".emb_layer_norm."): v
           for k, v in roberta.state_dict().items()}
    assert any(".emb_layer_norm." in k for k in old)
    torch.save({"model": old, "cfg": {"model": vars(args)}}, tmp_path / "roberta.pt")
    again = load()
    assert all(torch.equal(value, palm.state_dict()[name]) for name, value in again.state_dict().items())
    # an LM head with parameters missing is refused too, not loaded in part
    partial = {k: v for k, v in roberta.state_dict().items() if ".lm_head.layer_norm." not in k}
    torch.save({"model": partial, "cfg": {"model": vars(args)}}, tmp_path / "roberta.pt")
    with pytest.raises(ValueError, match=r'roberta.pt: its LM head does not fit PALM\'s MLM head \(Missing key\(s\) in '
                                         r'state_dict: "layer_norm.weight", "layer_norm.bias"\.\); give a checkpoint'):
        load()


def test_roberta_path_that_is_not_a_checkpoint_is_named(tmp_path):
    dictionary = make_dictionary()
    torch.save({"weights": {}}, tmp_path / "weights.pt")
    with pytest.raises(ValueError, match=r"weights\.pt: not a fairseq checkpoint \(no 'model' entry\); pass the "
                                         r"model\.pt of a RoBERTa model"):
        build(dictionary, roberta_path=str(tmp_path / "weights.pt"), encoder_max_positions=64)


def test_model_call_passes_decoder_options_on():
    """Options of fairseq's decoder interface given to the model's call (``features_only``, ``alignment_layer``)
    reach the decoder: the result is what the decoder returns with them, not the default log-probabilities and
    last layer's attention."""
    model = build(seed=5, decoder_layers=2).eval()
    net = batch_maker(model.encoder.dictionary, copy_task=False, batch=2, length=5, seed=3)()["net_input"]
    with torch.no_grad():
        states, extra = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"], features_only=True,
                              alignment_layer=0)
        encoder_out = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        expected, reference = model.decoder(net["prev_output_tokens"], encoder_out=encoder_out, features_only=True,
                                            alignment_layer=0)
        _, last_layer = model.decoder(net["prev_output_tokens"], encoder_out=encoder_out)
    assert states.shape == (2, 6, 64)  # decoder states, not log-probabilities over the vocabulary
    torch.testing.assert_close(states, expected, atol=0, rtol=0)
    torch.testing.assert_close(extra["attn"][0], reference["attn"][0], atol=0, rtol=0)
    assert not torch.allclose(extra["attn"][0], last_layer["attn"][0], atol=1e-3)


def test_state_dict_upgrade_under_a_prefix():
    """fairseq upgrades a submodule's entries under its name (``name.``-prefixed keys): a PALM inside another model
    adopts the checkpoint's source format, drops the MLM head and the <mask> row there, as at the top level."""
    pretrained = build(make_dictionary(mask=True), trains_encoder_mlm=True, seed=1, no_source_bos=True)
    state = {"palm." + k: v.clone() for k, v in pretrained.state_dict().items()}
    model = finetuning_model(seed=2)
    assert model.encoder.source_bos
    model.upgrade_state_dict_named(state, "palm")
    assert not model.encoder.source_bos
    assert not any(k.startswith("palm.mlm_head.") for k in state)
    rows = len(make_dictionary(mask=False))
    torch.testing.assert_close(state["palm.encoder.embed_tokens.weight"],
                               pretrained.encoder.embed_tokens.weight[:rows], atol=0, rtol=0)
    model.load_state_dict({k[len("palm."):]: v for k, v in state.items()}, strict=True)


# auto: today's default; blocked: the default before auto, which configurations saved then hold
@pytest.mark.parametrize("impl", ["compiled", "auto", "blocked"])
def test_deprecated_compile_copy_attention_agrees_with_copy_attention_impl_compiled(caplog, impl):
    """--compile-copy-attention (deprecated) means --copy-attention-impl compiled: given with compiled or a default,
    the model is built with the compiled copy attention, not refused as a contradiction, and the one warning names
    the new option."""
    caplog.set_level(logging.WARNING, logger="palm_plugin.models.palm")
    model = build(compile_copy_attention=True, copy_attention_impl=impl)
    assert model.decoder.pointer_generator.scores_impl == "compiled"
    assert caplog.messages == ["--compile-copy-attention is deprecated: use --copy-attention-impl compiled"]


def test_reinit_encoder_refuses_roberta_path():
    with pytest.raises(ValueError, match="leave out --roberta-path"):
        finetuning_model(seed=0, reinit_encoder=True, roberta_path="model.pt")


def test_finetuning_model_drops_mlm_head_and_mask_row():
    """A pre-training checkpoint (MLM head, <mask> appended to the dictionary) loads into a fine-tuning model
    whose dictionary has no <mask>, as fairseq's BART handles it."""
    pretrained = build(make_dictionary(mask=True), trains_encoder_mlm=True)
    finetuned = build(make_dictionary(mask=False), trains_encoder_mlm=False, seed=5)
    state = {k: v.clone() for k, v in pretrained.state_dict().items()}
    finetuned.load_state_dict(state, strict=True)
    rows = len(make_dictionary(mask=False))
    torch.testing.assert_close(finetuned.encoder.embed_tokens.weight, pretrained.encoder.embed_tokens.weight[:rows])
    assert finetuned.decoder.pointer_generator.output_embedding is finetuned.encoder.embed_tokens.weight
    torch.testing.assert_close(
        finetuned.decoder.layers[0].fc1.weight, pretrained.decoder.layers[0].fc1.weight
    )


def test_source_position_markers_share_the_unk_embedding_and_can_be_copied():
    dictionary = make_dictionary()
    for n in range(4):
        dictionary.add_symbol(f"<unk-{n}>")
    model = build(dictionary, source_position_markers=4).eval()
    marker = dictionary.index("<unk-2>")
    assert model.encoder.embed_tokens.num_embeddings == len(dictionary) - 4
    source = torch.tensor([[5, marker, 7, dictionary.eos()]])
    unk_source = source.masked_fill(source.eq(marker), dictionary.unk())
    with torch.no_grad():
        features = model.encoder(source)["encoder_out"][0]
        torch.testing.assert_close(features, model.encoder(unk_source)["encoder_out"][0])
        log_probs, _ = model(source, torch.tensor([4]), torch.tensor([[dictionary.eos(), 5]]))
    probs = log_probs.exp()
    assert probs.shape[-1] == len(dictionary)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2), atol=1e-5, rtol=0)
    assert (probs[0, :, marker] > 0).all() and (probs[0, :, dictionary.index("<unk-0>")] < 1e-30).all()
    # every word keeps its own row, the last one before the markers too; each marker reads <unk>'s
    table = model.encoder.embed_tokens
    expected = torch.cat([table.weight[: len(dictionary) - 4], table.weight[dictionary.unk()].expand(4, -1)])
    torch.testing.assert_close(table(torch.arange(len(dictionary))), expected, atol=0, rtol=0)



def test_mask_after_the_source_position_markers_is_refused():
    """The markers are the last rows of the dictionary and have no embedding row of their own: a <mask> listed
    after them would have none either."""
    dictionary = make_dictionary(mask=False)
    for n in range(2):
        dictionary.add_symbol(f"<unk-{n}>")
    dictionary.add_symbol("<mask>")
    with pytest.raises(ValueError, match=r"<mask> \(index 30\) comes after the 2 source position markers"):
        build(dictionary, source_position_markers=2)


def test_a_target_dictionary_other_than_the_source_one_is_refused_with_what_to_do():
    """PALM ties its encoder's, decoder's and copy layer's embeddings: a task whose target side was binarized with
    another dictionary is refused, saying how to binarize; the same symbols loaded twice (fairseq's translation task
    reads dict.src.txt and dict.tgt.txt apart) build, with the one embedding."""
    args = argparse.Namespace(dropout=0.0)
    palm_tiny(args)
    cfg = PalmConfig.from_namespace(args)
    other = make_dictionary()
    other.add_symbol("w-target-only")
    with pytest.raises(ValueError) as refused:
        PalmModel.build_model(cfg, argparse.Namespace(source_dictionary=make_dictionary(), target_dictionary=other))
    assert str(refused.value) == ("PALM shares one embedding between source and target: binarize both sides with the "
                                  "same dictionary (fairseq-preprocess --joined-dictionary or --srcdict/--tgtdict "
                                  "with one file)")
    model = PalmModel.build_model(cfg, argparse.Namespace(source_dictionary=make_dictionary(),
                                                          target_dictionary=make_dictionary()))
    assert model.decoder.pointer_generator.output_embedding is model.encoder.embed_tokens.weight
    # the decoder's dictionary (fairseq's FairseqDecoder.dictionary, which scripts read hypotheses out with) is that
    # one dictionary: ids 5 6 7 are the words make_dictionary added second to fourth, after fairseq's 4 specials
    assert model.decoder.dictionary.string(torch.tensor([5, 6, 7])) == "w1 w2 w3"


def test_fine_tuning_tasks_of_fairseq_get_no_mlm_head():
    """fairseq's translation task knows nothing of PALM's MLM head: without the task's say-so there is none."""
    args = argparse.Namespace(dropout=0.0)
    palm_tiny(args)
    dictionary = make_dictionary()
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = PalmModel.build_model(PalmConfig.from_namespace(args), task)
    assert model.mlm_head is None
    # asking such a model for MLM logits says why there are none (not an AttributeError on None)
    src_tokens = torch.tensor([[5, 6, 7, dictionary.eos()]])
    with pytest.raises(ValueError, match=r"^this PALM model has no MLM head: it is built only for the "
                                         r"continuation_pair task$"):
        model(src_tokens, torch.tensor([4]), masked_tokens=src_tokens.eq(6))


def test_copy_attention_dim_sets_the_size_of_w_m_and_w_s():
    model = build(copy_attention_dim=24)
    copy = model.decoder.pointer_generator
    assert copy.memory_projection.weight.shape == (24, 64) and copy.query_projection.weight.shape == (24, 64)


@pytest.mark.parametrize("return_fc", [False, True])
@pytest.mark.parametrize("return_all_hiddens", [False, True])
def test_one_padding_check_encoder_returns_what_fairseqs_encoder_returns(return_all_hiddens, return_fc):
    """--syncs-at-start's encoder (one host sync) against fairseq's forward: every field of the output, the
    per-layer states and given token embeddings included. ``return_fc``: layers as fairseq's
    TransformerEncoderBase(..., return_fc=True) builds them, returning ``(x, fc_result)``."""
    model = build(seed=6).eval()
    for layer in model.encoder.layers:
        layer.return_fc = return_fc
    dictionary = model.encoder.dictionary
    tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (3, 6), generator=torch.Generator().manual_seed(9))
    tokens[:, -1] = dictionary.eos()
    tokens[1, 3:] = dictionary.pad()
    tokens[1, 2] = dictionary.eos()
    lengths = tokens.ne(dictionary.pad()).sum(1)
    embeddings = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(10))  # with <s> in front: 7 positions
    outputs = []
    with torch.no_grad():
        for one_check in (False, True):
            model.encoder.one_padding_check = one_check
            outputs.append(model.encoder(tokens, lengths, return_all_hiddens=return_all_hiddens,
                                         token_embeddings=embeddings))
    plain, one_check = outputs
    assert plain.keys() == one_check.keys()
    assert len(plain["encoder_states"]) == (3 if return_all_hiddens else 0)
    assert [fc is not None for fc in plain["fc_results"]] == [return_fc] * (2 if return_all_hiddens else 0)
    for key in plain:
        assert len(plain[key]) == len(one_check[key]), key
        for expected, value in zip(plain[key], one_check[key]):
            if expected is not None:
                torch.testing.assert_close(value, expected, atol=1e-6, rtol=0, msg=key)
    torch.testing.assert_close(one_check["encoder_embedding"][0], embeddings)


def test_option_help_documents_the_table_6_ablations():
    """The help fairseq builds for the palm model, continuation_pair task and palm_mlm_lm criterion (fairseq-train
    --help prints before a plugin's options are added, so the parser is built as fairseq-train builds it)."""
    from fairseq import options

    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data", "--user-dir", str(Path(__file__).resolve().parents[1] / "palm_plugin"),
                                         "--task", "continuation_pair", "--arch", "palm_tiny",
                                         "--criterion", "palm_mlm_lm"])
    text = " ".join(parser.format_help().split())
    for option, ablation in (("--no-copy", "- pointer-generator"), ("--reinit-encoder", "- autoencoding"),
                             ("--reinit-decoder", "- autoregression"), ("--finetune-from-model", "- pre-training")):
        assert option in text and ablation in text, (option, ablation)
    for option in ("--split-mode", "--max-source-tokens", "--max-target-tokens", "--source-position-markers",
                   "--mlm-weight", "--lm-weight", "--copy-attention-dim", "--roberta-path", "--no-source-bos"):
        assert option in text, option


def test_activation_choice_reaches_the_mlm_head_and_probabilities_sum_to_one():
    """--activation-fn relu reaches the encoder's MLM head as it reaches the layers (RoBERTa's head uses the model's
    activation); the decoder's probabilities (log_probs=False) are the exponent of its log-probabilities and sum to
    one over the extended vocabulary."""
    model = build(seed=5, activation_fn="relu").eval()
    below_zero = torch.tensor([-1.0, 2.0])
    assert model.mlm_head.activation_fn(below_zero).tolist() == [0.0, 2.0]
    dictionary = model.encoder.dictionary
    sample = batch_maker(dictionary, copy_task=True, batch=2, length=5, seed=1)()
    with torch.no_grad():
        net = sample["net_input"]
        output = model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
        probs = model.get_normalized_probs(output, log_probs=False)
        log_probs = model.get_normalized_probs(output, log_probs=True)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:2]))
    torch.testing.assert_close(probs, log_probs.exp())


def test_source_bos_layout_and_truncation():
    """The encoder reads '<s> source </s>' right-padded whatever the batch's padding side, exactly as a model
    without source_bos reads the sources with <s> written in; a source of the full position budget loses the
    token before its </s>."""
    model = build(seed=6).eval()
    plain = build(seed=6, no_source_bos=True).eval()
    dictionary = model.encoder.dictionary
    pad, bos, eos = dictionary.pad(), dictionary.bos(), dictionary.eos()
    left = torch.tensor([[pad, pad, 5, 6, eos], [7, 8, 9, 10, eos]])
    expected = torch.tensor([[bos, 5, 6, eos, pad, pad], [bos, 7, 8, 9, 10, eos]])
    with torch.no_grad():
        read = model.encoder(left)
        reference = plain.encoder(expected)
    assert torch.equal(read["src_tokens"][0], expected)
    assert read["src_lengths"][0].view(-1).tolist() == [4, 6]  # the tokens read, <s> and </s> included
    torch.testing.assert_close(read["encoder_out"][0], reference["encoder_out"][0])
    limit = model.encoder.max_positions()
    full = torch.randint(dictionary.nspecial, 20, (1, limit))
    full[0, -1] = eos
    laid_out = model.encoder.source_layout(full, full, bos)
    assert laid_out.shape == (1, limit) and laid_out[0, 0] == bos and laid_out[0, -1] == eos
    assert torch.equal(laid_out[0, 1:-1], full[0, :-2])


def test_checkpoints_keep_their_source_format(caplog):
    """A checkpoint records whether its encoder read <s> first; loading it sets that format whatever the new
    model was configured with, and says so; a checkpoint from before the record (no entry) means no <s>."""
    import logging

    caplog.set_level(logging.INFO, logger="palm_plugin.models.palm_stacks")
    trained_without = build(seed=1, no_source_bos=True).state_dict()
    model = build(seed=2)
    caplog.clear()
    model.load_state_dict(dict(trained_without), strict=True)
    assert not model.encoder.source_bos
    assert caplog.messages == ["the checkpoint's encoder was trained without <s> first: its sources keep that format"]
    old = {k: v for k, v in build(seed=1).state_dict().items() if k != SOURCE_FORMAT}
    model = build(seed=2)
    model.load_state_dict(old, strict=True)
    assert not model.encoder.source_bos and float(model.state_dict()[SOURCE_FORMAT]) == 0
    model = build(seed=2, no_source_bos=True)
    caplog.clear()
    model.load_state_dict(build(seed=1).state_dict(), strict=True)
    assert model.encoder.source_bos
    assert caplog.messages == ["the checkpoint's encoder was trained with <s> first: its sources keep that format"]


def built_from_a_configuration_without(option):
    """A palm_tiny model, and the one fairseq builds from its configuration saved without ``option`` (as a checkpoint
    from before the option existed: fairseq builds an architecture name without the dataclass defaults), the first's
    weights loaded into it strictly."""
    from fairseq import models
    from omegaconf import OmegaConf

    trained = build(seed=1).eval()
    saved = OmegaConf.to_container(OmegaConf.structured(trained.cfg))
    del saved[option]
    saved["_name"] = "palm_tiny"
    old = models.build_model(OmegaConf.create(saved), FakeTask(trained.encoder.dictionary), from_checkpoint=True)
    old.load_state_dict(trained.state_dict(), strict=True)
    return trained, old.eval()


def test_checkpoint_configuration_from_before_source_position_markers_has_none():
    """A checkpoint saved before --source-position-markers existed has no such field, and fairseq builds its
    architecture (palm_tiny) without the dataclass defaults: no dictionary row is a marker, so every word keeps its
    embedding row and the trained weights load."""
    trained, old = built_from_a_configuration_without("source_position_markers")
    dictionary = trained.encoder.dictionary
    assert old.encoder.embed_tokens.num_embeddings == len(dictionary)
    last = torch.tensor([len(dictionary) - 1])  # <mask>, the last row: its own embedding, not <unk>'s
    torch.testing.assert_close(old.encoder.embed_tokens(last), trained.encoder.embed_tokens.weight[last], atol=0,
                               rtol=0)


def test_checkpoint_configuration_from_before_layer_norm_eps_keeps_fairseqs_epsilon():
    """A checkpoint saved before --layer-norm-eps existed has no such field, and fairseq builds an architecture
    (palm_tiny) from a saved configuration without the dataclass defaults (fairseq.models.build_model merges them for
    the model name only): its LayerNorms keep fairseq's epsilon, the one it was trained with, and it computes what
    the trained model computed."""
    from fairseq.modules import LayerNorm

    trained, old = built_from_a_configuration_without("layer_norm_eps")
    dictionary = trained.encoder.dictionary
    assert {m.eps for m in old.modules() if isinstance(m, torch.nn.LayerNorm)} == {LayerNorm(8).eps}
    pad, eos = dictionary.pad(), dictionary.eos()
    src_tokens = torch.tensor([[5, 6, 7, 8, 9, eos], [10, 11, eos, pad, pad, pad]])
    prev_output_tokens = torch.tensor([[eos, 12, 13, 14], [eos, 15, pad, pad]])
    with torch.no_grad():
        expected, _ = trained(src_tokens, torch.tensor([6, 3]), prev_output_tokens)
        got, _ = old(src_tokens, torch.tensor([6, 3]), prev_output_tokens)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
