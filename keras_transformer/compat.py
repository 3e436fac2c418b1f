"""What the project uses of its dependencies beyond their stable public API, in one place (no
paper section).

Each entry says what it reaches for, why no public API serves, and the versions it is tested
on; `tests/test_compat.py` fails when a release changes what it relies on.

- `torch_trace`: `torch.jit.trace`, public but deprecated since torch 2.10 in favour of
  `torch.compile`, which the PyTorch search loops use (`keras_transformer.inference.compiled`):
  eager decoding runs several times slower and `torch.compile` takes minutes to start
  (docs/performance.md, "Decoding under PyTorch: traced loops"). Tested with torch 2.13.0.
- `h11_protocol`: uvicorn's h11 HTTP protocol class,
  `uvicorn.protocols.http.h11_impl.H11Protocol`, a module uvicorn does not document, which
  the server subclasses (`keras_transformer.serving.protocol`) for what uvicorn's `Config`
  does not offer: a timeout on a request's headers, a bound on headers that arrive whole, and
  JSON errors for malformed HTTP. The subclass overrides `connection_made`, `data_received`,
  `connection_lost` and `send_400_response`, and reads the protocol's `conn` (an
  `h11.Connection`), `loop` and `transport`. The suite runs with uvicorn 0.54.0 (h11 0.16.0);
  one request runs with uvicorn 0.30.0, the lowest allowed (`.ci/lowest_versions.py`).
"""


def torch_trace(function, inputs):
    """`torch.jit.trace(function, inputs)` without a check run and without its warnings:
    the tracer's, that Python numbers become constants (Keras converts them to tensors
    inside a loop; they are constants), and torch's deprecation of `torch.jit.trace`."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", "`torch.jit.trace` is deprecated", DeprecationWarning)
        return torch.jit.trace(function, inputs, check_trace=False)


def h11_protocol():
    """uvicorn's h11 protocol class, the base of `keras_transformer.serving.protocol`'s."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol
