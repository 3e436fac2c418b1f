"""§6.1 Machine Translation: the length limits of decoding, "input length + 50".

The paper sets the "maximum output length to input length + 50". This module
is the one home of that rule and of the limits around it, for the Python path
(the searches and `Translator`) and the exported
SavedModel (`keras_transformer.export.saved_model`) alike:

* `output_limits`: each sentence's output limit and the room for the longest
  hypothesis (traceable: the exported graph computes it too);
* `source_limit` and `truncate_source`: the longest encoder input a model
  takes; a longer one keeps its first tokens and EOS;
* `source_width` and `smallest_bucket`: the width a batch of inputs is padded
  to, a multiple of `WIDTH_MULTIPLE` in Python, one of the export's compiled
  widths in the graph;
* `position_limit`: the decoder positions a model with learned position
  embeddings can embed (§3.5).
"""

from keras import ops

# "Maximum output length to input length + 50" (§6.1).
LENGTH_OFFSET = 50
# Source batches are padded to a multiple of this width, so that JAX and
# TensorFlow compile one search per width bucket instead of one per length.
WIDTH_MULTIPLE = 8
# The longest encoder input (ids + EOS) a model with sinusoidal positions
# takes by default. §3.5 chose sinusoids because they "may allow the model to
# extrapolate to sequence lengths longer than the ones encountered during
# training", so the limit is set apart from the training length.
SINUSOIDAL_SOURCE_LIMIT = 1024


def position_limit(config):
    """Most decoder positions a model can embed: `config.max_length` with
    learned position embeddings, None (no limit) with sinusoids (§3.5)."""
    return config.max_length if config.position_encoding == "learned" else None


def source_limit(config, max_source_length=None):
    """The longest encoder input (ids + EOS) a model takes.

    Args:
        config: The model's `TransformerConfig`.
        max_source_length: A limit of the caller's, or None for the default:
            `config.max_length` with learned positions (the table has no more
            rows), the larger of `config.max_length` and
            `SINUSOIDAL_SOURCE_LIMIT` with sinusoids.

    Returns:
        The limit, an int >= 2 (one token and EOS).

    Raises:
        ValueError: for a limit below 2, or past the learned position table.
    """
    if max_source_length is None:
        if config.position_encoding == "learned":
            return config.max_length
        return max(config.max_length, SINUSOIDAL_SOURCE_LIMIT)
    if isinstance(max_source_length, bool) or not isinstance(max_source_length, int) \
            or max_source_length < 2:
        raise ValueError(f"max_source_length={max_source_length!r} must be an integer >= 2 "
                         "(one token and EOS).")
    if config.position_encoding == "learned" and max_source_length > config.max_length:
        raise ValueError(
            f"max_source_length={max_source_length} is past the model's learned position "
            f"table (config.max_length={config.max_length}): it cannot embed more positions.")
    return max_source_length


def truncate_source(ids, limit, eos_id):
    """An encoder input cut to `limit` tokens: its first `limit - 1` ids and
    EOS. Inputs within the limit are returned as they are.

    Args:
        ids: One encoder input, a list of ids ending in EOS.
        limit: `source_limit(...)`.
        eos_id: The source side's end-of-sentence id.

    Returns:
        `(ids, truncated)`.
    """
    if len(ids) <= limit:
        return ids, False
    return list(ids[: limit - 1]) + [eos_id], True


def smallest_bucket(value, sizes):
    """The smallest of the ascending `sizes` that is >= `value`, or the
    largest size when none is (traceable: `value` may be a scalar tensor).

    >>> int(smallest_bucket(5, (1, 2, 4, 8)))
    8
    """
    if isinstance(value, int):
        return next((size for size in sizes if size >= value), sizes[-1])
    sizes = ops.convert_to_tensor(sizes, "int32")
    below = ops.sum(ops.cast(ops.less(sizes, value), "int32"))
    return ops.take(sizes, ops.minimum(below, ops.shape(sizes)[0] - 1))


def output_limits(source_ids, pad_id, max_output_length=None, positions=None):
    """The output length limits of §6.1: "input length + 50".

    Args:
        source_ids: (batch, S) int encoder inputs (NumPy or a tensor, also a
            traced one of unknown shape), padded with `pad_id`.
        pad_id: The padding id.
        max_output_length: Most output tokens (EOS included) for every
            sentence, or None for each sentence's source length + 50.
        positions: Most decoder positions the model embeds
            (`position_limit(config)`), or None.

    Returns:
        `(buffer_length, limits)`: the room for the longest hypothesis (an int
        when the shape is known, else a scalar tensor), and (batch,) int32 the
        limit of each sentence, at most `buffer_length`.
    """
    if max_output_length is None:
        buffer_length = ops.shape(source_ids)[1] + LENGTH_OFFSET
    else:
        buffer_length = max_output_length
    if positions is not None:
        buffer_length = _minimum(buffer_length, positions)
    lengths = ops.sum(ops.cast(ops.not_equal(source_ids, pad_id), "int32"), axis=1)
    if max_output_length is None:
        limits = lengths + LENGTH_OFFSET
    else:
        limits = ops.zeros_like(lengths) + max_output_length
    return buffer_length, ops.minimum(limits, buffer_length)


def source_width(longest, max_source_length):
    """The width a batch of encoder inputs is padded to.

    The longest input (ids + EOS) rounded up to a multiple of
    `WIDTH_MULTIPLE`, so that a compiled search serves a bucket of widths,
    but never past the `max_source_length` the model accepts (nor below
    `longest`).

    Args:
        longest: The longest input of the batch (int or scalar tensor).
        max_source_length: The longest input the model takes (`source_limit`).

    Returns:
        The width (an int for int arguments, else a scalar tensor).
    """
    width = -(-longest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    return _maximum(longest, _minimum(width, max_source_length))


def _minimum(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else ops.minimum(a, b)


def _maximum(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else ops.maximum(a, b)
