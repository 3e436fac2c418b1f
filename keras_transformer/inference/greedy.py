"""§6.1 Machine Translation: greedy search, one most probable token at a time.

`greedy_search` runs the encoder once and the decoder step by step with the
key/value cache, for a whole batch, until every sentence has ended in EOS or
reached its length limit ("input length + 50",
`keras_transformer.inference.limits`). `greedy_loop` is that loop as
`keras.ops` on tensors; sampling (`keras_transformer.inference.sampling`)
runs it with a draw in place of the most probable token, and beam search
with a beam of one and no length penalty runs it as well.
"""

from keras import ops

from keras_transformer.inference.limits import output_limits, position_limit
from keras_transformer.inference.search import check_search_options, run_search
from keras_transformer.inference.step import (
    cache_phases,
    decode_step,
    masked_log_probs,
    phased_loop,
)


def greedy_search(model, source_ids, bos_id, eos_id, max_output_length=None,
                  return_alignment=False):
    """Greedy decoding: at every step, the most probable next token.

    Runs the encoder once and the decoder step by step with the key/value
    cache, for a whole batch at once. A sentence stops at `eos_id` or at its
    length limit; the loop stops when every sentence has stopped. The padding
    and BOS ids are never generated.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int ids fed to the encoder (NumPy array, nested
            list or tensor), padded with `model.config.pad_id`.
        bos_id: Begin-of-sentence id, the first decoder input.
        eos_id: End-of-sentence id that ends a hypothesis.
        max_output_length: Most output tokens per sentence (EOS included).
            None means each sentence's own source length (its non-padding
            tokens) + 50, as in §6.1. With learned position embeddings it is
            further capped at `model.config.max_length`.
        return_alignment: Whether to also return each output token's
            alignment (`keras_transformer.inference.alignment`).

    Returns:
        `(token_ids, scores)` as NumPy arrays: (batch, L) int32 output ids after
        BOS, up to and including EOS, then padding (0 by default), with L the
        longest hypothesis in the batch; and (batch,) float32 log P(Y | X), the
        sum of the chosen tokens' log-probabilities. A hypothesis that reaches
        its length limit has no EOS. With `return_alignment`, a third array
        shaped as `token_ids`: each output token's source position (0 under
        padding).

    Example:

    >>> import numpy as np
    >>> import keras_transformer as kt
    >>> model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=20))
    >>> ids, scores = greedy_search(model, np.array([[5, 6, 7, 3]]), bos_id=2, eos_id=3,
    ...                             max_output_length=6)
    >>> ids.shape[0], scores.shape, int(ids.shape[1]) <= 6
    (1, (1,), True)
    """
    check_search_options(max_output_length=max_output_length)
    setting = ("greedy", max_output_length)

    def loop(model, source_ids, special_ids, alpha, streams):
        return greedy_loop(model, source_ids, special_ids, max_output_length)

    return run_search(model, source_ids, (bos_id, eos_id), loop, setting,
                      return_alignment=return_alignment)


def most_probable(log_probs, index):
    """(batch,) int32: each row's most probable token, the first of equals.

    As `argmax`, but in two plain reductions (the maximum, then the first
    index holding it), which XLA on a CPU runs faster than argmax's single
    reduction of value and index pairs. A row whose maximum is NaN gets the
    last token. (`index`, the step, is there for draws that depend on it.)
    """
    vocab_size = ops.shape(log_probs)[-1]
    best = ops.max(log_probs, axis=-1, keepdims=True)
    token_ids = ops.arange(vocab_size, dtype="int32")[None, :]
    first = ops.min(ops.where(ops.equal(log_probs, best), token_ids, vocab_size), axis=-1)
    return ops.cast(ops.minimum(first, vocab_size - 1), "int32")


def greedy_loop(model, source_ids, special_ids, max_output_length=None, choose=most_probable):
    """Greedy search, or sampling, as `keras.ops` on tensors (no checks).

    Each sentence's one hypothesis grows by the token `choose(log_probs,
    index)` picks, until EOS or its limit; the loop stops when every sentence
    has stopped.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int32 encoder inputs, padded with `pad_id`.
        special_ids: (2,) int32, [bos_id, eos_id].
        max_output_length: As in `greedy_search`.
        choose: A function of (batch, vocab) log-probabilities and the step
            returning (batch,) int32 tokens: `most_probable`, or a draw.

    Returns:
        `(token_ids, scores)`: (batch, buffer_length) int32 ids after BOS,
        padded with `pad_id`, and (batch,) float32 log P(Y | X).
    """
    pad_id = model.config.pad_id
    buffer_length, limits = output_limits(source_ids, pad_id, max_output_length,
                                          position_limit(model.config))
    batch_size = ops.shape(source_ids)[0]
    encoded, source_mask = model.encode(source_ids, training=False)
    cache = model.initial_cache(encoded, cache_phases(buffer_length)[0])
    bos_id, eos_id = special_ids[0], special_ids[1]
    sequences = ops.concatenate(
        [ops.ones((batch_size, 1), "int32") * bos_id,
         ops.zeros((batch_size, buffer_length), "int32")],
        axis=1,
    )

    def cond(phase_end, index, sequences, scores, finished, self_cache):
        return ops.logical_and(
            ops.less(index, phase_end), ops.logical_not(ops.all(finished))
        )

    def body(index, sequences, scores, finished, self_cache):
        inputs = ops.slice(sequences, (0, index), (batch_size, 1))
        logits, step_cache = decode_step(model, inputs, index, {**cache, "self": self_cache},
                                         source_mask)
        log_probs = masked_log_probs(logits, pad_id, bos_id)
        tokens = choose(log_probs, index)
        token_log_probs = ops.take_along_axis(log_probs, tokens[:, None], axis=1)[:, 0]
        tokens = ops.where(finished, pad_id, tokens)
        scores = scores + ops.where(finished, 0.0, token_log_probs)
        sequences = ops.slice_update(sequences, (0, index + 1), tokens[:, None])
        finished = ops.logical_or(
            finished,
            ops.logical_or(ops.equal(tokens, eos_id), ops.greater_equal(index + 1, limits)),
        )
        return index + 1, sequences, scores, finished, step_cache["self"]

    # Only the self-attention caches change; the cross-attention ones are
    # constants of the loop.
    state = (ops.convert_to_tensor(0, "int32"), sequences, ops.zeros((batch_size,), "float32"),
             ops.zeros((batch_size,), "bool"), cache["self"])
    _, sequences, scores, _, _ = phased_loop(model, cond, body, state, buffer_length)
    return sequences[:, 1:], scores
