"""Decoding options of the authors' code (s2s-ft, UniLMv2's appendix) for every fairseq generator.

fairseq's beam search divides a finished hypothesis' log-probability by ``len ** --lenpen``; s2s-ft (UniLM v1.2,
UniLMv2, MiniLM) divides by the GNMT length penalty ``((5 + len) / 6) ** alpha`` (Wu et al. 2016), ``len`` counting
the final [EOS] in both. s2s-ft's trigram blocking (``--forbid_duplicate_ngrams --forbid_ignore_word "."``) never
blocks an n-gram that holds one of the given tokens; fairseq's ``--no-repeat-ngram-size`` blocks every repeat.

:func:`install` adds two fields to fairseq's ``GenerationConfig`` (so ``fairseq-generate``, ``fairseq-interactive``
and the hub interface's ``generate(..., lenpen_style="gnmt")`` accept them; the plugin is imported inside
``options.get_parser``, before ``add_generation_args`` reads the dataclass) and makes ``FairseqTask.build_generator``
apply them to the ``SequenceGenerator`` it builds, for fairseq's own tasks (PALM decodes with ``translation``) and the
plugin's alike. It also refuses, with what to do, the generation options that fairseq would run into an assertion or a
traceback in the middle of decoding, or ignore: a ``--min-len`` above ``--max-len-b`` (:func:`length_problem`) and
fairseq-interactive's ``--score-reference`` or ``--prefix-size`` when the command line is parsed,
``--print-alignment`` on models whose attention is no alignment to the source, and at each batch a ``--min-len`` above
that batch's longest output (:func:`batch_length_problem`); and ``--eval-bleu-args`` that is no JSON object of
decoding options (:func:`eval_bleu_problem`, for ``--eval-bleu`` of fairseq's ``translation`` and of the plugin's ``unilm_seq2seq``:
fairseq ignores the names it does not know).
"""
import dataclasses
import json
import logging
import math
from argparse import Namespace
from dataclasses import dataclass, field, fields
from typing import Optional

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.configs import GenerationConfig

from palm_plugin.errors import CommandError, InputValueError
from palm_plugin.fixes.ngram_repeat_block import PrefixNGramRepeatBlock
from palm_plugin.fixes.option_ranges import option_flag
from palm_plugin.fixes.parsed_arguments import check_after_parsing

logger = logging.getLogger(__name__)

LENPEN_STYLES = ("fairseq", "gnmt")
# the markers fairseq's post_process joins (fairseq/data/data_utils.py); any other raises there, at a validation
REMOVE_BPE = ("@@ ", "@@", "subword_nmt", "sentencepiece", "wordpiece", "letter", "silence", "_EOW", "none")


@dataclass
class PluginGenerationOptions(FairseqDataclass):
    """The fields :func:`install` adds to fairseq's ``GenerationConfig``."""

    lenpen_style: ChoiceEnum(LENPEN_STYLES) = field(
        default="fairseq",
        metadata={
            "help": "how --lenpen normalises finished hypotheses: 'fairseq' divides the log-probability by "
            "len ** lenpen; 'gnmt' by ((5 + len) / 6) ** lenpen, the GNMT penalty of s2s-ft's --length_penalty "
            "(len counts the final </s> in both)"
        },
    )
    no_repeat_ngram_ignore: Optional[str] = field(
        default=None,
        metadata={
            "help": "with --no-repeat-ngram-size: never block an n-gram holding one of these target dictionary "
            "symbols, separated by '|' (s2s-ft's --forbid_ignore_word '.'). Symbols are as in dict.txt, after "
            "BPE: with fairseq's GPT-2 BPE '.' is 13"
        },
    )


class IgnoringNGramRepeatBlock(PrefixNGramRepeatBlock):
    """Blocks a token that would repeat an n-gram of the hypothesis unless the n-gram holds an ignored token.

    This is s2s-ft's rule: no blocking when the last ``n - 1`` tokens hold an ignored token, and an earlier match of
    them blocks its next token only if that token is not ignored. Vectorised, so it runs on the device of the scores.
    """

    def __init__(self, no_repeat_ngram_size: int, ignored_tokens):
        super().__init__(no_repeat_ngram_size, use_extension=False)
        self.register_buffer("ignored", torch.tensor(sorted(ignored_tokens), dtype=torch.long), persistent=False)

    def forward(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        """``tokens`` ``(bsz * beam, L)`` the generator's buffer; ``lprobs`` ``(bsz * beam, V)``, updated in place."""
        n = self.no_repeat_ngram_size
        prefix = tokens[:, : step + 1]
        if prefix.size(1) < n:
            return lprobs
        ngrams = prefix.unfold(1, n, 1)  # (rows, windows, n): every n-gram generated so far
        tail = prefix[:, prefix.size(1) - n + 1 :]  # the n - 1 tokens the next one would extend
        ignored = torch.isin(ngrams, self.ignored.to(tokens.device))
        banned = (ngrams[:, :, :-1] == tail.unsqueeze(1)).all(-1) & ~ignored.any(-1)
        rows, windows = banned.nonzero(as_tuple=True)
        lprobs[rows, ngrams[rows, windows, -1]] = -math.inf
        return lprobs


class GenerationOptionError(CommandError):
    """Generation options that no hypothesis can satisfy."""


def length_problem(args, named=option_flag):
    """``--min-len`` above the longest output ``--max-len-b`` allows when ``--max-len-a`` is 0 (the default), or None.
    fairseq asserts it at the first batch (``min_len cannot be larger than max_len``), naming neither option.
    ``named(name, value)`` writes an option as the user gave it (``--min-len 5``, or ``min_len=5`` in Python)."""
    low, a, b = (getattr(args, name, None) for name in ("min_len", "max_len_a", "max_len_b"))
    if getattr(args, "match_source_len", False) or a != 0 or not isinstance(b, int) or not isinstance(low, int):
        return None
    if low > b:
        return (f"{named('min_len', low)} is above {named('max_len_b', b)}, the longest output with "
                f"{named('max_len_a', 0)}: no hypothesis can end; give min_len <= max_len_b")
    return None


def _interactive_problem(args):
    """The options that read references, which fairseq-interactive has none of, or None: --score-reference failed on
    the first line (``KeyError: 'target'``), --prefix-size was ignored."""
    if not hasattr(args, "buffer_size"):  # fairseq-interactive's own option
        return None
    if getattr(args, "score_reference", False):
        return ("--score-reference scores the references of a binarized split, and fairseq-interactive reads none: "
                "score them with fairseq-generate --score-reference (or the API's score(sources, targets))")
    if getattr(args, "prefix_size", 0):
        return (f"--prefix-size {args.prefix_size} forces the first tokens of each reference, and fairseq-interactive "
                f"reads none (it would be ignored): leave it out, or decode a binarized split with fairseq-generate")
    return None


def _check_parsed(args):
    message = length_problem(args) or _interactive_problem(args) or eval_bleu_problem(args)
    if message:
        raise GenerationOptionError(message)


def json_option(name: str, value: str) -> dict:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise InputValueError(f"--{name} {value!r}: not JSON ({error}); write it as '{{\"beam\": 4}}', names and "
                              "strings in double quotes") from None
    if not isinstance(parsed, dict):
        raise InputValueError(f"--{name} {value!r}: a JSON object of options is needed, e.g. '{{\"beam\": 4}}'")
    return parsed


def decoding_options(value: str) -> Namespace:
    """``--eval-bleu-args`` as the namespace ``build_generator`` reads; a name fairseq-generate does not have stops
    (fairseq's translation task ignores it, and decodes with the default)."""
    options = json_option("eval-bleu-args", value)
    known = {f.name for f in fields(GenerationConfig)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InputValueError(f"--eval-bleu-args: {', '.join(unknown)}: not a decoding option; give fairseq-generate's "
                              "names with underscores (beam, lenpen, max_len_a, max_len_b, min_len, "
                              "no_repeat_ngram_size, lenpen_style, ...)")
    return Namespace(**options)


def eval_bleu_problem(args) -> Optional[str]:
    """What stops ``--eval-bleu``'s options of a parsed command line (fairseq's ``translation`` task has them
    too, and reads them only when the model is built), or None."""
    if not getattr(args, "eval_bleu", False):
        return None
    remove_bpe = getattr(args, "eval_bleu_remove_bpe", None)
    if remove_bpe is not None and remove_bpe not in REMOVE_BPE:
        return (f"--eval-bleu-remove-bpe {remove_bpe!r}: fairseq joins {', '.join(map(repr, REMOVE_BPE))}; leave it "
                "out to count BPE pieces (GPT-2's, BERT's WordPiece)")
    try:
        decoding_options(args.eval_bleu_args)
        json_option("eval-bleu-detok-args", args.eval_bleu_detok_args)
    except InputValueError as error:
        return str(error)
    return None


def _check_alignment(models):
    """--print-alignment reads the decoder's attention as an alignment to ``src_tokens``; refuse models where it is
    none (the plugin's models say so: ``alignment_problem``), before fairseq fails on the first batch (an IndexError
    or KeyError) after printing part of the output."""
    for model in models:
        problem = model.alignment_problem() if hasattr(model, "alignment_problem") else None
        if problem:
            raise InputValueError(f"--print-alignment: {problem}")


def batch_length_problem(generator, net_input):
    """Why no hypothesis of this batch can reach ``--min-len``, or None. fairseq asserts ``min_len <= max_len`` at the
    start of each batch (``min_len cannot be larger than max_len``, naming no option), where the longest output
    depends on the batch: its longest source with ``--match-source-len``, else ``--max-len-a`` x the padded source
    width + ``--max-len-b``, capped one below the model's decoder positions."""
    tokens, low = net_input.get("src_tokens"), generator.min_len
    if tokens is None:
        return None
    if generator.match_source_len:
        lengths, counted = net_input.get("src_lengths"), "with its </s>"
        if lengths is None:  # fairseq's own count then leaves </s> out
            lengths, counted = (tokens.ne(generator.eos) & tokens.ne(generator.pad)).sum(1), "without its </s>"
        longest = int(lengths.max())
        if low > longest:
            return (f"--min-len {low} with --match-source-len: the longest source of this batch counts {longest} "
                    f"tokens ({counted}, as fairseq counts), the longest a hypothesis may be; give --min-len "
                    f"{longest} or less, or leave out --match-source-len")
        return None
    a, b, width = generator.max_len_a, generator.max_len_b, tokens.size(1)
    limit, cap = int(a * width + b), generator.max_len - 1
    if low <= min(limit, cap):
        return None
    if limit <= cap:
        return (f"--min-len {low} is above --max-len-a {a} x {width} (this batch's source width) + --max-len-b {b} "
                f"= {limit}, the longest output of this batch; raise --max-len-a or --max-len-b, or give --min-len "
                f"{limit} or less")
    return (f"--min-len {low} is above {cap}, the longest output the model's {generator.max_len} decoder positions "
            f"allow; give --min-len {cap} or less")


def _apply(generator, args, dictionary) -> None:
    """Configure ``generator`` (built by fairseq from the generation options ``args``) with the plugin's options."""
    from fairseq.sequence_generator import SequenceGenerator

    style = getattr(args, "lenpen_style", "fairseq")
    if style not in LENPEN_STYLES:
        raise InputValueError(f"--lenpen-style {style!r}: choose one of {', '.join(LENPEN_STYLES)}")
    ignore = getattr(args, "no_repeat_ngram_ignore", None)
    if not isinstance(generator, SequenceGenerator):  # --score-reference, sampling-free scorers: nothing to decode
        return
    if getattr(args, "print_alignment", None):
        _check_alignment(generator.model.models)
    if style == "gnmt" and not generator.normalize_scores:
        raise InputValueError("--lenpen-style gnmt normalises scores: leave out --unnormalized")
    generator.gnmt_length_penalty = style == "gnmt"
    if ignore:
        n = getattr(args, "no_repeat_ngram_size", 0)
        if not n:
            raise InputValueError("--no-repeat-ngram-ignore needs --no-repeat-ngram-size (s2s-ft: 3)")
        symbols = ignore.split("|")
        missing = [s for s in symbols if dictionary.index(s) == dictionary.unk() and s != dictionary.unk_word]
        if missing:
            raise InputValueError(
                f"--no-repeat-ngram-ignore: {' '.join(missing)} not in the target dictionary; give symbols as they "
                f"appear in dict.txt (after BPE)"
            )
        generator.repeat_ngram_blocker = IgnoringNGramRepeatBlock(n, [dictionary.index(s) for s in symbols])


def _add_fields(target, source) -> None:
    """Add the dataclass fields of ``source`` to the existing dataclass ``target`` (defaults as class attributes and
    types as annotations, where dataclasses keep them), so fairseq's parser and omegaconf see them."""
    for f in dataclasses.fields(source):
        if f.name not in target.__dataclass_fields__:
            target.__dataclass_fields__[f.name] = f
            target.__annotations__[f.name] = f.type
            setattr(target, f.name, f.default)


def install():
    """Add the options to ``GenerationConfig`` and apply them in ``build_generator`` (idempotent)."""
    from fairseq.dataclass.configs import GenerationConfig
    from fairseq.dataclass.initialize import hydra_init
    from fairseq.sequence_generator import SequenceGenerator
    from fairseq.tasks.fairseq_task import FairseqTask

    build_generator = FairseqTask.build_generator
    if getattr(build_generator, "__palm_plugin__", False):
        return
    _add_fields(GenerationConfig, PluginGenerationOptions)
    hydra_init()  # fairseq stored the config schema at import; store it again with the new fields
    check_after_parsing("__palm_generation_options__", lambda args, argv: _check_parsed(args))

    def build_generator_with_options(self, models, args, *rest, **kwargs):
        generator = build_generator(self, models, args, *rest, **kwargs)
        _apply(generator, args, self.target_dictionary)
        return generator

    finalize_hypos = SequenceGenerator.finalize_hypos

    def finalize_hypos_with_gnmt(self, step, *rest, **kwargs):
        # fairseq divides by (step + 1) ** len_penalty; this exponent makes that ((5 + step + 1) / 6) ** alpha.
        # At step 0 both penalties are 1.
        if not getattr(self, "gnmt_length_penalty", False) or step == 0:
            return finalize_hypos(self, step, *rest, **kwargs)
        alpha = self.len_penalty
        self.len_penalty = alpha * math.log((6 + step) / 6) / math.log(step + 1)
        try:
            return finalize_hypos(self, step, *rest, **kwargs)
        finally:
            self.len_penalty = alpha

    generate = SequenceGenerator._generate

    def generate_within_lengths(self, sample, *rest, **kwargs):
        message = batch_length_problem(self, sample["net_input"])
        if message:
            raise InputValueError(message)
        return generate(self, sample, *rest, **kwargs)

    build_generator_with_options.__palm_plugin__ = True
    FairseqTask.build_generator = build_generator_with_options
    SequenceGenerator.finalize_hypos = finalize_hypos_with_gnmt
    SequenceGenerator._generate = generate_within_lengths
