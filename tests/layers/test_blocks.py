"""Tests of §3.1 encoder and decoder blocks: residuals, LayerNorm, dropout, cache."""

import numpy as np
import pytest
from helpers import run_layer_test, to_numpy
from keras import ops

from keras_transformer.layers import DecoderBlock, EncoderBlock

RNG = np.random.default_rng(0)


def random(*shape):
    return RNG.normal(size=shape).astype("float32")


def drop_everything(block, *names):
    """Replaces the named Dropout layers by ones that drop every unit."""
    for name in names:
        getattr(block, name).call = lambda inputs, training=None: inputs * 0.0


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_block_contract(norm_position):
    run_layer_test(
        EncoderBlock, dict(num_heads=2, d_ff=16, norm_position=norm_position),
        {"inputs": random(2, 5, 8), "padding_mask": np.array([[1] * 5, [1, 1, 1, 0, 0]], bool)},
        expected_output_shape=(2, 5, 8),
    )


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_decoder_block_contract(norm_position):
    run_layer_test(
        DecoderBlock, dict(num_heads=2, d_ff=16, norm_position=norm_position),
        {"inputs": random(2, 4, 8), "encoder_outputs": random(2, 6, 8),
         "encoder_padding_mask": np.array([[1] * 6, [1, 1, 0, 0, 0, 0]], bool)},
        expected_output_shape=(2, 4, 8),
    )


def test_post_norm_output_is_layer_normalized():
    """The paper's LayerNorm(x + Sublayer(x)): every position has mean 0, variance 1."""
    out = to_numpy(EncoderBlock(num_heads=2, d_ff=16)(random(2, 5, 8) * 5 + 3))
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-4)
    np.testing.assert_allclose(out.var(-1), 1, atol=1e-3)


def test_pre_norm_output_is_not_normalized():
    out = to_numpy(EncoderBlock(num_heads=2, d_ff=16, norm_position="pre")(random(2, 5, 8) * 5 + 3))
    assert abs(out.mean()) > 1


def test_sublayer_dropout_is_applied_before_the_residual_add():
    """Dropping a whole sublayer output leaves only the residual path (§5.4)."""
    x = random(2, 5, 8)
    pre = EncoderBlock(num_heads=2, d_ff=16, norm_position="pre", dropout_rate=0.1)
    pre(x)
    drop_everything(pre, "self_attention_dropout", "feed_forward_dropout")
    np.testing.assert_allclose(to_numpy(pre(x, training=True)), x, atol=1e-6)

    post = EncoderBlock(num_heads=2, d_ff=16, dropout_rate=0.1)
    post(x)
    drop_everything(post, "self_attention_dropout", "feed_forward_dropout")
    expected = post.feed_forward_norm(post.self_attention_norm(x))
    np.testing.assert_allclose(to_numpy(post(x, training=True)), to_numpy(expected), atol=1e-5)


def test_decoder_sublayer_dropouts_cover_all_three_sublayers():
    x, memory = random(2, 3, 8), random(2, 4, 8)
    block = DecoderBlock(num_heads=2, d_ff=16, norm_position="pre", dropout_rate=0.1)
    block(x, memory)
    drop_everything(block, "self_attention_dropout", "cross_attention_dropout",
                    "feed_forward_dropout")
    np.testing.assert_allclose(to_numpy(block(x, memory, training=True)), x, atol=1e-6)


def test_dropout_is_active_only_in_training():
    block = EncoderBlock(num_heads=2, d_ff=16, dropout_rate=0.3)
    x = random(2, 5, 8)
    np.testing.assert_allclose(to_numpy(block(x)), to_numpy(block(x, training=False)))
    assert not np.allclose(to_numpy(block(x, training=True)), to_numpy(block(x, training=True)))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_block_gives_its_self_attention_weights(norm_position):
    block = EncoderBlock(num_heads=2, d_ff=16, norm_position=norm_position)
    x = random(1, 5, 8)
    weights = to_numpy(block.attention_weights(x))
    assert tuple(weights.shape) == (1, 2, 5, 5)
    np.testing.assert_allclose(weights.sum(-1), 1, atol=1e-5)
    attended = block.self_attention_norm(x) if norm_position == "pre" else x
    np.testing.assert_allclose(
        weights, to_numpy(block.self_attention.attention_weights(attended)), atol=1e-6)


def test_decoder_self_attention_is_causal():
    block = DecoderBlock(num_heads=2, d_ff=16)
    x, memory = random(1, 5, 8), random(1, 4, 8)
    changed = x.copy()
    changed[:, 2:] = random(1, 3, 8)
    np.testing.assert_allclose(
        to_numpy(block(x, memory))[:, :2], to_numpy(block(changed, memory))[:, :2], atol=1e-5
    )


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("value_dim", [None, 6], ids=["d_v=d_k", "d_v!=d_k"])
def test_cached_decoding_matches_full(norm_position, value_dim):
    block = DecoderBlock(num_heads=2, d_ff=16, value_dim=value_dim,
                         norm_position=norm_position)
    x, memory = random(2, 5, 8), random(2, 3, 8)
    full = to_numpy(block(x, memory))
    cache = block.initial_cache(memory, 5)
    steps = []
    for index in range(5):
        # The cross-attention reads its precomputed keys and values, not `memory`.
        out, self_cache = block(x[:, index : index + 1], None,
                                self_attention_cache=cache["self"], cache_update_index=index,
                                cross_attention_cache=cache["cross"])
        cache = {"self": self_cache, "cross": cache["cross"]}
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_decoder_gives_self_and_cross_attention_weights_as_its_sublayers_see_them(
        norm_position):
    block = DecoderBlock(num_heads=2, d_ff=16, norm_position=norm_position)
    x, memory = random(1, 3, 8), random(1, 4, 8)
    weights = block.attention_weights(x, memory)
    assert tuple(weights["self"].shape) == (1, 2, 3, 3)
    assert tuple(weights["cross"].shape) == (1, 2, 3, 4)
    assert np.all(np.triu(to_numpy(weights["self"])[0, 0], k=1) == 0)
    # The encoder-decoder attention's query is the first sublayer's output.
    x = ops.convert_to_tensor(x)
    if norm_position == "post":
        middle = block.self_attention_norm(block.self_attention(x, use_causal_mask=True) + x)
    else:
        middle = block.cross_attention_norm(
            block.self_attention(block.self_attention_norm(x), use_causal_mask=True) + x)
    np.testing.assert_allclose(
        to_numpy(weights["cross"]),
        to_numpy(block.cross_attention.attention_weights(middle, memory)), atol=1e-6)


def test_a_decoder_block_returns_a_pair_with_a_cache_and_a_tensor_without():
    block = DecoderBlock(num_heads=2, d_ff=16)
    memory = random(2, 4, 8)
    outputs = block(random(2, 3, 8), memory)
    assert not isinstance(outputs, tuple) and tuple(outputs.shape) == (2, 3, 8)
    cache = block.initial_cache(memory, 3)
    cached = block(random(2, 1, 8), None, self_attention_cache=cache["self"],
                   cache_update_index=0, cross_attention_cache=cache["cross"])
    assert isinstance(cached, tuple) and len(cached) == 2
    assert tuple(cached[0].shape) == (2, 1, 8)
    assert [tuple(part.shape) for part in cached[1]] == [(2, 3, 8), (2, 3, 8)]


def test_cache_without_index_is_an_error():
    block = DecoderBlock(num_heads=2, d_ff=16)
    with pytest.raises(ValueError, match="cache_update_index"):
        block(random(1, 1, 8), random(1, 2, 8),
              self_attention_cache=(ops.zeros((1, 3, 2, 4)), ops.zeros((1, 3, 2, 4))))


@pytest.mark.parametrize("beam_size", [0, -2, 1.5])
def test_decoder_block_cache_checks_beam_size(beam_size):
    block = DecoderBlock(num_heads=2, d_ff=16)
    block(random(1, 1, 8), random(1, 2, 8))
    with pytest.raises(ValueError, match="beam_size"):
        block.initial_cache(random(1, 2, 8), 4, beam_size=beam_size)


def test_indivisible_d_model_names_the_values():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=4"):
        EncoderBlock(num_heads=4, d_ff=16)(random(1, 2, 10))


def test_bad_norm_position_is_an_error():
    with pytest.raises(ValueError, match="norm_position='middle'"):
        EncoderBlock(num_heads=2, d_ff=16, norm_position="middle")
