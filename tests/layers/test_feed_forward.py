"""Tests of §3.3 the position-wise feed-forward network."""

import keras
import numpy as np
import pytest
from helpers import run_layer_test, to_numpy

from keras_transformer.layers import PositionwiseFeedForward


def test_layer_contract():
    run_layer_test(
        PositionwiseFeedForward, dict(d_ff=16),
        {"inputs": np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")},
        expected_output_shape=(2, 5, 8),
    )


def test_matches_equation_2():
    layer = PositionwiseFeedForward(d_ff=12)
    x = np.random.default_rng(1).normal(size=(3, 4, 6)).astype("float32")
    out = to_numpy(layer(x))
    w1, b1 = (to_numpy(w) for w in layer.inner_dense.weights)
    w2, b2 = (to_numpy(w) for w in layer.output_dense.weights)
    np.testing.assert_allclose(out, np.maximum(0, x @ w1 + b1) @ w2 + b2, atol=1e-5)


def test_is_applied_to_each_position_separately():
    layer = PositionwiseFeedForward(d_ff=12)
    x = np.random.default_rng(2).normal(size=(1, 4, 6)).astype("float32")
    whole = to_numpy(layer(x))
    for t in range(4):
        np.testing.assert_allclose(to_numpy(layer(x[:, t : t + 1]))[:, 0], whole[:, t], atol=1e-6)


def test_output_dim_sets_the_output_width_eagerly_and_symbolically():
    layer = PositionwiseFeedForward(d_ff=8, output_dim=5)
    assert to_numpy(layer(np.ones((2, 3, 6), "float32"))).shape == (2, 3, 5)
    assert PositionwiseFeedForward(d_ff=8, output_dim=5)(keras.KerasTensor((2, 3, 6))).shape \
        == (2, 3, 5)


def test_activation_dropout_only_in_training():
    layer = PositionwiseFeedForward(d_ff=64, activation_dropout_rate=0.5)
    x = np.ones((1, 3, 8), "float32")
    np.testing.assert_allclose(to_numpy(layer(x)), to_numpy(layer(x, training=False)))
    assert not np.allclose(to_numpy(layer(x, training=True)), to_numpy(layer(x)))


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_ff=0), "d_ff=0 must be a positive integer"),
    (dict(d_ff=32.0), "d_ff=32.0 must be a positive integer"),
    (dict(d_ff=8, activation_dropout_rate=1.5),
     r"activation_dropout_rate=1.5 must be a number in \[0, 1\)"),
    (dict(d_ff=8, output_dim=0), "output_dim=0 must be a positive integer: pass None"),
])
def test_bad_arguments_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PositionwiseFeedForward(**kwargs)
