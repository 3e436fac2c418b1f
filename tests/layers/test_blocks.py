"""Tests of §3.1 encoder and decoder blocks: residuals, LayerNorm, dropout, cache,
Keras's implicit masks."""

import warnings

import keras
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


# Keras's implicit mask: ids 0 are padding for `Embedding(mask_zero=True)`. The source
# has right padding; the target pads its first position, so that causality alone does
# not hide the padding from the real positions after it.
SOURCE_IDS = np.array([[3, 4, 5, 6, 7], [6, 7, 8, 0, 0]])
TARGET_IDS = np.array([[2, 3, 4], [0, 5, 6]])


def unmasked(tensor):
    """The same values in a tensor that carries no Keras mask."""
    return ops.convert_to_tensor(to_numpy(tensor))


def masked_embeddings(ids):
    """`Embedding(mask_zero=True)` of `ids`, and the same vectors without the mask."""
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(ids)
    return embedded, unmasked(embedded)


def assert_close_at_real_positions(actual, expected, ids):
    real = ids != 0
    np.testing.assert_allclose(to_numpy(actual)[real], to_numpy(expected)[real], atol=1e-5)


def assert_differs_at_real_positions(actual, expected, ids):
    real = ids != 0
    assert not np.allclose(to_numpy(actual)[real], to_numpy(expected)[real], atol=1e-3)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_block_takes_the_keras_mask_as_its_padding_mask(norm_position):
    masked, plain = masked_embeddings(SOURCE_IDS)
    block = EncoderBlock(num_heads=2, d_ff=16, norm_position=norm_position)
    with warnings.catch_warnings():
        # The sublayers get the inputs without the mask: none warns that it drops it.
        warnings.filterwarnings("error", "Layer .* does not support masking")
        implicit = block(masked)
    assert_close_at_real_positions(implicit, block(plain, padding_mask=SOURCE_IDS != 0),
                                   SOURCE_IDS)
    assert_differs_at_real_positions(implicit, block(plain), SOURCE_IDS)


def test_an_explicit_padding_mask_wins_over_the_keras_mask():
    masked, plain = masked_embeddings(SOURCE_IDS)
    block = EncoderBlock(num_heads=2, d_ff=16)
    everything = np.ones_like(SOURCE_IDS, bool)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "Layer .* does not support masking")
        overridden = block(masked, padding_mask=everything)
    np.testing.assert_allclose(to_numpy(overridden), to_numpy(block(plain)), atol=1e-5)


def test_encoder_block_passes_the_keras_mask_to_the_next_layer():
    """Pooling after the block averages over the real positions only."""
    ids = keras.Input((None,), dtype="int32")
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    block = EncoderBlock(num_heads=2, d_ff=16)
    pooled = keras.layers.GlobalAveragePooling1D()(block(embedding(ids)))
    model = keras.Model(ids, pooled)

    outputs = to_numpy(block(unmasked(embedding(SOURCE_IDS)), padding_mask=SOURCE_IDS != 0))
    real = (SOURCE_IDS != 0)[..., None]
    expected = (outputs * real).sum(1) / real.sum(1)
    np.testing.assert_allclose(to_numpy(model(SOURCE_IDS)), expected, atol=1e-5)
    assert not np.allclose(expected, outputs.mean(1), atol=1e-3)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_decoder_block_takes_the_keras_masks_of_both_inputs(norm_position):
    target, plain_target = masked_embeddings(TARGET_IDS)
    source, plain_source = masked_embeddings(SOURCE_IDS)
    block = DecoderBlock(num_heads=2, d_ff=16, norm_position=norm_position)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "Layer .* does not support masking")
        implicit = block(target, source)
    decoder_mask, encoder_mask = TARGET_IDS != 0, SOURCE_IDS != 0
    assert_close_at_real_positions(
        implicit, block(plain_target, plain_source, decoder_padding_mask=decoder_mask,
                        encoder_padding_mask=encoder_mask), TARGET_IDS)
    # Each mask changes the outputs: neither is dropped.
    assert_differs_at_real_positions(
        implicit, block(plain_target, plain_source, encoder_padding_mask=encoder_mask),
        TARGET_IDS)
    assert_differs_at_real_positions(
        implicit, block(plain_target, plain_source, decoder_padding_mask=decoder_mask),
        TARGET_IDS)


def test_decoder_block_passes_the_keras_mask_of_its_inputs_to_the_next_layer():
    target_ids = keras.Input((None,), dtype="int32")
    source_ids = keras.Input((None,), dtype="int32")
    target_embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    source_embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    block = DecoderBlock(num_heads=2, d_ff=16)
    outputs = block(target_embedding(target_ids), source_embedding(source_ids))
    model = keras.Model([target_ids, source_ids],
                        keras.layers.GlobalAveragePooling1D()(outputs))

    outputs = to_numpy(block(unmasked(target_embedding(TARGET_IDS)),
                             unmasked(source_embedding(SOURCE_IDS)),
                             decoder_padding_mask=TARGET_IDS != 0,
                             encoder_padding_mask=SOURCE_IDS != 0))
    real = (TARGET_IDS != 0)[..., None]
    expected = (outputs * real).sum(1) / real.sum(1)
    np.testing.assert_allclose(to_numpy(model([TARGET_IDS, SOURCE_IDS])), expected, atol=1e-5)
