"""Python API in fairseq's hub style for every model of the plugin (``palm``, ``unilm``, ``unilm2_*``).

::

    from palm_plugin.models.hub_interface import from_pretrained
    model = from_pretrained("checkpoints/cnndm", checkpoint_file="checkpoint_best.pt", data_name_or_path="data-bin/cnndm",
                            bpe="gpt2")
    model.generate(["a source document ..."], beam=5, lenpen=0.9, lenpen_style="gnmt", no_repeat_ngram_size=3)
    model.score(["a source document ..."], ["its summary ..."])  # log-probabilities and perplexity per pair

``PalmModel.from_pretrained`` and ``UniLMModel.from_pretrained`` are this function. Loading, tokenisation, BPE,
batching by length (``max_tokens`` / ``batch_size``) and beam search are fairseq's
(:class:`fairseq.hub_utils.GeneratorHubInterface`, the task's ``build_dataset_for_inference`` and
``build_generator``), so every generation option of ``fairseq-generate`` is a keyword here, the plugin's
``lenpen_style`` and ``no_repeat_ngram_ignore`` included, and the hypotheses are those of ``fairseq-generate``.
``score`` uses the task's ``--score-reference`` scorer: fairseq's ``SequenceScorer`` for PALM (``translation``
task), the one-pass reference scorer for UniLM (``unilm_seq2seq``).
"""
import copy
import difflib
import math
import os
from typing import Dict, List, Union

import torch
from fairseq import hub_utils, utils
from fairseq.data import BaseWrapperDataset, data_utils
from fairseq.tasks import FairseqTask
from omegaconf import open_dict

from palm_plugin.fixes.data_checks import warn_if_truncated
from palm_plugin.fixes.model_overrides import option_names
from palm_plugin.modules.dictionary_check import warn_if_unknown


def from_pretrained(
    model_name_or_path: str,
    checkpoint_file: str = "checkpoint_best.pt",
    data_name_or_path: str = ".",
    **kwargs,
) -> "PluginHubInterface":
    """Load a checkpoint of the plugin for generation and scoring.

    Args:
        model_name_or_path: the directory of the checkpoint (fairseq-train's ``--save-dir``).
        checkpoint_file: the file in it; ``a.pt:b.pt`` ensembles several.
        data_name_or_path: the fairseq-preprocess output with the dictionaries (relative to the model directory
            when it starts with ``.``).
        kwargs: overrides of the training configuration, as in fairseq: ``bpe="gpt2"``, ``tokenizer="moses"``,
            ``sentencepiece_model=...``, ``max_tokens=...``, ``batch_size=...``, generation defaults, ...
    """
    model_name_or_path, checkpoint_file = _path(model_name_or_path, "model_name_or_path"), _path(
        checkpoint_file, "checkpoint_file")
    data_name_or_path = _path(data_name_or_path, "data_name_or_path")
    # fairseq would look the name up in its hub archive list and fail deep inside with a TypeError
    for name in checkpoint_file.split(os.pathsep):
        path = os.path.join(model_name_or_path, name)
        if not os.path.isfile(path):
            found = sorted(n for n in os.listdir(model_name_or_path) if n.endswith(".pt")) if os.path.isdir(
                model_name_or_path) else None
            raise FileNotFoundError(
                f"{path}: no such checkpoint" + (f"; {model_name_or_path} holds {', '.join(found[:5])}" if found else
                                                 f"; {model_name_or_path} is not a directory" if found is None else
                                                 f"; {model_name_or_path} holds no .pt file")
                + " (from_pretrained(DIR, checkpoint_file=NAME) takes fairseq-train's --save-dir and a file in it)")
    # fairseq resolves a folder that is not there to None, and fails on a configuration field named data
    data = os.path.abspath(os.path.join(model_name_or_path, data_name_or_path)) if data_name_or_path.startswith(
        ".") else data_name_or_path
    if not os.path.isdir(data):
        raise FileNotFoundError(f"data_name_or_path {data}: no such folder; give the fairseq-preprocess output with "
                                f"the dictionaries (dict.*.txt), or leave it out to read them beside the checkpoint")
    overrides = set(kwargs)
    try:
        loaded = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, **kwargs)
    except FileNotFoundError as error:  # the task's dictionary, named by fairseq or the task's own message
        missing = error.filename or str(error).split(":")[0]
        if os.path.abspath(os.path.dirname(missing)) != os.path.abspath(data):
            raise
        raise FileNotFoundError(
            f"{missing}: no such dictionary; from_pretrained reads the dictionaries from data_name_or_path ({data}"
            f"{', by default the checkpoint folder' if data_name_or_path == '.' else ''}): give the fairseq-preprocess "
            f"output the checkpoint was trained with, or copy its dict.*.txt there") from None
    unknown = sorted(overrides - option_names(loaded["args"]) - {"generation_args", "archive_map"})
    if unknown:
        # fairseq overrides only the options the checkpoint's configuration has, and drops the others silently
        path = os.path.join(model_name_or_path, checkpoint_file)
        raise TypeError(
            f"from_pretrained: {', '.join(unknown)}: not an option of {path} (task {loaded['task'].cfg._name}, model "
            f"{type(loaded['models'][0]).__name__}), so it would have no effect; leave it out, or check its name "
            f"(fairseq's options, with _ for -)")
    task = loaded["task"]
    if type(task).build_dataset_for_inference is FairseqTask.build_dataset_for_inference:
        raise ValueError(
            f"{os.path.join(model_name_or_path, checkpoint_file)}: a checkpoint of the task {task.cfg._name} "
            f"(pre-training), which neither generates nor scores text; fine-tune it first (fairseq-train --task "
            f"unilm_seq2seq, or translation for PALM, with --finetune-from-model this checkpoint) and load that one")
    return PluginHubInterface(loaded["args"], task, loaded["models"])


def _path(value, name):
    """``value`` as a str path (a ``pathlib.Path`` is one); anything else is refused with what to give."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise TypeError(f"from_pretrained: {name} is a {type(value).__name__}; give a path (a str or a pathlib.Path)")


def _texts(values, name):
    """``values`` as a list of strings and whether it was one string (HF's convention: a str is one item)."""
    if isinstance(values, str):
        return [values], True
    if isinstance(values, (list, tuple)) and all(isinstance(v, str) for v in values):
        return list(values), False
    wrong = next((v for v in values if not isinstance(v, str)), values) if isinstance(values, (list, tuple)) else values
    raise TypeError(f"{name}: expected a string or a list of strings, got {type(wrong).__name__} {wrong!r:.60}; "
                    f"give text (the API tokenises it), e.g. {name}(\"a sentence\") or {name}([\"one\", \"two\"])")


def _keyword(name, value):
    """An option as a Python caller writes it: ``beam=0``."""
    return f"{name}={value}"


# Hugging Face's names of generation options that difflib does not match to fairseq's
HF_NAMES = {"max_new_tokens": "max_len_b", "length_penalty": "lenpen", "num_return_sequences": "nbest",
            "do_sample": "sampling", "top_k": "sampling_topk", "top_p": "sampling_topp"}


def _check_options(function, generation, options, extra=()):
    """The keywords of ``function`` (generate or score): generation options (fairseq would set an unknown one on its
    configuration and ignore it), in their ranges and consistent with the loaded ones (``generation``), as on the
    command line (``beam=0`` is refused with what to give)."""
    from types import SimpleNamespace

    from fairseq.dataclass.configs import GenerationConfig

    from palm_plugin.fixes.generation_options import length_problem
    from palm_plugin.fixes.option_ranges import problem

    known = set(GenerationConfig.__dataclass_fields__) | set(generation) | set(extra)
    for name in options:
        if name not in known:
            close = HF_NAMES.get(name) or next(iter(difflib.get_close_matches(name, sorted(known), n=1)), None)
            raise TypeError(f"{function}: unknown option {name!r}{f' (did you mean {close!r}?)' if close else ''}; "
                            "give fairseq-generate's options, with _ for - (beam, nbest, lenpen, max_len_a, max_len_b, "
                            "min_len, ...)")
    message = problem(SimpleNamespace(**options), named=_keyword) or length_problem(
        SimpleNamespace(**{**generation, **options}), named=_keyword)
    if message:
        raise ValueError(message)


class _WithReferences(BaseWrapperDataset):
    """The task's inference dataset plus the references as ``target`` (and, for encoder-decoder models fed by
    teacher forcing, ``prev_output_tokens``): what the task's ``--score-reference`` scorer reads."""

    def __init__(self, dataset, references, dictionary):
        super().__init__(dataset)
        self.references = references
        self.pad, self.eos = dictionary.pad(), dictionary.eos()

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if not batch:
            return batch
        references = [self.references[i] for i in batch["id"].tolist()]
        batch["target"] = data_utils.collate_tokens(references, self.pad, self.eos)
        batch["net_input"]["prev_output_tokens"] = data_utils.collate_tokens(
            references, self.pad, self.eos, move_eos_to_beginning=True
        )
        batch["ntokens"] = sum(len(r) for r in references)
        return batch


class PluginHubInterface(hub_utils.GeneratorHubInterface):
    """fairseq's generator hub interface whose ``generate`` also takes strings and whose ``score`` scores pairs."""

    @torch.inference_mode()
    def generate(self, inputs: Union[str, List[str], List[torch.LongTensor]], beam: int = 5, verbose=False, **kwargs):
        """Strings in, strings out (the best hypothesis of each, detokenised; with ``nbest`` above 1, a list of the
        ``nbest`` best of each); token tensors in, fairseq's hypothesis dicts out (``GeneratorHubInterface.generate``).
        Keywords are generation options (``beam``, ``nbest``, ``lenpen``, ``lenpen_style``, ``no_repeat_ngram_size``,
        ``no_repeat_ngram_ignore``, ``min_len``, ``max_len_b``, ...)."""
        _check_options("generate", self.cfg.generation, dict(beam=beam, **kwargs), extra=(
            "skip_invalid_size_inputs", "inference_step_args", "prefix_allowed_tokens_fn"))
        for name in ("score_reference", "prefix_size"):  # fairseq-generate's references: a failure, or ignored
            if kwargs.get(name):
                raise ValueError(f"generate: {name}={kwargs[name]} reads references, which generate has none of; "
                                 + ("score pairs with score(sources, targets)" if name == "score_reference" else
                                    "leave it out"))
        if isinstance(inputs, (list, tuple)) and inputs and all(torch.is_tensor(t) for t in inputs):
            return super().generate(inputs, beam=beam, verbose=verbose, **kwargs)
        texts, one = _texts(inputs, "generate")
        tokens = [self.encode(text) for text in texts]  # once: encoding warns about an unreadable input
        warn_if_truncated(self.task, tokens)
        nbest = kwargs.get("nbest", self.cfg.generation.nbest)
        outputs = [[self.decode(hypo["tokens"]) for hypo in hypos[:nbest]] if nbest > 1 else self.decode(
            hypos[0]["tokens"]) for hypos in super().generate(tokens, beam=beam, verbose=verbose, **kwargs)]
        return outputs[0] if one else outputs

    def encode(self, sentence: str) -> torch.LongTensor:
        """fairseq's encoding (tokenizer, BPE, dictionary), with a warning when the sentence has no known symbol."""
        tokens = super().encode(sentence)
        warn_if_unknown(sentence, tokens, self.src_dict)
        return tokens

    @torch.inference_mode()
    def score(self, sources: Union[str, List[str]], targets: Union[str, List[str]], **kwargs) -> List[Dict]:
        """Score each target given its source, as ``fairseq-generate --score-reference`` does. Two strings are one
        pair (one dict back), as ``generate`` of one string gives one string.

        Returns:
            per pair: ``tokens`` (the target with </s>), ``positional_scores`` (natural-log probability of each),
            ``log_prob`` (their sum), ``score`` (their mean) and ``perplexity`` (``exp(-score)``, per token).
        """
        _check_options("score", self.cfg.generation, kwargs)
        (sources, one), (targets, one_target) = _texts(sources, "score"), _texts(targets, "score")
        if one != one_target:
            raise TypeError("score: one source string but a list of targets, or the reverse; give two strings (one "
                            "pair) or two lists of the same length")
        if len(sources) != len(targets):
            raise ValueError(f"score: {len(sources)} sources but {len(targets)} targets")
        source_tokens = [self.encode(s) for s in sources]
        references = [self.tgt_dict.encode_line(self.apply_bpe(self.tokenize(t)), add_if_not_exist=False).long()
                      for t in targets]
        generator = self._generator(score_reference=True, **kwargs)
        dataset = _WithReferences(
            self.task.build_dataset_for_inference(source_tokens, [len(t) for t in source_tokens]),
            references,
            self.tgt_dict,
        )
        iterator = self.task.get_batch_iterator(
            dataset=dataset,
            max_tokens=self.cfg.dataset.max_tokens,
            max_sentences=self.cfg.dataset.batch_size,
            max_positions=self.max_positions,
            disable_iterator_cache=True,
        ).next_epoch_itr(shuffle=False)
        results = {}
        for batch in iterator:
            batch = utils.apply_to_sample(lambda t: t.to(self.device), batch)
            for i, hypos in zip(batch["id"].tolist(), self.task.inference_step(generator, self.models, batch)):
                positional = hypos[0]["positional_scores"].float().cpu()
                mean = float(positional.mean())
                results[i] = {
                    "tokens": hypos[0]["tokens"].cpu(),
                    "positional_scores": positional,
                    "log_prob": float(positional.sum()),
                    "score": mean,
                    "perplexity": math.exp(-mean),
                }
        return results[0] if one else [results[i] for i in range(len(sources))]

    def _generator(self, **options):
        """The task's generator (or scorer) for the loaded generation options updated with ``options``."""
        args = copy.deepcopy(self.cfg.generation)
        with open_dict(args):
            for key, value in options.items():
                setattr(args, key, value)
        return self.task.build_generator(self.models, args)
