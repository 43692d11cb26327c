"""What a fine-tuned model does: it learns where its output ends.

Each family's fine-tuning path trains a tiny model, in process, on a task whose right output length is known: the
target is a copy of the source, sources of 1 to 8 words. Then fairseq's beam search, built by the task as
fairseq-generate builds it, decodes held-out sources; the outputs must have the expected length ([EOS] included) for
most of them, far above what a model that ignores the source could reach (the share of the most frequent length).
A model that never learned [EOS] (it was not a target, or decoding cannot emit it) runs to the length limit and
fails. Paths: ``unilm_seq2seq`` with unilm_tiny (UniLM), ``unilm_seq2seq --pseudo-masks`` with unilm2_tiny
(UniLMv2), and palm_tiny through fairseq's ``translation`` task with ``label_smoothed_cross_entropy`` (PALM).
Dropout is off so that a few hundred updates suffice.
"""
import argparse
from collections import Counter

import numpy as np
import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterionConfig
from fairseq.data import Dictionary, LanguagePairDataset, ListDataset
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import OmegaConf

from palm_plugin.criterions.unilm_cloze import UniLMClozeConfig
from palm_plugin.models.palm import PalmConfig, palm_tiny
from palm_plugin.models.unilm import UniLMConfig, unilm2_tiny, unilm_tiny
from palm_plugin.tasks.unilm_seq2seq import UniLMSeq2SeqConfig, UniLMSeq2SeqTask

pytestmark = pytest.mark.slow

WORDS = 12
SHORTEST, LONGEST = 1, 8  # source words; the target copies them, then [EOS]
LIMIT = 20  # decoding's --max-len-b: a model that never stops ends here, far from every expected length
BATCH = 32


def dictionary():
    d = Dictionary()
    for index in range(WORDS):
        d.add_symbol(f"w{index}")
    return d


def copy_pairs(d, count, seed):
    """``count`` (source, target) pairs as binarized data holds them (ending with [EOS]); target = source."""
    rng = np.random.default_rng(seed)
    sources = [
        torch.tensor([*rng.integers(d.nspecial, d.nspecial + WORDS, rng.integers(SHORTEST, LONGEST + 1)), d.eos()])
        for _ in range(count)
    ]
    return sources, [source.clone() for source in sources]


def model_config(config_class, arch, name):
    namespace = argparse.Namespace()
    arch(namespace)
    cfg = OmegaConf.structured(config_class.from_namespace(namespace))
    cfg._name, cfg.dropout, cfg.attention_dropout = name, 0.0, 0.0
    return cfg


def fine_tune(model, criterion, dataset, steps, seed=0):
    """Adam over random batches of ``dataset`` (its collater pads them as fairseq would), one loss per token."""
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for step in range(steps):
        dataset.set_epoch(step + 1)  # new masks each update, as new epochs draw them
        batch = dataset.collater([dataset[int(i)] for i in rng.choice(len(dataset), BATCH, replace=False)])
        loss, sample_size, _ = criterion(model, batch)
        optimizer.zero_grad()
        (loss / sample_size).backward()
        optimizer.step()
    return model.eval()


def decoded_lengths(task, model, sources):
    """Output lengths ([EOS] included) of beam search over ``sources``, in their order."""
    dataset = task.build_dataset_for_inference(sources, [len(s) for s in sources])
    generator = task.build_generator([model], argparse.Namespace(beam=2, max_len_a=0, max_len_b=LIMIT))
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        hypotheses = task.inference_step(generator, [model], batch)
    lengths = [0] * len(sources)
    for index, hypothesis in zip(batch["id"].tolist(), hypotheses):
        lengths[index] = len(hypothesis[0]["tokens"])
    return lengths


def assert_learned_to_stop(task, model, family):
    sources, targets = copy_pairs(task.source_dictionary, 60, seed=99)
    expected = [len(target) for target in targets]
    lengths = decoded_lengths(task, model, sources)
    right = np.mean([a == b for a, b in zip(lengths, expected)])
    chance = max(Counter(expected).values()) / len(expected)  # the best length that ignores the source
    assert right >= 0.8 and right >= chance + 0.5, (
        f"{family}: {right:.0%} of the outputs have the expected length (one fixed length would get {chance:.0%}); "
        f"lengths {lengths[:12]}..., expected {expected[:12]}...: the model did not learn to end its output with "
        "[EOS] (is [EOS] a target in training, and can decoding emit it?)"
    )


def unilm_task(pseudo_masks):
    cfg = UniLMSeq2SeqConfig(data="unused", seed=1, pseudo_masks=pseudo_masks)
    if pseudo_masks:  # UniLMv2's two segment types
        cfg.source_segment, cfg.target_segment = 0, 1
    return UniLMSeq2SeqTask(OmegaConf.structured(cfg), dictionary())


@pytest.mark.parametrize("pseudo_masks, arch, steps", [(False, unilm_tiny, 200), (True, unilm2_tiny, 200)],
                         ids=["unilm", "unilm2_pseudo_masks"])
def test_unilm_seq2seq_fine_tuning_learns_where_the_output_ends(pseudo_masks, arch, steps):
    torch.manual_seed(0)
    task = unilm_task(pseudo_masks)
    model = task.build_model(model_config(UniLMConfig, arch, "unilm"))
    criterion = task.build_criterion(OmegaConf.structured(UniLMClozeConfig(_name="unilm_cloze", label_smoothing=0.1)))
    sources, targets = copy_pairs(task.source_dictionary, 400, seed=0)
    # the training dataset the task builds in load_dataset, from in-memory sentences instead of binarized files
    dataset = task._dataset(ListDataset(sources, [len(s) for s in sources]),
                            ListDataset(targets, [len(t) for t in targets]))
    fine_tune(model, criterion, dataset, steps)
    assert_learned_to_stop(task, model, "unilm_seq2seq" + (" --pseudo-masks" if pseudo_masks else ""))


def test_palm_fine_tuned_with_fairseqs_translation_task_learns_where_the_output_ends():
    torch.manual_seed(0)
    d = dictionary()
    task = TranslationTask(OmegaConf.structured(TranslationConfig(data="unused", source_lang="src", target_lang="tgt")),
                           d, d)
    model = task.build_model(model_config(PalmConfig, palm_tiny, "palm"))
    criterion = task.build_criterion(OmegaConf.structured(LabelSmoothedCrossEntropyCriterionConfig(
        _name="label_smoothed_cross_entropy", label_smoothing=0.1, sentence_avg=False)))
    sources, targets = copy_pairs(d, 400, seed=0)
    # what the translation task's load_dataset builds: sources padded on the left, targets on the right
    dataset = LanguagePairDataset(sources, [len(s) for s in sources], d, targets, [len(t) for t in targets], d,
                                  left_pad_source=task.cfg.left_pad_source, left_pad_target=task.cfg.left_pad_target)
    fine_tune(model, criterion, dataset, steps=120)
    assert_learned_to_stop(task, model, "palm (translation)")
