"""Loading a trained model together with the tokenizer saved beside it.

A recipe's run directory holds `model.keras` (and `model_averaged.keras`) with
`tokenizer/` next to it, or `source_tokenizer/` and `target_tokenizer/` for
separate vocabularies. Evaluation, plots, export and serving all start here, so
they use exactly the training vocabulary.
"""

import os

import keras

from keras_transformer.training.tokenizers import SubwordTokenizer


def resolve_model_path(path):
    """`path` itself if it is a .keras file; in a run directory, its
    `model_averaged.keras` if present, else its `model.keras`."""
    if os.path.isdir(path):
        for name in ("model_averaged.keras", "model.keras"):
            candidate = os.path.join(path, name)
            if os.path.exists(candidate):
                return candidate
        raise FileNotFoundError(
            f"No model.keras in {path!r}: pass a .keras file or a run directory that a "
            "recipe has finished."
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"No model at {path!r}.")
    if not path.endswith(".keras"):
        raise ValueError(f"{path!r} is not a .keras file: pass a .keras model or a run directory.")
    return path


def load_tokenizers(model_path):
    """(source_tokenizer, target_tokenizer) saved beside `model_path`; the same
    object twice for a shared vocabulary."""
    directory = os.path.dirname(os.path.abspath(model_path))
    shared = os.path.join(directory, "tokenizer")
    if os.path.isdir(shared):
        tokenizer = SubwordTokenizer.load(shared)
        return tokenizer, tokenizer
    source, target = (os.path.join(directory, f"{side}_tokenizer") for side in ("source", "target"))
    if os.path.isdir(source) and os.path.isdir(target):
        return SubwordTokenizer.load(source), SubwordTokenizer.load(target)
    raise FileNotFoundError(
        f"No tokenizer beside {model_path!r}: expected {shared}/ (or source_tokenizer/ and "
        "target_tokenizer/), as the recipes write them."
    )


def load_translation_model(path):
    """Loads (model, source_tokenizer, target_tokenizer) from a .keras file or a
    run directory, in Keras's safe mode (no arbitrary code)."""
    model_path = resolve_model_path(path)
    try:
        model = keras.saving.load_model(model_path, compile=False, safe_mode=True)
    except Exception as error:  # a damaged zip raises many kinds of errors
        raise ValueError(
            f"Cannot load {model_path!r} as a Keras model ({type(error).__name__}: {error}); "
            "the file may be truncated or not a .keras file."
        ) from error
    source_tokenizer, target_tokenizer = load_tokenizers(model_path)
    return model, source_tokenizer, target_tokenizer
