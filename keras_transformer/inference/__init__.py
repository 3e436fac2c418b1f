"""§6.1 Inference: greedy and beam-search decoding, and a text-to-text translator."""

from keras_transformer.inference.decoding import (
    beam_search,
    greedy_search,
    length_penalty,
)
from keras_transformer.inference.translator import Translator

__all__ = ["Translator", "beam_search", "greedy_search", "length_penalty"]
