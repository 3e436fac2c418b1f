"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs unchanged on the TensorFlow, JAX and PyTorch backends (`KERAS_BACKEND`).

Importing the package loads Keras and registers the package's layers, model, loss
and schedule with Keras's serialization, so that `keras.saving.load_model` loads a
saved model. It changes nothing else in the program that imports it: it sets no
environment variable, log level, warning filter, signal handler or import hook
(`tests/test_imports.py`). Quieting native log lines is left to the command lines,
which own their process (`keras_transformer.logs`: a process started as one of them
is quieted here, before Keras loads). A Ctrl-C that comes while the
package loads Keras and the backend is held back until they are loaded, so that
it ends the program cleanly after the import rather than inside a library's
start-up.
"""

import os

from keras_transformer.backend import check_backend_name
from keras_transformer.logs import quiet_if_a_command_line, signals_deferred

quiet_if_a_command_line()  # before Keras loads TensorFlow: only in our own command lines

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
    # imports, so that the command line (keras_transformer.cli) can say so in
    # one line; using the library raises the same clear error.
    def __getattr__(name, _error=_backend_error):
        if name in __all__:
            raise ValueError(str(_error)) from None
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
else:
    with signals_deferred():
        from keras_transformer import layers
        from keras_transformer.config import TransformerConfig
        from keras_transformer.model import Transformer
        from keras_transformer.training import (
            LabelSmoothedCrossEntropy,
            MaskedTokenAccuracy,
            NoamSchedule,
            paper_adam,
        )
