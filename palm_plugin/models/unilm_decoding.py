"""UniLM's encoder/decoder pair for fairseq's ``SequenceGenerator`` (Dong et al. 2019, section 2.5, decoding).

The "encoder" runs ``[SOS] S1 [EOS]`` once, bidirectionally, and keeps every layer's keys and values once per
sentence; the incremental "decoder" feeds, per step, the token decoded last and a placeholder ([MASK], or UniLMv2's
pseudo token) at the next position, predicts from the placeholder, and caches only the real token's keys and values.
Without an incremental state the decoder recomputes the whole packed sequence instead (the reference the cached
path is tested against). With ``--decoding-graph`` the cache has fixed shapes and each step is one CUDA graph
(:mod:`palm_plugin.modules.fixed_shape_decoding`). Both share the network and LM head of
:class:`palm_plugin.models.unilm.UniLMModel`.
"""
from typing import Dict, Optional

import torch
from fairseq.models import FairseqEncoder, FairseqIncrementalDecoder

from palm_plugin.errors import InputValueError
from palm_plugin.modules.attention_masks import bidirectional_mask, hide_padding, seq2seq_decoding_mask, seq2seq_mask
from palm_plugin.modules.fixed_shape_decoding import FixedShapeStep
from palm_plugin.modules.unilm_transformer import UniLMTransformer


class UniLMSourceEncoder(FairseqEncoder):
    """Runs ``[SOS] S1 [EOS]`` (right-padded) once and keeps each layer's keys and values for decoding.

    The output holds the source cache once per sentence; ``rows_per_source`` says how many consecutive decoder
    rows (the sentence's beams) share each entry. :meth:`reorder_encoder_out` changes only that number while the
    rows of a sentence stay together (the usual case: beams reordered within their sentence), and copies the cache
    only when sentences are dropped or the order mixes sentences.
    """

    def __init__(self, dictionary, stack: UniLMTransformer):
        super().__init__(dictionary)
        self.stack = stack
        self.padding_idx = dictionary.pad()

    def forward(self, src_tokens, src_lengths=None, source_segments=None, target_segment=None, **unused):
        """
        Args:
            src_tokens: ``(n, S)`` right-padded ``[SOS] S1 [EOS]``.
            source_segments: ``(n, S)`` segment ids of the source; target_segment: ``(n,)`` segment id the decoded
                tokens get. The task's data decides both (UniLM v1: 4 and 5; UniLMv2: 0 and 1).
        Returns:
            dict with ``source_keys`` / ``source_values`` (per layer ``(n, h, S, d)``), ``source_padding``
            ``(n, S)``, ``src_tokens``, ``source_segments``, ``target_segment``, ``rows_per_source`` (1) and
            ``relative_bias_table`` (UniLMv2: the bias of every position offset, read by each decoding step).
        """
        if source_segments is None or target_segment is None:
            raise InputValueError(
                "UniLM decoding needs source_segments and target_segment in net_input; use --task unilm_seq2seq"
            )
        padding = src_tokens.eq(self.padding_idx)
        mask = hide_padding(bidirectional_mask(src_tokens.size(1), src_tokens.device), padding)
        cache = self.stack.forward_source(src_tokens, mask, source_segments)
        table = self.stack.bias_table()
        return {
            "relative_bias_table": [] if table is None else [table],  # per batch, not per row: never reordered
            "source_keys": [k for k, _ in cache],
            "source_values": [v for _, v in cache],
            "source_padding": [padding],
            "src_tokens": [src_tokens],
            "source_segments": [source_segments],
            "target_segment": [target_segment],
            "rows_per_source": [1],
        }

    def reorder_encoder_out(self, encoder_out, new_order):
        """Point the decoder rows ``new_order`` (``(N',)`` indices of the current rows) at their sentences."""
        sentence_of_row = new_order // encoder_out["rows_per_source"][0]
        group = int((sentence_of_row == sentence_of_row[0]).sum())
        grouped = sentence_of_row.numel() % group == 0 and bool(
            (sentence_of_row.view(-1, group) == sentence_of_row.view(-1, group)[:, :1]).all()
        )
        if not grouped:
            group = 1
        sentences = sentence_of_row[::group]
        current = encoder_out["source_padding"][0].size(0)
        reordered = dict(encoder_out, rows_per_source=[group])
        if sentences.numel() != current or bool((sentences != torch.arange(current, device=sentences.device)).any()):
            for key in ("source_keys", "source_values", "source_padding", "src_tokens", "source_segments", "target_segment"):
                reordered[key] = [t.index_select(0, sentences) for t in encoder_out[key]]
        return reordered

    def max_positions(self):
        return self.stack.embeddings.positions.num_embeddings


class UniLMIncrementalDecoder(FairseqIncrementalDecoder):
    """Predicts target token t from a placeholder at position ``|[SOS] S1 [EOS]| + t`` (section 2.5).

    The network and LM head belong to the model; the decoder keeps references to them without registering them
    again (so the parameters are stored once).
    """

    def __init__(self, dictionary, stack: UniLMTransformer, lm_head, cfg):
        super().__init__(dictionary)
        self.__dict__["stack"] = stack
        self.__dict__["lm_head"] = lm_head
        self.placeholder = dictionary.index(cfg.decoding_placeholder)
        if self.placeholder == dictionary.unk() and cfg.decoding_placeholder != dictionary.unk_word:
            raise ValueError(
                f"decoding placeholder {cfg.decoding_placeholder!r} is not in the dictionary; the task must add it "
                f"(dictionary.add_symbol) before building the model"
            )
        self.padding_idx = dictionary.pad()
        self.decoding_graph = getattr(cfg, "decoding_graph", False)

    def forward(self, prev_output_tokens, encoder_out, incremental_state=None, **unused):
        """
        Args:
            prev_output_tokens: ``(N, t + 1)``: the generator's start symbol, then the ``t`` tokens decoded so far.
            encoder_out: from :class:`UniLMSourceEncoder` (``N`` = its sentences x ``rows_per_source``).
            incremental_state: fairseq's cache dict; None recomputes the whole packed sequence.
        Returns:
            logits ``(N, 1, V)`` for target token t, and ``{"attn": None, "ends": (N,) bool}``: the rows whose
            placeholder sits at the model's last position, which can only end (:meth:`get_normalized_probs`).
        """
        if incremental_state is None:
            logits = self.lm_head(self._recompute(prev_output_tokens, encoder_out))
        elif self.decoding_graph:
            logits = self._fixed_shape_step(prev_output_tokens, encoder_out, incremental_state)
        else:
            logits = self.lm_head(self._step(prev_output_tokens, encoder_out, incremental_state))
        # A long source leaves fewer positions for the output than --max-len-a/b may allow: end the hypothesis at the
        # last position, as fairseq's generator does at its max_len, instead of failing on the next position id.
        placeholder_positions = self._source_lengths(encoder_out) + prev_output_tokens.size(1) - 1
        return logits, {"attn": None, "ends": placeholder_positions >= self.max_positions() - 1}

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        """fairseq's softmax over the logits; then, in the rows that can only end, every token but [EOS] gets
        probability 0 and [EOS] keeps its own, as fairseq's generator does at its max_len (masking the logits
        instead would give [EOS] probability 1 there, favouring the hypotheses cut off)."""
        probs = super().get_normalized_probs(net_output, log_probs, sample)
        ends = net_output[1].get("ends") if len(net_output) > 1 and net_output[1] else None
        if ends is None:
            return probs
        not_eos = torch.arange(probs.size(-1), device=probs.device) != self.dictionary.eos()
        return probs.masked_fill(ends[:, None, None] & not_eos, float("-inf") if log_probs else 0.0)

    def _rows(self, tensor, encoder_out):
        """A per-sentence tensor repeated for each decoder row (used for small tensors only)."""
        return tensor.repeat_interleave(encoder_out["rows_per_source"][0], dim=0)

    def _source_lengths(self, encoder_out):
        return self._rows((~encoder_out["source_padding"][0]).sum(1), encoder_out)

    def _step(self, prev_output_tokens, encoder_out, incremental_state):
        decoded = prev_output_tokens.size(1) - 1
        rows = prev_output_tokens.size(0)
        device = prev_output_tokens.device
        placeholder = torch.full((rows, 1), self.placeholder, dtype=torch.long, device=device)
        # At step 0 the token before the placeholder is the source's final [EOS], already in the source cache.
        tokens = placeholder if decoded == 0 else torch.cat([prev_output_tokens[:, -1:], placeholder], dim=1)
        new = tokens.size(1)
        source_lengths = self._source_lengths(encoder_out).unsqueeze(1)
        positions = source_lengths + torch.arange(decoded + 1 - new, decoded + 1, device=device)
        cached_positions = source_lengths + torch.arange(decoded + 1 - new, device=device)
        source_padding = self._rows(encoder_out["source_padding"][0], encoder_out)
        source_positions = torch.arange(source_padding.size(1), device=device).expand(rows, -1)
        key_positions = torch.cat([source_positions, cached_positions, positions], dim=1)

        cache = self.get_incremental_state(incremental_state, "target_cache")
        num_layers = len(self.stack.layers)
        target_cache = None
        if cache is not None:
            target_cache = [(cache[f"key_{i}"], cache[f"value_{i}"]) for i in range(num_layers)]
        mask = seq2seq_decoding_mask(source_padding, cached_positions.size(1), new)
        source_cache = list(zip(encoder_out["source_keys"], encoder_out["source_values"]))
        features, new_kv = self.stack.forward_step(
            tokens,
            positions,
            self._rows(encoder_out["target_segment"][0], encoder_out).unsqueeze(1).expand_as(tokens),
            key_positions,
            mask,
            source_cache,
            target_cache,
            encoder_out["relative_bias_table"][0] if encoder_out.get("relative_bias_table") else None,
        )
        if new == 2:  # keep the real token, never the placeholder
            updated: Dict[str, Optional[torch.Tensor]] = {}
            for i, (k, v) in enumerate(new_kv):
                k, v = k[:, :, :1], v[:, :, :1]
                if target_cache is not None:
                    k, v = torch.cat([target_cache[i][0], k], dim=2), torch.cat([target_cache[i][1], v], dim=2)
                updated[f"key_{i}"], updated[f"value_{i}"] = k, v
            self.set_incremental_state(incremental_state, "target_cache", updated)
        return features[:, -1:]

    def _fixed_shape_step(self, prev_output_tokens, encoder_out, incremental_state):
        state = self.get_incremental_state(incremental_state, "fixed_shape")
        if state is None:
            dtype = encoder_out["source_keys"][0].dtype
            step = FixedShapeStep(self, encoder_out, prev_output_tokens.size(0), prev_output_tokens.device, dtype)
            state = {"step": step}
            self.set_incremental_state(incremental_state, "fixed_shape", state)
        return state["step"](prev_output_tokens, encoder_out)

    def _recompute(self, prev_output_tokens, encoder_out):
        """Run ``[source | decoded tokens | placeholder]`` through the full network with the seq2seq mask."""
        source = self._rows(encoder_out["src_tokens"][0], encoder_out)
        source_padding = source.eq(self.padding_idx)
        rows, width = source.shape
        target = torch.cat(
            [prev_output_tokens[:, 1:], prev_output_tokens.new_full((rows, 1), self.placeholder)], dim=1
        )
        tokens = torch.cat([source, target], dim=1)
        # The source keeps its right padding inside the packed row; explicit positions put the target right after
        # the source's last real token, as in training.
        source_lengths = (~source_padding).sum(1, keepdim=True)
        positions = torch.cat(
            [
                torch.arange(width, device=source.device).expand(rows, -1),
                source_lengths + torch.arange(target.size(1), device=source.device),
            ],
            dim=1,
        )
        target_segment = self._rows(encoder_out["target_segment"][0], encoder_out)
        segments = torch.cat(
            [self._rows(encoder_out["source_segments"][0], encoder_out), target_segment.unsqueeze(1).expand_as(target)],
            dim=1,
        )
        padding = torch.cat([source_padding, torch.zeros_like(target, dtype=torch.bool)], dim=1)
        mask = hide_padding(seq2seq_mask(source.new_full((rows,), width), tokens.size(1)), padding)
        features = self.stack(tokens, mask, positions, segments)
        return features[:, -1:]

    def reorder_incremental_state(self, incremental_state, new_order):
        """Reorder only the target cache (the source cache is per sentence, see :class:`UniLMSourceEncoder`)."""
        fixed_shape = self.get_incremental_state(incremental_state, "fixed_shape")
        if fixed_shape is not None:
            fixed_shape["step"].reorder(new_order)
        cache = self.get_incremental_state(incremental_state, "target_cache")
        if cache is not None:
            reordered = {name: tensor.index_select(0, new_order) for name, tensor in cache.items()}
            self.set_incremental_state(incremental_state, "target_cache", reordered)

    def max_positions(self):
        return self.stack.embeddings.positions.num_embeddings
