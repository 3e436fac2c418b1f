"""§6.1 Machine Translation: the search itself, as `keras.ops` on tensors.

`traced_search` runs greedy search, sampling (beyond the paper: see
`keras_transformer.inference.sampling`) or beam search
(`keras_transformer.inference.beam`) on a batch of encoder inputs, with the
output limits of `keras_transformer.inference.limits` ("input length + 50").
Greedy search and sampling share `greedy_loop`: one hypothesis per sentence,
extended by the most probable or a drawn token until EOS or its limit.

Everything here is traceable and runs on NumPy values and tensors alike, so
the Python path (`keras_transformer.inference.decoding`, which compiles it per
backend with `keras_transformer.inference.compiled`) and the exported
SavedModel (`keras_transformer.inference.export`, which traces it into its
graph) run the same search.

Every shape is fixed before the loop (the output buffer has room for the
longest allowed hypothesis), so the loop is a `keras.ops.while_loop` that
compiles with `jax.jit` and `tf.function(jit_compile=True)`; under PyTorch
`keras_transformer.inference.compiled.while_loop` traces it once per shape
instead. A loop's condition and body read tensors other than its loop
variables only through their closures, which is how that trace finds them.
Sizes are read with `ops.shape`, so the loops also trace with an unknown batch
size and source width (the SavedModel, where XLA fixes them per input shape).
The loops grow their self-attention cache in phases
(`keras_transformer.inference.step.cache_phases`).
"""

from keras import ops

from keras_transformer.inference.beam import beam_loop
from keras_transformer.inference.limits import output_limits, position_limit
from keras_transformer.inference.sampling import sample_tokens, uniform_for_stream
from keras_transformer.inference.step import (
    alignment_candidates,
    cache_phases,
    decode_step,
    masked_log_probs,
    phased_loop,
)


def searched_beam_size(beam_size, alpha):
    """The `beam_size` to run: None (greedy search) for a beam of one without
    a length penalty, else `beam_size`.

    Beam search with `beam_size=1` and α = 0 is exactly greedy search (see
    `keras_transformer.inference.decoding.beam_search`), and greedy search's
    loop has less to do per step. With α > 0 a beam of one may finish another
    hypothesis than greedy search, and keeps the beam loop.

    Args:
        beam_size: Hypotheses kept per sentence (a Python int), or None.
        alpha: α of the length penalty (a Python number).
    """
    return None if beam_size == 1 and alpha == 0 else beam_size


def traced_search(model, source_ids, special_ids, alpha, beam_size=None,
                  max_output_length=None, num_return=1, sampling=None, streams=None,
                  alignment=False):
    """The search as `keras.ops` on tensors: what is compiled and exported.

    `greedy_search` and `beam_search` compile this function per backend; the
    SavedModel traces it into its graph. Arguments are not checked here.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int32 encoder inputs, padded with the model's
            `pad_id`; the shape may be unknown while tracing.
        special_ids: (2,) int32 tensor, [bos_id, eos_id].
        alpha: Scalar float32, α of the length penalty (unused by greedy search).
        beam_size: Hypotheses kept per sentence, or None for greedy search.
        max_output_length: As in `beam_search`.
        num_return: Finished hypotheses returned per sentence by beam search,
            1 <= num_return <= beam_size (unused by greedy search).
        sampling: None, or `(temperature, top_k, top_p)` to sample each token
            instead of taking the most probable one (then `beam_size` must be
            None): see `sample_tokens`.
        streams: With `sampling`, (batch, 3) int32: each row's seed, stream
            id and sample number, which fix its random numbers
            (`uniform_for_stream`).
        alignment: Whether to also return each output token's source
            position (`alignment_positions`).

    Returns:
        `(token_ids, scores)`: (batch, buffer_length) int32 ids after BOS,
        padded with `pad_id`, and (batch,) float32 scores; with
        `num_return > 1`, (batch, num_return, buffer_length) ids and
        (batch, num_return) scores, best first. With `alignment`, a third
        int32 tensor shaped as the ids: the source position each output
        token is aligned to.
    """
    config = model.config
    buffer_length, limits = output_limits(
        source_ids, config.pad_id, max_output_length, position_limit(config))
    aligned_to = alignment_candidates(source_ids, config.pad_id) if alignment else None
    if beam_size is None:
        if sampling is None:
            choose = _most_probable
        else:
            def choose(log_probs, index):
                return sample_tokens(log_probs, uniform_for_stream(streams, index), *sampling)
        return greedy_loop(model, source_ids, limits, special_ids, buffer_length, choose,
                           aligned_to)
    return beam_loop(model, source_ids, limits, special_ids, alpha, beam_size, buffer_length,
                     num_return, aligned_to)


def _most_probable(log_probs, index):
    """(batch,) int32: each row's most probable token, the first of equals.

    As `argmax`, but in two plain reductions (the maximum, then the first
    index holding it), which XLA on a CPU runs faster than argmax's single
    reduction of value and index pairs. A row whose maximum is NaN gets the
    last token.
    """
    vocab_size = ops.shape(log_probs)[-1]
    best = ops.max(log_probs, axis=-1, keepdims=True)
    token_ids = ops.arange(vocab_size, dtype="int32")[None, :]
    first = ops.min(ops.where(ops.equal(log_probs, best), token_ids, vocab_size), axis=-1)
    return ops.cast(ops.minimum(first, vocab_size - 1), "int32")


def greedy_loop(model, source_ids, limits, special_ids, buffer_length, choose=_most_probable,
                aligned_to=None):
    """Greedy search, or sampling, as `keras.ops` on tensors (`traced_search`
    checks nothing and calls it).

    Each sentence's one hypothesis grows by the token `choose(log_probs,
    index)` picks, until EOS or its limit; the loop stops when every sentence
    has stopped.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int32 encoder inputs, padded with `pad_id`.
        limits: (batch,) int32, each sentence's most output tokens.
        special_ids: (2,) int32, [bos_id, eos_id].
        buffer_length: Room for the longest hypothesis (`output_limits`).
        choose: A function of (batch, vocab) log-probabilities and the step
            returning (batch,) int32 tokens: `_most_probable`, or a draw.
        aligned_to: None, or (batch, S) bool `alignment_candidates` to also
            return each token's source position.

    Returns:
        `(token_ids, scores[, alignments])` as `traced_search` returns them.
    """
    pad_id = model.config.pad_id
    batch_size = ops.shape(source_ids)[0]
    encoded, source_mask = model.encode(source_ids, training=False)
    cache = model.initial_cache(encoded, cache_phases(buffer_length)[0])
    bos_id, eos_id = special_ids[0], special_ids[1]
    sequences = ops.concatenate(
        [ops.ones((batch_size, 1), "int32") * bos_id,
         ops.zeros((batch_size, buffer_length), "int32")],
        axis=1,
    )
    scores = ops.zeros((batch_size,), "float32")
    finished = ops.zeros((batch_size,), "bool")
    # With `aligned_to`, each output token's source position, beside
    # `sequences`. Without, nothing is carried: a constant that passes through
    # three or more XLA-compiled tf.while_loops unchanged fails TensorFlow's
    # constant propagation (tensorflow/tensorflow#122886).
    alignments = [ops.zeros_like(sequences)] if aligned_to is not None else []

    def cond(phase_end, index, sequences, scores, finished, *rest):
        return ops.logical_and(
            ops.less(index, phase_end), ops.logical_not(ops.all(finished))
        )

    def body(index, sequences, scores, finished, *rest):
        *alignments, self_cache = rest
        inputs = ops.slice(sequences, (0, index), (batch_size, 1))
        logits, step_cache, positions = decode_step(
            model, inputs, index, {**cache, "self": self_cache}, source_mask,
            aligned_to)
        log_probs = masked_log_probs(logits, pad_id, bos_id)
        tokens = choose(log_probs, index)
        token_log_probs = ops.take_along_axis(log_probs, tokens[:, None], axis=1)[:, 0]
        tokens = ops.where(finished, pad_id, tokens)
        scores = scores + ops.where(finished, 0.0, token_log_probs)
        sequences = ops.slice_update(sequences, (0, index + 1), tokens[:, None])
        if aligned_to is not None:
            alignments = [ops.slice_update(alignments[0], (0, index + 1), positions[:, None])]
        finished = ops.logical_or(
            finished,
            ops.logical_or(ops.equal(tokens, eos_id),
                           ops.greater_equal(index + 1, limits)),
        )
        return (index + 1, sequences, scores, finished, *alignments, step_cache["self"])

    # Only the self-attention caches change; the cross-attention ones are
    # constants of the loop.
    state = (ops.convert_to_tensor(0, "int32"), sequences, scores, finished, *alignments,
             cache["self"])
    _, sequences, scores, _, *alignments, _ = phased_loop(model, cond, body, state,
                                                          buffer_length)
    return (sequences[:, 1:], scores, *(positions[:, 1:] for positions in alignments))
