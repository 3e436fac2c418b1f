"""The paper's boxes as Keras layers (§3.1-§3.5)."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.blocks import DecoderBlock, EncoderBlock
from keras_transformer.layers.embedding import (
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    sinusoidal_position_encoding,
)
from keras_transformer.layers.feed_forward import PositionwiseFeedForward

__all__ = [
    "DecoderBlock",
    "EncoderBlock",
    "LearnedPositionEmbedding",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SinusoidalPositionEncoding",
    "TokenEmbedding",
    "sinusoidal_position_encoding",
]
