"""The palm model in process: incremental decoding, decoder causality, learning to copy, state-dict upgrades."""
import argparse
import math
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary

from palm_plugin.criterions.palm_mlm_lm import PalmMlmLmCriterion
from palm_plugin.models.palm import PalmConfig, PalmModel, palm_tiny

WORDS = 24


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The machine's cores are shared with other test processes: oversubscribed threads make training 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    model = build(seed=3).eval()
    dictionary = model.encoder.dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    torch.manual_seed(0)
    batch, beam, steps = 2, 3, 6
    src_tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (batch, 7))
    src_tokens[1, :2] = pad  # left padding, as fairseq's translation task batches sources
    src_tokens[:, -1] = eos
    with torch.no_grad():
        encoder_out = model.encoder(src_tokens, src_lengths=src_tokens.ne(pad).sum(1))
        order = torch.arange(batch).repeat_interleave(beam)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
        history = torch.full((batch * beam, 1), eos)
        incremental_state = {}
        for step in range(steps):
            if step > 0:
                # beam search: each sentence's hypotheses are reordered (and duplicated) among themselves
                new_order = torch.cat([b * beam + torch.randint(0, beam, (beam,)) for b in range(batch)])
                model.decoder.reorder_incremental_state_scripting(incremental_state, new_order)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
                history = history.index_select(0, new_order)
            step_log_probs, _ = model.decoder(history, encoder_out=encoder_out, incremental_state=incremental_state)
            full_log_probs, _ = model.decoder(history, encoder_out=encoder_out)
            torch.testing.assert_close(step_log_probs[:, 0], full_log_probs[:, -1], atol=1e-5, rtol=0)
            next_tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (batch * beam, 1))
            history = torch.cat((history, next_tokens), dim=1)
    cached = [value for key, value in incremental_state.items() if "copy_memory" in key]
    assert len(cached) == 1 and cached[0]["memory"].shape[:2] == (batch * beam, 7)


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


def test_decoder_cannot_see_the_future_on_random_tokens():
    """i.i.d. targets independent of the source: the best possible loss is log2(16) bits on the 8 words and
    0 on the final EOS. A decoder that sees the token it predicts would fall far below that."""
    model = build(seed=1)
    lm_bits = train(model, batch_maker(model.encoder.dictionary, copy_task=False), steps=150)
    chance = 8 / 9 * math.log2(16)
    assert lm_bits > chance - 0.15, f"lm_loss {lm_bits:.3f} bits below chance {chance:.3f}: the decoder sees the future"
    assert lm_bits < chance + 0.4  # and it did learn the unigram distribution and the EOS


def test_decoder_learns_to_copy_the_source():
    model = build(seed=1)
    lm_bits = train(model, batch_maker(model.encoder.dictionary, copy_task=True), steps=150)
    assert lm_bits < 0.3, f"lm_loss {lm_bits:.3f} bits on a copy task"


def test_no_copy_ablation_has_no_copy_parameters():
    full, ablated = build(), build(no_copy=True)
    names = {name for name, _ in ablated.named_parameters()}
    assert not any(part in name for name in names for part in ("memory_projection", "query_projection", "gate"))
    extra = sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in ablated.parameters())
    assert extra == 64 * 64 + (64 * 64 + 64) + 64 + (128 + 1)  # W_m, W_s + b_c, w_c, [w_z; w_s] + b_m


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


def test_option_help_documents_the_table_6_ablations():
    """The help fairseq builds for the palm model, continuation_pair task and palm_mlm_lm criterion (fairseq-train
    --help prints before a plugin's options are added, so the parser is built as fairseq-train builds it)."""
    from fairseq import options

    parser = options.get_training_parser()
    options.parse_args_and_arch(parser, ["data", "--user-dir", str(Path(__file__).resolve().parents[1] / "palm_plugin"),
                                         "--task", "continuation_pair", "--arch", "palm_tiny",
                                         "--criterion", "palm_mlm_lm"])
    text = " ".join(parser.format_help().split())
    for option, ablation in (("--no-copy", "- pointer-generator"), ("--roberta-path", "- autoencoding"),
                             ("--stage", "- autoregression"), ("--finetune-from-model", "- pre-training")):
        assert option in text and ablation in text, (option, ablation)
    for option in ("--split-mode", "--max-source-tokens", "--max-target-tokens", "--source-position-markers",
                   "--mlm-weight", "--lm-weight", "--copy-attention-dim"):
        assert option in text, option
