"""§6.1 Machine Translation: what the three searches share on the Python side.

`greedy_search` (`keras_transformer.inference.greedy`), `sample_search`
(`keras_transformer.inference.sampling`) and `beam_search`
(`keras_transformer.inference.beam`) each check their own settings and hand
`run_search` their loop, a function of tensors built from `keras.ops`.
`run_search` checks the model and the ids, compiles the loop for the backend
once per model and setting (`keras_transformer.inference.compiled`:
`jax.jit`, `tf.function(jit_compile=True)`, a traced loop under PyTorch), runs
it on NumPy inputs, trims its outputs to the longest hypothesis, and adds
alignments when asked (`keras_transformer.inference.alignment`). The exported
SavedModel traces the same loops into its graph
(`keras_transformer.export.saved_model`).

Every shape is fixed before a loop runs (the output buffer has room for the
longest allowed hypothesis, `keras_transformer.inference.limits`), so the
loops are `keras.ops.while_loop`s that compile, and they also trace with an
unknown batch size and source width (the SavedModel, where XLA fixes them
per input shape).
"""

import math
import weakref

import numpy as np
from keras import ops

from keras_transformer import id_checks, validation
from keras_transformer.inference.alignment import align
from keras_transformer.inference.compiled import compile_inference
from keras_transformer.inference.limits import LENGTH_OFFSET, position_limit


def check_model(model):
    """Raises a TypeError unless `model` can decode (a `Transformer`)."""
    missing = [name for name in ("encode", "decode", "config", "initial_cache")
               if not hasattr(model, name)]
    if missing:
        raise TypeError(
            f"Decoding needs a keras_transformer.Transformer, got {type(model).__name__} "
            f"(no {', '.join(missing)}): build one with Transformer(config) or load one "
            "with keras.saving.load_model."
        )


#: The largest length penalty α for a search of any output length: ((5 + length) / 6)^α
#: stays finite in float32 up to about 40,000 tokens. A search whose `max_output_length`
#: is given may take more, as long as the penalty stays finite at that length.
MAX_ALPHA = 10.0
_LOG_FLOAT32_MAX = 88.72  # log(3.4028235e38)


def check_search_options(beam_size=4, alpha=0.6, max_output_length=None, num_return=1):
    """Raises a ValueError that names a bad search setting.

    Args:
        beam_size: A positive integer (4 in §6.1).
        alpha: The length penalty's α, a number from 0 to `MAX_ALPHA` (0.6 in §6.1),
            or above when `max_output_length` is given and the penalty of an output of
            that length is finite in float32.
        max_output_length: A positive integer, or None for source length + 50.
        num_return: Hypotheses returned per sentence, a positive integer no
            larger than `beam_size`.
    """
    validation.check_positive_int("beam_size", beam_size, "4 in §6.1")
    validation.check_non_negative_number(
        "alpha", alpha, "0.6 in §6.1; 0 disables the length penalty")
    if max_output_length is not None:
        validation.check_positive_int(
            "max_output_length", max_output_length,
            f"or None for source length + {LENGTH_OFFSET} (§6.1)")
    if (alpha > MAX_ALPHA if max_output_length is None
            else alpha * math.log((5 + max_output_length) / 6) > _LOG_FLOAT32_MAX):
        raise ValueError(
            f"alpha={alpha!r} is too large: the length penalty ((5 + length) / 6)^alpha "
            "overflows float32 for the longest outputs, which then score 0 and the ranking "
            f"is arbitrary. Keep it at most {MAX_ALPHA:g} (§6.1 uses 0.6; tuning usually "
            "tries 0 to 2).")
    validation.check_positive_int("num_return", num_return, "1 for the best hypothesis only")
    if num_return > beam_size:
        raise ValueError(
            f"num_return={num_return} is more than beam_size={beam_size}: beam search "
            f"finishes at most beam_size hypotheses a step, so raise beam_size to at least "
            f"{num_return} or ask for fewer.")


def run_search(model, source_ids, special_ids, loop, setting, alpha=0.0, streams=None,
               n_best=(), return_alignment=False):
    """Runs a search loop on NumPy inputs.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int encoder inputs (NumPy array, nested list or
            tensor), padded with `model.config.pad_id`.
        special_ids: `(bos_id, eos_id)` of the target side.
        loop: `loop(model, source_ids, special_ids, alpha, streams)`, the search
            as `keras.ops` on tensors, returning `(token_ids, scores)`.
        setting: A hashable key of the Python settings `loop` was built with:
            one compiled function is kept per model and setting.
        alpha: α of the length penalty (an argument of the compiled loop).
        streams: (batch, 3) int32 random streams for sampling, or None.
        n_best: `()`, or `(N,)` when the loop returns N hypotheses per sentence.
        return_alignment: Whether to add each output token's source position.

    Returns:
        `(token_ids, scores)` as NumPy arrays, trimmed to the longest
        hypothesis; with `return_alignment`, a third array shaped as the ids.
    """
    check_model(model)
    config = model.config
    bos_id, eos_id = _check_special_ids(special_ids, config)
    source_ids = id_checks.as_id_matrix(source_ids, "source_ids", config.vocab_size)
    positions = position_limit(config)
    if positions is not None and source_ids.shape[1] > positions:
        raise ValueError(
            f"source_ids has {source_ids.shape[1]} positions but the model's learned "
            f"position embeddings cover max_length={positions}: remove trailing "
            "padding, or truncate or split the sentences."
        )
    if source_ids.shape[0] == 0:
        empty = (np.zeros((0, *n_best, 0), "int32"), np.zeros((0, *n_best), "float32"))
        return (*empty, empty[0]) if return_alignment else empty
    if streams is None:
        streams = np.zeros((source_ids.shape[0], 3), "int32")  # read by sampling only
    token_ids, scores = _compiled(model, loop, setting)(
        source_ids, np.array([bos_id, eos_id], "int32"), np.float32(alpha), streams)
    token_ids = ops.convert_to_numpy(token_ids).astype("int32")
    width = int(np.sum(token_ids != config.pad_id, axis=-1).max(initial=0))
    results = (token_ids[..., :width], ops.convert_to_numpy(scores).astype("float32"))
    if return_alignment:
        results += (align(model, source_ids, results[0], bos_id),)
    return results


def _check_special_ids(special_ids, config):
    vocab_size = config.resolved_target_vocab_size
    for name, value in zip(("bos_id", "eos_id"), special_ids):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            0 <= value < vocab_size
        ):
            raise ValueError(
                f"{name}={value!r} must be an integer id of the target vocabulary "
                f"(0 <= {name} < {vocab_size}): take it from the tokenizer."
            )
    if special_ids[1] == config.pad_id:
        raise ValueError(
            f"eos_id={special_ids[1]} equals the padding id {config.pad_id}, which decoding "
            "never generates: pass the tokenizer's end-of-sentence id."
        )
    return special_ids


# One dict of compiled searches per model, keyed by the setting that shaped the
# loop. Ids, α, seeds and stream ids are arguments, so changing them compiles
# nothing new. The functions reach the model through a weak reference, so the
# cache does not keep it alive.
_COMPILED = weakref.WeakKeyDictionary()


def _compiled(model, loop, setting):
    functions = _COMPILED.setdefault(model, {})
    if setting not in functions:
        functions[setting] = compile_inference(weakref.ref(model), loop)
    return functions[setting]
