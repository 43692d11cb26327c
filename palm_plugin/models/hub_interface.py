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
import math
import os
from typing import Dict, List, Union

import torch
from fairseq import hub_utils, utils
from fairseq.data import BaseWrapperDataset, data_utils
from fairseq.tasks import FairseqTask
from omegaconf import open_dict

from palm_plugin.fixes.data_checks import warn_if_truncated
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
    import palm_plugin

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
    kwargs.setdefault("user_dir", os.path.dirname(palm_plugin.__file__))
    loaded = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, **kwargs)
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


def _check_options(**options):
    """The generation options' ranges, as on the command line (``beam=0`` is refused with what to give)."""
    from types import SimpleNamespace

    from palm_plugin.fixes.option_ranges import problem

    message = problem(SimpleNamespace(**options), named=lambda name, value: f"{name}={value}")
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
        """Strings in, strings out (the best hypothesis of each, detokenised); token tensors in, fairseq's
        hypothesis dicts out (``GeneratorHubInterface.generate``). Keywords are generation options (``beam``,
        ``lenpen``, ``lenpen_style``, ``no_repeat_ngram_size``, ``no_repeat_ngram_ignore``, ``min_len``,
        ``max_len_b``, ...)."""
        _check_options(beam=beam, **kwargs)
        if isinstance(inputs, (list, tuple)) and inputs and all(torch.is_tensor(t) for t in inputs):
            return super().generate(inputs, beam=beam, verbose=verbose, **kwargs)
        texts, one = _texts(inputs, "generate")
        tokens = [self.encode(text) for text in texts]  # once: encoding warns about an unreadable input
        warn_if_truncated(self.task, tokens)
        outputs = [self.decode(hypos[0]["tokens"]) for hypos in
                   super().generate(tokens, beam=beam, verbose=verbose, **kwargs)]
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
        _check_options(**kwargs)
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
