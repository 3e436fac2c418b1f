"""Tests of §3.4 embeddings and §3.5 positional encodings."""

import math

import keras
import numpy as np
import pytest
from helpers import run_layer_test, to_numpy

from keras_transformer.layers import (
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    sinusoidal_position_encoding,
)


def numpy_position_encoding(length, d_model, start=0):
    """§3.5 written out element by element."""
    pe = np.zeros((length, d_model))
    for pos in range(start, start + length):
        for dim in range(d_model):
            i = dim // 2
            angle = pos / 10000 ** (2 * i / d_model)
            pe[pos - start, dim] = math.sin(angle) if dim % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("length, d_model, start", [(50, 16, 0), (7, 9, 0), (5, 512, 100)])
def test_sinusoidal_encoding_matches_formula(length, d_model, start):
    np.testing.assert_allclose(
        to_numpy(sinusoidal_position_encoding(length, d_model, start_index=start)),
        numpy_position_encoding(length, d_model, start),
        atol=2e-5,
    )


def test_sinusoidal_layer_contract():
    run_layer_test(
        SinusoidalPositionEncoding, {}, {"inputs": np.zeros((2, 7, 6), "float32")},
        expected_output_shape=(2, 7, 6), run_training=False,
    )


def test_sinusoidal_layer_start_index_shifts_positions():
    layer = SinusoidalPositionEncoding()
    out = to_numpy(layer(np.zeros((1, 3, 8), "float32"), start_index=4))
    np.testing.assert_allclose(out[0], numpy_position_encoding(3, 8, start=4), atol=1e-5)


def test_token_embedding_contract():
    run_layer_test(
        TokenEmbedding, dict(vocab_size=11, d_model=6),
        {"inputs": np.array([[1, 2, 3], [4, 0, 10]], "int32")},
        expected_output_shape=(2, 3, 6),
    )


def test_token_embedding_is_scaled_by_sqrt_d_model():
    layer = TokenEmbedding(vocab_size=5, d_model=16)
    out = to_numpy(layer(np.array([[3]])))
    np.testing.assert_allclose(out[0, 0], to_numpy(layer.embeddings)[3] * 4.0, rtol=1e-6)
    unscaled = TokenEmbedding(vocab_size=5, d_model=16, scale_embeddings=False)
    np.testing.assert_allclose(
        to_numpy(unscaled(np.array([[3]])))[0, 0], to_numpy(unscaled.embeddings)[3]
    )


def test_reverse_projection_shares_the_embedding_matrix():
    layer = TokenEmbedding(vocab_size=7, d_model=4, use_output_bias=True)
    layer.build()
    layer.output_bias.assign(np.arange(7, dtype="float32"))
    hidden = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
    logits = layer(hidden, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    expected = hidden @ to_numpy(layer.embeddings).T + np.arange(7)
    np.testing.assert_allclose(to_numpy(logits), expected, atol=1e-5)


def test_reverse_projection_by_the_kernel_made_beforehand():
    layer = TokenEmbedding(vocab_size=7, d_model=4, use_output_bias=True)
    layer.build()
    layer.output_bias.assign(np.arange(7, dtype="float32"))
    kernel = layer.reverse_kernel()
    assert tuple(kernel.shape) == (4, 7)
    np.testing.assert_array_equal(to_numpy(kernel), to_numpy(layer.embeddings).T)
    hidden = np.random.default_rng(1).normal(size=(2, 3, 4)).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(hidden, reverse=True, reverse_kernel=kernel)),
                               to_numpy(layer(hidden, reverse=True)), atol=1e-6)
    # The kernel given is the one multiplied by, not the layer's embeddings.
    doubled = to_numpy(layer(hidden, reverse=True, reverse_kernel=2 * to_numpy(kernel)))
    np.testing.assert_allclose(doubled, 2 * (hidden @ to_numpy(kernel)) + np.arange(7),
                               atol=1e-5)


def test_reverse_projection_is_float32_under_mixed_precision():
    layer = TokenEmbedding(vocab_size=7, d_model=4, dtype="mixed_bfloat16")
    vectors = layer(np.array([[1, 2]]))
    assert keras.backend.standardize_dtype(vectors.dtype) == "bfloat16"
    logits = layer(vectors, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


def test_learned_position_embedding_contract():
    run_layer_test(
        LearnedPositionEmbedding, dict(max_length=10),
        {"inputs": np.zeros((2, 7, 6), "float32")},
        expected_output_shape=(2, 7, 6),
    )


def test_learned_position_embedding_slices_from_start_index():
    layer = LearnedPositionEmbedding(max_length=10)
    layer.build((None, None, 4))
    out = to_numpy(layer(np.zeros((1, 3, 4), "float32"), start_index=5))
    np.testing.assert_allclose(out[0], to_numpy(layer.position_embeddings)[5:8])


def test_learned_position_embedding_rejects_long_inputs():
    layer = LearnedPositionEmbedding(max_length=4)
    with pytest.raises(ValueError, match="longer than max_length=4"):
        layer(np.zeros((1, 5, 2), "float32"))


@pytest.mark.parametrize("make, message", [
    (lambda: TokenEmbedding(vocab_size=0, d_model=4), "vocab_size=0 must be a positive integer"),
    (lambda: TokenEmbedding(vocab_size=10, d_model=4.0), "d_model=4.0 must be a positive integer"),
    (lambda: LearnedPositionEmbedding(max_length=-1), "max_length=-1 must be a positive integer"),
])
def test_bad_sizes_are_explained(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_numpy_sizes_give_a_serializable_config():
    layer = TokenEmbedding(vocab_size=np.int64(10), d_model=np.int32(4))
    config = layer.get_config()
    assert type(config["vocab_size"]) is type(config["d_model"]) is int
