"""What the project uses of its dependencies beyond their stable public API, in one place (no
paper section).

Each entry says what it reaches for, why no public API serves, and the versions it is tested
on; `tests/test_compat.py` fails when a release changes what it relies on.

- `torch_trace`: `torch.jit.trace`, public but deprecated since torch 2.10 in favour of
  `torch.compile`, which the PyTorch search loops use (`keras_transformer.inference.compiled`):
  eager decoding runs several times slower and `torch.compile` takes minutes to start
  (docs/performance.md, "Decoding under PyTorch: traced loops"). Tested with torch 2.13.0.

The server stands on asyncio and httptools' public parser API
(`keras_transformer.serving.protocol`), with nothing of uvicorn's.
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

