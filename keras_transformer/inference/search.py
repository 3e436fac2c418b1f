"""§6.1 Machine Translation: the search itself, as `keras.ops` on tensors.

Greedy search, sampling (beyond the paper: temperature, top-k and top-p, for
diverse outputs such as back-translation) and beam search with the length
penalty of Wu et al. (2016),

    lp(Y) = ((5 + |Y|) / 6)^α,        score(Y) = log P(Y | X) / lp(Y),

at most "input length + 50" output tokens, stopping early when no hypothesis
can change any more. Each step runs the model's cached decoding step
(`Transformer.decode` with the cache of `Transformer.initial_cache`).

Everything here is traceable and runs on NumPy values and tensors alike, so
the Python path (`keras_transformer.inference.decoding`, which compiles it per
backend) and the exported SavedModel (`keras_transformer.inference.export`,
which traces it into its graph) run the same code: `traced_search` for the
search and `output_limits` for the "+ 50" rule. The Python path pads a batch
to `source_width`; the export pads to its compiled shapes with
`smallest_bucket`. `source_limit` and `truncate_source` are the length rule of
both: a longer input keeps its first tokens and EOS.

Every shape is fixed before the loop (the output buffer has room for the
longest allowed hypothesis), so the loop is a `keras.ops.while_loop` that
compiles with `jax.jit` and `tf.function(jit_compile=True)`; under PyTorch
`keras_transformer.backend.while_loop` traces it once per shape instead.
A loop's condition and body read tensors other than its loop variables only
through their closures, which is how that trace finds them. Sizes are read
with `ops.shape`, so the loops also trace with an unknown batch size and
source width (the SavedModel, where XLA fixes them per input shape).

A step attends over every slot of the self-attention cache, and beam search
copies every slot when it reorders the cache after its parents, so a step
costs in proportion to the cache's size, not to the positions decoded. The
loop therefore runs in phases (`cache_phases`): the cache starts with room for
32 positions and doubles between phases, up to the buffer's length, so that
a step touches at most about twice the positions decoded so far. A phase is
one more compiled loop body, so short buffers keep one phase. From a cache of
`PAIRED_BEAM_STEPS_FROM` positions on, beam search runs two steps per
iteration, which spares XLA copies of the cache: every one under JAX, every
other one under TensorFlow (`_beam_loop` says why).
"""

from keras import ops

from keras_transformer import backend

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

_NEG_INF = float("-inf")
# The self-attention cache's room in the first phase of a decoding loop.
FIRST_CACHE_PHASE = 32
# Beam search runs two steps per iteration of its loop in the phases whose
# cache has room for at least this many positions, one step in the others
# (see `_beam_loop`); None: one step everywhere.
PAIRED_BEAM_STEPS_FROM = 128


def length_penalty(length, alpha):
    """The length penalty lp(Y) = ((5 + |Y|) / 6)^α of §6.1 (Wu et al., 2016).

    Beam search ranks finished hypotheses by log P(Y | X) / lp(Y); α = 0 gives
    plain log-probabilities, larger α favours longer outputs.

    Args:
        length: |Y|, the number of output tokens (int, array or tensor).
        alpha: α, the strength of the penalty.

    Returns:
        lp(Y) as float32 (a tensor for tensor input).

    Example:

    >>> round(float(length_penalty(7, 0.6)), 4)  # (12 / 6)^0.6
    1.5157
    """
    length = ops.cast(length, "float32")
    return ops.power((5.0 + length) / 6.0, alpha)


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

    The longest input (ids + EOS) rounded up to a multiple of 8, so that a
    compiled search serves a bucket of widths, but never past the
    `max_source_length` the model accepts (nor below `longest`).

    Args:
        longest: The longest input of the batch (int or scalar tensor).
        max_source_length: `config.max_length`.

    Returns:
        The width (an int for int arguments, else a scalar tensor).
    """
    width = -(-longest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    return _maximum(longest, _minimum(width, max_source_length))


def cache_phases(buffer_length):
    """The self-attention cache's sizes in the phases of a decoding loop.

    Phase i decodes the positions below `sizes[i]` with a cache of that many
    slots; the cache grows between phases. The sizes double from
    `FIRST_CACHE_PHASE` while the doubled size still fits in the buffer, and
    the last is the buffer's length, so no phase is shorter than the one
    before it.

    Args:
        buffer_length: The decoder positions of the longest hypothesis (BOS
            included), an int, or a tensor while tracing with an unknown
            source width (then one phase: its size is not known yet).

    Returns:
        A list of sizes, ascending, ending with `buffer_length`.

    >>> cache_phases(256), cache_phases(306), cache_phases(60)
    ([32, 64, 128, 256], [32, 64, 128, 306], [60])
    """
    if not isinstance(buffer_length, int):
        return [buffer_length]
    sizes, size = [], FIRST_CACHE_PHASE
    while 2 * size <= buffer_length:
        sizes.append(size)
        size *= 2
    return sizes + [buffer_length]


def _phased_loop(model, cond, body, state, buffer_length, paired_from=None):
    """`ops.while_loop(cond, body, state)` in the phases of `cache_phases`.

    `state` is `(index, ..., self_cache)`: the step index first and the
    self-attention caches last. `cond(phase_end, *state)` says whether to go
    on within a phase that ends at `phase_end`.

    A phase of an even number of steps that ends at `paired_from` or later
    runs two steps per iteration, and its `cond` is asked whether the step
    before the phase's end may run, so that both steps lie in the phase. A
    step run after `cond` would have stopped must then change nothing that
    matters.
    """
    def two_steps(*state):
        return body(*body(*state))

    phase_start = 0
    for phase, phase_end in enumerate(cache_phases(buffer_length)):
        if phase:  # the loop starts with the first phase's cache
            grown = model.grow_cache({"self": state[-1], "cross": None}, phase_end)
            state = (*state[:-1], grown["self"])
        paired = paired_from is not None and isinstance(phase_end, int) \
            and phase_end >= paired_from and (phase_end - phase_start) % 2 == 0
        phase_start = phase_end
        bound = phase_end - 1 if paired else phase_end
        state = backend.while_loop(lambda *s, end=bound: cond(end, *s),
                                   two_steps if paired else body, state)
    return state


def _minimum(a, b):
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else ops.minimum(a, b)


def _maximum(a, b):
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else ops.maximum(a, b)


def searched_beam_size(beam_size, alpha):
    """The `beam_size` to run: None (greedy search) for a beam of one without
    a length penalty, else `beam_size`.

    Beam search with `beam_size=1` and α = 0 is exactly greedy search (see
    `keras_transformer.inference.decoding.beam_search`), and greedy search's
    loop has less to do per step: the beam loop of one took 1.095x the greedy
    loop's time at 32 tokens and 1.02x at 128 (benchmarks/RESULTS.md,
    "Greedy decoding's last operations"). With α > 0 a beam of one may
    finish another hypothesis than greedy search, and keeps the beam loop.

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
        return _greedy_loop(model, source_ids, limits, special_ids, buffer_length, choose,
                            aligned_to)
    return _beam_loop(model, source_ids, limits, special_ids, alpha, beam_size, buffer_length,
                      num_return, aligned_to)


def alignment_candidates(source_ids, pad_id):
    """(batch, S) bool: the source positions an output token may be aligned to.

    The real tokens before the last one, which is EOS in every encoder input
    (fairseq's `--print-alignment` leaves EOS out too); a source of one token
    keeps it, so that every row has a candidate.
    """
    real = ops.not_equal(source_ids, pad_id)
    lengths = ops.sum(ops.cast(real, "int32"), axis=1)
    positions = ops.arange(ops.shape(source_ids)[1], dtype="int32")
    before_last = ops.less(positions[None, :], (lengths - 1)[:, None])
    return ops.where(ops.greater(lengths, 1)[:, None], ops.logical_and(real, before_last), real)


def alignment_positions(cross_weights, aligned_to):
    """Each query's source position of highest encoder-decoder attention.

    Args:
        cross_weights: (batch, heads, T, S) float32 weights of the last
            decoder block's encoder-decoder attention.
        aligned_to: (batch, S) bool, `alignment_candidates`.

    Returns:
        (batch, T) int32: the argmax over the candidates of the weights
        averaged over heads (fairseq's `--print-alignment`).
    """
    mean = ops.mean(cross_weights, axis=1)
    return ops.cast(ops.argmax(ops.where(aligned_to[:, None, :], mean, -1.0), axis=-1), "int32")


# The search loops: backend-agnostic, keras.ops only, fixed shapes.


def _masked_log_probs(logits, pad_id, bos_id):
    """log_softmax over the vocabulary; padding and BOS are made impossible.

    Neither is a valid output token: padding would read as the end of the
    hypothesis, and BOS only ever starts the decoder input.
    """
    log_probs = ops.log_softmax(logits, axis=-1)
    vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")
    never = ops.logical_or(ops.equal(vocab, pad_id), ops.equal(vocab, bos_id))
    return ops.where(never[None, :], _NEG_INF, log_probs)


def _decode_step(model, token_ids, index, cache, source_mask, aligned_to=None):
    """(batch, vocab) logits of the next token, the updated cache and, with
    `aligned_to`, (batch,) the source position the token is aligned to."""
    if aligned_to is None:
        logits, cache = model.decode(
            token_ids, None, source_mask, cache=cache, cache_update_index=index, training=False)
        return logits[:, 0, :], cache, None
    logits, cache, weights = model.decode(
        token_ids, None, source_mask, cache=cache, cache_update_index=index,
        return_attention_scores=True, training=False)
    return logits[:, 0, :], cache, alignment_positions(weights[-1]["cross"], aligned_to)[:, 0]


def _most_probable(log_probs, index):
    """(batch,) int32: each row's most probable token, the first of equals.

    As `argmax`, but in two plain reductions (the maximum, then the first
    index holding it): XLA on a CPU ran argmax's single reduction of value
    and index pairs over (8, 8000) in 166 µs, these two in 49 µs, and a
    greedy step 1.08-1.11x faster with them under JAX (no change under
    TensorFlow and PyTorch; benchmarks/RESULTS.md, "Greedy decoding's last
    operations"). A row whose maximum is NaN gets the last token.
    """
    vocab_size = ops.shape(log_probs)[-1]
    best = ops.max(log_probs, axis=-1, keepdims=True)
    token_ids = ops.arange(vocab_size, dtype="int32")[None, :]
    first = ops.min(ops.where(ops.equal(log_probs, best), token_ids, vocab_size), axis=-1)
    return ops.cast(ops.minimum(first, vocab_size - 1), "int32")


# Sampling. Its random numbers come from a counter-based hash, not from
# `keras.random`: a compiled loop needs them as a pure function of tensors
# (Keras 3 draws from seed generators or int seeds only), and a hash of
# (seed, stream, sample number, step) gives every sample of every sentence its
# own reproducible sequence, whatever batch it is decoded in.


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


def _greedy_loop(model, source_ids, limits, special_ids, buffer_length, choose=_most_probable,
                 aligned_to=None):
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
        logits, step_cache, positions = _decode_step(
            model, inputs, index, {**cache, "self": self_cache}, source_mask,
            aligned_to)
        log_probs = _masked_log_probs(logits, pad_id, bos_id)
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
    _, sequences, scores, _, *alignments, _ = _phased_loop(model, cond, body, state,
                                                           buffer_length)
    return (sequences[:, 1:], scores, *(positions[:, 1:] for positions in alignments))


def _beam_loop(model, source_ids, limits, special_ids, alpha, beam_size, buffer_length,
               num_return=1, aligned_to=None):
    pad_id = model.config.pad_id
    bos_id, eos_id = special_ids[0], special_ids[1]
    batch_size = ops.shape(source_ids)[0]
    # Two steps per iteration in the phases of large caches
    # (`PAIRED_BEAM_STEPS_FROM`). XLA cannot reorder a cache in place: with
    # one step per iteration it gathers each cache tensor into a new buffer
    # and copies that back into the loop's (a copy per tensor and step in the
    # loop body's HLO). With two, the first step gathers into a scratch
    # buffer and the second from it back into the loop's, and JAX's loop has
    # no copy left. The price is a loop body twice the size to compile, and
    # up to one step more than needed, so small caches, where the copy costs
    # least, keep one step. A phase is paired only if it has an even number
    # of steps, so an odd length that would end in a paired phase is rounded
    # up to an even number of steps: a step past every sentence's limit
    # changes nothing returned. A model with learned positions cannot embed a
    # position past its table: an odd length it caps is not rounded, and its
    # last phase runs one step per iteration.
    paired_from = PAIRED_BEAM_STEPS_FROM
    steps, rounded = buffer_length, False
    if paired_from is not None and isinstance(buffer_length, int) \
            and buffer_length >= paired_from and buffer_length % 2:
        positions = position_limit(model.config)
        rounded = positions is None or buffer_length < positions
        steps += rounded
    width = steps + 1  # BOS + the longest hypothesis
    flat_size = batch_size * beam_size

    encoded, source_mask = model.encode(source_ids, training=False)
    # Rows of the flat (batch * beam) tensors are sentence-major: b * beam + k.
    # Every beam of a sentence reads the same source, so the cross-attention
    # cache keeps one row per sentence, which its beams share and which never
    # needs reordering (a quarter of the memory at beam 4, and a step
    # 1.05-1.1x as fast as with a copy per beam: benchmarks/RESULTS.md).
    cache = model.initial_cache(encoded, cache_phases(steps)[0], beam_size=beam_size)
    if aligned_to is not None:
        aligned_to = ops.repeat(aligned_to, beam_size, axis=0)

    alive_sequences = ops.concatenate(
        [ops.ones((batch_size, beam_size, 1), "int32") * bos_id,
         ops.zeros((batch_size, beam_size, steps), "int32")],
        axis=2,
    )
    # All beams start identical; only the first may expand at step 0.
    first_beam = ops.equal(ops.arange(beam_size), 0)
    alive_log_probs = ops.broadcast_to(
        ops.where(first_beam, 0.0, _NEG_INF)[None, :], (batch_size, beam_size)
    )
    # The num_return best finished hypotheses of each sentence, best first;
    # a slot nothing has finished into yet scores -inf and holds padding.
    finished_sequences = ops.zeros((batch_size, num_return, width), "int32")
    finished_scores = ops.full((batch_size, num_return), _NEG_INF, "float32")
    # With `aligned_to`, each token's source position, beside the alive and
    # the finished sequences; without, nothing is carried (see _greedy_loop).
    alignments = [] if aligned_to is None else [
        ops.zeros((batch_size, beam_size, width), "int32"),
        ops.zeros((batch_size, num_return, width), "int32")]
    batch_offsets = ops.arange(batch_size, dtype="int32")[:, None] * beam_size
    max_penalty = length_penalty(limits, alpha)

    def gather_beams(tensor, beam_indices):
        """tensor[b, beam_indices[b, j]] for (batch, beam, ...) tensors."""
        flat = ops.reshape(tensor, (flat_size, *ops.shape(tensor)[2:]))
        return ops.take(flat, beam_indices + batch_offsets, axis=0)

    def cond(phase_end, index, alive_sequences, alive_log_probs, finished_sequences,
             finished_scores, *rest):
        # A sentence is decided when the best score an alive hypothesis could
        # still reach does not beat its num_return-th finished one.
        best_possible = alive_log_probs[:, 0] / max_penalty
        undecided = ops.any(ops.less(finished_scores[:, num_return - 1], best_possible))
        return ops.logical_and(ops.less(index, phase_end), undecided)

    def body(index, alive_sequences, alive_log_probs, finished_sequences,
             finished_scores, *rest):
        *alignments, self_cache = rest
        inputs = ops.reshape(
            ops.slice(alive_sequences, (0, 0, index), (batch_size, beam_size, 1)),
            (flat_size, 1),
        )
        logits, step_cache, positions = _decode_step(
            model, inputs, index, {**cache, "self": self_cache}, source_mask,
            aligned_to)
        log_probs = _masked_log_probs(logits, pad_id, bos_id)
        vocab_size = log_probs.shape[-1]
        candidates = alive_log_probs[:, :, None] + ops.reshape(
            log_probs, (batch_size, beam_size, vocab_size)
        )
        top_log_probs, top_indices = ops.top_k(
            ops.reshape(candidates, (batch_size, beam_size * vocab_size)), 2 * beam_size
        )
        top_indices = ops.cast(top_indices, "int32")
        top_beams = ops.floor_divide(top_indices, vocab_size)
        top_tokens = ops.mod(top_indices, vocab_size)
        top_sequences = ops.slice_update(
            gather_beams(alive_sequences, top_beams), (0, 0, index + 1), top_tokens[:, :, None]
        )
        ends = ops.logical_or(
            ops.equal(top_tokens, eos_id),
            ops.greater_equal(index + 1, limits)[:, None],
        )

        # The candidates that end within the best beam_size compete with the
        # finished hypotheses for the num_return places; a tie keeps the
        # hypothesis that finished first. (Masking the candidates outside the
        # beam, rather than slicing them off, keeps XLA's loop fast: with the
        # slices, beam search ran 10x slower on a CPU.)
        in_beam = ops.less(ops.arange(2 * beam_size), beam_size)[None, :]
        ended_scores = ops.where(
            ops.logical_and(ends, in_beam),
            top_log_probs / length_penalty(index + 1, alpha),
            _NEG_INF,
        )
        pool_scores = ops.concatenate([finished_scores, ended_scores], axis=1)
        pool_sequences = ops.concatenate(
            [finished_sequences, top_sequences], axis=1)
        best = _best_first(pool_scores, num_return)
        finished_scores = ops.take_along_axis(pool_scores, best, axis=1)
        finished_sequences = ops.take_along_axis(pool_sequences, best[:, :, None], axis=1)

        # The best beam_size candidates that do not end stay alive.
        alive_log_probs, keep = ops.top_k(
            ops.where(ends, _NEG_INF, top_log_probs), beam_size
        )
        keep = ops.cast(keep, "int32")
        alive_sequences = ops.take_along_axis(top_sequences, keep[:, :, None], axis=1)
        if aligned_to is not None:
            # The alignments follow the sequences through the same gathers.
            alive_alignments, finished_alignments = alignments
            step_positions = ops.take_along_axis(
                ops.reshape(positions, (batch_size, beam_size)), top_beams, axis=1)
            top_alignments = ops.slice_update(gather_beams(alive_alignments, top_beams),
                                              (0, 0, index + 1), step_positions[:, :, None])
            finished_alignments = ops.take_along_axis(
                ops.concatenate([finished_alignments, top_alignments], axis=1),
                best[:, :, None], axis=1)
            alive_alignments = ops.take_along_axis(top_alignments, keep[:, :, None], axis=1)
            alignments = [alive_alignments, finished_alignments]
        parents = ops.reshape(ops.take_along_axis(top_beams, keep, axis=1) + batch_offsets,
                              (flat_size,))
        step_cache = model.reorder_cache(step_cache, parents)
        return (index + 1, alive_sequences, alive_log_probs, finished_sequences,
                finished_scores, *alignments, step_cache["self"])

    state = (ops.convert_to_tensor(0, "int32"), alive_sequences, alive_log_probs,
             finished_sequences, finished_scores, *alignments, cache["self"])
    state = _phased_loop(model, cond, body, state, steps, paired_from)
    after_bos = slice(1, buffer_length + 1 if rounded else None)
    results = [state[3][:, :, after_bos], state[4]]
    if aligned_to is not None:
        results.append(state[6][:, :, after_bos])
    if num_return == 1:
        results = [result[:, 0] for result in results]
    return tuple(results)


def _best_first(scores, k):
    """(batch, k) int32 indices of the k highest scores of each row, best
    first; of equal scores, the one at the lower index comes first.

    `ops.top_k` leaves the order of equal values to the backend (PyTorch's
    CPU kernel returns them in no particular order). Ranking every pair of a
    row fixes it on all three, and the rows are short (num_return + beam_size
    scores).
    """
    size = ops.shape(scores)[1]
    positions = ops.arange(size, dtype="int32")
    higher = ops.greater(scores[:, None, :], scores[:, :, None])
    equal_and_before = ops.logical_and(
        ops.equal(scores[:, None, :], scores[:, :, None]),
        ops.less(positions[None, :], positions[:, None])[None],
    )
    # rank[b, i]: how many scores of row b come before score i (0 is the best).
    rank = ops.sum(ops.cast(ops.logical_or(higher, equal_and_before), "int32"), axis=2)
    slots = ops.arange(k, dtype="int32")
    at_slot = ops.cast(ops.equal(rank[:, None, :], slots[None, :, None]), "int32")
    return ops.cast(ops.argmax(at_slot, axis=2), "int32")
