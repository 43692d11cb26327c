"""The Python API (palm_plugin/models/hub_interface.py) against fairseq's command-line tools on tiny models trained by
real fairseq-train runs: ``generate`` gives fairseq-generate's hypotheses, ``score`` fairseq-generate
--score-reference's scores, for palm, unilm and unilm2, with the plugin's decoding options."""
import math
import re
import shutil

import pytest
import torch

from tests.conftest import REPO, binarize_pairs, run_cli, save_untrained_checkpoint

USER_DIR = REPO / "palm_plugin"

# (training options, task options shared by fairseq-train and fairseq-generate)
FAMILIES = {
    "palm": (["--arch", "palm_tiny", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"],
             ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]),
    "unilm": (["--arch", "unilm_tiny", "--criterion", "unilm_cloze", "--label-smoothing", "0.1", "--mask-prob", "0.5"],
              ["--task", "unilm_seq2seq", "--max-source-positions", "12", "--max-target-positions", "10"]),
    "unilm2": (["--arch", "unilm2_tiny", "--criterion", "unilm_cloze", "--label-smoothing", "0.1"],
               ["--task", "unilm_seq2seq", "--pseudo-masks", "--source-segment", "0", "--target-segment", "1",
                "--max-source-positions", "12", "--max-target-positions", "10"]),
}
DECODING = {"beam": 3, "lenpen": 0.8, "lenpen_style": "gnmt", "no_repeat_ngram_size": 2, "no_repeat_ngram_ignore": ".",
            "max_len_b": 8, "min_len": 2}


def flags(options):
    return [a for key, value in options.items() for a in (f"--{key.replace('_', '-')}", value)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Pairs whose target is the source's first words, with "." between some of them; fairseq-preprocess output."""
    root = tmp_path_factory.mktemp("hub")
    generator = torch.Generator().manual_seed(0)
    for split, count in {"train": 200, "valid": 8, "test": 9}.items():
        sources, targets = [], []
        for _ in range(count):
            words = [f"w{int(i)}" if int(i) < 11 else "." for i in torch.randint(12, (int(torch.randint(3, 9, (1,),
                                                                                               generator=generator)),),
                                                                               generator=generator)]
            sources.append(" ".join(words))
            targets.append(" ".join(words[:4]))
        (root / f"{split}.src").write_text("\n".join(sources) + "\n")
        (root / f"{split}.tgt").write_text("\n".join(targets) + "\n")
    binarize_pairs(root / "bin", root / "train", root / "valid", root / "test")
    return root


@pytest.fixture(scope="module")
def trained(data):
    """One checkpoint per family after a few updates of real fairseq-train."""
    checkpoints = {}
    for family, (train, task) in FAMILIES.items():
        save_dir = data / f"ckpt_{family}"
        run_cli("fairseq-train", data / "bin", "--user-dir", USER_DIR, *task, *train, "--optimizer", "adam",
                "--lr", "3e-3", "--batch-size", "16", "--max-update", "30", "--save-dir", save_dir,
                "--no-epoch-checkpoints", "--cpu", "--log-format", "simple", "--seed", "1")
        checkpoints[family] = save_dir
    return checkpoints


def generate_cli(data, family, checkpoint_dir, *extra):
    result = run_cli("fairseq-generate", data / "bin", "--user-dir", USER_DIR, *FAMILIES[family][1], "--path",
                     checkpoint_dir / "checkpoint_last.pt", "--gen-subset", "test", "--batch-size", "4",
                     "--required-batch-size-multiple", "1", "--cpu", *extra)
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_api_generate_and_score_equal_fairseq_generate(data, trained, family, caplog):
    from palm_plugin.models.hub_interface import from_pretrained

    model = from_pretrained(trained[family], checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data / "bin"))
    sources = (data / "test.src").read_text().splitlines()
    targets = (data / "test.tgt").read_text().splitlines()

    expected = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", generate_cli(data, family, trained[family], *flags(DECODING)),
                               flags=re.M))
    hypotheses = model.generate(sources, **DECODING)
    assert hypotheses == [expected[str(i)] for i in range(len(sources))]
    assert hypotheses == model.sample(sources, **DECODING) == model.translate(sources, **DECODING)
    # the options took effect: scores carry the GNMT penalty, no bigram without "." repeats
    for hypo in (h[0] for h in model.generate([model.encode(s) for s in sources], **DECODING)):
        penalty = ((5 + len(hypo["tokens"])) / 6) ** DECODING["lenpen"]
        assert float(hypo["score"]) == pytest.approx(float(hypo["positional_scores"].sum()) / penalty, abs=1e-5)
    for text in hypotheses:
        bigrams = [b for b in zip(text.split(), text.split()[1:]) if "." not in b]
        assert len(bigrams) == len(set(bigrams)), text

    # a source the model cannot read is answered, with a warning (the answer does not depend on it)
    with caplog.at_level("WARNING", logger="palm_plugin.modules.dictionary_check"):
        assert len(model.generate(["", "zebra quokka", sources[0]], beam=1)) == 3
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "an input is empty", "the input 'zebra quokka' has no symbol of the dictionary"]

    reference = generate_cli(data, family, trained[family], "--score-reference")
    positional = dict(re.findall(r"^P-(\d+)\t(.*)$", reference, flags=re.M))
    scored = model.score(sources, targets)
    for i, result in enumerate(scored):
        printed = [float(x) for x in positional[str(i)].split()]  # base 2, 4 decimals
        assert len(result["tokens"]) == len(targets[i].split()) + 1
        assert (result["positional_scores"] / math.log(2)).tolist() == pytest.approx(printed, abs=1e-4)
        assert result["log_prob"] == pytest.approx(float(result["positional_scores"].sum()), abs=1e-5)
        assert result["perplexity"] == pytest.approx(math.exp(-result["log_prob"] / len(result["tokens"])), rel=1e-5)


def test_from_pretrained_reads_checkpoint_best_of_a_directory(tmp_path):
    """fairseq's hub convention: a directory and, by default, its checkpoint_best.pt; here a converted published
    checkpoint (palm-convert) with the data dictionaries fairseq-preprocess --srcdict would write."""
    import shutil

    import transformers

    from palm_plugin.fixes import safe_loading
    from palm_plugin.models.hub_interface import from_pretrained
    from palm_plugin.models.unilm import UniLMModel
    from palm_tools.convert import cli as convert
    from tests.test_convert_checkpoint import randomize, tiny_bert_config, write_bert_dir

    config = tiny_bert_config()
    source = write_bert_dir(tmp_path / "hf", randomize(transformers.BertForPreTraining(config), seed=21), config)
    convert.main(["bert", "--input", str(source), "--output", str(tmp_path / "run")])
    run = tmp_path / "run"
    (run / "model.pt").rename(run / "checkpoint_best.pt")
    for language in ("src", "tgt"):
        shutil.copy(run / "dict.txt", run / f"dict.{language}.txt")
    hub = from_pretrained(str(run))
    expected = safe_loading.load_state(str(run / "checkpoint_best.pt"))["model"]
    [model] = hub.models
    assert isinstance(model, UniLMModel) and len(hub.task.source_dictionary) == expected[
        "encoder.stack.embeddings.tokens.weight"].size(0)
    assert all(torch.equal(value, expected[name]) for name, value in model.state_dict().items())
    again = UniLMModel.from_pretrained(str(run), beam=3)  # the model class's entry point, fairseq's hub style
    assert all(torch.equal(value, expected[name]) for name, value in again.models[0].state_dict().items())
    assert again.cfg.generation.beam == 3 and hub.cfg.generation.beam != 3  # its options reach the configuration
    # generation options reach the generator: at most max_len_b tokens
    for length in (1, 3):
        assert 0 < len(hub.generate("w1 w2 w3 w4", beam=2, max_len_b=length).split()) <= length
    # options out of range are refused as the Python caller wrote them (beam=0), not as command-line flags
    with pytest.raises(ValueError, match=r"^beam=0: outside \[1, infinity\) \(a size or a count\); give a value in "
                                         r"that range$"):
        hub.generate("w1 w2", beam=0)
    with pytest.raises(ValueError, match=r"^nbest=3 is above beam=2: beam search keeps only 2 hypotheses; give "
                                         r"nbest <= beam$"):
        hub.score("w1 w2", "w2", beam=2, nbest=3)
    assert_score_recomputes_beam_search(hub, ["w1 w2 w3 w4", "w5 w6"])


def assert_score_recomputes_beam_search(hub, sources):
    """``score`` of each best hypothesis in one pass equals the log-probabilities beam search summed step by step."""
    best = [hypos[0] for hypos in hub.generate([hub.encode(s) for s in sources], beam=2, max_len_b=4)]
    scored = hub.score(sources, [hub.decode(hypo["tokens"]) for hypo in best], beam=7)  # options pass through
    assert len(scored) == len(sources)
    for hypo, result in zip(best, scored):
        assert result["tokens"].tolist() == hypo["tokens"].tolist()
        torch.testing.assert_close(result["positional_scores"], hypo["positional_scores"], atol=1e-5, rtol=0)


def test_palm_from_pretrained_reads_a_training_directory(data, tmp_path):
    """``PalmModel.from_pretrained(save_dir)``: checkpoint_best.pt and the dictionaries beside it, by default; its
    keywords reach fairseq's loading as overrides."""
    import shutil

    from palm_plugin.fixes import safe_loading
    from palm_plugin.models.palm import PalmModel

    train, task = FAMILIES["palm"]
    run_cli("fairseq-train", data / "bin", "--user-dir", USER_DIR, *task, *train, "--optimizer", "adam", "--lr",
            "3e-3", "--batch-size", "16", "--max-update", "2", "--save-dir", tmp_path, "--no-epoch-checkpoints",
            "--cpu", "--seed", "1")
    for language in ("src", "tgt"):
        shutil.copy(data / "bin" / f"dict.{language}.txt", tmp_path)
    hub = PalmModel.from_pretrained(str(tmp_path))
    [model] = hub.models
    expected = safe_loading.load_state(str(tmp_path / "checkpoint_best.pt"))["model"]
    assert isinstance(model, PalmModel)
    assert all(torch.equal(value, expected[name]) for name, value in model.state_dict().items())
    assert_score_recomputes_beam_search(hub, ["w1 w2 w3 w4", "w5 w6"])
    # keywords override the training configuration, as in fairseq: here the generation defaults (exactly 3 tokens)
    sources = ["w1 w2 w3 w4", "w5 w6"]
    options = {"max_len_a": 0, "max_len_b": 3, "min_len": 3}
    fixed = PalmModel.from_pretrained(str(tmp_path), **options).generate(sources, beam=2)
    assert fixed == hub.generate(sources, beam=2, **options)
    assert [len(text.split()) for text in fixed] == [3, 3]


def test_references_are_collated_as_fairseqs_translation_batches():
    """``score`` adds the references to the task's inference batches (for the --score-reference scorers): target
    and teacher-forced decoder input as fairseq's LanguagePairDataset collates a parallel pair."""
    from fairseq.data import Dictionary, LanguagePairDataset

    from palm_plugin.models.hub_interface import _WithReferences

    dictionary = Dictionary()
    for index in range(12):
        dictionary.add_symbol(f"w{index}")
    eos = dictionary.eos()
    sources = [torch.tensor([5, 6, eos]), torch.tensor([7, eos]), torch.tensor([8, 9, 10, 11, eos])]
    targets = [torch.tensor([12, 13, 14, eos]), torch.tensor([15, eos]), torch.tensor([9, 9, eos])]
    source_sizes, target_sizes = [len(t) for t in sources], [len(t) for t in targets]
    ours = _WithReferences(LanguagePairDataset(sources, source_sizes, dictionary), targets, dictionary)
    pairs = LanguagePairDataset(sources, source_sizes, dictionary, targets, target_sizes, dictionary)
    batch = ours.collater([ours[i] for i in range(3)])
    expected = pairs.collater([pairs[i] for i in range(3)])
    assert torch.equal(batch["target"], expected["target"]) and batch["ntokens"] == expected["ntokens"]
    assert torch.equal(batch["net_input"]["prev_output_tokens"], expected["net_input"]["prev_output_tokens"])
    assert ours.collater([]) == {}


def test_from_pretrained_of_a_missing_checkpoint_names_it_and_what_is_there(tmp_path):
    from palm_plugin.models.hub_interface import from_pretrained

    with pytest.raises(FileNotFoundError, match=r"missing/checkpoint_best\.pt: no such checkpoint; .*missing is not a "
                                                r"directory \(from_pretrained\(DIR, checkpoint_file=NAME\)"):
        from_pretrained(str(tmp_path / "missing"))
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"checkpoint_best\.pt: no such checkpoint; .* holds checkpoint_last"):
        from_pretrained(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"b\.pt: no such checkpoint"):
        from_pretrained(str(tmp_path), checkpoint_file="checkpoint_last.pt:b.pt")
    # a folder of many checkpoints: the first 5 in name order
    for epoch in range(1, 7):
        (tmp_path / f"checkpoint{epoch}.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as missing:
        from_pretrained(str(tmp_path))
    assert str(missing.value) == (
        f"{tmp_path}/checkpoint_best.pt: no such checkpoint; {tmp_path} holds checkpoint1.pt, checkpoint2.pt, "
        "checkpoint3.pt, checkpoint4.pt, checkpoint5.pt (from_pretrained(DIR, checkpoint_file=NAME) takes "
        "fairseq-train's --save-dir and a file in it)")


@pytest.mark.parametrize("arguments, name, kind", [
    ({"model_name_or_path": None}, "model_name_or_path", "NoneType"),
    ({"checkpoint_file": ["a.pt", "b.pt"]}, "checkpoint_file", "list"),  # an ensemble is one string, "a.pt:b.pt"
    ({"data_name_or_path": None}, "data_name_or_path", "NoneType"),
])
def test_from_pretrained_names_the_argument_that_is_not_a_path(tmp_path, arguments, name, kind):
    """A value that is no path stops before fairseq reads anything, with the keyword the user has to fix."""
    from palm_plugin.models.hub_interface import from_pretrained

    with pytest.raises(TypeError, match=rf"^from_pretrained: {name} is a {kind}; give a path \(a str or a "
                                        r"pathlib\.Path\)$"):
        from_pretrained(**{"model_name_or_path": str(tmp_path), **arguments})


def test_from_pretrained_of_a_pretraining_checkpoint_says_to_fine_tune_it_first(tmp_path):
    from palm_plugin.models.hub_interface import from_pretrained

    save_untrained_checkpoint(tmp_path, "pretrain.pt", ["--task", "unilm_pretraining", "--arch", "unilm_tiny",
                                                        "--criterion", "unilm_cloze"])
    with pytest.raises(ValueError) as error:
        from_pretrained(str(tmp_path), checkpoint_file="pretrain.pt", data_name_or_path=str(tmp_path))
    assert str(error.value) == (
        f"{tmp_path}/pretrain.pt: a checkpoint of the task unilm_pretraining (pre-training), which neither generates "
        "nor scores text; fine-tune it first (fairseq-train --task unilm_seq2seq, or translation for PALM, with "
        "--finetune-from-model this checkpoint) and load that one")


def test_a_checkpoint_trained_with_the_plugin_elsewhere_loads_with_this_plugin(tmp_path):
    """fairseq-train records --user-dir in the checkpoint; trained on another machine, the folder it names is not
    here: from_pretrained (part of the plugin, so the plugin is loaded) never reads it, and loads the weights."""
    from palm_plugin.models.hub_interface import from_pretrained

    saved = save_untrained_checkpoint(tmp_path, "model.pt", ["--task", "unilm_seq2seq", "--arch", "unilm_tiny",
                                                             "--criterion", "unilm_cloze"])
    state = torch.load(tmp_path / "model.pt", weights_only=False)
    state["cfg"]["common"]["user_dir"] = "/home/someone/elsewhere/palm_plugin"
    torch.save(state, tmp_path / "model.pt")
    hub = from_pretrained(str(tmp_path), checkpoint_file="model.pt", data_name_or_path=str(tmp_path))
    assert all(torch.equal(value, saved.state_dict()[name]) for name, value in hub.models[0].state_dict().items())


def test_a_unilm_checkpoint_from_before_attention_impl_loads_with_sdpa(tmp_path):
    """fairseq builds an architecture name (unilm_tiny) from a saved configuration without the dataclass defaults: a
    checkpoint saved before --attention-impl existed has no such field, and is built with the default, sdpa."""
    from palm_plugin.models.hub_interface import from_pretrained

    saved = save_untrained_checkpoint(tmp_path, "old.pt", ["--task", "unilm_seq2seq", "--arch", "unilm_tiny",
                                                           "--criterion", "unilm_cloze"], drop=("attention_impl",))
    hub = from_pretrained(str(tmp_path), checkpoint_file="old.pt", data_name_or_path=str(tmp_path))
    [model] = hub.models
    assert model.stack.attention_impl == "sdpa"
    assert all(torch.equal(value, saved.state_dict()[name]) for name, value in model.state_dict().items())
    assert len(hub.generate("w1 w2 w3", beam=2, max_len_b=3).split()) <= 3


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """An untrained unilm_tiny (512 positions) loaded by from_pretrained, and its folder (dictionaries beside it)."""
    from palm_plugin.models.hub_interface import from_pretrained

    root = tmp_path_factory.mktemp("untrained")
    save_untrained_checkpoint(root, "model.pt", ["--task", "unilm_seq2seq", "--arch", "unilm_tiny", "--criterion",
                                                 "unilm_cloze"])
    return from_pretrained(root, checkpoint_file="model.pt", data_name_or_path=root), root


API_CASES = {
    # fairseq set an unknown keyword on its configuration and ignored it
    "hf-name": (lambda hub, root: hub.generate("w1", num_beams=4), TypeError,
                "generate: unknown option 'num_beams' (did you mean 'beam'?); give fairseq-generate's options, with _ "
                "for - (beam, nbest, lenpen, max_len_a, max_len_b, min_len, ...)"),
    # transformers' name of an option whose fairseq name no spelling is close to
    "hf-name-far-from-fairseqs": (lambda hub, root: hub.generate("w1", max_new_tokens=20), TypeError,
                                  "generate: unknown option 'max_new_tokens' (did you mean 'max_len_b'?); give "
                                  "fairseq-generate's options, with _ for - (beam, nbest, lenpen, max_len_a, "
                                  "max_len_b, min_len, ...)"),
    "score-typo": (lambda hub, root: hub.score("w1", "w2", lenpen_stlye="gnmt"), TypeError,
                   "score: unknown option 'lenpen_stlye' (did you mean 'lenpen_style'?); give fairseq-generate's "
                   "options, with _ for - (beam, nbest, lenpen, max_len_a, max_len_b, min_len, ...)"),
    # fairseq's AssertionError: min_len cannot be larger than max_len, please adjust these!
    "min-len-above-max-len-b": (lambda hub, root: hub.generate("w1", min_len=5, max_len_b=3), ValueError,
                                "min_len=5 is above max_len_b=3, the longest output with max_len_a=0: no hypothesis "
                                "can end; give min_len <= max_len_b"),
    # ValueError: position id 512 exceeds the model's 512 positions; truncate the input (... --max-len-b)
    "min-len-past-the-positions": (lambda hub, root: hub.generate("w1 w2", min_len=510, max_len_b=600), ValueError,
                                   "--min-len 510: the longest source of this batch takes 4 of the model's 512 "
                                   "positions, which leaves room for 507 tokens before </s>; give --min-len 507 or "
                                   "less, or shorter sources (--max-source-positions)"),
    # the same with --match-source-len, whose cap (the source's length, 301 here) leaves --min-len 250 allowed
    "min-len-past-the-positions-matching-the-source": (
        lambda hub, root: hub.generate(" ".join(["w1"] * 300), match_source_len=True, min_len=250), ValueError,
        "--min-len 250: the longest source of this batch takes 302 of the model's 512 positions, which leaves room "
        "for 209 tokens before </s>; give --min-len 209 or less, or shorter sources (--max-source-positions)"),
    # fairseq's AssertionError again: with --match-source-len the longest output is the batch's longest source
    "min-len-above-the-source": (lambda hub, root: hub.generate(["w1 w2", "w3"], match_source_len=True, min_len=4),
                                 ValueError,
                                 "--min-len 4 with --match-source-len: the longest source of this batch counts 3 "
                                 "tokens (with its </s>, as fairseq counts), the longest a hypothesis may be; give "
                                 "--min-len 3 or less, or leave out --match-source-len"),
    "min-len-above-max-len-a": (lambda hub, root: hub.generate(["w1 w2", "w3"], min_len=9, max_len_a=1, max_len_b=2),
                                ValueError,
                                "--min-len 9 is above --max-len-a 1 x 4 (this batch's source width) + --max-len-b 2 = "
                                "6, the longest output of this batch; raise --max-len-a or --max-len-b, or give "
                                "--min-len 6 or less"),
    # AttributeError: 'NoneType' object has no attribute 'device'
    "generate-score-reference": (lambda hub, root: hub.generate("w1", score_reference=True), ValueError,
                                 "generate: score_reference=True reads references, which generate has none of; score "
                                 "pairs with score(sources, targets)"),
    # ignored
    "generate-prefix-size": (lambda hub, root: hub.generate("w1", prefix_size=1), ValueError,
                             "generate: prefix_size=1 reads references, which generate has none of; leave it out"),
    # fairseq dropped an override the checkpoint's configuration does not have
    "override-typo": (lambda hub, root: _load(root, bpe_modle="x"), TypeError,
                      "from_pretrained: bpe_modle: not an option of {root}/model.pt (task unilm_seq2seq, model "
                      "UniLMModel), so it would have no effect; leave it out, or check its name (fairseq's options, "
                      "with _ for -)"),
    # omegaconf's ValidationError: Incompatible value 'None' for field of type 'str' (full_key: data)
    "data-folder-missing": (lambda hub, root: _load(root, data_name_or_path=root / "missing"), FileNotFoundError,
                            "data_name_or_path {root}/missing: no such folder; give the fairseq-preprocess output with "
                            "the dictionaries (dict.*.txt), or leave it out to read them beside the checkpoint"),
    # FileNotFoundError: DIR/dict.src.txt: no dictionary; run fairseq-preprocess (translation layout) first
    "no-dictionary": (lambda hub, root: _load(root, data_name_or_path=root / "empty"), FileNotFoundError,
                      "{root}/empty/dict.src.txt: no such dictionary; from_pretrained reads the dictionaries from "
                      "data_name_or_path ({root}/empty): give the fairseq-preprocess output the checkpoint was trained "
                      "with, or copy its dict.*.txt there"),
    # the same, data_name_or_path left out: the checkpoint's folder, which has no dictionaries
    "no-dictionary-beside": (lambda hub, root: _load_alone(root), FileNotFoundError,
                             "{root}/alone/dict.src.txt: no such dictionary; from_pretrained reads the dictionaries "
                             "from data_name_or_path ({root}/alone, by default the checkpoint folder): give the "
                             "fairseq-preprocess output the checkpoint was trained with, or copy its dict.*.txt there"),
}


def _load_alone(root):
    """from_pretrained on a copy of the checkpoint in a folder of its own, data_name_or_path left out."""
    from palm_plugin.models.hub_interface import from_pretrained

    (root / "alone").mkdir(exist_ok=True)
    shutil.copy(root / "model.pt", root / "alone" / "model.pt")
    return from_pretrained(root / "alone", checkpoint_file="model.pt")


def _load(root, **options):
    from palm_plugin.models.hub_interface import from_pretrained

    (root / "empty").mkdir(exist_ok=True)
    return from_pretrained(root, checkpoint_file="model.pt", **{"data_name_or_path": str(root), **options})


@pytest.mark.parametrize("case", list(API_CASES))
def test_api_calls_no_model_can_answer_say_what_to_give(untrained, case):
    hub, root = untrained
    call, error, message = API_CASES[case]
    with pytest.raises(error) as raised:
        call(hub, root)
    assert str(raised.value) == message.format(root=root)


def test_data_folder_is_looked_for_where_fairseq_reads_it(untrained, tmp_path, monkeypatch):
    """data_name_or_path as fairseq's hub resolves it: from the checkpoint's folder when it starts with ``.``, else
    from the current folder; a missing one is named by the path looked at."""
    import shutil

    hub, root = untrained
    monkeypatch.chdir(tmp_path)  # not the checkpoint's folder
    (tmp_path / "bin").mkdir()
    for name in ("dict.src.txt", "dict.tgt.txt"):
        shutil.copy(root / name, tmp_path / "bin" / name)
    loaded = _load(root, data_name_or_path="bin")
    assert loaded.task.source_dictionary.symbols == hub.task.source_dictionary.symbols
    with pytest.raises(FileNotFoundError) as raised:
        _load(root, data_name_or_path="./missing")
    assert str(raised.value).startswith(f"data_name_or_path {root}/missing: no such folder; ")


def test_fairseqs_archive_map_and_generation_args_are_passed_on_not_refused_as_options(untrained):
    """archive_map and generation_args are keywords of fairseq's own from_pretrained, not options of the checkpoint:
    a map that gives the model folder options sets them, as in fairseq (here beam, fairseq's default 5), and
    generation_args sets generation options, with the same weights."""
    hub, root = untrained
    loaded = _load(root, data_name_or_path=".", archive_map={str(root): {"path": str(root), "beam": 3}},
                   generation_args={"nbest": 2})
    assert (hub.cfg.generation.beam, loaded.cfg.generation.beam) == (5, 3)
    assert (hub.cfg.generation.nbest, loaded.cfg.generation.nbest) == (1, 2)
    expected = hub.models[0].state_dict()
    assert all(torch.equal(value, expected[name]) for name, value in loaded.models[0].state_dict().items())


def test_generate_with_nbest_gives_that_many_hypotheses_of_each_input(untrained):
    """It gave the best one only, whatever ``nbest`` said."""
    hub, _ = untrained
    best = hub.generate(["w1 w2", "w3"], beam=3, max_len_b=3)
    three = hub.generate(["w1 w2", "w3"], beam=3, nbest=3, max_len_b=3)
    assert [len(hypotheses) for hypotheses in three] == [3, 3]
    assert [hypotheses[0] for hypotheses in three] == best
    assert hub.generate("w1 w2", beam=2, nbest=2, max_len_b=3) == hub.generate(["w1 w2"], beam=2, nbest=2,
                                                                                max_len_b=3)[0]


def test_prefix_allowed_tokens_fn_constrains_unilm_hypotheses(untrained):
    """generate's prefix_allowed_tokens_fn (fairseq's hub interface hands it to the task's build_generator): each step
    writes only a token it returns, here w3 or </s>; the untrained model writes other words without it."""
    hub, _ = untrained
    allowed = [hub.tgt_dict.index("w3"), hub.tgt_dict.eos()]
    free = hub.generate("w1 w2", beam=2, min_len=3, max_len_b=5).split()
    constrained = hub.generate("w1 w2", beam=2, min_len=3, max_len_b=5,
                               prefix_allowed_tokens_fn=lambda sentence, prefix: allowed).split()
    assert set(free) != {"w3"}
    assert set(constrained) == {"w3"} and 3 <= len(constrained) <= 5


def test_match_source_len_caps_unilm_hypotheses_as_fairseqs_translation_does(untrained, tmp_path):
    """fairseq caps a hypothesis at its source's src_lengths, which count the source and its </s> in translation
    (PALM's task); a UniLM source also holds [SOS], which gave UniLM one token more than PALM."""
    from palm_plugin.models.palm import PalmModel

    save_untrained_checkpoint(tmp_path, "model.pt", ["--task", "translation", "-s", "src", "-t", "tgt", "--arch",
                                                     "palm_tiny"])
    palm = PalmModel.from_pretrained(str(tmp_path), checkpoint_file="model.pt")
    unilm, _ = untrained
    for hub in (palm, unilm):
        for words in (2, 5):
            source = [hub.encode(" ".join(f"w{i}" for i in range(words)))]

            def lengths(**options):  # tokens before </s> (an untrained PALM may write <s>, which text leaves out)
                return [len(h["tokens"]) - 1 for h in hub.generate(source, match_source_len=True, **options)[0]]
            # --min-len at the cap forces hypotheses of exactly that length; one more is refused
            assert lengths(beam=2, min_len=words + 1) == [words + 1] * 2
            with pytest.raises(ValueError, match=f"counts {words + 1} tokens"):
                lengths(min_len=words + 2)
            assert max(lengths(beam=4)) <= words + 1
