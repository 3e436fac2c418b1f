"""Sampling, beyond §6.1: each output token drawn from the model's distribution.

The paper decodes with beam search. Sampling gives diverse outputs instead
(back-translation, several candidates per sentence): each step draws from
softmax(logits / temperature), restricted to the `top_k` most probable tokens
and then to the smallest most-probable set whose probability reaches `top_p`
(nucleus sampling, Holtzman et al. 2020). `sample_tokens` is that draw, run by
the greedy loop of `keras_transformer.inference.search` in place of the most
probable token; `Sampling` holds its settings for `Translator`.

Its random numbers come from a counter-based hash (`uniform_for_stream`), not
from `keras.random`: a compiled loop needs them as a pure function of tensors
(Keras 3 draws from seed generators or int seeds only), and a hash of (seed,
stream, sample number, step) gives every sample of every sentence its own
reproducible sequence, whatever batch it is decoded in.
"""

import dataclasses

from keras import ops

from keras_transformer import validation


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
