"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs unchanged on the TensorFlow, JAX and PyTorch backends (`KERAS_BACKEND`).

Importing the package loads Keras and registers the package's layers, model, loss
and schedule with Keras's serialization, so that `keras.saving.load_model` loads a
saved model. It changes nothing else in the program that imports it, whatever the
program is called: it sets no environment variable, log level, warning filter, signal
handler or import hook (`tests/test_imports.py`). Setting up a process (quieting
native log lines, handling signals) is left to the program's entry points, which own
theirs (`keras_transformer_app`).
"""

import os

from keras_transformer.backend import check_backend_name, check_keras_version

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

try:
    check_backend_name(os.environ.get("KERAS_BACKEND"))
except ValueError as _backend_error:
    # Keras itself cannot be imported with this backend name. The package still
    # imports, so that a program that imports it can say so in one line; using the
    # library raises the same clear error.
    def __getattr__(name, _error=_backend_error):
        if name in __all__:
            raise ValueError(str(_error)) from None
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
else:
    import keras

    check_keras_version(keras.__version__)

    from keras_transformer import layers
    from keras_transformer.config import TransformerConfig
    from keras_transformer.model import Transformer
    from keras_transformer.training import (
        LabelSmoothedCrossEntropy,
        MaskedTokenAccuracy,
        NoamSchedule,
        paper_adam,
    )
