"""Tests of the decoding step's fast paths (keras_transformer/layers/attention_step.py).
`single_query_attention` is tested through the layer against NumPy's eq. (1) in
test_attention.py (one query against a cache, and a cache shared by groups of
queries); `project`'s matmul is tested here against the layer it replaces."""

import keras
import numpy as np
import pytest
from helpers import to_numpy

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
