"""§6.1 Machine Translation: the decoding step that greedy and beam search share.

The loops of `keras_transformer.inference.greedy` (greedy search and
sampling) and `keras_transformer.inference.beam` run the model's cached
decoding step (`Transformer.decode` with the cache of
`Transformer.initial_cache`) through `decode_step`, turn its logits into
log-probabilities with `masked_log_probs`, and run their `while_loop` in the
phases of `cache_phases` through `phased_loop`.

A step attends over every slot of the self-attention cache, and beam search
copies every slot when it reorders the cache after its parents, so a step
costs in proportion to the cache's size, not to the positions decoded. The
loop therefore runs in phases: the cache starts with room for
`FIRST_CACHE_PHASE` positions and doubles between phases, up to the buffer's
length, so that a step touches at most about twice the positions decoded so
far. A phase is one more compiled loop body, so short buffers keep one phase.
"""

from keras import ops

from keras_transformer.inference import compiled

_NEG_INF = float("-inf")
# The self-attention cache's room in the first phase of a decoding loop.
FIRST_CACHE_PHASE = 32


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


def phased_loop(model, cond, body, state, buffer_length, paired_from=None):
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
        state = compiled.while_loop(lambda *s, end=bound: cond(end, *s),
                                    two_steps if paired else body, state)
    return state


def masked_log_probs(logits, pad_id, bos_id):
    """log_softmax over the vocabulary; padding and BOS are made impossible.

    Neither is a valid output token: padding would read as the end of the
    hypothesis, and BOS only ever starts the decoder input.
    """
    log_probs = ops.log_softmax(logits, axis=-1)
    vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")
    never = ops.logical_or(ops.equal(vocab, pad_id), ops.equal(vocab, bos_id))
    return ops.where(never[None, :], _NEG_INF, log_probs)


def decode_step(model, token_ids, index, cache, source_mask):
    """(batch, vocab) logits of the next token, and the updated cache."""
    logits, cache = model.decode(
        token_ids, None, source_mask, cache=cache, cache_update_index=index, training=False)
    return logits[:, 0, :], cache
