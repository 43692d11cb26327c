"""UniLMv2 fine-tuning (``unilm_seq2seq --pseudo-masks``): the packed [source | target | pseudo] batch, its
equality with cached decoding from a [P] placeholder, leakage by perturbation, and fairseq end to end."""
import argparse

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary
from omegaconf import OmegaConf

from palm_plugin.data.symbols import MASK_SYMBOL, PSEUDO_SYMBOL
from palm_plugin.data.pseudo_seq2seq_dataset import PseudoSeq2SeqDataset
from palm_plugin.data.token_masking import TokenMaskingPolicy
from palm_plugin.models.unilm import UniLMConfig, UniLMModel, unilm2_tiny
from palm_plugin.modules.attention_masks import mask_from_fields, pseudo_seq2seq_mask
from tests.conftest import REPO, binarize_pairs

SOURCE_SEGMENT, TARGET_SEGMENT = 0, 1


def make_dictionary(words=30):
    dictionary = Dictionary()
    for index in range(words):
        dictionary.add_symbol(f"w{index}")
    dictionary.add_symbol(MASK_SYMBOL)
    dictionary.add_symbol(PSEUDO_SYMBOL)
    return dictionary


class Sentences(torch.utils.data.Dataset):
    """Binarized sentences as fairseq's indexed datasets give them: token ids ending with [EOS]."""

    def __init__(self, dictionary, lengths, seed):
        rng = np.random.default_rng(seed)
        self.items = [
            torch.tensor([*rng.integers(dictionary.nspecial, dictionary.nspecial + 30, n - 1), dictionary.eos()])
            for n in lengths
        ]
        self.sizes = np.array(lengths)

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self):
        return len(self.items)


def make_dataset(dictionary, noise=TokenMaskingPolicy(mask_prob=0.5, mask_token_prob=0.0, random_token_prob=0.0)):
    """Three pairs; by default the noise leaves every token unchanged (a clean target)."""
    source, target = Sentences(dictionary, [5, 8, 3], seed=0), Sentences(dictionary, [4, 2, 6], seed=1)
    return PseudoSeq2SeqDataset(
        source, target, dictionary, 64, 32, noise, dictionary.index(MASK_SYMBOL), SOURCE_SEGMENT, TARGET_SEGMENT, 7
    )


def tiny_model(dictionary, seed=0):
    torch.manual_seed(seed)
    namespace = argparse.Namespace(decoding_placeholder=PSEUDO_SYMBOL)
    unilm2_tiny(namespace)
    model = UniLMModel.build_model(UniLMConfig.from_namespace(namespace), argparse.Namespace(source_dictionary=dictionary))
    with torch.no_grad():  # larger weights than BERT's init, so that each context gives clearly different logits
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.15)
    return model.eval()


def seq2seq_task(folder, dictionary, **options):
    """A unilm_seq2seq task over ``dictionary`` (saved in ``folder`` as its two sides'), --pseudo-masks and segments
    0 / 1 unless ``options`` say otherwise."""
    from palm_plugin.tasks.unilm_seq2seq import UniLMSeq2SeqConfig, UniLMSeq2SeqTask

    for lang in ("src", "tgt"):
        dictionary.save(str(folder / f"dict.{lang}.txt"))
    options = {"pseudo_masks": True, "source_segment": 0, "target_segment": 1, "seed": 1, **options}
    return UniLMSeq2SeqTask.setup_task(UniLMSeq2SeqConfig(data=str(folder), **options))


def tiny_model_config():
    """unilm2_tiny's configuration as fairseq-train hands it to a task's build_model."""
    namespace = argparse.Namespace()
    unilm2_tiny(namespace)
    cfg = UniLMConfig.from_namespace(namespace)
    cfg._name = "unilm"
    return OmegaConf.structured(cfg)


def generation_batch(dataset, indices):
    """The generation view of the same pairs (what fairseq-generate gets once the task built its generator)."""
    dataset.generation = True
    try:
        return dataset.collater([dataset[i] for i in indices])
    finally:
        dataset.generation = False



def test_generation_dataset_built_by_the_task_is_the_parents_generation_view():
    """The task builds its generation datasets with ``generation=True`` (fairseq-generate, the Python API): the
    pseudo-mask dataset must pass it on, giving the parent class's source-only batches and sizes."""
    from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset

    dictionary = make_dictionary()
    source, target = Sentences(dictionary, [5, 8, 3], seed=0), Sentences(dictionary, [4, 2, 6], seed=1)
    arguments = (source, target, dictionary, 64, 32, TokenMaskingPolicy(mask_prob=0.5), dictionary.index(MASK_SYMBOL),
                 SOURCE_SEGMENT, TARGET_SEGMENT, 7)
    ours, parent = PseudoSeq2SeqDataset(*arguments, generation=True), UniLMSeq2SeqDataset(*arguments, generation=True)
    assert ours.generation and list(ours.sizes) == list(parent.sizes)
    batch, expected = (d.collater([d[i] for i in range(3)]) for d in (ours, parent))
    assert batch.keys() == expected.keys() and batch["net_input"].keys() == expected["net_input"].keys()
    for name, value in [*batch["net_input"].items(), ("target", batch["target"])]:
        assert torch.equal(value, expected["net_input"].get(name, expected["target"])), name
    assert list(make_dataset(dictionary).sizes) == [s + 2 * t for s, t in zip(parent.source_sizes, parent.target_sizes)]



def test_training_batches_are_ordered_by_length_in_a_seeded_shuffle():
    from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset

    dictionary = make_dictionary()
    lengths = [5, 8, 3, 5, 8, 5]
    source, target = Sentences(dictionary, lengths, seed=0), Sentences(dictionary, [4] * 6, seed=1)
    dataset = UniLMSeq2SeqDataset(source, target, dictionary, 64, 32, TokenMaskingPolicy(mask_prob=0.5),
                                  dictionary.index(MASK_SYMBOL), SOURCE_SEGMENT, TARGET_SEGMENT, 7)
    orders = []
    for seed in range(4):
        np.random.seed(seed)
        orders.append(dataset.ordered_indices().tolist())
    for order in orders:
        assert sorted(order) == list(range(6)) and (np.diff(dataset.sizes[order]) >= 0).all()
    assert len({tuple(order) for order in orders}) > 1


def test_training_examples_of_one_length_keep_the_seeded_shuffles_order():
    """fairseq's convention: the shuffle drawn from numpy's seed, then a stable sort by length, so that examples of one
    length are batched in the shuffled order. Hundreds of one length: numpy's default argsort is unstable at that
    size and would reorder them."""
    from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset

    dictionary = make_dictionary()
    lengths = [6 + i % 2 for i in range(400)]
    source, target = Sentences(dictionary, lengths, seed=0), Sentences(dictionary, [4] * len(lengths), seed=1)
    dataset = UniLMSeq2SeqDataset(source, target, dictionary, 64, 32, TokenMaskingPolicy(mask_prob=0.5),
                                  dictionary.index(MASK_SYMBOL), SOURCE_SEGMENT, TARGET_SEGMENT, 7)
    np.random.seed(3)
    shuffled = np.random.permutation(len(lengths)).tolist()
    np.random.seed(3)
    assert dataset.ordered_indices().tolist() == sorted(shuffled, key=lambda i: lengths[i])  # Python's sort is stable


def test_batch_layout():
    dictionary = make_dictionary()
    dataset = make_dataset(dictionary)
    samples = [dataset[i] for i in range(3)]
    batch = dataset.collater(samples)
    generation = generation_batch(dataset, range(3))
    cloze, labels = batch["net_input"], batch["target"]
    pad, pseudo = dictionary.pad(), dictionary.index(PSEUDO_SYMBOL)
    for row, sample in enumerate(samples):
        source, target = sample["source"], sample["target"]
        s, t = len(source), len(target)
        assert source[0] == dictionary.bos() and source[-1] == target[-1] == dictionary.eos()
        assert cloze["src_tokens"][row, : s + 2 * t].tolist() == source.tolist() + target.tolist() + [pseudo] * t
        assert (cloze["src_tokens"][row, s + 2 * t :] == pad).all()
        # target token i and its pseudo token share position s + i
        assert cloze["position_ids"][row, : s + 2 * t].tolist() == list(range(s + t)) + list(range(s, s + t))
        assert cloze["segment_ids"][row, : s + 2 * t].tolist() == [SOURCE_SEGMENT] * s + [TARGET_SEGMENT] * 2 * t
        # loss on the pseudo rows only, every target token once
        assert labels[row, s + t : s + 2 * t].tolist() == target.tolist()
        assert (labels[row, : s + t] == pad).all() and (labels[row, s + 2 * t :] == pad).all()
        # the generation view is the source alone
        assert generation["net_input"]["src_tokens"][row, :s].tolist() == source.tolist()
        assert generation["target"][row, :t].tolist() == target.tolist()
    lengths = [(len(x["source"]), len(x["target"])) for x in samples]
    expected_mask = pseudo_seq2seq_mask(
        torch.tensor([s for s, _ in lengths]), torch.tensor([t for _, t in lengths]), cloze["src_tokens"].eq(pad)
    )
    # the batch carries lengths only; the model builds the (B, L, L) mask from them
    assert "attention_mask" not in cloze
    built = mask_from_fields(
        cloze["src_tokens"].eq(pad), source_lengths=cloze["source_lengths"], target_lengths=cloze["target_lengths"]
    )
    assert torch.equal(built, expected_mask)
    assert batch["ntokens"] == sum(s + 2 * t for s, t in lengths)
    assert dataset.num_tokens(1) == 8 + 1 + 2 * 2  # [SOS] + source, twice the target


def test_target_noise_never_touches_pseudo_tokens_or_labels():
    dictionary = make_dictionary()
    noisy = make_dataset(dictionary, TokenMaskingPolicy(mask_prob=0.5, mask_token_prob=0.5, random_token_prob=0.5))
    pseudo, mask = dictionary.index(PSEUDO_SYMBOL), dictionary.index(MASK_SYMBOL)
    corrupted = masked = 0
    for epoch in range(1, 30):
        noisy.set_epoch(epoch)
        for index in range(3):
            sample = noisy[index]
            noised, target = sample["noised_target"], sample["target"]
            changed = noised.ne(target)
            assert int(changed.sum()) <= int(np.ceil(0.5 * len(target)))
            assert not (noised == pseudo).any()  # random replacements never draw [P]
            corrupted += int(changed.sum())
            masked += int(noised[changed].eq(mask).sum())
        batch = noisy.collater([noisy[i] for i in range(3)])
        s, t = len(noisy[0]["source"]), len(noisy[0]["target"])
        assert batch["net_input"]["src_tokens"][0, s + t : s + 2 * t].eq(pseudo).all()
        assert batch["target"][0, s + t : s + 2 * t].tolist() == noisy[0]["target"].tolist()  # clean labels
    assert corrupted > 30
    assert 0.3 < masked / corrupted < 0.7  # half of the chosen tokens become [MASK], half random ones


def test_s2s_ft_noise_fills_pseudo_slots_80_10_10_and_noises_each_target_token_independently():
    """--pseudo-mask-noise s2s_ft (Microsoft's s2s-ft, mask_way v2): every pseudo slot holds [MASK] (80%), a random
    token (10%) or the true token (10%); each target token, independently with probability target_mask_prob,
    shows its own slot's token in the history (so the count per row varies, unlike the exact default)."""
    dictionary = make_dictionary(words=200)
    rows = 40
    source, target = Sentences(dictionary, [6] * rows, seed=0), Sentences(dictionary, [25] * rows, seed=1)
    policy = TokenMaskingPolicy(mask_prob=0.3, mask_token_prob=0.8, random_token_prob=0.1)
    dataset = PseudoSeq2SeqDataset(source, target, dictionary, 64, 32, policy, dictionary.index(MASK_SYMBOL),
                                   SOURCE_SEGMENT, TARGET_SEGMENT, 7, noise="s2s_ft")
    mask, pseudo = dictionary.index(MASK_SYMBOL), dictionary.index(PSEUDO_SYMBOL)
    slots, truths, histories, changed_per_row, partly_shown = [], [], [], [], []
    for epoch in range(1, 6):
        dataset.set_epoch(epoch)
        batch = dataset.collater([dataset[i] for i in range(rows)])
        tokens, labels = batch["net_input"]["src_tokens"], batch["target"]
        for row in range(rows):
            s, n = int(batch["net_input"]["source_lengths"][row]), int(batch["net_input"]["target_lengths"][row])
            truth = labels[row, s + n : s + 2 * n]
            slot, history = tokens[row, s + n : s + 2 * n], tokens[row, s : s + n]
            slots.append(slot), truths.append(truth), histories.append(history)
            changed_per_row.append(int(history.ne(truth).sum()))
            noisable = slot.ne(truth)  # the tokens whose own slot differs from them: shown or not, one by one
            partly_shown.append(0 < int(history[noisable].ne(truth[noisable]).sum()) < int(noisable.sum()))
    slot, truth, history = torch.cat(slots), torch.cat(truths), torch.cat(histories)
    total = len(slot)  # 5000 target tokens
    assert abs(float(slot.eq(mask).float().mean()) - 0.8) < 0.03
    assert abs(float(slot.eq(truth).float().mean()) - 0.1) < 0.02
    random = slot.ne(mask) & slot.ne(truth)
    assert abs(float(random.float().mean()) - 0.1) < 0.02
    assert not slot.eq(pseudo).any() and (slot[random] >= dictionary.nspecial).all()
    # the history shows either the true token or the token of its own slot
    assert bool((history.eq(truth) | history.eq(slot)).all())
    noised = slot.ne(truth)
    assert abs(float(history[noised].ne(truth[noised]).float().mean()) - 0.3) < 0.03
    assert len(set(changed_per_row)) > 3  # binomial counts, not ceil(p * n) every time
    # a draw per token, not one per row: all or none of a row's ~22 noisable tokens has probability 0.7^22 + 0.3^22
    assert sum(partly_shown) >= 0.95 * len(partly_shown)
    assert total == 5 * rows * 25


def test_decoding_placeholder_follows_the_noise_scheme(tmp_path):
    """The decoder feeds the symbol the pseudo slots held in training: <pseudo> (exact) or [MASK] (s2s_ft)."""
    for noise, symbol in (("exact", PSEUDO_SYMBOL), ("s2s_ft", MASK_SYMBOL)):
        task = seq2seq_task(tmp_path, make_dictionary(), pseudo_mask_noise=noise)
        model = task.build_model(tiny_model_config())
        assert model.decoder.placeholder == task.dictionary.index(symbol)
        # the task's training data fills the pseudo slots by the same scheme (s2s_ft: [MASK] 80%, never <pseudo>)
        dataset = task._dataset(Sentences(task.dictionary, [5, 8], 0), Sentences(task.dictionary, [9, 12], 1))
        batch = dataset.collater([dataset[0], dataset[1]])
        slots = batch["net_input"]["src_tokens"][batch["target"].ne(task.dictionary.pad())]
        assert slots.eq(model.decoder.placeholder).float().mean() >= 0.5
        assert slots.eq(task.dictionary.index(PSEUDO_SYMBOL)).all() == (noise == "exact")


@pytest.mark.parametrize("segments", [(1, 0), (0, 0), (1, 1), (0, 2), (2, 1), (-1, 1), (0, -1)])
def test_segments_are_any_two_of_the_models_segment_types(tmp_path, segments):
    """--source-segment and --target-segment may be any of the model's segment types (0 and 1 of a UniLMv2 or BERT
    model), in either order or the same one; one past them stops fairseq-train with what to give."""
    source, target = segments
    task = seq2seq_task(tmp_path, make_dictionary(), source_segment=source, target_segment=target)
    cfg = tiny_model_config()
    assert cfg.num_segments == 2
    if all(0 <= segment < 2 for segment in segments):
        assert task.build_model(cfg).cfg.num_segments == 2
        return
    with pytest.raises(ValueError) as refused:
        task.build_model(cfg)
    assert str(refused.value) == (f"--source-segment {source} / --target-segment {target} do not fit the model's 2 "
                                  "segment types (UniLMv2 and BERT checkpoints: --source-segment 0 --target-segment 1)")


def decode_step_logits(model, batch, dictionary, cached):
    """Logits (B, T, V) of target token i given y_<i, from the model's decoder (placeholder [P])."""
    targets = [t[t.ne(dictionary.pad())] for t in batch["target"]]
    steps = max(len(t) for t in targets)
    prefix = torch.full((len(targets), steps), dictionary.pad())
    for row, target in enumerate(targets):
        prefix[row, : len(target)] = target
    encoder_out = model.encoder(**batch["net_input"])
    state = {} if cached else None
    outputs = []
    for step in range(steps):
        prev = torch.cat([torch.full((len(targets), 1), dictionary.eos()), prefix[:, :step]], dim=1)
        logits, _ = model.decoder(prev, encoder_out, incremental_state=state)
        outputs.append(logits[:, -1])
    return torch.stack(outputs, dim=1)


def test_training_forward_equals_cached_and_recomputed_decoding():
    """Pseudo row i of the training layout computes exactly what the decoder computes at step i from a [P]
    placeholder after y_<i, with its cache and without it (relative position bias included)."""
    dictionary = make_dictionary()
    model = tiny_model(dictionary)
    dataset = make_dataset(dictionary)
    training = dataset.collater([dataset[i] for i in range(3)])
    batch = generation_batch(dataset, range(3))
    with torch.no_grad():
        training_logits, _ = model(**training["net_input"])
        cached = decode_step_logits(model, batch, dictionary, cached=True)
        recomputed = decode_step_logits(model, batch, dictionary, cached=False)
    for row in range(3):
        s = int(batch["net_input"]["src_lengths"][row])
        t = int(batch["target"][row].ne(dictionary.pad()).sum())
        pseudo_rows = training_logits[row, s + t : s + 2 * t]
        torch.testing.assert_close(cached[row, :t], pseudo_rows, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(recomputed[row, :t], pseudo_rows, atol=1e-4, rtol=1e-4)
        assert (pseudo_rows[1:] - pseudo_rows[:-1]).abs().amax() > 1e-2  # the rows really differ


def test_changing_target_token_j_changes_only_pseudo_rows_after_j():
    dictionary = make_dictionary()
    model = tiny_model(dictionary, seed=5)
    dataset = make_dataset(dictionary)
    batch = dataset.collater([dataset[2]])  # source 3 (+[SOS]), target 6
    cloze = batch["net_input"]
    s, t = 4, 6
    with torch.no_grad():
        reference, _ = model(**cloze)
        for j in range(t):
            perturbed = dict(cloze, src_tokens=cloze["src_tokens"].clone())
            perturbed["src_tokens"][0, s + j] = dictionary.nspecial + (perturbed["src_tokens"][0, s + j] + 5) % 30
            logits, _ = model(**perturbed)
            difference = (logits - reference).abs().amax(-1)[0]
            assert difference[:s].max() == 0  # the source never sees the target
            for i in range(t):
                if i <= j:
                    assert difference[s + t + i] == 0, f"pseudo row {i} saw target token {j}"
                else:
                    assert difference[s + t + i] > 1e-4, f"pseudo row {i} ignores target token {j}"


def prefix_copy_data(directory, lines_per_split, seed=0):
    """Pairs whose target is the first two words of the source."""
    rng = np.random.default_rng(seed)
    raw = directory / "raw"
    raw.mkdir()
    for split, count in lines_per_split.items():
        sources = [[f"w{i}" for i in rng.integers(12, size=rng.integers(3, 7))] for _ in range(count)]
        (raw / f"{split}.src").write_text("\n".join(" ".join(words) for words in sources) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(" ".join(words[:2]) for words in sources) + "\n")
    return raw


@pytest.mark.slow
def test_fairseq_preprocess_train_generate_end_to_end(tmp_path, cli):
    """fairseq-preprocess -> fairseq-train --pseudo-masks --arch unilm2_tiny -> fairseq-generate learns the task."""
    raw = prefix_copy_data(tmp_path, {"train": 2000, "valid": 16, "test": 10})
    data = tmp_path / "bin"
    binarize_pairs(data, raw / "train", raw / "valid", raw / "test")
    task = ["--user-dir", REPO / "palm_plugin", "--task", "unilm_seq2seq", "--pseudo-masks", "--cpu",
            "--source-segment", "0", "--target-segment", "1", "--max-source-positions", "10",
            "--max-target-positions", "8"]
    cli("fairseq-train", data, *task, "--arch", "unilm2_tiny", "--criterion", "unilm_cloze", "--optimizer", "adam",
        "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--batch-size", "32", "--max-update", "900",
        "--target-mask-prob", "0.1", "--leave-unmasked-prob", "1", "--random-token-prob", "0", "--dropout", "0",
        "--attention-dropout", "0", "--save-dir", tmp_path / "ckpt", "--no-epoch-checkpoints", "--log-format", "simple")
    result = cli("fairseq-generate", data, *task, "--path", tmp_path / "ckpt" / "checkpoint_last.pt", "--gen-subset",
                 "test", "--beam", "3", "--max-len-b", "8", "--batch-size", "4", "--required-batch-size-multiple", "1")
    lines = result.stdout.splitlines()
    hypotheses = {line.split("\t")[0][2:]: line.split("\t")[2] for line in lines if line.startswith("H-")}
    references = {line.split("\t")[0][2:]: line.split("\t")[1] for line in lines if line.startswith("T-")}
    assert len(hypotheses) == len(references) == 10
    correct = sum(hypotheses[key] == references[key] for key in references)
    assert correct >= 8, f"only {correct} of 10 test targets generated:\n" + "\n".join(lines[-30:])


@pytest.mark.parametrize("pseudo_masks", [False, True])
def test_one_view_per_use_and_raw_sources_for_inference(tmp_path, pseudo_masks):
    """Training batches hold the packed rows and labels only (no reference, no source-only view); generation
    batches hold the source, its segments and the reference, and draw no noise; build_dataset_for_inference takes
    encoded lines as fairseq-interactive gives them."""
    dictionary = make_dictionary()
    task = seq2seq_task(tmp_path, dictionary, pseudo_masks=pseudo_masks)
    dataset = task._dataset(Sentences(task.dictionary, [5, 8], 0), Sentences(task.dictionary, [4, 2], 1))
    training = dataset.collater([dataset[0], dataset[1]])
    assert set(training) == {"id", "nsentences", "ntokens", "net_input", "target"}
    assert training["net_input"]["src_tokens"].shape == training["target"].shape  # packed rows and their labels
    assert "src_lengths" not in training["net_input"] and "attention_mask" not in training["net_input"]
    dataset.generation = True
    item = dataset[1]
    assert set(item) == {"id", "source", "reference"}  # no noise drawn
    generation = dataset.collater([dataset[0], dataset[1]])
    assert generation["target"][1, :2].tolist() == dataset.target[1].tolist()
    assert generation["net_input"]["source_segments"].eq(0).all()
    assert generation["net_input"]["target_segment"].eq(1).all()

    lines = [torch.tensor([dictionary.index("w3"), dictionary.index("w4"), dictionary.eos()]),
             torch.tensor([dictionary.index("w5"), dictionary.eos()])]
    inference = task.build_dataset_for_inference(lines, [len(t) for t in lines])
    batch = inference.collater([inference[0], inference[1]])
    assert batch["target"] is None
    assert batch["net_input"]["src_tokens"][0].tolist() == [dictionary.bos(), *lines[0].tolist()]
    assert batch["net_input"]["src_tokens"][1].tolist() == [dictionary.bos(), *lines[1].tolist(), dictionary.pad()]


def test_constraints_for_inference_are_refused_with_what_to_do(tmp_path):
    """fairseq-interactive --constraints hands the constraints to build_dataset_for_inference: the unilm decoder has
    no constrained search, so an error that says so, not constraints silently ignored."""
    dictionary = make_dictionary()
    task = seq2seq_task(tmp_path, dictionary)
    lines = [torch.tensor([dictionary.index("w3"), dictionary.eos()])]
    with pytest.raises(ValueError) as refused:
        task.build_dataset_for_inference(lines, [2], constraints=torch.tensor([[1, dictionary.index("w4"), 0]]))
    assert str(refused.value) == "--constraints is not supported by the unilm decoder; decode without constraints"


def test_inference_step_adds_the_tasks_segments_and_refuses_a_training_batch(tmp_path):
    """A batch of sources alone (src_tokens and src_lengths, as fairseq-interactive's and the hub interface's callers
    may give it) decodes as the generation batch with the task's segments does; a training batch that reaches the
    generator stops with what to do."""
    from fairseq.dataclass.configs import GenerationConfig

    dictionary = make_dictionary()
    task = seq2seq_task(tmp_path, dictionary)
    model = tiny_model(task.dictionary)
    generator = task.build_generator([model], GenerationConfig(beam=2, max_len_b=4))
    lines = [torch.tensor([dictionary.index(w) for w in ("w3", "w4", "w7")] + [dictionary.eos()]),
             torch.tensor([dictionary.index("w5"), dictionary.eos()])]
    inference = task.build_dataset_for_inference(lines, [len(t) for t in lines])
    batch = inference.collater([inference[0], inference[1]])
    assert batch["net_input"]["source_segments"].eq(0).all() and batch["net_input"]["target_segment"].eq(1).all()
    bare = {**batch, "net_input": {k: batch["net_input"][k] for k in ("src_tokens", "src_lengths")}}
    with torch.no_grad():
        expected, decoded = (task.inference_step(generator, [model], b) for b in (batch, bare))
    for ours, reference in zip(decoded, expected):
        assert [h["tokens"].tolist() for h in ours] == [h["tokens"].tolist() for h in reference]
        assert [float(h["score"]) for h in ours] == [float(h["score"]) for h in reference]
    dataset = task._dataset(Sentences(task.dictionary, [5, 8], 0), Sentences(task.dictionary, [4, 2], 1))
    training = dataset.collater([dataset[0], dataset[1]])
    with pytest.raises(RuntimeError) as refused:
        task.inference_step(generator, [model], training)
    assert str(refused.value) == (
        "a training batch reached the generator: the data loader started before the task built its generator (with "
        "fairseq-generate: --data-buffer-size 0 and --num-workers > 0); keep the default --data-buffer-size, or "
        "--num-workers 0, or in Python call task.build_generator before iterating (or use "
        "task.build_dataset_for_inference)")


def test_a_batch_that_carries_its_segments_decodes_with_them(tmp_path):
    """The task adds its segments to a batch without any: a batch that carries its own (collated by a dataset of
    other segments, or built by hand) is decoded with those, as a task of those segments decodes the bare sources."""
    from fairseq.dataclass.configs import GenerationConfig

    dictionary = make_dictionary()
    tasks = {segments: seq2seq_task(tmp_path, dictionary, source_segment=segments[0], target_segment=segments[1])
             for segments in ((0, 1), (1, 0))}
    model = tiny_model(tasks[0, 1].dictionary)
    lines = [torch.tensor([dictionary.index(w) for w in ("w3", "w4", "w7")] + [dictionary.eos()]),
             torch.tensor([dictionary.index("w5"), dictionary.eos()])]

    def decode(task, own_segments=None):
        generator = task.build_generator([model], GenerationConfig(beam=2, max_len_b=4))
        inference = task.build_dataset_for_inference(lines, [len(t) for t in lines])
        batch = inference.collater([inference[0], inference[1]])
        net_input = {k: batch["net_input"][k] for k in ("src_tokens", "src_lengths")}
        if own_segments is not None:
            net_input["source_segments"] = torch.full_like(net_input["src_tokens"], own_segments[0])
            net_input["target_segment"] = torch.full((len(lines),), own_segments[1])
        with torch.no_grad():
            hypotheses = task.inference_step(generator, [model], {**batch, "net_input": net_input})
        return [[(h["tokens"].tolist(), float(h["score"])) for h in row] for row in hypotheses]

    swapped = decode(tasks[1, 0])
    assert swapped != decode(tasks[0, 1])  # the segments change what is decoded
    assert decode(tasks[0, 1], own_segments=(1, 0)) == swapped


def test_sources_that_fill_the_positions_exactly_are_not_counted_as_truncated():
    """A source of n tokens (its [EOS] included) takes n + 1 positions with [SOS]: at --max-source-positions n + 1
    it is whole, one fewer cuts it; the count is what the task logs, as are the empty lines it keeps."""
    from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset

    dictionary = make_dictionary()
    source, target = Sentences(dictionary, [5, 8, 3], seed=0), Sentences(dictionary, [4, 2, 6], seed=1)
    noise = TokenMaskingPolicy(mask_prob=0.5)
    for max_source, truncated in ((9, 0), (8, 1), (6, 1), (5, 2)):
        dataset = UniLMSeq2SeqDataset(source, target, dictionary, max_source, 32, noise,
                                      dictionary.index(MASK_SYMBOL), SOURCE_SEGMENT, TARGET_SEGMENT, 7)
        assert dataset.truncated_sources == truncated, max_source
    # empty lines ([EOS] alone) are kept and counted, sources and targets apart; a line of one word is not empty
    empty = UniLMSeq2SeqDataset(Sentences(dictionary, [1, 2, 3], seed=0), Sentences(dictionary, [2, 1, 1], seed=1),
                                dictionary, 64, 32, noise, dictionary.index(MASK_SYMBOL), SOURCE_SEGMENT,
                                TARGET_SEGMENT, 7)
    assert (len(empty), empty.empty_sources, empty.empty_targets) == (3, 1, 2)
    with pytest.raises(ValueError, match=r"unknown pseudo-mask noise 'gaussian'; expected one of \('exact', 's2s_ft'\)"):
        PseudoSeq2SeqDataset(source, target, dictionary, 64, 32, noise, dictionary.index(MASK_SYMBOL), SOURCE_SEGMENT,
                             TARGET_SEGMENT, 7, noise="gaussian")


def test_size_filter_keeps_the_pairs_whose_packed_row_fits_the_positions_exactly():
    """fairseq drops the pairs longer than the model's positions with ``filter_indices_by_size``: a packed training
    row (as the collater builds it) of exactly that many tokens fits the position table and is kept."""
    from palm_plugin.data.unilm_seq2seq_dataset import UniLMSeq2SeqDataset

    dictionary = make_dictionary()
    source, target = Sentences(dictionary, [5, 8, 3, 6], seed=0), Sentences(dictionary, [4, 2, 6, 5], seed=1)
    dataset = UniLMSeq2SeqDataset(source, target, dictionary, 64, 32, TokenMaskingPolicy(mask_prob=0.5),
                                  dictionary.index(MASK_SYMBOL), SOURCE_SEGMENT, TARGET_SEGMENT, 7)
    batch = dataset.collater([dataset[i] for i in range(4)])
    rows = batch["net_input"]["src_tokens"].ne(dictionary.pad()).sum(1).tolist()
    assert rows == [10, 11, 10, 12]  # [SOS] + source + target
    for limit in (10, 11, 12):
        kept, dropped = dataset.filter_indices_by_size(np.arange(4), limit)
        assert kept.tolist() == [i for i in range(4) if rows[i] <= limit], limit
        assert dropped == [i for i in range(4) if rows[i] > limit], limit
