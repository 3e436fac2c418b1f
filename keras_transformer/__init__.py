"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs unchanged on the TensorFlow, JAX and PyTorch backends (`KERAS_BACKEND`).
"""

import os
import sys

BACKENDS = ("tensorflow", "jax", "torch")


def _check_backend():
    # Before Keras is imported: its own error for a mistyped name is a traceback
    # from deep inside keras.src.backend.
    backend = os.environ.get("KERAS_BACKEND")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(
            f"KERAS_BACKEND={backend!r} is not a backend keras-transformer runs on: set it "
            f"to one of {', '.join(BACKENDS)} (or unset it for Keras's default)."
        )


def _run_as_command():
    # The keras-transformer script, or python -m keras_transformer.<module>
    # (while runpy imports the package of a -m module, sys.argv[0] is "-m").
    argument = sys.argv[0] if sys.argv else ""
    return argument == "-m" or os.path.basename(argument) == "keras-transformer"


try:
    _check_backend()
except ValueError as _error:
    if not _run_as_command():
        raise
    print(f"error: {_error}", file=sys.stderr)  # one line, no traceback, for a user mistake
    sys.exit(2)

from keras_transformer import layers  # noqa: E402
from keras_transformer.config import TransformerConfig  # noqa: E402
from keras_transformer.model import Transformer  # noqa: E402
from keras_transformer.training import (  # noqa: E402
    LabelSmoothedCrossEntropy,
    MaskedTokenAccuracy,
    NoamSchedule,
    paper_adam,
)

__version__ = "0.1.0"

__all__ = [
    "LabelSmoothedCrossEntropy",
    "MaskedTokenAccuracy",
    "NoamSchedule",
    "Transformer",
    "TransformerConfig",
    "layers",
    "paper_adam",
]
