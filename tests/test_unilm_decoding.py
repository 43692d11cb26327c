"""Decoding UniLM with fairseq's generator: the cached incremental decoder against full recomputation."""
import argparse

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator

from palm_plugin.models.unilm import UniLMConfig, UniLMModel, unilm2_tiny, unilm_tiny
from palm_plugin.modules import fixed_shape_decoding
from palm_plugin.modules.attention_masks import Objective
from tests.conftest import REPO, binarize_pairs

ARCHS = {"unilm_tiny": (unilm_tiny, 4, 5), "unilm2_tiny": (unilm2_tiny, 0, 1)}


def tiny_dictionary(words=30):
    dictionary = Dictionary()
    for index in range(words):
        dictionary.add_symbol(f"w{index}")
    dictionary.add_symbol("<mask>")
    return dictionary


def tiny_model(arch, dictionary, seed=0):
    torch.manual_seed(seed)
    namespace = argparse.Namespace()
    ARCHS[arch][0](namespace)
    cfg = UniLMConfig.from_namespace(namespace)
    model = UniLMModel.build_model(cfg, argparse.Namespace(source_dictionary=dictionary))
    with torch.no_grad():  # larger random weights than BERT's init, so that predictions differ clearly per context
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.15)
    return model.eval()


def sources(dictionary, lengths, seed=1):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths)), dictionary.pad())
    for row, length in enumerate(lengths):
        body = torch.randint(dictionary.nspecial, len(dictionary) - 1, (length - 2,), generator=generator)
        tokens[row, :length] = torch.cat([torch.tensor([dictionary.bos()]), body, torch.tensor([dictionary.eos()])])
    return tokens


def net_input(arch, src_tokens):
    _, source_segment, target_segment = ARCHS[arch]
    return {
        "src_tokens": src_tokens,
        "src_lengths": src_tokens.ne(1).sum(1),
        "source_segments": torch.full_like(src_tokens, source_segment),
        "target_segment": torch.full((src_tokens.size(0),), target_segment),
    }


@pytest.mark.parametrize("graph", [False, True], ids=["growing_cache", "fixed_shape"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_cached_steps_equal_recomputation_through_beam_reorders_and_batch_shrinking(arch, graph, monkeypatch):
    """The growing cache, and --decoding-graph's fixed-shape steps (run eagerly on the CPU; its buffer of 2 slots
    doubles twice here), equal recomputation step by step; UniLMv2's cached steps read the relative bias of every
    offset that the encoder computed once per batch, never computing it again."""
    monkeypatch.setattr(fixed_shape_decoding, "INITIAL_SLOTS", 2)
    dictionary = tiny_dictionary()
    model = tiny_model(arch, dictionary)
    model.decoder.decoding_graph = graph
    tables = []
    bias_table = model.stack.bias_table
    monkeypatch.setattr(model.stack, "bias_table", lambda: tables.append(bias_table()) or tables[-1])
    src = sources(dictionary, [7, 4, 5])
    beam = 3
    with torch.no_grad():
        encoder_out = model.encoder(**net_input(arch, src))
        assert tables and (tables[-1] is not None) == (arch == "unilm2_tiny")  # the encoder's, once a batch
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, torch.arange(3).repeat_interleave(beam))
        source_keys = encoder_out["source_keys"][0]
        assert source_keys.size(0) == 3  # once per sentence, not per beam
        state = {}
        prev = torch.full((3 * beam, 1), dictionary.eos())
        generator = torch.Generator().manual_seed(2)
        for step in range(6):
            computed = len(tables)
            cached, _ = model.decoder(prev, encoder_out, incremental_state=state)
            assert len(tables) == computed
            recomputed, _ = model.decoder(prev, encoder_out)
            torch.testing.assert_close(
                torch.log_softmax(cached, -1), torch.log_softmax(recomputed, -1), atol=1e-5, rtol=0
            )
            rows = prev.size(0)
            sentences = rows // beam
            # Beams reordered within their sentence, as the generator does.
            order = (torch.randint(beam, (sentences, beam), generator=generator) + torch.arange(sentences).view(-1, 1) * beam).view(-1)
            if step == 3:  # the first sentence finishes: the batch shrinks
                order = order.view(sentences, beam)[1:].reshape(-1)
            next_tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (rows, 1), generator=generator)
            prev = torch.cat([prev, next_tokens], dim=1)[order]
            model.decoder.reorder_incremental_state_scripting(state, order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            if step < 3:  # reordering beams never copies the source cache
                assert encoder_out["source_keys"][0].data_ptr() == source_keys.data_ptr()
        assert encoder_out["source_keys"][0].size(0) == 2 and encoder_out["rows_per_source"] == [beam]
        if graph:
            assert model.decoder.get_incremental_state(state, "fixed_shape")["step"].cache.size(4) == 8



@pytest.mark.parametrize("arch", list(ARCHS))
def test_rows_not_grouped_by_sentence_still_read_their_own_source(arch):
    """A reorder whose rows do not form equal groups per sentence (the generator's beams always do; other callers
    need not) falls back to one source cache per row; further reorders and cached steps stay exact."""
    dictionary = tiny_dictionary()
    model = tiny_model(arch, dictionary)
    src = sources(dictionary, [7, 4, 5])
    with torch.no_grad():
        encoder_out = model.encoder(**net_input(arch, src))
        state, prev = {}, torch.full((3, 1), dictionary.eos())
        for order in (torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([5, 0, 2, 2])):
            if prev.size(0) == 3:
                prev = prev[order]
            else:
                prev = torch.cat([prev, torch.full_like(prev, 7)], dim=1)[order]
                model.decoder.reorder_incremental_state_scripting(state, order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            cached, _ = model.decoder(prev, encoder_out, incremental_state=state)
            recomputed, _ = model.decoder(prev, encoder_out)
            torch.testing.assert_close(torch.log_softmax(cached, -1), torch.log_softmax(recomputed, -1), atol=1e-5,
                                       rtol=0)
        # rows 5, 0, 2, 2 of [0, 0, 1, 2, 2, 2] read sentences 2, 0, 1, 1: the same as a fresh encoding of those
        fresh = model.encoder(**net_input(arch, src[[2, 0, 1, 1]]))
        torch.testing.assert_close(model.decoder(prev, encoder_out)[0], model.decoder(prev, fresh)[0], atol=1e-5,
                                   rtol=0)


def greedy_by_training_forward(model, dictionary, arch, src, steps):
    """Greedy decoding written with the training forward only (objective SEQ2SEQ, packed rows, no cache)."""
    _, source_segment, target_segment = ARCHS[arch]
    outputs = []
    for row in src:
        source = row[row.ne(dictionary.pad())]
        target = []
        for _ in range(steps):
            packed = torch.cat([source, torch.tensor(target + [dictionary.index("<mask>")], dtype=torch.long)])
            segments = torch.tensor([source_segment] * len(source) + [target_segment] * (len(target) + 1))
            logits, _ = model(
                packed[None], segment_ids=segments[None], objectives=torch.tensor([int(Objective.SEQ2SEQ)]),
                source_lengths=torch.tensor([len(source)]),
            )
            target.append(int(logits[0, -1].argmax()))
            if target[-1] == dictionary.eos():
                break
        outputs.append(target)
    return outputs


@pytest.mark.parametrize("graph", [False, True], ids=["growing_cache", "fixed_shape"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_decoding_makes_its_tensors_on_the_inputs_device_not_torchs_default(arch, graph):
    """Encoding, cached steps and full recomputation put every tensor they make (positions, masks, caches) on the
    device of their inputs: a model on a GPU while torch's default device is the CPU must not mix the two. Here the
    inputs stay on the CPU and the default device is "meta", which no tensor of the model may land on: the results
    are those under the CPU default."""
    dictionary = tiny_dictionary()
    model = tiny_model(arch, dictionary)
    model.decoder.decoding_graph = graph
    inputs = net_input(arch, sources(dictionary, [7, 4, 5]))
    with torch.no_grad():
        results = []
        for default in ("cpu", "meta"):
            prev = torch.tensor([[dictionary.eos()]] * 3)
            state, steps = {}, []
            with torch.device(default):
                encoder_out = model.encoder(**inputs)
                for token in (9, 12):
                    cached, _ = model.decoder(prev, encoder_out, incremental_state=state)
                    recomputed, _ = model.decoder(prev, encoder_out)
                    steps += [cached, recomputed]
                    prev = torch.cat([prev, torch.tensor([[token], [token + 1], [token + 2]], device="cpu")], dim=1)
            results.append(steps)
    for on_cpu, under_meta in zip(*results):
        assert under_meta.device == torch.device("cpu")
        torch.testing.assert_close(under_meta, on_cpu, atol=0, rtol=0)


@pytest.mark.parametrize("graph", [False, True], ids=["growing_cache", "fixed_shape"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_generator_with_cache_matches_recomputation_and_the_training_forward(arch, graph):
    dictionary = tiny_dictionary()
    model = tiny_model(arch, dictionary, seed=3)
    model.decoder.decoding_graph = graph
    src = sources(dictionary, [6, 9, 4], seed=4)
    sample = {"net_input": net_input(arch, src)}
    with torch.no_grad():
        greedy = SequenceGenerator([model], dictionary, beam_size=1, max_len_b=8)
        cached = greedy.generate([model], sample)
        expected = greedy_by_training_forward(model, dictionary, arch, src, steps=8)
        for hypotheses, reference in zip(cached, expected):
            tokens = hypotheses[0]["tokens"].tolist()
            assert tokens[: len(reference)] == reference

        for options in ({"beam_size": 3}, {"beam_size": 4, "no_repeat_ngram_size": 2, "min_len": 3, "len_penalty": 1.5}):
            beam = SequenceGenerator([model], dictionary, max_len_b=8, **options)
            with_cache = beam.generate([model], sample)
            beam.model.has_incremental = False  # the generator then re-runs the decoder on the whole prefix
            without_cache = beam.generate([model], sample)
            for ours, reference in zip(with_cache, without_cache):
                assert [h["tokens"].tolist() for h in ours] == [h["tokens"].tolist() for h in reference]
                for a, b in zip(ours, reference):
                    torch.testing.assert_close(a["positional_scores"], b["positional_scores"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_decoding_a_batch_without_segments_names_the_task_to_use(arch):
    """A batch from a task that gives no segment ids (fairseq's translation: src_tokens and src_lengths only) stops
    with the message the user sees, word for word, naming the missing inputs and the task that provides them."""
    dictionary = tiny_dictionary()
    model = tiny_model(arch, dictionary)
    src = sources(dictionary, [6, 4])
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}
    generator = SequenceGenerator([model], dictionary, beam_size=2, max_len_b=4)
    with pytest.raises(ValueError) as raised, torch.no_grad():
        generator.generate([model], sample)
    assert str(raised.value) == ("UniLM decoding needs source_segments and target_segment in net_input; "
                                 "use --task unilm_seq2seq")


def copy_data(directory, lines_per_split, seed=0):
    generator = torch.Generator().manual_seed(seed)
    raw = directory / "raw"
    raw.mkdir()
    for split, count in lines_per_split.items():
        rows = []
        for _ in range(count):
            length = int(torch.randint(3, 7, (1,), generator=generator))
            rows.append(" ".join(f"w{int(i)}" for i in torch.randint(12, (length,), generator=generator)))
        for side in ("src", "tgt"):
            (raw / f"{split}.{side}").write_text("\n".join(rows) + "\n")
    return raw


@pytest.mark.slow
def test_fairseq_preprocess_train_generate_end_to_end(tmp_path, cli):
    raw = copy_data(tmp_path, {"train": 64, "valid": 16, "test": 10})
    data = tmp_path / "bin"
    binarize_pairs(data, raw / "train", raw / "valid", raw / "test")
    task = ["--user-dir", REPO / "palm_plugin", "--task", "unilm_seq2seq", "--cpu", "--max-source-positions", "10",
            "--max-target-positions", "5"]
    train = cli("fairseq-train", data, *task, "--arch", "unilm_tiny", "--criterion", "unilm_cloze", "--label-smoothing",
                "0.1", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "16", "--max-epoch", "2", "--save-dir",
                tmp_path / "ckpt", "--no-epoch-checkpoints", "--mask-prob", "0.5", "--log-format", "simple")
    log = train.stdout + train.stderr
    assert "truncated 0 sources" in log and "targets to --max-target-positions 5" in log
    result = cli("fairseq-generate", data, *task, "--path", tmp_path / "ckpt" / "checkpoint_last.pt", "--gen-subset",
                 "test", "--beam", "3", "--nbest", "2", "--lenpen", "1.2", "--min-len", "2", "--max-len-b", "6",
                 "--no-repeat-ngram-size", "2", "--batch-size", "8", "--required-batch-size-multiple", "1")
    hypotheses = [line.split("\t") for line in result.stdout.splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 20  # 10 sentences x nbest 2
    for _, _, text in hypotheses:
        words = text.split()
        assert 2 <= len(words) <= 6
        bigrams = list(zip(words, words[1:]))
        assert len(bigrams) == len(set(bigrams))
    references = [line for line in result.stdout.splitlines() if line.startswith("T-")]
    assert len(references) == 10 and all(len(r.split("\t")[1].split()) >= 3 for r in references)  # not truncated


def test_no_repeat_ngram_blocking_sees_the_generated_prefix():
    """fairseq's CPU blocker reads the end of the whole buffer (padding) and blocks nothing (fairseq #5206);
    the plugin installs one that reads the generated prefix."""
    from fairseq.ngram_repeat_block import NGramRepeatBlock

    from palm_plugin.fixes.ngram_repeat_block import PrefixNGramRepeatBlock

    a, b, pad = 4, 5, 1
    buffer = torch.tensor([[2, a, b, a] + [pad] * 4])  # generated: a b a; step 3 chooses the 5th token
    blocked = PrefixNGramRepeatBlock(2, use_extension=False)(buffer, torch.zeros(1, 8), 1, 1, step=3)
    assert blocked[0, b] == float("-inf") and (blocked[0, torch.arange(8) != b] == 0).all()  # "a b" seen: no b
    unfixed = NGramRepeatBlock(2, use_extension=False)(buffer, torch.zeros(1, 8), 1, 1, step=3)
    assert (unfixed == 0).all()
