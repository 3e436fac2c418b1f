"""Tests of §6.1 checkpoint averaging."""

import keras
import numpy as np
import pytest
from helpers import tiny_model, to_numpy

from keras_transformer_app.training.averaging import average_checkpoints

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")


def test_average_of_two_checkpoints_is_their_elementwise_mean(tmp_path):
    first, second = tiny_model(12), tiny_model(12)
    first.save(tmp_path / "a.keras")
    second.save(tmp_path / "b.keras")
    averaged = average_checkpoints([str(tmp_path / "a.keras"), str(tmp_path / "b.keras")],
                                   str(tmp_path / "avg.keras"))
    means = [(to_numpy(a) + to_numpy(b)) / 2 for a, b in zip(first.weights, second.weights)]
    assert len(averaged.weights) == len(means) > 0
    assert not np.allclose(means[0], to_numpy(first.weights[0]))  # the two really differ
    for mean, weight in zip(means, averaged.weights):
        np.testing.assert_allclose(to_numpy(weight), mean, atol=1e-7)
    # The written file holds the averaged model.
    written = keras.saving.load_model(tmp_path / "avg.keras")
    for mean, weight in zip(means, written.weights):
        np.testing.assert_allclose(to_numpy(weight), mean, atol=1e-7)


def test_checkpoints_of_different_models_are_refused(tmp_path):
    tiny_model(12).save(tmp_path / "a.keras")
    tiny_model(13).save(tmp_path / "b.keras")
    with pytest.raises(ValueError, match="architecture"):
        average_checkpoints([str(tmp_path / "a.keras"), str(tmp_path / "b.keras")])


def test_no_or_missing_checkpoints_are_errors(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        average_checkpoints([str(tmp_path / "missing.keras")])
