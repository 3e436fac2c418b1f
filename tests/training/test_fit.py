"""keras_transformer/training/fit.py: the time budget of the Table 3 script
(fit_steps itself runs in every recipe smoke test)."""

import keras
import numpy as np
import pytest

from keras_transformer.training.fit import TimeBudget


def tiny_regression():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model, np.ones((64, 4), "float32"), np.zeros((64, 1), "float32")


def test_time_budget_stops_fit_after_the_batch_that_exhausts_it():
    model, x, y = tiny_regression()
    budget = TimeBudget(1e-9)
    model.fit(x, y, batch_size=8, epochs=3, callbacks=[budget], verbose=0)
    assert budget.exhausted
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1


def test_time_budget_does_not_stop_a_run_that_fits_in_it():
    model, x, y = tiny_regression()
    budget = TimeBudget(3600)
    model.fit(x, y, batch_size=8, epochs=2, callbacks=[budget], verbose=0)
    assert not budget.exhausted
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 16


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan")])
def test_time_budget_must_be_positive(seconds):
    with pytest.raises(ValueError, match="positive"):
        TimeBudget(seconds)
