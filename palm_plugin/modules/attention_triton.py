"""UniLM-family self-attention as Triton kernels (``--attention-impl triton``): ``softmax(Q K^T / sqrt(d) + M + b) V``
in tiles, with UniLMv2's relative position bias ``b`` read inside the kernel and its gradient summed there per
bucket, and every tile that the mask ``M`` hides skipped.

Why a kernel of our own: SDPA takes UniLMv2's bias as a dense ``(B, h, T, T)`` tensor, which sends it to the
memory-efficient kernel and makes every layer's backward write a gradient of that size; FlexAttention avoids the
tensor, but trained slower than SDPA on an H100 (docs/benchmarks-gpu.md, section 8). Issue 38 asks for a hand-written
kernel where FlexAttention misses; this is it, with the card's measurement to come.

The algorithm is FlashAttention's (Dao et al. 2022; the backward of FlashAttention-2): each program keeps one tile of
``BLOCK_M`` query rows in registers and walks the key tiles with an online softmax; the backward recomputes the
probabilities from the saved log-sum-exp, one kernel for ``dQ`` (walking key tiles) and one for ``dK``, ``dV``
(walking query tiles). What is particular to UniLM:

* The mask is evaluated from two integers per token, its rank and reach
  (:func:`~palm_plugin.modules.attention_masks.visibility_ranks`: UniLM's masks written as the pseudo-masked LM's
  rule, :func:`~palm_plugin.modules.attention_masks.as_pmlm_layout`, and that rule as an interval), so a pair costs
  two comparisons; the dense mask, built once per forward by torch, only sorts the tiles: per tile row and per tile
  column, the lists of tiles the mask shows partly and shows whole (:class:`TritonMask`), shared by all heads and
  layers. Hidden tiles are never visited; whole ones are computed without the rule.
* UniLMv2's bias: score ``(i, j)`` of head ``h`` adds ``table[h, pos_j - pos_i + P - 1]`` from the bias of every
  offset (``weight[h, bucket(offset)]``, :class:`~palm_plugin.modules.relative_position.RelativePositionBias`), by
  the two tokens' position ids, as the starting value of the tile's ``q k^T`` product. Its gradient is that of the
  ``(h, num_buckets)`` weight: the ``dQ`` kernel sums each tile's score gradients per row and bucket, over the
  buckets the tile's offsets reach (one, away from the diagonal), sums along rows staying within a warp, and
  writes one partial sum per program, which torch adds up: deterministic, no atomics.
* Attention dropout (BERT's 0.1, the recipes'): pair ``(i, j)`` of a (sentence, head) is kept by 16 bits of a
  Philox draw at a counter of ``(i, j)`` under a key made of the call's seed (drawn from torch's generator, so
  ``--seed`` fixes it) and the (sentence, head), one draw for eight pairs (:func:`_dropout`), the rate in steps of
  2^-16 (:func:`keep_probability`); the forward and both backward kernels draw the same pairs, and nothing of the
  mask is stored.

Sums run in float32 whatever the inputs' dtype; probabilities are rounded to it before their products with ``V`` (as
FlashAttention does). The kernels run on CUDA tensors; under Triton's interpreter (``TRITON_INTERPRET=1`` when triton
is imported: tests/test_attention_triton.py) on any, slowly.
"""
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from palm_plugin.modules import attention_masks
from palm_plugin.modules.attention_masks import as_pmlm_layout, pmlm_mask, visibility_ranks
from palm_plugin.modules.fused_attention import SDPA_INSTEAD, FusedMask, TritonAttentionError


class Tiles(NamedTuple):
    """A kernel's tile, ``rows`` (query rows) x ``keys`` (powers of two, at least 16: tl.dot's least), and the warps of
    its programs. The forward and dQ programs hold ``rows`` and walk tiles of ``keys``; the dK/dV programs hold
    ``keys`` and walk tiles of ``rows``."""

    rows: int
    keys: int
    warps: int


# Each kernel's tiles: of those compiled for the H100 as a launch compiles them (base size, bf16) with no register
# spilled, the fewest instructions issued over the tiles of a pmlm AE+PAR and a UniLM pre-training batch with the
# recipes' dropout (docs/benchmarks-gpu.md section 14; the walked tile narrower in the backward, whose programs hold
# more). dQ's tile is smaller with the bias: a larger tile reaches more buckets, and their sums cost more than the
# larger tile saves. Not yet timed on a card.
FORWARD = Tiles(64, 64, 4)
QUERY_GRADIENT = Tiles(64, 32, 4)  # with UniLMv2's bias
QUERY_GRADIENT_WITHOUT_BIAS = Tiles(64, 64, 4)
KEY_GRADIENT = Tiles(32, 64, 4)
# whether triton.jit made the kernels for its interpreter (TRITON_INTERPRET=1 when triton was imported)
INTERPRETED = bool(triton.knobs.runtime.interpret)
LOG2E = 1.4426950408889634  # the kernels work in base 2: exp2 is one instruction
# The dropout's Philox rounds: FlashAttention's 7 (torch's copy of it, whose dropout fairseq's own models get through
# SDPA, runs 7), where Triton and cuRAND default to 10 (docs/benchmarks-gpu.md section 14)
PHILOX_ROUNDS = tl.constexpr(7)
PADDING_RANK = tl.constexpr(attention_masks.PADDING_RANK)


# ------------------------------------------------------------------------------------------------ one tile's scores
@triton.jit
def _scores(x, y, rows, columns, row_positions, column_positions, rank_base, table_base, center, row_count,
            column_count, PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
            KEYS_ARE_ROWS: tl.constexpr):
    """The tile's scores ``x y^T`` in the units of the product, ``q k^T + b sqrt(d)``, -inf where the mask hides a
    pair (partial tiles only; a whole tile has no pair out of bounds, as :func:`tile_lists` counts the tiles at the
    edges partial). ``x`` holds the queries and ``y`` the keys, or with ``KEYS_ARE_ROWS`` the other way round (the
    dK/dV kernel's scores, transposed). Their callers scale them to base 2 (``scale2``: ``log2(e) / sqrt(d)``) where
    they subtract a row's maximum or log-sum-exp, in one multiply-add, as FlashAttention does."""
    if HAS_BIAS:
        if KEYS_ARE_ROWS:
            offsets = row_positions[:, None] - column_positions[None, :] + center
        else:
            offsets = column_positions[None, :] - row_positions[:, None] + center
        # the bias enters the product as its accumulator, in units of the product (q k^T), as the table holds it
        # (_bias_table)
        bias = tl.load(table_base + offsets).to(tl.float32)
        scores = tl.dot(x, tl.trans(y), bias, input_precision=PRECISION)
    else:
        scores = tl.dot(x, tl.trans(y), input_precision=PRECISION)
    if PARTIAL:
        if KEYS_ARE_ROWS:
            query_ranks = _ranks(rank_base, columns, column_count)[None, :]
            shown = (_ranks(rank_base, rows, row_count)[:, None] <= query_ranks) & \
                (query_ranks <= _ranks(rank_base + row_count, rows, row_count)[:, None])
        else:
            query_ranks = _ranks(rank_base, rows, row_count)[:, None]
            shown = (_ranks(rank_base, columns, column_count)[None, :] <= query_ranks) & \
                (query_ranks <= _ranks(rank_base + column_count, columns, column_count)[None, :])
        scores = tl.where(shown, scores, float("-inf"))
    return scores


@triton.jit
def _bitwise_or(a, b):
    return a | b


@triton.jit
def _ranks(base, tokens, count):
    """The tokens' ranks (or reaches) from ``base``; a token past ``count`` is padding (:func:`visibility_ranks`)."""
    return tl.where(tokens < count, tl.load(base + tokens, mask=tokens < count, other=0), PADDING_RANK + tokens)


@triton.jit
def _quarters(x, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    """``x`` ``(ROWS, COLUMNS)`` as four ``(ROWS / 16, 8, COLUMNS / 16, 8)`` tensors: with rows ``16 a + 8 b + r`` and
    columns ``16 c + 8 d + e``, those of ``(b, d)`` = (0, 0), (0, 1), (1, 0), (1, 1)."""
    x = tl.permute(tl.reshape(x, (ROWS // 16, 2, 8, COLUMNS // 16, 2, 8)), (0, 2, 3, 5, 1, 4))
    left, right = tl.split(x)  # d = 0, 1
    top_left, bottom_left = tl.split(left)  # b = 0, 1
    top_right, bottom_right = tl.split(right)
    return top_left, top_right, bottom_left, bottom_right


@triton.jit
def _whole(top_left, top_right, bottom_left, bottom_right, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    """The inverse of :func:`_quarters`."""
    x = tl.join(tl.join(top_left, bottom_left), tl.join(top_right, bottom_right))  # (.., b, d)
    return tl.reshape(tl.permute(x, (0, 4, 1, 2, 5, 3)), (ROWS, COLUMNS))


@triton.jit
def _dropout(like, rows, columns, keys, stream, rate, KEYS_ARE_ROWS: tl.constexpr):
    """Attention dropout's factor for each pair of a ``(rows, columns)`` tile of queries x keys (keys x queries with
    ``KEYS_ARE_ROWS``), in the layout of ``like`` (a tile of that shape): for a kept pair the inverse of the
    probability of keeping it, else 0. The rate is taken in steps of 2^-16 (:func:`keep_probability`). One Philox draw
    under the program's ``stream`` (the call's seed and the (sentence, head)) keeps eight pairs, each by half of an
    output: for query ``16 a + 8 b + r`` and key ``16 c + 8 d + e`` (``r, e < 8``), the low half for an even ``e``,
    the high half for an odd one, of output ``2 b + d`` of the draw at counter ``((8 a + r) ceil(keys / 16) + c) 4 +
    e // 2``, so every kernel of a call draws the same pairs. Why these eight: the draws are most of dropout's cost,
    and a thread of the products' layouts holds rows ``i``, ``i + 8`` and keys ``j``, ``j + 1``, ``j + 8``, ``j + 9``,
    so taking the tile apart and back moves no data. With ``KEYS_ARE_ROWS`` (the dK/dV kernel) a thread holds keys
    ``j`` and ``j + 8`` but not ``j + 1``: the two threads of a key pair each draw, and each takes its half."""
    ROWS: tl.constexpr = like.shape[0]
    COLUMNS: tl.constexpr = like.shape[1]
    dropped = tl.minimum(tl.cast(rate * 65536.0 + 0.5, tl.int32), 65535)  # of 2^16: keep_probability's rounding
    threshold = tl.cast(dropped, tl.uint32) << 16  # a half reaches `dropped` iff shifted to the top it reaches this
    scale = 65536.0 / (65536 - dropped)
    if KEYS_ARE_ROWS:
        query, key = columns[None, :], rows[:, None]
    else:
        query, key = rows[:, None], columns[None, :]
    query = _quarters(tl.broadcast_to(query, (ROWS, COLUMNS)), ROWS, COLUMNS)[0]
    key = _quarters(tl.broadcast_to(key, (ROWS, COLUMNS)), ROWS, COLUMNS)[0]
    anchor = _quarters(like, ROWS, COLUMNS)[0]
    if not KEYS_ARE_ROWS:  # a draw for each pair of keys: the even keys' quarter-tiles
        query, key, anchor = _key_pairs(query)[0], _key_pairs(key)[0], _key_pairs(anchor)[0]
    counters = ((query - query // 16 * 8) * tl.cdiv(keys, 16) + key // 16) * 4 + key % 8 // 2
    # computed where `like` is held: without this select the compiler draws in a layout of its own and moves the
    # results through shared memory, with barriers (the counter of a NaN does not matter)
    draws = tl.randint4x(stream, tl.where(anchor == anchor, counters, 0), PHILOX_ROUNDS)
    # kept where the pair's half reaches `dropped`: one integer comparison (tl.rand's floats cost two more a draw)
    if KEYS_ARE_ROWS:  # the quarters' (b, d) are (key's, query's); each key takes its own half
        low = 16 - 16 * (key % 2)
        f0 = tl.where(draws[0] << low >= threshold, scale, 0.0)
        f1 = tl.where(draws[1] << low >= threshold, scale, 0.0)
        f2 = tl.where(draws[2] << low >= threshold, scale, 0.0)
        f3 = tl.where(draws[3] << low >= threshold, scale, 0.0)
        factors = _whole(f0, f2, f1, f3, ROWS, COLUMNS)
    else:
        f0 = _kept_by_halves(draws[0], threshold, scale)
        f1 = _kept_by_halves(draws[1], threshold, scale)
        f2 = _kept_by_halves(draws[2], threshold, scale)
        f3 = _kept_by_halves(draws[3], threshold, scale)
        factors = _whole(f0, f1, f2, f3, ROWS, COLUMNS)
    return factors


@triton.jit
def _key_pairs(x):
    """A quarter-tile ``(.., 8)`` of :func:`_quarters` as its even and odd keys ``(.., 4)``."""
    A: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[2]
    return tl.split(tl.reshape(x, (A, 8, C, 4, 2)))


@triton.jit
def _kept_by_halves(draws, threshold, scale):
    """The factors of a quarter-tile whose even keys take the low halves of ``draws`` (a draw a pair of keys), its
    odd keys the high halves."""
    A: tl.constexpr = draws.shape[0]
    C: tl.constexpr = draws.shape[2]
    even = tl.where(draws << 16 >= threshold, scale, 0.0)
    odd = tl.where(draws >= threshold, scale, 0.0)
    return tl.reshape(tl.join(even, odd), (A, 8, C, 8))


def keep_probability(rate: float) -> float:
    """The probability with which the kernels keep a pair at dropout ``rate``: ``1 - round(rate 2^16) / 2^16``,
    within 2^-17 of ``1 - rate`` (the kernels compare 16-bit halves of Philox outputs; they scale what they keep by its
    inverse, so the expectation is the attention without dropout, as torch's dropout keeps it)."""
    return 1.0 - min(int(rate * 65536.0 + 0.5), 65535) / 65536.0


@triton.jit
def _stream(seed, b64, h64, heads):
    """The Philox key of one (sentence, head) under a call's ``seed`` (below 2^31): unique per call and program."""
    return seed.to(tl.int64) + (b64 * heads + h64) * 4294967296


@triton.jit
def _sentence_and_head(heads):
    """The (sentence, head) of this program (the grid's first axis, the one CUDA lets exceed 65,535), as 64-bit
    offsets."""
    return (tl.program_id(0) // heads).to(tl.int64), (tl.program_id(0) % heads).to(tl.int64)


@triton.jit
def _tile_list(COUNTS, TILES, b64, held, walked):
    """How many partly and wholly shown tiles the program walks, and where their indices start
    (:func:`tile_lists`: ``held`` is the program's row (or column) of tiles, ``walked`` the tiles along it)."""
    lists = b64 * tl.num_programs(1) + held
    return tl.load(COUNTS + 2 * lists), tl.load(COUNTS + 2 * lists + 1), TILES + lists * walked


@triton.jit
def _positions(base, tokens, count, PARTIAL: tl.constexpr):
    """The position ids of a walked tile's tokens (0 past ``count``): a whole tile has none past it, and its loads
    need no mask."""
    if PARTIAL:
        return tl.load(base + tokens, mask=tokens < count, other=0)
    return tl.load(base + tokens)


@triton.jit
def _load_rows(base, stride, rows, count, dims, head_dim):
    """A ``(rows, DIM)`` tile of a ``(B, h, T, d)`` tensor (zero past the length and past ``d``)."""
    return tl.load(base + rows[:, None] * stride + dims[None, :],
                   mask=(rows[:, None] < count) & (dims[None, :] < head_dim), other=0.0)


# ------------------------------------------------------------------------------------------------ forward
@triton.jit
def _forward_tile(q, acc, row_max, row_sum, tile, rows, query_positions, k_base, v_base, stride_k, stride_v,
                  key_base, rank_base, table_base, center, queries, keys, head_dim, scale2, stream, rate,
                  PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr, DROPOUT: tl.constexpr):
    columns = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, DIM)
    k = _load_rows(k_base, stride_k, columns, keys, dims, head_dim)
    v = _load_rows(v_base, stride_v, columns, keys, dims, head_dim)
    key_positions = _positions(key_base, columns, keys, PARTIAL) if HAS_BIAS else columns
    scores = _scores(q, k, rows, columns, query_positions, key_positions, rank_base, table_base, center, queries, keys,
                     PARTIAL, HAS_BIAS, PRECISION, False)
    new_max = tl.maximum(row_max, tl.max(scores, 1) * scale2)  # in base 2
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row that has seen nothing yet keeps its zeros
    probs = tl.math.exp2(scores * scale2 - shift[:, None])
    rescale = tl.math.exp2(row_max - shift)
    row_sum = row_sum * rescale + tl.sum(probs, 1)  # the softmax's sum: before dropout
    if DROPOUT:
        probs = probs * _dropout(probs, rows, columns, keys, stream, rate, False)
    acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
    return acc, new_max, row_sum


@triton.jit(do_not_specialize=["seed"])  # a seed of 1 would be a constant, one of 16 a variant
def _forward_kernel(Q, K, V, O, LSE, RANKS, COUNTS, TILES, POS, TABLE,
                    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                    stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
                    heads, queries, keys, head_dim, table_width, scale2, seed, rate,
                    HAS_BIAS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    PRECISION: tl.constexpr, DROPOUT: tl.constexpr):
    """One program per (sentence x head, tile of query rows): the rows' outputs and base-2 log-sum-exps."""
    row_tile = tl.program_id(1)
    b64, h64 = _sentence_and_head(heads)
    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, DIM)
    q = _load_rows(Q + b64 * stride_qb + h64 * stride_qh, stride_qt, rows, queries, dims, head_dim)
    key_base = POS + b64 * keys
    query_positions = tl.load(POS + b64 * queries + rows, mask=rows < queries, other=0) if HAS_BIAS else rows
    k_base, v_base = K + b64 * stride_kb + h64 * stride_kh, V + b64 * stride_vb + h64 * stride_vh
    rank_base, table_base = RANKS + b64 * 2 * keys, TABLE + h64 * table_width
    center = table_width // 2
    stream = _stream(seed, b64, h64, heads)
    acc = tl.zeros((BLOCK_M, DIM), dtype=tl.float32)
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    partial, whole, tiles = _tile_list(COUNTS, TILES, b64, row_tile, tl.cdiv(keys, BLOCK_N))
    for i in range(partial, partial + whole):
        acc, row_max, row_sum = _forward_tile(
            q, acc, row_max, row_sum, tl.load(tiles + i), rows, query_positions, k_base, v_base, stride_kt,
            stride_vt, key_base, rank_base, table_base, center, queries, keys, head_dim, scale2, stream, rate,
            False, HAS_BIAS, DIM, BLOCK_N, PRECISION, DROPOUT)
    for i in range(0, partial):
        acc, row_max, row_sum = _forward_tile(
            q, acc, row_max, row_sum, tl.load(tiles + i), rows, query_positions, k_base, v_base, stride_kt,
            stride_vt, key_base, rank_base, table_base, center, queries, keys, head_dim, scale2, stream, rate,
            True, HAS_BIAS, DIM, BLOCK_N, PRECISION, DROPOUT)
    row_sum = tl.where(row_sum == 0, 1.0, row_sum)  # a row that sees no key (no mask of ours has one) gives zeros
    out = acc / row_sum[:, None]
    o_base = O + b64 * stride_ob + h64 * stride_oh
    tl.store(o_base + rows[:, None].to(tl.int64) * stride_ot + dims[None, :], out.to(O.dtype.element_ty),
             mask=(rows[:, None] < queries) & (dims[None, :] < head_dim))
    tl.store(LSE + (b64 * heads + h64) * queries + rows, row_max + tl.math.log2(row_sum), mask=rows < queries)


# ------------------------------------------------------------------------------------------------ backward
@triton.jit
def _query_gradient_tile(q, do, lse, delta, dq, row_sums, tile, rows, query_positions, k_base, v_base, stride_k,
                         stride_v, key_base, rank_base, table_base, buckets, center, queries, keys, head_dim, scale2,
                         stream, rate, PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, DIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, NUM_BUCKETS: tl.constexpr, PRECISION: tl.constexpr,
                         DROPOUT: tl.constexpr):
    columns = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, DIM)
    k = _load_rows(k_base, stride_k, columns, keys, dims, head_dim)
    v = _load_rows(v_base, stride_v, columns, keys, dims, head_dim)
    key_positions = _positions(key_base, columns, keys, PARTIAL) if HAS_BIAS else columns
    scores = _scores(q, k, rows, columns, query_positions, key_positions, rank_base, table_base, center, queries, keys,
                     PARTIAL, HAS_BIAS, PRECISION, False)
    probs = tl.math.exp2(scores * scale2 - lse[:, None])
    grad_probs = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    if DROPOUT:  # through the dropout: the pairs it kept, scaled as it scaled them
        grad_probs = grad_probs * _dropout(grad_probs, rows, columns, keys, stream, rate, False)
    grad_scores = probs * (grad_probs - delta[:, None])  # dL/d(score), softmax's backward
    if HAS_BIAS:  # the tile's score gradients summed per row and bucket, over the buckets its offsets reach
        tile_buckets = tl.load(buckets + key_positions[None, :] - query_positions[:, None] + center)
        # a select with the gradients before the loop, so that the compiler moves the bucket ids into the
        # gradients' layout once per tile, not once per bucket (buckets are never negative)
        tile_buckets = tl.where(grad_scores == grad_scores, tile_buckets, -1)
        slots = tl.arange(0, NUM_BUCKETS)
        # sums along rows only, which stay within a warp (a sum over the whole tile waits on every warp, once per
        # bucket); every bucket unrolled and skipped unless the tile reaches it, as a loop of run-time length kept
        # the compiler from pipelining the loads of the loop over tiles. Which buckets the tile reaches: one bit each,
        # 32 to a word, the words or-ed over the whole tile (a tile of the appended tokens reaches about 10 buckets
        # scattered over a range of 13)
        for bucket in tl.static_range(NUM_BUCKETS):
            if bucket % 32 == 0:
                in_word = (tile_buckets >> 5) == bucket // 32
                reached = tl.reduce(tl.where(in_word, 1 << (tile_buckets & 31), 0), None, _bitwise_or)
            if (reached >> (bucket % 32)) & 1:
                share = tl.sum(tl.where(tile_buckets == bucket, grad_scores, 0.0), 1)
                row_sums = tl.where(slots[None, :] == bucket, row_sums + share[:, None], row_sums)
        # a NaN gradient, which the select above sent to no bucket, reaches every bucket (as autograd's sum would)
        row_sums += tl.sum(tl.where(tile_buckets < 0, grad_scores, 0.0), 1)[:, None]
    return dq + tl.dot(grad_scores.to(k.dtype), k, input_precision=PRECISION), row_sums


@triton.jit(do_not_specialize=["seed"])  # a seed of 1 would be a constant, one of 16 a variant
def _query_gradient_kernel(Q, K, V, DO, LSE, DELTA, DQ, BUCKET_SUMS, RANKS, COUNTS, TILES, POS, TABLE, BUCKETS,
                           stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                           stride_vb, stride_vh, stride_vt, stride_db, stride_dh, stride_dt,
                           heads, queries, keys, head_dim, table_width, scale, scale2, seed, rate,
                           HAS_BIAS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, NUM_BUCKETS: tl.constexpr, PRECISION: tl.constexpr,
                           DROPOUT: tl.constexpr):
    """One program per (sentence x head, tile of query rows): ``dQ`` of the rows (stored in ``Q``'s layout) and, with a
    bias, the program's per-bucket sums of the score gradients (``BUCKET_SUMS[b, h, tile]``)."""
    row_tile = tl.program_id(1)
    b64, h64 = _sentence_and_head(heads)
    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, DIM)
    q = _load_rows(Q + b64 * stride_qb + h64 * stride_qh, stride_qt, rows, queries, dims, head_dim)
    do = _load_rows(DO + b64 * stride_db + h64 * stride_dh, stride_dt, rows, queries, dims, head_dim)
    row_stats = (b64 * heads + h64) * queries + rows
    lse = tl.load(LSE + row_stats, mask=rows < queries, other=0.0)
    delta = tl.load(DELTA + row_stats, mask=rows < queries, other=0.0)
    key_base = POS + b64 * keys
    query_positions = tl.load(POS + b64 * queries + rows, mask=rows < queries, other=0) if HAS_BIAS else rows
    k_base, v_base = K + b64 * stride_kb + h64 * stride_kh, V + b64 * stride_vb + h64 * stride_vh
    rank_base, table_base = RANKS + b64 * 2 * keys, TABLE + h64 * table_width
    center = table_width // 2
    stream = _stream(seed, b64, h64, heads)
    dq = tl.zeros((BLOCK_M, DIM), dtype=tl.float32)
    row_sums = tl.zeros((BLOCK_M, NUM_BUCKETS), dtype=tl.float32)  # per row and bucket, added up at the end
    partial, whole, tiles = _tile_list(COUNTS, TILES, b64, row_tile, tl.cdiv(keys, BLOCK_N))
    for i in range(partial, partial + whole):  # the whole tiles first, as in the forward
        dq, row_sums = _query_gradient_tile(
            q, do, lse, delta, dq, row_sums, tl.load(tiles + i), rows, query_positions, k_base, v_base, stride_kt,
            stride_vt, key_base, rank_base, table_base, BUCKETS, center, queries, keys, head_dim, scale2, stream,
            rate, False, HAS_BIAS, DIM, BLOCK_N, NUM_BUCKETS, PRECISION, DROPOUT)
    for i in range(0, partial):
        dq, row_sums = _query_gradient_tile(
            q, do, lse, delta, dq, row_sums, tl.load(tiles + i), rows, query_positions, k_base, v_base, stride_kt,
            stride_vt, key_base, rank_base, table_base, BUCKETS, center, queries, keys, head_dim, scale2, stream,
            rate, True, HAS_BIAS, DIM, BLOCK_N, NUM_BUCKETS, PRECISION, DROPOUT)
    dq_base = DQ + b64 * stride_qb + h64 * stride_qh
    tl.store(dq_base + rows[:, None].to(tl.int64) * stride_qt + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=(rows[:, None] < queries) & (dims[None, :] < head_dim))
    if HAS_BIAS:
        slots = tl.arange(0, NUM_BUCKETS)
        tl.store(BUCKET_SUMS + ((b64 * heads + h64) * tl.num_programs(1) + row_tile) * NUM_BUCKETS + slots,
                 tl.sum(row_sums, 0))


@triton.jit
def _key_gradient_tile(k, v, dk, dv, tile, keys_held, key_positions, q_base, do_base, stride_q, stride_do, stats_base,
                       position_base, rank_base, table_base, center, queries, keys, head_dim, scale2, stream, rate,
                       PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       PRECISION: tl.constexpr, DROPOUT: tl.constexpr, LSE, DELTA):
    """One tile of query rows against the program's keys, in the keys' orientation (scores transposed, keys x
    queries, as FlashAttention-2's dK/dV kernel has them): the products with dO and Q take the probabilities and
    their gradients as they are, and the scores' tile is as many keys high as the warp-group products need."""
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, DIM)
    q = _load_rows(q_base, stride_q, rows, queries, dims, head_dim)
    do = _load_rows(do_base, stride_do, rows, queries, dims, head_dim)
    lse = tl.load(LSE + stats_base + rows, mask=rows < queries, other=0.0)
    delta = tl.load(DELTA + stats_base + rows, mask=rows < queries, other=0.0)
    query_positions = _positions(position_base, rows, queries, PARTIAL) if HAS_BIAS else rows
    scores = _scores(k, q, keys_held, rows, key_positions, query_positions, rank_base, table_base, center, keys,
                     queries, PARTIAL, HAS_BIAS, PRECISION, True)
    probs = tl.math.exp2(scores * scale2 - lse[None, :])
    grad_probs = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    if DROPOUT:  # dV from the kept pairs; the gradient reaches the kept probabilities only
        factor = _dropout(probs, keys_held, rows, keys, stream, rate, True)
        dv += tl.dot((probs * factor).to(do.dtype), do, input_precision=PRECISION)
        grad_probs = grad_probs * factor
    else:
        dv += tl.dot(probs.to(do.dtype), do, input_precision=PRECISION)
    grad_scores = probs * (grad_probs - delta[None, :])
    dk += tl.dot(grad_scores.to(q.dtype), q, input_precision=PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["seed"])  # a seed of 1 would be a constant, one of 16 a variant
def _key_gradient_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, RANKS, COUNTS, TILES, POS, TABLE,
                         stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                         stride_vb, stride_vh, stride_vt, stride_db, stride_dh, stride_dt,
                         heads, queries, keys, head_dim, table_width, scale, scale2, seed, rate,
                         HAS_BIAS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         PRECISION: tl.constexpr, DROPOUT: tl.constexpr):
    """One program per (sentence x head, tile of keys): ``dK``, ``dV`` of the keys (in ``K``'s and ``V``'s layouts)."""
    key_tile = tl.program_id(1)
    b64, h64 = _sentence_and_head(heads)
    columns = key_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, DIM)
    k = _load_rows(K + b64 * stride_kb + h64 * stride_kh, stride_kt, columns, keys, dims, head_dim)
    v = _load_rows(V + b64 * stride_vb + h64 * stride_vh, stride_vt, columns, keys, dims, head_dim)
    position_base = POS + b64 * keys
    q_base, do_base = Q + b64 * stride_qb + h64 * stride_qh, DO + b64 * stride_db + h64 * stride_dh
    stats_base = (b64 * heads + h64) * queries
    rank_base, table_base = RANKS + b64 * 2 * keys, TABLE + h64 * table_width
    center = table_width // 2
    stream = _stream(seed, b64, h64, heads)
    dk = tl.zeros((BLOCK_N, DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, DIM), dtype=tl.float32)
    partial, whole, tiles = _tile_list(COUNTS, TILES, b64, key_tile, tl.cdiv(queries, BLOCK_M))
    key_positions = tl.load(position_base + columns, mask=columns < keys, other=0) if HAS_BIAS else columns
    for i in range(partial, partial + whole):  # the whole tiles first, as in the forward
        dk, dv = _key_gradient_tile(k, v, dk, dv, tl.load(tiles + i), columns, key_positions, q_base, do_base,
                                    stride_qt, stride_dt, stats_base, position_base, rank_base, table_base, center,
                                    queries, keys, head_dim, scale2, stream, rate, False, HAS_BIAS, DIM, BLOCK_M,
                                    PRECISION, DROPOUT, LSE, DELTA)
    for i in range(0, partial):
        dk, dv = _key_gradient_tile(k, v, dk, dv, tl.load(tiles + i), columns, key_positions, q_base, do_base,
                                    stride_qt, stride_dt, stats_base, position_base, rank_base, table_base, center,
                                    queries, keys, head_dim, scale2, stream, rate, True, HAS_BIAS, DIM, BLOCK_M,
                                    PRECISION, DROPOUT, LSE, DELTA)
    tile_mask = (columns[:, None] < keys) & (dims[None, :] < head_dim)
    dk_base, dv_base = DK + b64 * stride_kb + h64 * stride_kh, DV + b64 * stride_vb + h64 * stride_vh
    tl.store(dk_base + columns[:, None].to(tl.int64) * stride_kt + dims[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=tile_mask)
    tl.store(dv_base + columns[:, None].to(tl.int64) * stride_vt + dims[None, :], dv.to(DV.dtype.element_ty),
             mask=tile_mask)


# ------------------------------------------------------------------------------------------------ the tile lists
def tile_lists(mask: Tensor, block_rows: int, block_columns: int):
    """For each row of tiles of ``mask`` ``(B, T, S)`` (True = shown): how many tiles the mask shows partly and
    whole, ``(B, rows, 2)`` int32, and their indices, partly shown first, ``(B, rows, columns)`` int32 (the hidden
    tiles' indices follow, never read). Tiles reaching past ``T`` or ``S`` count as partial (their out-of-bounds pairs
    are hidden)."""
    batch, queries, keys = mask.shape
    rows, columns = -(-queries // block_rows), -(-keys // block_columns)
    padded = F.pad(mask, (0, columns * block_columns - keys, 0, rows * block_rows - queries))
    tiles = padded.view(batch, rows, block_rows, columns, block_columns)
    shown_anywhere, shown_everywhere = tiles.any(4).any(2), tiles.all(4).all(2)
    # order: 0 partial, 1 whole, 2 hidden; a stable sort keeps the tiles of each kind in order
    kind = torch.where(shown_everywhere, 1, torch.where(shown_anywhere, 0, 2)).to(torch.int8)
    order = torch.sort(kind, dim=-1, stable=True).indices.int()
    counts = torch.stack([(kind == 0).sum(-1), (kind == 1).sum(-1)], dim=-1).int()
    return counts.contiguous(), order.contiguous()


class TritonMask(FusedMask):
    """What every layer of one forward shares under ``--attention-impl triton``: each token's rank and reach, the tile
    lists by rows (forward, ``dQ``) and by columns (``dK``, ``dV``) and, for UniLMv2, the position ids with the bucket
    of every offset."""

    def __init__(self, fields, positions: Optional[Tensor] = None, bias_weight: Optional[Tensor] = None,
                 offset_buckets: Optional[Tensor] = None):
        """
        Args:
            fields: the batch's mask fields (:class:`~palm_plugin.modules.flex_attention.MaskFields`: padding
                ``(B, T)`` and the family's own).
            positions: ``(B, T)`` position ids, below ``P``; bias_weight: ``(h, num_buckets)``
                (:attr:`RelativePositionBias.weight`); offset_buckets: ``(2P - 1,)`` the bucket of each offset
                ``1 - P .. P - 1`` (:meth:`RelativePositionBias.offset_buckets`). All three, or none (UniLM).
        """
        padding = fields.padding_mask
        steps, kinds = as_pmlm_layout(padding, **fields.fields)
        self.ranks = torch.stack(visibility_ranks(steps, kinds, padding), 1).int().contiguous()  # (B, 2, T)
        mask = pmlm_mask(steps, kinds, padding)
        self.forward_tiles = tile_lists(mask, FORWARD.rows, FORWARD.keys)
        self.query_gradient = QUERY_GRADIENT if positions is not None else QUERY_GRADIENT_WITHOUT_BIAS
        self.query_gradient_tiles = tile_lists(mask, self.query_gradient.rows, self.query_gradient.keys)
        self.key_gradient_tiles = tile_lists(mask.transpose(1, 2), KEY_GRADIENT.keys, KEY_GRADIENT.rows)
        self.positions = None if positions is None else positions.int().contiguous()
        self.bias_weight = bias_weight
        self.offset_buckets = None if offset_buckets is None else offset_buckets.int().contiguous()

    # --compile-layers compiles around the kernels, not through them: each launch is a plain Python call, and the
    # seed a host-side draw
    @torch.compiler.disable
    def attend(self, q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
        _runnable(q)
        return _TritonAttention.apply(q, k, v, self.bias_weight, self, dropout_p)


def draw_seed() -> int:
    """The seed of one attention call's dropout, from torch's default generator (so ``--seed`` fixes it), on the host:
    no device synchronisation."""
    return int(torch.randint(2**31 - 1, ()))


@triton.jit(do_not_specialize=["seed"])  # a seed of 1 would be a constant, one of 16 a variant
def _kept_pairs_kernel(KEPT, seed, rate, heads, queries, keys, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b64, h64 = _sentence_and_head(heads)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    columns = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    ones = tl.full((BLOCK_M, BLOCK_N), 1.0, dtype=tl.float32)
    kept = _dropout(ones, rows, columns, keys, _stream(seed, b64, h64, heads), rate, False) != 0
    base = KEPT + tl.program_id(0).to(tl.int64) * queries * keys
    tl.store(base + rows[:, None] * keys + columns[None, :], kept.to(tl.int8),
             mask=(rows[:, None] < queries) & (columns[None, :] < keys))


def kept_pairs(seed: int, rate: float, batch: int, heads: int, length: int, device) -> Tensor:
    """``(B, h, T, T)`` bool: the pairs the kernels' dropout keeps in a call drawn with ``seed`` (for tests)."""
    kept = torch.empty(batch, heads, length, length, dtype=torch.int8, device=device)
    grid = batch * heads, triton.cdiv(length, 16), triton.cdiv(length, 16)
    _kept_pairs_kernel[grid](kept, seed, rate, heads, length, length, BLOCK_M=16, BLOCK_N=16)
    return kept.bool()


def _runnable(tensor: Tensor):
    if tensor.device.type != "cuda" and not INTERPRETED:
        raise TritonAttentionError(f"its kernels run on CUDA tensors, and these are on {tensor.device.type} "
                                   f"(elsewhere only under TRITON_INTERPRET=1, for tests); {SDPA_INSTEAD}")


def _launch(tiles: Tiles, held: int, q: Tensor, **constants):
    """The grid of a kernel whose programs each hold ``held`` rows or keys of one (sentence, head), and its constants:
    the tile, the head size as the tiles hold it (a power of two, at least 16: tl.dot's least), the products'
    precision."""
    batch, heads, length, head_dim = q.shape
    grid = batch * heads, triton.cdiv(length, held)
    return grid, dict(constants, DIM=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=tiles.rows,
                      BLOCK_N=tiles.keys, PRECISION=_precision(q), num_warps=tiles.warps)


def _precision(q: Tensor) -> str:
    """float32 products in float32, as SDPA's kernels compute them (tl.dot's default for float32 is TF32)."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


def _strides(*tensors):
    return [stride for t in tensors for stride in t.stride()[:3]]


def _heads_layout(t: Tensor) -> Tensor:
    """``t`` ``(B, h, T, d)`` laid out ``(B, h, T, d)`` or ``(B, T, h, d)`` (the layers' projections), else a copy so
    laid out: the kernels step ``d`` by 1, and store the gradients with the inputs' strides into ``empty_like``
    tensors, which keep the strides of these two layouts only (not of slices of a packed projection, say)."""
    return t if t.is_contiguous() or t.transpose(1, 2).is_contiguous() else t.contiguous()


def _like_heads(t: Tensor) -> Tensor:
    """An empty ``(B, h, T, d)`` tensor laid out ``(B, T, h, d)``, as the layers' projections are: their outputs and
    gradients reshape to ``(B, T, C)`` without a copy."""
    batch, heads, length, head_dim = t.shape
    return t.new_empty(batch, length, heads, head_dim).transpose(1, 2)


def _bias_table(bias_weight: Tensor, offset_buckets: Tensor, scale: float, dtype: torch.dtype) -> Tensor:
    """``(h, 2P - 1)``: the bias of every offset in units of ``q k^T`` (divided by the softmax's ``scale``: a power
    of two, so no rounding, for heads of 4^n such as 64), as the kernels add it to the product before scaling it, in
    the inputs' dtype (a tile of it is moved between layouts through shared memory every step: half the traffic of
    float32). Not part of autograd: the kernels' bucket sums give the weight's gradient."""
    return (bias_weight.detach()[:, offset_buckets.long()].float() / scale).to(dtype).contiguous()


class _TritonAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, bias_weight, plan: TritonMask, dropout_p: float):
        q, k, v = (_heads_layout(t) for t in (q, k, v))
        batch, heads, queries, head_dim = q.shape
        has_bias = bias_weight is not None
        scale = head_dim ** -0.5
        table = _bias_table(bias_weight, plan.offset_buckets, scale, q.dtype) if has_bias else q.new_zeros(1, 1)
        positions = plan.positions if has_bias else plan.ranks  # any int32 tensor when unread
        out = _like_heads(q)
        lse = q.new_empty(batch, heads, queries, dtype=torch.float32)
        seed = draw_seed() if dropout_p > 0 else 0
        grid, constants = _launch(FORWARD, FORWARD.rows, q, HAS_BIAS=has_bias, DROPOUT=dropout_p > 0)
        _forward_kernel[grid](
            q, k, v, out, lse, plan.ranks, *plan.forward_tiles, positions, table, *_strides(q, k, v, out),
            heads, queries, queries, head_dim, table.size(1), scale * LOG2E, seed, dropout_p, **constants)
        ctx.save_for_backward(q, k, v, out, lse, table)
        ctx.plan, ctx.has_bias, ctx.seed, ctx.dropout_p = plan, has_bias, seed, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, table = ctx.saved_tensors
        grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()  # read with its own strides
        plan, has_bias = ctx.plan, ctx.has_bias
        batch, heads, queries, head_dim = q.shape
        delta = (grad_out.float() * out.float()).sum(-1)  # (B, h, T): row i's sum_j p_ij dL/dp_ij
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # their layouts: the strides passed
        scale = head_dim ** -0.5
        positions = plan.positions if has_bias else plan.ranks
        buckets = plan.offset_buckets if has_bias else plan.ranks
        num_buckets = triton.next_power_of_2(plan.bias_weight.size(1)) if has_bias else 1
        flags = dict(HAS_BIAS=has_bias, DROPOUT=ctx.dropout_p > 0)
        grid, constants = _launch(plan.query_gradient, plan.query_gradient.rows, q, NUM_BUCKETS=num_buckets, **flags)
        bucket_sums = q.new_zeros(batch, heads, grid[1], num_buckets, dtype=torch.float32)
        _query_gradient_kernel[grid](
            q, k, v, grad_out, lse, delta, dq, bucket_sums, plan.ranks, *plan.query_gradient_tiles, positions, table,
            buckets, *_strides(q, k, v, grad_out), heads, queries, queries, head_dim, table.size(1), scale,
            scale * LOG2E, ctx.seed, ctx.dropout_p, **constants)
        grid, constants = _launch(KEY_GRADIENT, KEY_GRADIENT.keys, q, **flags)
        _key_gradient_kernel[grid](
            q, k, v, grad_out, lse, delta, dk, dv, plan.ranks, *plan.key_gradient_tiles, positions, table,
            *_strides(q, k, v, grad_out), heads, queries, queries, head_dim, table.size(1), scale, scale * LOG2E,
            ctx.seed, ctx.dropout_p, **constants)
        grad_weight = None
        if has_bias and ctx.needs_input_grad[3]:
            grad_weight = bucket_sums.sum((0, 2))[:, :plan.bias_weight.size(1)].to(plan.bias_weight.dtype)
        return dq, dk, dv, grad_weight, None, None
