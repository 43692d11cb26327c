"""Relative position buckets and bias against transformers' T5 (the reference implementation of the scheme)."""
import pytest
import torch
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from palm_plugin.modules.relative_position import RelativePositionBias, relative_position_bucket


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (16, 32), (8, 20)])
def test_buckets_equal_t5(bidirectional, num_buckets, max_distance):
    offsets = torch.arange(-3 * max_distance, 3 * max_distance + 1)
    ours = relative_position_bucket(offsets, num_buckets, max_distance, bidirectional)
    reference = T5Attention._relative_position_bucket(
        offsets, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(ours, reference)
    assert ours.min() >= 0 and ours.max() == num_buckets - 1  # every bucket range is reached, none exceeded


def test_buckets_known_values():
    # Hand-computed for the default 32 buckets / 128: exact for |offset| < 8, log-spaced up to 128, keys after the
    # query in the upper 16 buckets.
    offsets = torch.tensor([0, -1, -7, -8, -12, -128, -1000, 1, 7, 8, 1000])
    expected = torch.tensor([0, 1, 7, 8, 9, 15, 15, 17, 23, 24, 31])
    assert torch.equal(relative_position_bucket(offsets), expected)


def _t5_attention(num_heads, num_buckets, max_distance):
    config = T5Config(
        d_model=16, d_kv=4, num_heads=num_heads, relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance, is_decoder=False,
    )
    return T5Attention(config, has_relative_attention_bias=True)


def test_bias_equals_t5_compute_bias():
    torch.manual_seed(0)
    bias = RelativePositionBias(num_heads=3, num_buckets=32, max_distance=128)
    t5 = _t5_attention(3, 32, 128)
    with torch.no_grad():
        t5.relative_attention_bias.weight.copy_(bias.weight.t())  # T5 stores [buckets, heads]
    length = 200
    positions = torch.arange(length).unsqueeze(0)
    ours = bias(positions, positions)
    assert ours.shape == (1, 3, length, length)
    torch.testing.assert_close(ours, t5.compute_bias(length, length), rtol=0, atol=0)


def test_bias_follows_position_ids_not_indices():
    """Appended tokens carry the position id of the token they stand for: the bias must use the ids."""
    torch.manual_seed(0)
    bias = RelativePositionBias(num_heads=2, num_buckets=16, max_distance=32)
    query = torch.tensor([[0, 1, 2, 3, 1, 2]])  # two appended rows stand for positions 1 and 2
    key = torch.tensor([[0, 1, 2, 3, 1, 2, 5]])
    out = bias(query, key)
    assert out.shape == (1, 2, 6, 7)
    for i in range(6):
        for j in range(7):
            bucket = relative_position_bucket(key[0, j] - query[0, i], 16, 32)
            torch.testing.assert_close(out[0, :, i, j], bias.weight[:, bucket], rtol=0, atol=0)
    # rows standing for the same position get identical biases
    torch.testing.assert_close(out[0, :, 1], out[0, :, 4], rtol=0, atol=0)


def test_bias_gradient_reaches_table():
    bias = RelativePositionBias(num_heads=2, num_buckets=8, max_distance=16)
    positions = torch.arange(5).unsqueeze(0)
    bias(positions, positions).sum().backward()
    # d(sum)/d(weight[h, b]) = the number of (query, key) pairs whose offset falls in bucket b, for every head.
    offsets = positions.view(1, -1) - positions.view(-1, 1)  # key - query
    counts = torch.bincount(relative_position_bucket(offsets, 8, 16).flatten(), minlength=8).float()
    torch.testing.assert_close(bias.weight.grad, counts.expand(2, 8))


def _pmlm_like_positions(generator, batch=3, length=37, appended=11, max_positions=64):
    """Position ids as UniLMv2's pseudo-masked inputs have them: each row's text 0 .. n-1 (lengths unequal), then
    appended tokens repeating the ids of masked ones, the rest padding's ids."""
    rows = []
    for row in range(batch):
        text = length - appended - 3 * row
        masked = torch.randperm(text, generator=generator)[:appended]
        rows.append(torch.cat([torch.arange(text), masked, torch.full((3 * row,), 1)]))
    return torch.stack(rows)


@pytest.mark.parametrize("mask_form", ["per row", "one for the batch", "none"])
def test_masked_offset_bias_equals_bucketing_every_pair_in_values_and_gradient(mask_form):
    """masked_offset_bias (the bias read from the table of every offset, the mask folded in), as the layers get it in
    training: values equal to bucketing every (query, key) pair plus the additive mask (exactly), and the gradient of
    the bucket weights equal to that path's in float64, through the CPU's scatter and through CUDA's one-hot
    products (run here on the CPU), for pmlm-like positions with repeated ids and unequal lengths."""
    from palm_plugin.modules import relative_position
    from palm_plugin.modules.attention_masks import to_additive

    generator = torch.Generator().manual_seed(3)
    positions = _pmlm_like_positions(generator)
    batch, length = positions.shape
    mask = {"per row": torch.rand(batch, length, length, generator=generator) < 0.6,
            "one for the batch": torch.rand(length, length, generator=generator) < 0.6, "none": None}[mask_form]
    bias = RelativePositionBias(num_heads=4, num_buckets=16, max_distance=40).double()
    upstream = torch.randn(batch, 4, length, length, generator=generator, dtype=torch.float64)

    reference = bias(positions, positions)
    if mask is not None:
        reference = to_additive(mask, torch.float64).unsqueeze(-3) + reference  # as the SDPA path did
    got = relative_position.masked_offset_bias(bias.table(64), positions, positions, mask)
    assert got.shape == reference.shape and got.stride(-1) == 1
    torch.testing.assert_close(got, reference, rtol=0, atol=0)

    visible = torch.ones(batch, length, length, dtype=torch.bool) if mask is None else mask.expand(batch, -1, -1)
    weights = upstream * visible.unsqueeze(1)  # attention's gradient is 0 where the mask hides a pair
    (expected,) = torch.autograd.grad((bias(positions, positions) * weights).sum(), bias.weight)
    (scattered,) = torch.autograd.grad((relative_position.masked_offset_bias(
        bias.table(64), positions, positions, mask) * weights).sum(), bias.weight)
    torch.testing.assert_close(scattered, expected, rtol=1e-12, atol=1e-12)
    products = relative_position.offset_sums(weights, positions, positions, 2 * 64 - 1)
    (through_products,) = torch.autograd.grad(bias.table(64), bias.weight, products)
    torch.testing.assert_close(through_products, expected, rtol=1e-12, atol=1e-12)


def test_table_starts_as_the_authors_linear_layer_does():
    """UniLMv2's code holds the table in a bias-free nn.Linear that BERT's init draws from N(0, initializer_range);
    transformers' BertConfig gives that range (0.02). A table at N(0, 1) would put biases of several units on
    every score at the first step."""
    import transformers

    torch.manual_seed(0)
    weight = RelativePositionBias(num_heads=16, num_buckets=1024, max_distance=4096).weight.detach()
    assert abs(weight.mean().item()) < 0.002  # 4 standard errors of a mean of 16384 draws
    assert weight.std().item() == pytest.approx(transformers.BertConfig().initializer_range, rel=0.03)


@pytest.mark.parametrize("buckets, max_distance", [(1, 128), (2, 128), (3, 128), (32, 8), (32, 4)])
def test_tables_that_t5s_bucketing_cannot_fill_are_refused(buckets, max_distance):
    """Fewer than 4 buckets leave a half without an exact bucket (T5's formula divides by zero); a max distance at or
    below the exact range (a quarter of the buckets) gives buckets outside the table. 0 buckets: no bias at all."""
    from palm_plugin.modules.unilm_transformer import UniLMTransformer

    offsets = torch.arange(-200, 200)
    try:
        found = relative_position_bucket(offsets, buckets, max_distance)
        assert found.min() < 0 or found.max() >= buckets
    except ZeroDivisionError:
        pass
    with pytest.raises(ValueError, match=rf"relative position buckets {buckets} / max distance {max_distance}: need"):
        UniLMTransformer(vocab_size=20, padding_idx=1, dim=8, ffn_dim=16, layers=1, num_heads=2, max_positions=16,
                         num_segments=2, relative_position_buckets=buckets, relative_position_max_distance=max_distance)
    # the smallest table works (bucket 2, "offset 0 seen from the right", cannot occur)
    assert relative_position_bucket(offsets, 4, 2).unique().tolist() == [0, 1, 3]
    assert RelativePositionBias(num_heads=2, num_buckets=4, max_distance=2).weight.shape == (2, 4)


@pytest.mark.parametrize("buckets", [0, 8])
def test_one_mask_for_the_whole_batch_equals_it_given_per_row(buckets):
    """A ``(T, T)`` mask applies to every row of the batch: the same states as the mask repeated ``(B, T, T)``
    (here B = 3 rows of T = 5 tokens, so a mask laid along the wrong dimension cannot broadcast by chance)."""
    from palm_plugin.modules.attention_masks import left_to_right_mask
    from palm_plugin.modules.unilm_transformer import UniLMTransformer

    torch.manual_seed(0)
    stack = UniLMTransformer(vocab_size=20, padding_idx=1, dim=16, ffn_dim=32, layers=2, num_heads=2,
                             max_positions=16, num_segments=2, dropout=0.0, attention_dropout=0.0,
                             relative_position_buckets=buckets, relative_position_max_distance=16).eval()
    tokens = torch.randint(4, 20, (3, 5), generator=torch.Generator().manual_seed(1))
    mask = left_to_right_mask(5)
    with torch.no_grad():
        shared, per_row = stack(tokens, mask), stack(tokens, mask.expand(3, 5, 5))
    shared, per_row = (s[0] if isinstance(s, tuple) else s for s in (shared, per_row))
    torch.testing.assert_close(shared, per_row, atol=1e-6, rtol=0)


def test_the_mask_reaches_attention_with_its_last_dimension_contiguous():
    """CUDA's fused attention kernels (memory-efficient, cuDNN) take an additive mask only with its last dimension at
    stride 1; the bias as bucketed is a view with the heads innermost. And the memory-efficient kernel copies a mask
    into a padded one, each layer and in the backward too, unless every other stride is a multiple of 8 elements
    (torch's ``preprocess_mask``; the card's pmlm profile spent a sixth of its time so at odd lengths). Every form of
    the UniLMv2 mask (no mask, one for the batch, one per row, read from the decoding table) reaches
    ``scaled_dot_product_attention`` laid out so, at a length that is no multiple of 8."""
    from palm_plugin.modules.attention_masks import left_to_right_mask
    from palm_plugin.modules.unilm_transformer import UniLMTransformer

    stack = UniLMTransformer(vocab_size=20, padding_idx=1, dim=12, ffn_dim=16, layers=1, num_heads=3,
                             max_positions=16, num_segments=2, relative_position_buckets=8,
                             relative_position_max_distance=16)
    positions = torch.arange(5).expand(2, 5)
    rows = positions[:, 3:]
    assert stack.relative_position(positions, positions).stride(-1) == 3  # the view this test is about
    masks = [(positions, None, None), (positions, left_to_right_mask(5), None),
             (positions, left_to_right_mask(5).expand(2, 5, 5), None),
             (rows, left_to_right_mask(5)[3:].expand(2, 2, 5), stack.bias_table())]
    for queries, mask, table in masks:
        additive = stack.attention_bias(queries, positions, mask, torch.float32, table)
        assert additive.shape == (2, 3, queries.size(1), 5) and additive.stride(-1) == 1
        assert all(stride % 8 == 0 for stride in additive.stride()[:-1]), additive.stride()
