"""§6.1 Inference: greedy, sampling and beam-search decoding, and a text-to-text translator.

- `greedy.py`, `sampling.py`, `beam.py`: the three searches, each an entry point
  on NumPy arrays and a loop of `keras.ops` on tensors;
- `search.py`: what the entry points share (checks, compiling, running);
- `step.py`: the cached decoding step and the phases of the loops;
- `compiled.py`: the loops compiled per backend;
- `limits.py`: "input length + 50" and the limits around it;
- `alignment.py`: each output token's source position;
- `translator.py`: `Translator`, from text to text.
"""

from keras_transformer.inference.beam import beam_search, length_penalty
from keras_transformer.inference.greedy import greedy_search
from keras_transformer.inference.sampling import Sampling, sample_search
from keras_transformer.inference.translator import (
    Hypothesis,
    SourceTruncatedWarning,
    Translation,
    Translator,
)

__all__ = ["Hypothesis", "Sampling", "SourceTruncatedWarning", "Translation", "Translator",
           "beam_search", "greedy_search", "length_penalty", "sample_search"]
