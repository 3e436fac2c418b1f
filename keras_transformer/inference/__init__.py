"""§6.1 Inference: greedy, sampling and beam-search decoding, and a text-to-text translator."""

from keras_transformer.inference.beam import length_penalty
from keras_transformer.inference.decoding import beam_search, greedy_search, sample_search
from keras_transformer.inference.sampling import Sampling
from keras_transformer.inference.translator import (
    Hypothesis,
    SourceTruncatedWarning,
    Translation,
    Translator,
)

__all__ = ["Hypothesis", "Sampling", "SourceTruncatedWarning", "Translation", "Translator",
           "beam_search", "greedy_search", "length_penalty", "sample_search"]
