"""keras-transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs unchanged on the TensorFlow, JAX and PyTorch backends (`KERAS_BACKEND`).
"""

from keras_transformer import layers
from keras_transformer.config import TransformerConfig
from keras_transformer.model import Transformer
from keras_transformer.training import (
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
