"""§6.1 Checkpoint averaging.

"For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals. For the big models, we
averaged the last 20 checkpoints." Averaging the weights of nearby checkpoints
smooths the noise of the last optimizer steps and usually adds a little BLEU.
"""

import os

import keras
import numpy as np

from keras_transformer import saving


def average_checkpoints(paths, output_path=None):
    """Averages the weights of several saved models of one architecture.

    Every floating-point weight becomes the element-wise mean over the
    checkpoints; other variables (integer counters) are taken from the last one.
    The optimizer state is not averaged: the result is for inference (or for
    fine-tuning with a freshly compiled optimizer).

    Args:
        paths: `.keras` files, e.g. the last 5 of `list_checkpoints(...)`.
        output_path: Where to save the averaged model, or None to only return it.

    Returns:
        The averaged model (the last checkpoint's architecture and config).
    """
    paths = list(paths)
    if not paths:
        raise ValueError("average_checkpoints needs at least one .keras file; got none.")
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"No checkpoint at {path!r}.")
    model = saving.load_model(paths[-1])
    sums = [np.asarray(keras.ops.convert_to_numpy(w), dtype="float64") for w in model.weights]
    for path in paths[:-1]:
        other = saving.load_model(path)
        if len(other.weights) != len(model.weights) or any(
            tuple(a.shape) != tuple(b.shape) for a, b in zip(other.weights, model.weights)
        ):
            raise ValueError(
                f"{path!r} does not have the architecture of {paths[-1]!r}: only "
                "checkpoints of one training run can be averaged."
            )
        for total, weight in zip(sums, other.weights):
            total += keras.ops.convert_to_numpy(weight)
    for weight, total in zip(model.weights, sums):
        if keras.backend.is_float_dtype(weight.dtype):
            dtype = keras.backend.standardize_dtype(weight.dtype)
            weight.assign((total / len(paths)).astype(dtype))
    if output_path:
        saving.save_model(model, output_path)
    return model


def tokenizer_folder(checkpoint_path):
    """The folder whose tokenizer(s) go with `checkpoint_path`: its own folder,
    or the run directory above a run's `checkpoints/`; None if neither holds one."""
    folder = os.path.dirname(os.path.abspath(checkpoint_path))
    for candidate in (folder, os.path.dirname(folder)):
        if any(os.path.isdir(directory) for directory in
               saving.tokenizer_directories(candidate)
               + saving.tokenizer_directories(candidate, separate=True)):
            return candidate
    return None


def tokenizers_to_copy(source_folder, output_path):
    """The tokenizers of `source_folder` that must be written beside `output_path`
    for the averaged model to translate as it is (`keras-transformer translate
    OUTPUT`): `(source, target)`, or None when they are there already.

    Raises:
        FileExistsError: the output's folder holds another vocabulary.
    """
    output_folder = os.path.dirname(os.path.abspath(output_path))
    if os.path.isdir(output_folder) and os.path.samefile(source_folder, output_folder):
        return None
    tokenizers = saving.load_tokenizers(source_folder)
    try:
        present = saving.load_tokenizers(output_folder)
    except FileNotFoundError:
        return tokenizers
    if [t.fingerprint() for t in present] != [t.fingerprint() for t in tokenizers]:
        raise FileExistsError(
            f"{output_folder} holds the tokenizer of another model: write the averaged "
            "model into another folder (--output).")
    return None
