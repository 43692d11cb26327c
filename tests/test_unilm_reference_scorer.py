"""fairseq-generate --score-reference for unilm: the one-pass reference scorer against the incremental decoder
forced along the reference, token by token (the probabilities beam search would compute)."""
import numpy as np
import pytest
import torch

from palm_plugin.data.symbols import PSEUDO_SYMBOL
from palm_plugin.data.token_masking import TokenMaskingPolicy
from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset
from palm_plugin.models.unilm_reference_scorer import UniLMReferenceScorer
from tests.test_unilm_decoding import ARCHS, net_input, sources, tiny_dictionary, tiny_model


def forced_decoding_log_probs(model, arch, src_tokens, references, pad):
    """log P(y_t | x, y_<t) for every reference token, one cached decoder step per token, one sentence at a time."""
    scores = []
    with torch.no_grad():
        for row, reference in enumerate(references):
            source = src_tokens[row : row + 1]
            source = source[:, : int(source.ne(pad).sum())]
            encoder_out = model.encoder(**net_input(arch, source))
            state, prev, row_scores = {}, torch.full((1, 1), model.decoder.dictionary.eos()), []
            for token in reference.tolist():
                logits, _ = model.decoder(prev, encoder_out, incremental_state=state)
                row_scores.append(torch.log_softmax(logits[0, -1].float(), -1)[token])
                prev = torch.cat([prev, torch.tensor([[token]])], dim=1)
            scores.append(torch.stack(row_scores))
    return scores


def references(dictionary, lengths, seed=3):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.cat([torch.randint(dictionary.nspecial, len(dictionary) - 2, (n - 1,), generator=generator),
                   torch.tensor([dictionary.eos()])])
        for n in lengths
    ]


@pytest.mark.parametrize("arch,placeholder", [("unilm_tiny", "<mask>"), ("unilm2_tiny", PSEUDO_SYMBOL)])
def test_scores_equal_forced_incremental_decoding(arch, placeholder):
    dictionary = tiny_dictionary()
    dictionary.add_symbol(PSEUDO_SYMBOL)
    model = tiny_model(arch, dictionary)
    model.decoder.placeholder = dictionary.index(placeholder)
    pad = dictionary.pad()
    src_tokens = sources(dictionary, [7, 4, 9])
    refs = references(dictionary, [5, 8, 3])
    sample = {"net_input": net_input(arch, src_tokens),
              "target": torch.nn.utils.rnn.pad_sequence(refs, batch_first=True, padding_value=pad)}
    _, source_segment, target_segment = ARCHS[arch]

    hypos = UniLMReferenceScorer(dictionary, source_segment, target_segment).generate([model], sample)

    expected = forced_decoding_log_probs(model, arch, src_tokens, refs, pad)
    for hypo, reference, want in zip(hypos, refs, expected):
        (best,) = hypo
        assert torch.equal(best["tokens"], reference)
        torch.testing.assert_close(best["positional_scores"], want, atol=2e-5, rtol=0)
        torch.testing.assert_close(best["score"], want.mean(), atol=2e-5, rtol=0)


def test_ensemble_averages_probabilities():
    dictionary = tiny_dictionary()
    first, second = tiny_model("unilm_tiny", dictionary, seed=0), tiny_model("unilm_tiny", dictionary, seed=1)
    src_tokens = sources(dictionary, [6, 5])
    refs = references(dictionary, [4, 4])
    sample = {"net_input": net_input("unilm_tiny", src_tokens), "target": torch.stack(refs)}
    scorer = UniLMReferenceScorer(dictionary, 4, 5)

    alone = [[h[0]["positional_scores"] for h in scorer.generate([m], sample)] for m in (first, second)]
    together = [h[0]["positional_scores"] for h in scorer.generate([first, second], sample)]

    for a, b, both in zip(*alone, together):
        torch.testing.assert_close(both, ((a.exp() + b.exp()) / 2).log(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["unilm_tiny", "unilm2_tiny"])
def test_a_pair_filling_the_positions_is_scored_and_one_token_more_refused(arch):
    """Source and reference of exactly max_positions tokens use the last row of the position table: scored as
    forced decoding scores them; one token more is refused with the lengths, before the model runs."""
    dictionary = tiny_dictionary()
    dictionary.add_symbol(PSEUDO_SYMBOL)
    model = tiny_model(arch, dictionary)
    model.decoder.placeholder = dictionary.index("<mask>" if arch == "unilm_tiny" else PSEUDO_SYMBOL)
    _, source_segment, target_segment = ARCHS[arch]
    scorer = UniLMReferenceScorer(dictionary, source_segment, target_segment)
    limit = model.max_positions()
    src_tokens = sources(dictionary, [limit - 5])
    fits, longer = references(dictionary, [5]), references(dictionary, [6])
    (best,), = scorer.generate([model], {"net_input": net_input(arch, src_tokens), "target": fits[0][None]})
    # at the last position decoding leaves only [EOS], with the model's own probability (as fairseq at max_len)
    (want,) = forced_decoding_log_probs(model, arch, src_tokens, fits, dictionary.pad())
    torch.testing.assert_close(best["positional_scores"], want, atol=2e-5, rtol=0)
    sample = {"net_input": net_input(arch, src_tokens), "target": longer[0][None]}
    with pytest.raises(ValueError, match=f"a source and reference of {limit + 1} tokens exceed the model's {limit} "):
        scorer.generate([model], sample)


class _Sentences(list):
    """A fairseq indexed dataset's interface (items and sizes) over tensors."""

    @property
    def sizes(self):
        return np.array([len(item) for item in self])


def test_scores_equal_the_training_layout_with_one_token_masked():
    """UniLM v1 fine-tunes with target tokens masked in place ([SOS] S1 [EOS] S2' [EOS], seq2seq mask). With only
    token i masked, training predicts it from the source and y_<i, the condition decoding and the scorer use: the
    scorer's log-probability of every reference token equals the training layout's, built by the task's collater.
    (So what fine-tuning optimises, with one mask, is exactly what --score-reference measures.)"""
    arch = "unilm_tiny"
    dictionary = tiny_dictionary()
    model = tiny_model(arch, dictionary)
    mask, pad = dictionary.index("<mask>"), dictionary.pad()
    model.decoder.placeholder = mask
    _, source_segment, target_segment = ARCHS[arch]
    src_tokens = sources(dictionary, [7, 4, 9])
    refs = references(dictionary, [5, 8, 3])
    bodies = [row[1:int(row.ne(pad).sum()) - 1] for row in src_tokens]  # binarized S1 [EOS], without [SOS]
    dataset = UniLMSeq2SeqDataset(
        _Sentences(torch.cat([b, torch.tensor([dictionary.eos()])]) for b in bodies), _Sentences(refs), dictionary,
        64, 64, TokenMaskingPolicy(), mask, source_segment, target_segment, seed=1,
    )
    sample = {"net_input": net_input(arch, src_tokens),
              "target": torch.nn.utils.rnn.pad_sequence(refs, batch_first=True, padding_value=pad)}
    hypos = UniLMReferenceScorer(dictionary, source_segment, target_segment).generate([model], sample)
    for index, (hypo, reference) in enumerate(zip(hypos, refs)):
        source = dataset[index]["source"].numpy()
        items = []
        for i in range(len(reference)):
            noised = reference.numpy().copy()
            noised[i] = mask
            labels = np.full(len(source) + len(reference), pad)
            labels[len(source) + i] = reference[i]
            items.append({"source": source, "packed": np.concatenate([source, noised]), "labels": labels})
        batch = dataset.training_batch(items)
        predicted = batch["target"].ne(pad)
        with torch.no_grad():
            logits, _ = model(**batch["net_input"], masked_tokens=predicted)
        training = torch.log_softmax(logits.float(), -1).gather(1, batch["target"][predicted].unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(hypo[0]["positional_scores"], training, atol=2e-5, rtol=0)


@pytest.mark.parametrize("arch", ["unilm_tiny", "unilm2_tiny"])
def test_at_the_last_position_decoding_keeps_only_eos_with_its_own_probability(arch):
    """A hypothesis reaching the model's last position can only end; as fairseq's generator does at max_len, every
    other token gets probability 0 and [EOS] keeps the model's own log-probability (not 0, which would favour the
    hypotheses cut off); a step before it, nothing is masked."""
    dictionary = tiny_dictionary()
    dictionary.add_symbol(PSEUDO_SYMBOL)
    model = tiny_model(arch, dictionary).eval()
    model.decoder.placeholder = dictionary.index("<mask>" if arch == "unilm_tiny" else PSEUDO_SYMBOL)
    limit, eos = model.max_positions(), dictionary.eos()
    source = sources(dictionary, [limit - 5])
    reference = references(dictionary, [5])[0]
    with torch.no_grad():
        encoder_out = model.encoder(**net_input(arch, source))
        state, prev = {}, torch.full((1, 1), eos)
        for step, token in enumerate(reference.tolist()):
            net_output = model.decoder(prev, encoder_out, incremental_state=state)
            log_probs = model.get_normalized_probs(net_output, log_probs=True)[0, -1]
            own = torch.log_softmax(net_output[0][0, -1].float(), -1)
            ends = bool(net_output[1]["ends"][0])
            assert ends == (step == len(reference) - 1)  # the reference's [EOS] sits at the last position
            if ends:
                assert torch.isinf(log_probs[torch.arange(len(own)) != eos]).all()
                torch.testing.assert_close(log_probs[eos], own[eos], atol=1e-6, rtol=0)
                assert own[eos] < -1e-3  # a real probability below 1: the masking did not happen before the softmax
            else:
                torch.testing.assert_close(log_probs, own, atol=1e-6, rtol=0)
            prev = torch.cat([prev, torch.tensor([[token]])], dim=1)
