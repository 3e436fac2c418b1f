"""keras_transformer/compat.py: what the project relies on beyond its dependencies' stable public
API still holds in the versions installed. A release that changes it fails here, by name, before
the server's or the search's own tests fail in its consequences."""

import keras
import numpy as np
import pytest

from keras_transformer import compat


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's tracer")
def test_torch_trace_records_a_function_and_replays_it_on_new_values():
    import torch

    def body(step, total, weights):
        return step + 1, total + weights * step

    inputs = (torch.tensor(1), torch.zeros(3), torch.ones(3))
    traced = compat.torch_trace(body, inputs)
    step, total = traced(torch.tensor(4), torch.ones(3), torch.full((3,), 2.0))
    assert int(step) == 5
    np.testing.assert_allclose(total.numpy(), [9.0, 9.0, 9.0])
