"""The shared Transformer of UniLM (Dong et al. 2019, sections 2.1-2.2), reused by UniLMv2 (Bao et al. 2020).

One BERT-style stack serves every objective; only the self-attention mask changes (equations 1-3):

    H^0 = LayerNorm(token + position + segment embeddings)
    Q, K, V = H^{l-1} W^Q, H^{l-1} W^K, H^{l-1} W^V                          (1)
    A_l = softmax(Q K^T / sqrt(d_k) + M [+ relative position bias]) V       (2, 3)
    H^l = post-LN BERT block (attention output + residual, GELU feed-forward + residual)

The mask ``M`` is boolean (True = may attend, :mod:`palm_plugin.modules.attention_masks`). Without a relative
position bias it goes to ``scaled_dot_product_attention`` as is; with one (UniLMv2), mask and bias are combined
once per forward into one additive float mask ``to_additive(M) + bias`` shared by every layer. With
``attention_impl="flex"`` the full-sequence forward goes through FlexAttention instead
(:mod:`palm_plugin.modules.flex_attention`: a block mask, and the bias as a score_mod), with ``"triton"`` through the
plugin's kernels (:mod:`palm_plugin.modules.attention_triton`: the mask from a code per token, the bias and the
attention dropout inside the kernels); decoding keeps SDPA.

Shapes: ``B`` batch, ``T`` query length, ``S`` key length, ``C`` model dimension, ``h`` heads, ``d = C / h``.
"""
import functools
import warnings
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from palm_plugin.errors import InputValueError
from palm_plugin.modules import flex_attention
from palm_plugin.modules.attention_impl import IMPLEMENTATIONS
from palm_plugin.modules.attention_masks import to_additive
from palm_plugin.modules.fused_attention import FusedMask
from palm_plugin.modules.relative_position import RelativePositionBias, masked_offset_bias


@functools.lru_cache(maxsize=None)
def _warn_explicit_mask(impl):
    warnings.warn(f"--attention-impl {impl}: a mask given as a tensor (not built from the batch's fields) goes "
                  f"through the sdpa path", stacklevel=3)


def _fields(positions, mask) -> flex_attention.MaskFields:
    """The kernels' mask fields: ``mask``, or for None (every row sees every column) a batch without padding."""
    return mask if mask is not None else flex_attention.MaskFields(positions.new_zeros(positions.shape,
                                                                                       dtype=torch.bool))


class UniLMEmbeddings(nn.Module):
    """Token + absolute position + segment embeddings, then LayerNorm and dropout (BERT's input layer)."""

    def __init__(self, vocab_size, padding_idx, dim, max_positions, num_segments, layer_norm_eps, dropout):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim, padding_idx=padding_idx)
        self.positions = nn.Embedding(max_positions, dim)
        self.segments = nn.Embedding(num_segments, dim)
        self.layer_norm = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens, positions, segments, check=True):
        """``tokens``, ``positions``, ``segments``: ``(B, T)`` long -> ``(B, T, C)``. ``check``: raise a readable
        error for a position beyond the table (a host synchronisation; fixed-shape decoding bounds them itself)."""
        if check and positions.max() >= self.positions.num_embeddings:
            raise InputValueError(
                f"position id {int(positions.max())} exceeds the model's {self.positions.num_embeddings} positions; "
                f"truncate the input (--max-source-positions / --max-target-positions / --max-len-b)"
            )
        x = self.tokens(tokens) + self.positions(positions) + self.segments(segments)
        return self.dropout(self.layer_norm(x))


class UniLMLayer(nn.Module):
    """One post-LN Transformer block (BERT's), with two ways to attend:

    * :meth:`forward`: the whole sequence at once through ``scaled_dot_product_attention``, or through a kernel of
      its own when given a :class:`~palm_plugin.modules.fused_attention.FusedMask` (training, scoring);
    * :meth:`forward_cached`: a few new query rows against keys and values computed before (incremental decoding),
      with the source keys/values stored once per sentence and shared by the sentence's beams.
    """

    def __init__(self, dim, ffn_dim, num_heads, layer_norm_eps, dropout, attention_dropout, activation_dropout):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"model dimension {dim} is not divisible by the number of heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.self_attn_layer_norm = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.final_layer_norm = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)
        self.activation_dropout = nn.Dropout(activation_dropout)
        self.attention_dropout = attention_dropout

    def _heads(self, x):
        """``(B, T, C)`` -> ``(B, h, T, d)``."""
        return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).transpose(1, 2)

    def project(self, x) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Equation (1): queries, keys and values ``(B, h, T, d)`` of ``x`` ``(B, T, C)``."""
        return self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))

    def _finish(self, x, context):
        """Output projection, residual + LayerNorm, feed-forward, residual + LayerNorm. ``context`` ``(B, h, T, d)``."""
        context = context.transpose(1, 2).reshape(x.shape)
        x = self.self_attn_layer_norm(x + self.dropout(self.out_proj(context)))
        hidden = self.activation_dropout(F.gelu(self.fc1(x)))
        return self.final_layer_norm(x + self.dropout(self.fc2(hidden)))

    def forward(self, x, attn_mask):
        """
        Args:
            x: ``(B, T, C)``.
            attn_mask: boolean ``(B, 1, T, T)`` (True = may attend), additive float ``(B, h, T, T)``, or a
                :class:`~palm_plugin.modules.fused_attention.FusedMask` (FlexAttention's, the Triton kernels').
        Returns:
            ``(B, T, C)``, and the keys and values ``(B, h, T, d)`` of ``x`` (kept by the decoder's source cache).
        """
        q, k, v = self.project(x)
        dropout_p = self.attention_dropout if self.training else 0.0
        if isinstance(attn_mask, FusedMask):
            context = attn_mask.attend(q, k, v, dropout_p)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        return self._finish(x, context), (k, v)

    def forward_cached(self, x, source_kv, target_kv, additive_mask):
        """Attend from new rows to [source | cached target | new rows] (incremental decoding, no dropout).

        Args:
            x: ``(N, Tq, C)`` new rows, ``N = n * k``: rows ``r*k .. r*k+k-1`` belong to source sentence ``r``.
            source_kv: keys and values ``(n, h, S, d)`` of the ``n`` source sentences, shared by their ``k`` rows.
            target_kv: keys and values ``(N, h, t, d)`` of the target tokens decoded before, or None.
            additive_mask: ``(N, 1 or h, Tq, S + t + Tq)`` float, 0 = may attend (bias included for UniLMv2).
        Returns:
            ``(N, Tq, C)`` outputs and the keys and values ``(N, h, Tq, d)`` of the new rows.
        """
        q, k_new, v_new = self.project(x)
        q = q * self.head_dim**-0.5
        source_k, source_v = source_kv
        n, rows, tq = source_k.size(0), x.size(0), x.size(1)
        group = rows // n

        # The k rows of a sentence become extra query rows of one product with that sentence's source keys, so the
        # source keys/values are never copied per beam.
        def fold(t):  # (N, h, Tq, *) -> (n, h, k*Tq, *)
            return t.view(n, group, *t.shape[1:]).transpose(1, 2).reshape(n, self.num_heads, group * tq, -1)

        def unfold(t):  # (n, h, k*Tq, *) -> (N, h, Tq, *)
            return t.view(n, self.num_heads, group, tq, -1).transpose(1, 2).reshape(rows, self.num_heads, tq, -1)

        k_target, v_target = k_new, v_new
        if target_kv is not None:
            k_target, v_target = torch.cat([target_kv[0], k_new], dim=2), torch.cat([target_kv[1], v_new], dim=2)
        scores = torch.cat(
            [unfold(fold(q) @ source_k.transpose(-1, -2)), q @ k_target.transpose(-1, -2)], dim=-1
        ) + additive_mask
        probs = torch.softmax(scores.float(), dim=-1).type_as(q)
        source_len = source_k.size(2)
        context = unfold(fold(probs[..., :source_len]) @ source_v) + probs[..., source_len:] @ v_target
        return self._finish(x, context), (k_new, v_new)


class UniLMTransformer(nn.Module):
    """Embeddings + ``layers`` :class:`UniLMLayer` blocks; the one network every UniLM objective shares.

    ``relative_position_buckets > 0`` adds UniLMv2's relative position bias
    (:class:`palm_plugin.modules.relative_position.RelativePositionBias`), computed once per forward from the
    position ids and added in every layer.

    ``attention_impl``: ``"sdpa"``, ``"flex"`` or ``"triton"`` (:data:`palm_plugin.modules.attention_impl.HELP`), for
    :meth:`forward`; :meth:`forward_source` and :meth:`forward_step` (decoding) always use SDPA.
    """

    def __init__(
        self,
        vocab_size: int,
        padding_idx: int,
        dim: int,
        ffn_dim: int,
        layers: int,
        num_heads: int,
        max_positions: int,
        num_segments: int,
        layer_norm_eps: float = 1e-12,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.0,
        relative_position_buckets: int = 0,
        relative_position_max_distance: int = 128,
        attention_impl: str = "sdpa",
    ):
        super().__init__()
        if attention_impl not in IMPLEMENTATIONS:
            raise ValueError(f"attention_impl {attention_impl!r}: one of {', '.join(IMPLEMENTATIONS)}")
        self.attention_impl = attention_impl
        self.embeddings = UniLMEmbeddings(
            vocab_size, padding_idx, dim, max_positions, num_segments, layer_norm_eps, dropout
        )
        self.layers = nn.ModuleList(
            UniLMLayer(dim, ffn_dim, num_heads, layer_norm_eps, dropout, attention_dropout, activation_dropout)
            for _ in range(layers)
        )
        self.relative_position = (
            RelativePositionBias(num_heads, relative_position_buckets, relative_position_max_distance)
            if relative_position_buckets > 0
            else None
        )

    @staticmethod
    def default_positions(tokens):
        """``(B, T)`` absolute positions ``0 .. T-1`` (BERT's)."""
        return torch.arange(tokens.size(1), device=tokens.device).expand_as(tokens)

    def attention_bias(self, query_positions, key_positions, mask, dtype, bias_table=None):
        """The mask as the layers take it, with UniLMv2's bias folded in when the model has one.

        Args:
            query_positions ``(B, T)``, key_positions ``(B, S)``: position ids (used by the bias only).
            mask: boolean ``(B, T, S)`` or ``(T, S)``, or None: every row sees every column.
            bias_table: :meth:`RelativePositionBias.table`, to read the bias from (decoding), or None.
        Returns:
            boolean ``(B or 1, 1, T, S)`` (None for no mask) without a relative position bias; otherwise additive
            float ``(B, h, T, S)`` = ``to_additive(mask) + bias``.
        """
        if self.relative_position is None:
            return None if mask is None else (mask.unsqueeze(0) if mask.dim() == 2 else mask).unsqueeze(1)
        table = self.bias_table() if bias_table is None else bias_table
        # CUDA's fused attention kernels take a mask only with its last dimension contiguous, and otherwise fall back
        # to the math path, which computes bf16 / fp16 attention in fp32 (docs/benchmarks-gpu.md, section 5):
        # masked_offset_bias lays it out so
        return masked_offset_bias(table.to(dtype), query_positions, key_positions, mask)

    def flex_mask(self, positions, mask, dtype) -> flex_attention.FlexMask:
        """What :meth:`attention_bias` gives the SDPA path, for FlexAttention: the block mask of ``mask`` (a
        :class:`~palm_plugin.modules.flex_attention.MaskFields`, or None: bidirectional without padding) and, with a
        relative position bias, the score_mod reading the bias of every offset by ``positions``."""
        batch, length = positions.shape
        block_mask = flex_attention.block_mask(_fields(positions, mask).mask_mod(), batch, length, positions.device)
        if self.relative_position is None:
            return flex_attention.FlexMask(block_mask)
        table = self.bias_table().to(dtype)
        score_mod = flex_attention.relative_position_score_mod(table, positions)
        return flex_attention.FlexMask(block_mask, score_mod)

    def triton_mask(self, positions, mask):
        """What :meth:`attention_bias` gives the SDPA path, for the Triton kernels: the mask of ``mask`` (a
        :class:`~palm_plugin.modules.flex_attention.MaskFields`, or None: bidirectional without padding) and, with a
        relative position bias, the bucket weights and the bucket of every offset."""
        from palm_plugin.modules.attention_triton import TritonMask

        fields = _fields(positions, mask)
        if self.relative_position is None:
            return TritonMask(fields)
        return TritonMask(fields, positions, self.relative_position.weight,
                          self.relative_position.offset_buckets(self.embeddings.positions.num_embeddings))

    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: Optional[torch.Tensor] = None,
        segments: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
    ):
        """
        Args:
            tokens: ``(B, T)`` token ids.
            attention_mask: boolean ``(B, T, T)`` or ``(T, T)``, True = row may attend to column; every row must see
                at least one column (see :func:`palm_plugin.modules.attention_masks.hide_padding`). None: no mask
                (``scaled_dot_product_attention`` may then use its flash kernel). Or the batch's compact fields,
                :class:`~palm_plugin.modules.flex_attention.MaskFields`, from which ``flex`` builds its block mask
                (and ``sdpa`` the dense mask).
            positions: ``(B, T)`` position ids (default ``0 .. T-1``); UniLMv2 gives appended tokens the position
                of the token they stand for.
            segments: ``(B, T)`` segment ids (default 0).
        Returns:
            top hidden states ``(B, T, C)``, and with ``return_all_hiddens`` the list of the ``L + 1`` states
            ``H^0 .. H^L``.
        """
        positions = self.default_positions(tokens) if positions is None else positions
        segments = torch.zeros_like(tokens) if segments is None else segments
        x = self.embeddings(tokens, positions, segments)
        if self.attention_impl == "triton" and not torch.is_tensor(attention_mask):
            attn_mask = self.triton_mask(positions, attention_mask)
        elif self.attention_impl == "flex" and not torch.is_tensor(attention_mask):
            attn_mask = self.flex_mask(positions, attention_mask, x.dtype)
        else:
            if isinstance(attention_mask, flex_attention.MaskFields):
                attention_mask = attention_mask.dense()
            elif self.attention_impl != "sdpa":
                # an explicit mask (a caller's own; full recomputation while decoding) has no structure for the
                # kernels to read: SDPA reads it as it is
                _warn_explicit_mask(self.attention_impl)
            attn_mask = self.attention_bias(positions, positions, attention_mask, x.dtype)
        hiddens: List[torch.Tensor] = [x]
        for layer in self.layers:
            x, _ = layer(x, attn_mask)
            hiddens.append(x)
        return (x, hiddens) if return_all_hiddens else x

    def forward_source(self, tokens, attention_mask, segments):
        """Encode a source once for decoding.

        Args:
            tokens, segments: ``(n, S)``; attention_mask: boolean ``(n, S, S)``.
        Returns:
            the list, per layer, of the source keys and values ``(n, h, S, d)``.
        """
        positions = self.default_positions(tokens)
        x = self.embeddings(tokens, positions, segments)
        attn_mask = self.attention_bias(positions, positions, attention_mask, x.dtype)
        cache = []
        for layer in self.layers:
            x, kv = layer(x, attn_mask)
            cache.append(kv)
        return cache

    def bias_table(self):
        """The relative position bias of every offset between the model's positions (None without a relative position
        bias): what decoding computes once per batch of sentences instead of at every step."""
        if self.relative_position is None:
            return None
        return self.relative_position.table(self.embeddings.positions.num_embeddings)

    def forward_step(self, tokens, positions, segments, key_positions, attention_mask, source_cache, target_cache,
                     bias_table=None):
        """Run new rows against cached keys and values (one step of incremental decoding).

        Args:
            tokens, positions, segments: ``(N, Tq)`` the new rows.
            key_positions: ``(N, S + t + Tq)`` position ids of [source | cached target | new rows].
            attention_mask: boolean ``(N, Tq, S + t + Tq)``.
            source_cache: from :meth:`forward_source`, ``n`` sentences (``N`` a multiple of ``n``).
            target_cache: per layer, keys and values ``(N, h, t, d)`` of earlier target rows, or None.
            bias_table: the relative position bias of every offset (:meth:`bias_table`), or None.
        Returns:
            top states ``(N, Tq, C)`` and, per layer, the keys and values ``(N, h, Tq, d)`` of the new rows.
        """
        x = self.embeddings(tokens, positions, segments)
        additive = self.attention_bias(positions, key_positions, attention_mask, x.dtype, bias_table)
        if additive.dtype == torch.bool:
            additive = to_additive(additive, x.dtype)
        new_cache = []
        for index, layer in enumerate(self.layers):
            x, kv = layer.forward_cached(
                x, source_cache[index], None if target_cache is None else target_cache[index], additive
            )
            new_cache.append(kv)
        return x, new_cache
