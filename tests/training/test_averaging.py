"""Tests of §6.1 checkpoint averaging."""

import numpy as np
import pytest
from helpers import to_numpy

import keras_transformer as kt
from keras_transformer.training.averaging import average_checkpoints


def test_average_of_two_checkpoints_is_their_elementwise_mean(tmp_path):
    config = kt.TransformerConfig.tiny(vocab_size=12)
    first, second = kt.Transformer(config), kt.Transformer(config)
    first.save(tmp_path / "a.keras")
    second.save(tmp_path / "b.keras")
    averaged = average_checkpoints([str(tmp_path / "a.keras"), str(tmp_path / "b.keras")],
                                   str(tmp_path / "avg.keras"))
    for a, b, mean in zip(first.weights, second.weights, averaged.weights):
        np.testing.assert_allclose(to_numpy(mean), (to_numpy(a) + to_numpy(b)) / 2, atol=1e-7)
    assert (tmp_path / "avg.keras").exists()


def test_checkpoints_of_different_models_are_refused(tmp_path):
    kt.Transformer(kt.TransformerConfig.tiny(vocab_size=12)).save(tmp_path / "a.keras")
    kt.Transformer(kt.TransformerConfig.tiny(vocab_size=13)).save(tmp_path / "b.keras")
    with pytest.raises(ValueError, match="architecture"):
        average_checkpoints([str(tmp_path / "a.keras"), str(tmp_path / "b.keras")])


def test_no_or_missing_checkpoints_are_errors(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        average_checkpoints([str(tmp_path / "missing.keras")])
