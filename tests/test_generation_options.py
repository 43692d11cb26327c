"""The decoding options of the authors' code (palm_plugin/fixes/generation_options.py) in fairseq's beam search:
the GNMT length penalty on hand-computed beam scores, and s2s-ft's n-gram blocking that ignores given tokens."""
import math
import random
from argparse import Namespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.dataclass.configs import GenerationConfig
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, FairseqIncrementalDecoder
from fairseq.tasks import FairseqTask

import palm_plugin  # noqa: F401  (installs the options)
from palm_plugin.fixes.generation_options import IgnoringNGramRepeatBlock

WORDS = ["a", "b", "c", ".", "d"]


def dictionary():
    d = Dictionary()
    for word in WORDS:
        d.add_symbol(word)
    return d


class MarkovModel(FairseqEncoderDecoderModel):
    """Next-token probabilities depend on the previous token only: ``table[previous] = {token: probability}``, the
    rest of the probability spread evenly over the other tokens (never </s> before a listed one)."""

    def __init__(self, d, table):
        encoder = _Encoder(d)
        super().__init__(encoder, _Decoder(d, table))


class _Encoder(FairseqEncoder):
    def forward(self, src_tokens, src_lengths=None):
        return {"src_tokens": [src_tokens]}

    def reorder_encoder_out(self, encoder_out, new_order):
        return {"src_tokens": [encoder_out["src_tokens"][0].index_select(0, new_order)]}


class _Decoder(FairseqIncrementalDecoder):
    def __init__(self, d, table):
        super().__init__(d)
        rows = torch.zeros(len(d), len(d))
        for previous in range(len(d)):
            listed = {d.index(w) if w != "</s>" else d.eos(): p for w, p in table.get(d[previous], {}).items()}
            others = [t for t in range(len(d)) if t not in listed and t not in (d.pad(), d.bos(), d.eos())]
            rows[previous, others] = (1 - sum(listed.values())) / len(others)
            for token, p in listed.items():
                rows[previous, token] = p
        self.log_table = rows.log()

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        return self.log_table[prev_output_tokens[:, -1:]], {"attn": None}

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        return net_output[0] if log_probs else net_output[0].exp()

    def reorder_incremental_state(self, incremental_state, new_order):
        pass

    def max_positions(self):
        return 1024


class ToyTask(FairseqTask):
    def __init__(self, d):
        super().__init__(Namespace())
        self.d = d

    @property
    def source_dictionary(self):
        return self.d

    @property
    def target_dictionary(self):
        return self.d


def decode(table, **options):
    """Beam search of the Markov model through ``FairseqTask.build_generator``; returns (words, score) per hypothesis."""
    d = dictionary()
    args = GenerationConfig()
    for key, value in options.items():
        setattr(args, key, value)
    model = MarkovModel(d, table).eval()
    generator = ToyTask(d).build_generator([model], args)
    sample = {"net_input": {"src_tokens": torch.tensor([[d.index("a"), d.eos()]]), "src_lengths": torch.tensor([2])}}
    hypos = generator.generate([model], sample)[0]
    return [(d.string(h["tokens"][:-1]), float(h["score"])) for h in hypos]


# Two ways to end: "a </s>" (log-probability log .5 + log .5) and "b c </s>" (log .4 + log .6 + log .6).
TWO_ENDINGS = {"</s>": {"a": 0.5, "b": 0.4}, "a": {"</s>": 0.5}, "b": {"c": 0.6}, "c": {"</s>": 0.6}}
SHORT = math.log(0.5) + math.log(0.5)
LONG = math.log(0.4) + math.log(0.6) + math.log(0.6)


def test_fairseq_length_penalty_divides_by_length():
    hypos = decode(TWO_ENDINGS, beam=2, lenpen=1.0)
    assert [w for w, _ in hypos] == ["b c", "a"]  # -1.938 / 3 = -0.646 beats -1.386 / 2 = -0.693
    assert hypos[0][1] == pytest.approx(LONG / 3, abs=1e-6)
    assert hypos[1][1] == pytest.approx(SHORT / 2, abs=1e-6)


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_gnmt_length_penalty_on_hand_computed_scores(alpha):
    """((5 + len) / 6) ** alpha with len counting </s>: "a </s>" 7/6, "b c </s>" 8/6."""
    hypos = decode(TWO_ENDINGS, beam=2, lenpen=alpha, lenpen_style="gnmt")
    expected = {"a": SHORT / (7 / 6) ** alpha, "b c": LONG / (8 / 6) ** alpha}
    assert dict(hypos) == pytest.approx(expected, abs=1e-6)
    assert [w for w, _ in hypos] == sorted(expected, key=expected.get, reverse=True)
    assert hypos[0][0] == "a"  # alpha 1: -1.188 beats -1.454; alpha 0.6: -1.267 beats -1.628


def test_gnmt_with_unnormalized_scores_is_refused():
    with pytest.raises(ValueError, match="--unnormalized"):
        decode(TWO_ENDINGS, beam=2, lenpen_style="gnmt", unnormalized=True)


# The likeliest continuation cycles "a . a . ..."; the runner-up is always </s>.
CYCLE = {"</s>": {"a": 0.9}, "a": {".": 0.6, "</s>": 0.3}, ".": {"a": 0.6, "</s>": 0.3}}


def test_ignored_token_lifts_the_block_only_on_ngrams_that_hold_it():
    free = decode(CYCLE, beam=1, max_len_b=8)[0][0]
    assert free == "a . a . a . a ."  # no blocking: the cycle until the length limit
    blocked = decode(CYCLE, beam=1, max_len_b=8, no_repeat_ngram_size=3)[0][0]
    assert blocked == "a . a ."  # "a . a" may not come twice: </s> instead
    ignoring = decode(CYCLE, beam=1, max_len_b=8, no_repeat_ngram_size=3, no_repeat_ngram_ignore=".")[0][0]
    assert ignoring == free  # every trigram of the cycle holds "."
    # a repeat without "." stays blocked: "a b c" cannot come twice
    abc = {"</s>": {"a": 0.9}, "a": {"b": 0.6, "</s>": 0.3}, "b": {"c": 0.6, "</s>": 0.3}, "c": {"a": 0.6, "</s>": 0.3}}
    assert decode(abc, beam=1, max_len_b=8, no_repeat_ngram_size=3, no_repeat_ngram_ignore=".")[0][0] == "a b c a b"


def s2s_ft_banned(seq, n, ignore):
    """s2s-ft's get_dup_ngram_candidates (decode_seq2seq beam search), restated: tokens banned after ``seq``."""
    if len(seq) < n:
        return set()
    tail = seq[len(seq) - n + 1 :]
    if any(t in ignore for t in tail):
        return set()
    return {seq[i + n - 1] for i in range(len(seq) - n + 1) if seq[i : i + n - 1] == tail and seq[i + n - 1] not in ignore}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_blocker_bans_what_s2s_ft_bans(n):
    rng = random.Random(n)
    vocabulary, ignore = 8, {4, 6}
    blocker = IgnoringNGramRepeatBlock(n, ignore)
    for _ in range(200):
        step = rng.randrange(0, 12)
        rows = [[2] + [rng.randrange(4, vocabulary) for _ in range(step)] for _ in range(3)]
        buffer = torch.tensor([r + [1] * 3 for r in rows])  # the generator's buffer: padding after the step
        lprobs = blocker(buffer, torch.zeros(3, vocabulary), 3, 1, step)
        for row, scores in zip(rows, lprobs):  # s2s-ft's sequences leave out the start symbol
            assert set(scores.eq(-math.inf).nonzero().flatten().tolist()) == s2s_ft_banned(row[1:], n, ignore)


def test_ignore_without_blocking_or_unknown_symbol_is_refused():
    with pytest.raises(ValueError, match="needs --no-repeat-ngram-size"):
        decode(CYCLE, beam=1, no_repeat_ngram_ignore=".")
    with pytest.raises(ValueError, match="zz not in the target dictionary"):
        decode(CYCLE, beam=1, no_repeat_ngram_size=3, no_repeat_ngram_ignore=".|zz")


class _SourceDecoder(_Decoder):
    """Next-token log-probabilities depend on the source's first token and the previous token (a random table)."""

    def __init__(self, d, seed):
        FairseqIncrementalDecoder.__init__(self, d)
        generator = torch.Generator().manual_seed(seed)
        self.log_table = torch.randn(len(d), len(d), len(d), generator=generator).mul(2).log_softmax(-1)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        first = encoder_out["src_tokens"][0][:, 0]
        return self.log_table[first, prev_output_tokens[:, -1]].unsqueeze(1), {"attn": None}


def _diverse_decode(model, d, sources, ids):
    args = GenerationConfig()
    args.beam, args.diverse_beam_groups, args.diverse_beam_strength, args.max_len_b = 4, 2, 2.0, 6
    generator = ToyTask(d).build_generator([model], args)
    sample = {"id": torch.tensor(ids), "net_input": {
        "src_tokens": torch.tensor([[d.index(w), d.eos()] for w in sources]),
        "src_lengths": torch.tensor([2] * len(sources))}}
    return [[(h["tokens"].tolist(), round(float(h["score"]), 5)) for h in hypos]
            for hypos in generator.generate([model], sample)]


@pytest.mark.parametrize("ids", [[7, 3, 11, 5], [2, 0, 3, 1]], ids=["ids-past-the-batch", "ids-permuted"])
def test_diverse_beam_search_of_a_batch_is_that_of_each_sentence_alone(ids):
    """fairseq's DiverseBeamSearch indexed its per-batch diversity counts with the sample ids: an IndexError for ids
    past the batch size, another sentence's counts for ids in another order (palm_plugin/fixes/diverse_beam_rows.py)."""
    d = Dictionary()
    for word in [f"w{i}" for i in range(12)]:
        d.add_symbol(word)
    model = FairseqEncoderDecoderModel(_Encoder(d), _SourceDecoder(d, seed=3)).eval()
    sources = ["w0", "w5", "w9", "w2"]
    batch = _diverse_decode(model, d, sources, ids)
    alone = [_diverse_decode(model, d, [source], [0])[0] for source in sources]
    assert len({len(hypos[0][0]) for hypos in alone}) > 1  # sentences finish at different steps
    assert batch == alone


# ------------------------------------------------------------------------------------------- options no model meets
PARSE_CASES = {
    # fairseq asserted it at the first batch (min_len cannot be larger than max_len), naming neither option
    "min-len-above-max-len-b": ("generation", ["--min-len", "50", "--max-len-b", "5"],
                                "error: --min-len 50 is above --max-len-b 5, the longest output with --max-len-a 0: no "
                                "hypothesis can end; give min_len <= max_len_b"),
    "max-len-b-negative": ("generation", ["--max-len-b", "-3"],
                           "error: --min-len 1 is above --max-len-b -3, the longest output with --max-len-a 0: no "
                           "hypothesis can end; give min_len <= max_len_b"),
    "with-max-len-a": ("generation", ["--min-len", "5", "--max-len-b", "3", "--max-len-a", "1"], None),
    "match-source-len": ("generation", ["--min-len", "5", "--max-len-b", "3", "--match-source-len"], None),
    # KeyError: 'target' on the first line
    "interactive-score-reference": ("interactive", ["--score-reference"],
                                    "error: --score-reference scores the references of a binarized split, and "
                                    "fairseq-interactive reads none: score them with fairseq-generate "
                                    "--score-reference (or the API's score(sources, targets))"),
    # ignored
    "interactive-prefix-size": ("interactive", ["--prefix-size", "1"],
                                "error: --prefix-size 1 forces the first tokens of each reference, and "
                                "fairseq-interactive reads none (it would be ignored): leave it out, or decode a "
                                "binarized split with fairseq-generate"),
    "generate-prefix-size": ("generation", ["--prefix-size", "1"], None),
}


@pytest.mark.parametrize("case", list(PARSE_CASES))
def test_generation_options_no_hypothesis_can_meet_stop_at_the_command_line(case):
    from fairseq import options

    from tests.conftest import USER_DIR

    parser, arguments, message = PARSE_CASES[case]
    parser = options.get_interactive_generation_parser() if parser == "interactive" else options.get_generation_parser()

    def parse():
        return options.parse_args_and_arch(parser, ["data", "--user-dir", str(USER_DIR), "--task", "translation",
                                                    *arguments])
    if message is None:
        parse()
        return
    with pytest.raises(SystemExit) as stop:
        parse()
    assert stop.value.code == message



def test_match_source_len_counts_a_batchs_sources_without_padding_when_it_gives_no_lengths():
    """A sample whose net_input has no src_lengths (a script's own batch): each source counts its tokens but padding
    and </s>, as fairseq's SequenceGenerator counts them then, and the message says so."""
    from palm_plugin.fixes.generation_options import batch_length_problem

    d = dictionary()
    a, b, c = (d.index(word) for word in "abc")
    tokens = torch.tensor([[a, b, c, d.eos(), d.pad(), d.pad()], [a, d.eos()] + [d.pad()] * 4])  # 3 and 1 words
    generator = Namespace(min_len=4, match_source_len=True, eos=d.eos(), pad=d.pad())
    assert batch_length_problem(generator, {"src_tokens": tokens}) == (
        "--min-len 4 with --match-source-len: the longest source of this batch counts 3 tokens (without its </s>, as "
        "fairseq counts), the longest a hypothesis may be; give --min-len 3 or less, or leave out --match-source-len")
    generator.min_len = 3
    assert batch_length_problem(generator, {"src_tokens": tokens}) is None


MODEL_OVERRIDE_CASES = {
    # fairseq's overwrite_args_by_name dropped them: the model decoded as if they had not been given
    "typo": ("unilm", "{'decoding_grahp': True}",
             "error: --model-overrides 'decoding_grahp': not an option of {path} (task unilm_seq2seq, model "
             "UniLMModel), so fairseq would ignore it; did you mean 'decoding_graph'? leave it out, or check its name "
             "(fairseq's options, with _ for -)"),
    "another-model's-option": ("palm", "{'decoding_graph': True, 'dropout': 0.0}",
                               "error: --model-overrides 'decoding_graph': not an option of {path} (task translation, "
                               "model PalmModel), so fairseq would ignore it; leave it out, or check its name "
                               "(fairseq's options, with _ for -)"),
    "known": ("unilm", "{'decoding_graph': True, 'dropout': 0.0}", None),
}


@pytest.mark.parametrize("case", list(MODEL_OVERRIDE_CASES))
def test_model_overrides_the_checkpoint_lacks_stop_the_command(tmp_path, case):
    """fairseq-generate's loading of --path with --model-overrides, in-process (fairseq-interactive's is the same)."""
    import ast

    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from tests.conftest import USER_DIR, save_untrained_checkpoint

    family, overrides, message = MODEL_OVERRIDE_CASES[case]
    arguments = (["--task", "unilm_seq2seq", "--arch", "unilm_tiny", "--criterion", "unilm_cloze"] if family == "unilm"
                 else ["--task", "translation", "-s", "src", "-t", "tgt", "--arch", "palm_tiny"])
    save_untrained_checkpoint(tmp_path, "model.pt", arguments)
    path = str(tmp_path / "model.pt")
    args = options.parse_args_and_arch(options.get_generation_parser(), [
        str(tmp_path), "--user-dir", str(USER_DIR), *arguments[:arguments.index("--arch")], "--path", path,
        "--model-overrides", overrides])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)

    def load():
        return checkpoint_utils.load_model_ensemble([path], arg_overrides=ast.literal_eval(args.model_overrides),
                                                    task=task)
    if message is None:
        models, cfg = load()
        assert cfg.model.decoding_graph is True and cfg.model.dropout == 0.0
        assert models[0].decoder.decoding_graph is True  # the decoder decodes as the override asks
        return
    with pytest.raises(SystemExit) as stop:
        load()
    assert stop.value.code == message.format(path=path)



def test_model_overrides_are_checked_against_a_model_configured_by_a_namespace():
    """A model without a dataclass (fairseq's lstm) keeps its options in the configuration as an argparse Namespace:
    the names --model-overrides is checked against include them (overriding one is not refused), and not a typo."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from palm_plugin.fixes.model_overrides import option_names

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--task", "translation", "-s", "src", "-t", "tgt", "--arch", "lstm"])
    cfg = convert_namespace_to_omegaconf(args)
    assert isinstance(cfg.model, Namespace)
    names = option_names(cfg)
    assert {"encoder_hidden_size", "decoder_attention", "lr", "beam"} <= names and "dropuot" not in names


ALIGNMENT_CASES = {
    "unilm": (["--task", "unilm_seq2seq", "--arch", "unilm_tiny", "--criterion", "unilm_cloze"],
              "--print-alignment: a UniLM model has no encoder-decoder attention to align with (source and target "
              "share one self-attention); decode without --print-alignment"),
    "palm": (["--task", "translation", "-s", "src", "-t", "tgt", "--arch", "palm_tiny", "--criterion", "cross_entropy"],
             "--print-alignment: this PALM model's encoder reads <s> before the source, so its attention is not over "
             "the source tokens fairseq aligns; decode without --print-alignment (a PALM trained with --no-source-bos "
             "prints them)"),
    "palm-no-source-bos": (["--task", "translation", "-s", "src", "-t", "tgt", "--arch", "palm_tiny", "--criterion",
                            "cross_entropy", "--no-source-bos"], None),
}


@pytest.mark.parametrize("family", list(ALIGNMENT_CASES))
def test_print_alignment_is_refused_where_the_attention_is_no_alignment(tmp_path, family):
    """fairseq failed on the first batch (IndexError for UniLM; KeyError for PALM, after printing part of the
    output): its alignment reads the decoder's attention as columns of ``src_tokens``."""
    from tests.conftest import save_untrained_checkpoint

    arguments, message = ALIGNMENT_CASES[family]
    model = save_untrained_checkpoint(tmp_path, "model.pt", arguments)
    args = GenerationConfig()
    args.print_alignment = "hard"
    if message is None:
        ToyTask(dictionary()).build_generator([model], args)
        return
    with pytest.raises(ValueError) as error:
        ToyTask(dictionary()).build_generator([model], args)
    assert str(error.value) == message


@pytest.mark.parametrize("task_name", ["unilm_seq2seq", "translation"])
def test_a_split_that_is_not_there_names_the_splits_that_are(tmp_path, task_name):
    """--gen-subset / --valid-subset of a split fairseq-preprocess did not write: unilm_seq2seq's, and fairseq's
    translation (PALM), which said "Dataset not found: test (DATA)"."""
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    from palm_plugin.tasks.unilm_seq2seq import UniLMSeq2SeqConfig, UniLMSeq2SeqTask

    for name in ("dict.src.txt", "dict.tgt.txt"):
        (tmp_path / name).write_text("w1 1\n")
    for split in ("train", "valid"):
        for suffix in ("idx", "bin"):
            (tmp_path / f"{split}.src-tgt.src.{suffix}").write_bytes(b"")
    if task_name == "unilm_seq2seq":
        task = UniLMSeq2SeqTask.setup_task(UniLMSeq2SeqConfig(data=str(tmp_path)))
    else:
        task = TranslationTask.setup_task(TranslationConfig(data=str(tmp_path), source_lang="src", target_lang="tgt"))
    with pytest.raises(FileNotFoundError) as error:
        task.load_dataset("test")
    assert str(error.value) == (
        f"{tmp_path}/test.src-tgt.src.idx: dataset not found (fairseq-preprocess output); {tmp_path} holds train, "
        f"valid: give one of those splits (--gen-subset, --valid-subset), or binarize 'test' into {tmp_path} with "
        "fairseq-preprocess")


def test_text_beside_a_binarized_split_is_read_as_fairseqs_translation_reads_it(tmp_path):
    """A folder that also holds fairseq-preprocess --dataset-impl raw's copies of the text (train.src-tgt.src): fairseq
    reads that text first, encoded with the task's dictionary, and so does unilm_seq2seq (not a failed assertion)."""
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    from palm_plugin.tasks.unilm_seq2seq import UniLMSeq2SeqConfig, UniLMSeq2SeqTask
    from tests.conftest import binarize

    words = Dictionary()
    for word in ("w1", "w2", "w3"):
        words.add_symbol(word)
    lines = {"src": ["w1 w2", "w3"], "tgt": ["w2", "w3 w1 w1"]}
    for lang, text in lines.items():
        words.save(str(tmp_path / f"dict.{lang}.txt"))
        (tmp_path / f"train.src-tgt.{lang}").write_text("\n".join(text) + "\n")
        binarize(tmp_path / f"train.src-tgt.{lang}", [[] for _ in text], words)  # unlike the text: shows which is read
    task = UniLMSeq2SeqTask.setup_task(UniLMSeq2SeqConfig(data=str(tmp_path)))
    task.load_dataset("train")
    fairseqs = TranslationTask.setup_task(TranslationConfig(data=str(tmp_path), source_lang="src", target_lang="tgt",
                                                            dataset_impl=None))  # fairseq's default: inferred
    fairseqs.load_dataset("train")
    ours, reference = task.dataset("train"), fairseqs.dataset("train")
    for side, dataset, expected in (("src", ours.source, reference.src), ("tgt", ours.target, reference.tgt)):
        assert [dataset[i].tolist() for i in range(2)] == [expected[i].tolist() for i in range(2)] == [
            [*map(task.dictionary.index, line.split()), task.dictionary.eos()] for line in lines[side]]
