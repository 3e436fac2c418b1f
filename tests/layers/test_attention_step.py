"""Tests of the decoding step's fast paths (keras_transformer/layers/attention_step.py).
`single_query_attention` is tested through the layer against NumPy's eq. (1) in
test_attention.py (one query against a cache, and a cache shared by groups of
queries); `project`'s matmul is tested here against the layer it replaces, and so is
`backend.call_part`, which calls the other parts of our layers."""

import keras
import numpy as np
import pytest
from helpers import to_numpy

from keras_transformer import backend
from keras_transformer.layers import MultiHeadAttention
from keras_transformer.layers.attention_step import project

RNG = np.random.default_rng(0)


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="only PyTorch's decoding step projects with one matmul")
@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "no_bias"])
def test_a_steps_matmul_projections_equal_the_einsum_layers(use_bias):
    layer = MultiHeadAttention(num_heads=3, key_dim=4, value_dim=5, use_bias=use_bias)
    x = RNG.normal(size=(2, 1, 8)).astype("float32")
    layer(x)  # builds the layer
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense):
        np.testing.assert_allclose(to_numpy(project(dense, x, step=True)), to_numpy(dense(x)),
                                   atol=1e-6)
    heads = RNG.normal(size=(2, 1, 3, 5)).astype("float32")
    np.testing.assert_allclose(to_numpy(project(layer.output_dense, heads, step=True)),
                               to_numpy(layer.output_dense(heads)), atol=1e-6)


@pytest.mark.parametrize("layer", [
    keras.layers.Dense(6, activation="relu"),
    keras.layers.LayerNormalization(),
    keras.layers.EinsumDense("btd,dnh->btnh", output_shape=(None, 2, 3), bias_axes="nh"),
], ids=["dense", "layer_norm", "einsum_dense"])
def test_a_part_called_directly_gives_what_its_call_gives(layer):
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    expected = to_numpy(layer(x))  # builds the layer
    np.testing.assert_allclose(to_numpy(backend.call_part(layer, keras.ops.convert_to_tensor(x))),
                               expected, atol=1e-6)


def test_a_quantized_part_goes_through_its_quantized_call():
    layer = keras.layers.Dense(16)
    x = keras.ops.convert_to_tensor(RNG.normal(size=(2, 5, 8)).astype("float32"))
    layer(x)
    layer.quantize("int8")
    quantized = to_numpy(layer(x))
    np.testing.assert_allclose(to_numpy(backend.call_part(layer, x)), quantized, atol=1e-6)


def test_dropout_as_a_part_drops_only_in_training():
    layer = keras.layers.Dropout(0.5, seed=1)
    x = keras.ops.ones((4, 64))
    np.testing.assert_array_equal(to_numpy(backend.call_part(layer, x, training=False)), 1.0)
    dropped = to_numpy(backend.call_part(layer, x, training=True))
    assert 0 < (dropped == 0).mean() < 1 and set(np.unique(dropped)) <= {0.0, 2.0}


@pytest.mark.parametrize("policy", ["mixed_float16", "float16"])
def test_a_part_gives_what_its_call_gives_under_every_policy(policy):
    layer = keras.layers.Dense(4, dtype=policy)
    x = RNG.normal(size=(2, 3, 8)).astype("float32")
    expected = layer(x)  # builds the layer
    for inputs in (x, keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(x, "float16")):
        outputs = backend.call_part(layer, inputs)
        assert keras.backend.standardize_dtype(outputs.dtype) == "float16"
        np.testing.assert_allclose(to_numpy(outputs), to_numpy(expected), atol=1e-2)
