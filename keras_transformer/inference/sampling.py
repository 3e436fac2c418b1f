"""Sampling, beyond §6.1: each output token drawn from the model's distribution.

The paper decodes with beam search. Sampling gives diverse outputs instead
(back-translation, several candidates per sentence): each step draws from
softmax(logits / temperature), restricted to the `top_k` most probable tokens
and then to the smallest most-probable set whose probability reaches `top_p`
(nucleus sampling, Holtzman et al. 2020). `sample_search` runs the greedy loop
of `keras_transformer.inference.greedy` with that draw (`sample_tokens`) in
place of the most probable token; `Sampling` holds its settings for
`Translator`.

Its random numbers come from a counter-based hash (`uniform_for_stream`), not
from `keras.random`: a compiled loop needs them as a pure function of tensors
(Keras 3 draws from seed generators or int seeds only), and a hash of (seed,
stream, sample number, step) gives every sample of every sentence its own
reproducible sequence, whatever batch it is decoded in.
"""

import dataclasses

import numpy as np
from keras import ops

from keras_transformer import id_checks, validation
from keras_transformer.inference.greedy import greedy_loop
from keras_transformer.inference.search import check_model, check_search_options, run_search


def check_sampling_options(temperature=1.0, top_k=0, top_p=1.0, seed=0, num_return=1):
    """Raises a ValueError that names a bad sampling setting.

    Args:
        temperature: A number > 0.
        top_k: An integer >= 0 (0: no top-k filter).
        top_p: A number in (0, 1] (1: no nucleus filter).
        seed: An integer in [0, 2^31).
        num_return: Samples per sentence, a positive integer.
    """
    validation.check_positive_number("temperature", temperature,
                                     "1 samples from the model's distribution")
    validation.check_non_negative_int("top_k", top_k, "0 keeps every token")
    validation.check_unit_interval("top_p", top_p, "1 keeps every token")
    if validation.check_non_negative_int("seed", seed) >= 2**31:
        raise ValueError(f"seed={seed!r} must be below 2**31.")
    validation.check_positive_int("num_return", num_return, "1 sample per sentence")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The settings of `sample_search`, checked when made.

    `Translator.translate(sentences, sampling=Sampling(top_p=0.9, seed=1))`
    samples instead of running beam search.

    Args:
        temperature: > 0; below 1 sharpens the distribution, above 1 flattens.
        top_k: Keep only the k most probable tokens; 0 keeps all.
        top_p: Keep the most probable tokens up to this total probability.
        seed: An integer in [0, 2^31).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        check_sampling_options(self.temperature, self.top_k, self.top_p, self.seed)


def sample_search(model, source_ids, bos_id, eos_id, temperature=1.0, top_k=0, top_p=1.0,
                  seed=0, max_output_length=None, num_return=1, stream_ids=None,
                  return_alignment=False):
    """Sampling: at every step, a token drawn from the model's distribution.

    Each step draws from softmax(logits / temperature), restricted to the
    `top_k` most probable tokens and then to the smallest set of the most
    probable ones whose probability reaches `top_p`, renormalised. It runs
    the same compiled, cached loop as greedy search, with the same length
    limits; the padding and BOS ids are never drawn.

    The draws are reproducible: sample j of sentence i takes its random
    numbers from a hash of (`seed`, the sentence's stream id, j, the step),
    so the same sentence with the same seed and stream id gives the same
    output on a given backend, whatever else is in the batch, and its first
    sample is the same whatever `num_return`. Backends may still differ
    where their floating point rounds a near-tie differently.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int ids fed to the encoder, padded with
            `model.config.pad_id`.
        bos_id: Begin-of-sentence id, the first decoder input.
        eos_id: End-of-sentence id that ends a hypothesis.
        temperature, top_k, top_p, seed: As in `Sampling`.
        max_output_length: As in `greedy_search`.
        num_return: Independent samples per sentence.
        stream_ids: (batch,) ints naming each sentence's random stream, or
            None for its row (0, 1, ...). `Translator` passes each sentence's
            position in its input, so batching does not change the samples.
        return_alignment: As in `greedy_search`.

    Returns:
        `(token_ids, scores)` as NumPy arrays: (batch, L) int32 ids after BOS,
        up to and including EOS, then padding; and (batch,) float32
        log P(Y | X) of each sample under the model (before temperature and
        filtering). With `num_return > 1`: (batch, num_return, L) ids and
        (batch, num_return) scores, in the order drawn.

    Example:

    >>> import numpy as np
    >>> import keras_transformer as kt
    >>> model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=20))
    >>> ids, scores = sample_search(model, np.array([[5, 6, 7, 3]]), bos_id=2, eos_id=3,
    ...                             top_p=0.9, seed=1, num_return=3, max_output_length=6)
    >>> ids.shape[:2], scores.shape
    ((1, 3), (1, 3))
    """
    check_sampling_options(temperature, top_k, top_p, seed, num_return)
    check_search_options(max_output_length=max_output_length)
    check_model(model)
    source = id_checks.as_id_matrix(source_ids, "source_ids", model.config.vocab_size)
    batch = len(source)
    streams = _streams(seed, batch, num_return, stream_ids)
    sampling = (float(temperature), int(top_k), float(top_p))

    def loop(model, source_ids, special_ids, alpha, streams):
        def choose(log_probs, index):
            return sample_tokens(log_probs, uniform_for_stream(streams, index), *sampling)

        return greedy_loop(model, source_ids, special_ids, max_output_length, choose)

    results = run_search(model, np.repeat(source, num_return, axis=0), (bos_id, eos_id), loop,
                         ("sample", max_output_length, sampling), streams=streams,
                         return_alignment=return_alignment)
    if num_return == 1:
        return results
    return tuple(result.reshape(batch, num_return, *result.shape[1:]) for result in results)


def _streams(seed, batch, num_return, stream_ids):
    """(batch * num_return, 3) int32: sample j of sentence i is row i * num_return
    + j, drawn from the stream (seed, stream_ids[i], j), so its first sample is
    the single one."""
    stream_ids = np.arange(batch) if stream_ids is None else np.asarray(stream_ids)
    if stream_ids.shape != (batch,) or not np.issubdtype(stream_ids.dtype, np.integer):
        raise ValueError(f"stream_ids must be ({batch},) ints, one per sentence, got shape "
                         f"{stream_ids.shape} and dtype {stream_ids.dtype}.")
    return np.stack([np.full((batch, num_return), seed),
                     np.broadcast_to(stream_ids[:, None] % 2**31, (batch, num_return)),
                     np.broadcast_to(np.arange(num_return), (batch, num_return))],
                    axis=-1).reshape(batch * num_return, 3).astype("int32")


def _mix32(x):
    """A 32-bit integer hash (Wellons's "lowbias32") in int32 arithmetic.

    Products wrap around modulo 2^32 on every backend; a right shift of a
    negative int32 is arithmetic, so each shift masks off the copied sign
    bits (0xFFFF after 16 bits, 0x1FFFF after 15) to act as the logical
    shift the hash is defined with.
    """
    x = ops.bitwise_xor(x, ops.bitwise_and(ops.right_shift(x, 16), 0xFFFF))
    x = ops.multiply(x, ops.convert_to_tensor(0x7FEB352D, "int32"))
    x = ops.bitwise_xor(x, ops.bitwise_and(ops.right_shift(x, 15), 0x1FFFF))
    x = ops.multiply(x, ops.convert_to_tensor(0x846CA68B - 2**32, "int32"))
    return ops.bitwise_xor(x, ops.bitwise_and(ops.right_shift(x, 16), 0xFFFF))


def uniform_for_stream(streams, index):
    """Uniform numbers in [0, 1), one per row, for decoding step `index`.

    Args:
        streams: (batch, 3) int32, each row's seed, stream id (its sentence)
            and sample number (0 for the first sample of the sentence).
        index: int32 scalar, the step.

    Returns:
        (batch,) float32, a pure function of (seed, stream, sample, index):
        the same on every call and every backend.
    """
    streams = ops.cast(streams, "int32")
    x = _mix32(ops.bitwise_xor(streams[:, 0], _mix32(streams[:, 1])))
    x = _mix32(ops.bitwise_xor(x, streams[:, 2]))
    x = _mix32(ops.bitwise_xor(x, ops.cast(index, "int32")))
    # The top 24 bits: every value is exact in float32.
    return ops.cast(ops.bitwise_and(ops.right_shift(x, 8), 0xFFFFFF), "float32") / 2.0**24


def sample_tokens(log_probs, uniform, temperature=1.0, top_k=0, top_p=1.0):
    """One token per row, drawn from the filtered distribution.

    The distribution is softmax(log_probs / temperature), restricted to the
    `top_k` most probable tokens (0: all) and renormalised, then restricted to
    the smallest set of the most probable ones whose probability reaches
    `top_p` (nucleus sampling, Holtzman et al. 2020) and renormalised again.
    The draw inverts its cumulative distribution at `uniform`.

    Args:
        log_probs: (batch, vocab) float32; -inf for tokens never generated.
        uniform: (batch,) float32 in [0, 1).
        temperature: > 0; below 1 sharpens, above 1 flattens.
        top_k: int >= 0.
        top_p: in (0, 1].

    Returns:
        (batch,) int32 token ids.
    """
    logits = ops.divide(ops.convert_to_tensor(log_probs, "float32"), temperature)
    vocab_size = log_probs.shape[-1]
    if top_k or top_p < 1.0:
        logits, token_ids = ops.top_k(logits, min(top_k or vocab_size, vocab_size))
    else:
        token_ids = None  # inverse CDF needs no order
    # softmax, written out: with top_k=1 the axis has one entry, which
    # Keras's softmax warns about.
    probs = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
    probs = probs / ops.sum(probs, axis=-1, keepdims=True)
    if top_p < 1.0:
        # Keep a token while the more probable ones before it sum to less
        # than top_p: the most probable token is always kept.
        probs = ops.where(ops.cumsum(probs, axis=-1) - probs < top_p, probs, 0.0)
    cdf = ops.cumsum(probs, axis=-1)
    # The first position whose cumulative probability passes the target: a
    # token of probability 0 (filtered, or never generated) never is. Should
    # rounding put the target at the total, the most probable token is taken.
    passes = ops.greater(cdf, ops.multiply(ops.expand_dims(uniform, 1), cdf[:, -1:]))
    choice = ops.where(ops.any(passes, axis=-1),
                       ops.argmax(ops.cast(passes, "int32"), axis=-1),
                       ops.argmax(probs, axis=-1))
    choice = ops.cast(choice, "int32")
    if token_ids is None:
        return choice
    return ops.take_along_axis(ops.cast(token_ids, "int32"), choice[:, None], axis=1)[:, 0]
