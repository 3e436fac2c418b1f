"""keras_transformer/compat.py: what the project relies on beyond its dependencies' stable public
API still holds in the versions installed. A release that changes it fails here, by name, before
the server's or the search's own tests fail in its consequences."""

import inspect

import keras
import numpy as np
import pytest

from keras_transformer import compat
from keras_transformer.serving import protocol


@pytest.mark.once("torch")  # about uvicorn, not the backend
def test_uvicorns_h11_protocol_has_what_the_server_overrides_and_reads():
    base = compat.h11_protocol()
    overridden = {name for name, value in vars(protocol._Hardened).items()
                  if callable(value) and not name.startswith("_")}
    assert overridden == {"connection_made", "data_received", "connection_lost",
                          "send_400_response"}
    for name in overridden:  # each override calls the base's with the same parameters
        assert (list(inspect.signature(getattr(base, name)).parameters)
                == list(inspect.signature(getattr(protocol._Hardened, name)).parameters)), name
    # What the subclass reads of the protocol: its h11 connection, event loop and transport.
    source = inspect.getsource(base)
    for attribute in ("self.conn = h11.Connection(", "self.loop = ", "self.transport = "):
        assert attribute in source, attribute
    server_class = protocol.protocol_class(header_timeout=5.0)
    assert issubclass(server_class, base) and server_class.header_timeout == 5.0


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
