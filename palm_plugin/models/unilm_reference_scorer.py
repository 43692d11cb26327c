"""``fairseq-generate --score-reference`` for the ``unilm`` model (task ``unilm_seq2seq``).

fairseq's own :class:`~fairseq.sequence_scorer.SequenceScorer` feeds ``net_input`` to ``model(...)`` and expects
decoder logits aligned with the target: a UniLM has no such call, because it predicts target token i from a
placeholder at the position of token i (Dong et al. 2019, section 2.5). This scorer packs each pair as
``[source | reference | placeholder x n]`` under the UniLMv2 fine-tuning mask
(:func:`palm_plugin.data.pseudo_seq2seq_dataset.pack_pseudo_seq2seq`): placeholder row i sees the source, the
reference tokens before i and itself, exactly what the incremental decoder's placeholder sees when ``y_<i`` has
been decoded. One forward pass therefore gives ``log P(y_i | x, y_<i)`` of every reference token as decoding
computes it, for UniLM v1 models (placeholder ``[MASK]``) and UniLMv2 models (``<pseudo>``) alike.
"""
import math
from typing import List

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.sequence_scorer import SequenceScorer

from palm_plugin.data.pseudo_seq2seq_dataset import pack_pseudo_seq2seq
from palm_plugin.errors import InputValueError


class UniLMReferenceScorer(SequenceScorer):
    """Scores the references of a ``unilm_seq2seq`` batch; returns hypotheses in :class:`SequenceScorer`'s format.

    Args:
        dictionary: the task's (shared) dictionary.
        source_segment, target_segment: the segment ids the task gives source and target.
    """

    def __init__(self, dictionary, source_segment: int, target_segment: int):
        super().__init__(dictionary)
        self.source_segment, self.target_segment = source_segment, target_segment

    @torch.no_grad()
    def generate(self, models, sample, **unused) -> List[List[dict]]:
        """
        Returns:
            per sentence, one hypothesis: ``tokens`` (the reference), ``positional_scores`` (natural-log
            probabilities of each reference token; an ensemble's are averaged in probability space, as fairseq
            does), ``score`` (their mean), no attention or alignment.
        """
        device = sample["target"].device
        sources = [utils.strip_pad(row, self.pad).cpu() for row in sample["net_input"]["src_tokens"]]
        references = [utils.strip_pad(row, self.pad).cpu() for row in sample["target"]]
        longest = max(len(s) + len(r) for s, r in zip(sources, references))
        per_model = []
        for model in models:
            model.eval()
            if longest > model.max_positions():
                raise InputValueError(
                    f"a source and reference of {longest} tokens exceed the model's {model.max_positions()} "
                    f"positions: lower --max-source-positions or leave the longest test pairs out"
                )
            net_input, labels = pack_pseudo_seq2seq(
                sources, references, references, model.decoder.placeholder, self.pad, self.source_segment,
                self.target_segment,
            )
            labels = labels.to(device)
            predicted = labels.ne(self.pad)
            logits, _ = model(**{k: v.to(device) for k, v in net_input.items()}, masked_tokens=predicted)
            log_probs = F.log_softmax(logits.float(), dim=-1)
            per_model.append(log_probs.gather(1, labels[predicted].unsqueeze(1)).squeeze(1))
        scores = torch.logsumexp(torch.stack(per_model), dim=0) - math.log(len(models))
        # the predicted positions come in row-major order: sentence by sentence, each reference's tokens in order
        hypos = []
        for reference, positional in zip(references, scores.split([len(r) for r in references])):
            hypos.append(
                [{"tokens": reference.to(device), "score": positional.mean(), "attention": None, "alignment": None,
                  "positional_scores": positional}]
            )
        return hypos
