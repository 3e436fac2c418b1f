"""§6.1 Machine Translation: beam search with the length penalty of Wu et al. (2016).

The paper decodes with "beam search with a beam size of 4 and length penalty
α = 0.6", ranking finished hypotheses by

    lp(Y) = ((5 + |Y|) / 6)^α,        score(Y) = log P(Y | X) / lp(Y),

and "terminate[s] early when possible". `beam_loop` keeps the `beam_size`
most probable unfinished hypotheses of each sentence, finishes those that end
in EOS or at their length limit (`keras_transformer.inference.limits`), and
stops when no alive hypothesis can beat the `num_return`-th finished one. It
runs the decoding step of `keras_transformer.inference.step` and reorders the
self-attention cache after each step's parents (`Transformer.reorder_cache`).

In the cache phases of `PAIRED_BEAM_STEPS_FROM` positions or more, the loop
runs two steps per iteration, which spares XLA copies of the cache
(`beam_loop` says why).
"""

from keras import ops

from keras_transformer.inference.limits import position_limit
from keras_transformer.inference.step import (
    cache_phases,
    decode_step,
    masked_log_probs,
    phased_loop,
)

_NEG_INF = float("-inf")
# Beam search runs two steps per iteration of its loop in the phases whose
# cache has room for at least this many positions, one step in the others
# (see `beam_loop`); None: one step everywhere.
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


def beam_loop(model, source_ids, limits, special_ids, alpha, beam_size, buffer_length,
              num_return=1, aligned_to=None):
    """Beam search as `keras.ops` on tensors (`traced_search` checks nothing
    and calls it; `keras_transformer.inference.beam_search` describes the
    search).

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int32 encoder inputs, padded with `pad_id`.
        limits: (batch,) int32, each sentence's most output tokens.
        special_ids: (2,) int32, [bos_id, eos_id].
        alpha: α of the length penalty, a float32 scalar.
        beam_size: Hypotheses kept per sentence (a Python int).
        buffer_length: Room for the longest hypothesis (`output_limits`).
        num_return: Finished hypotheses returned per sentence.
        aligned_to: None, or (batch, S) bool `alignment_candidates` to also
            return each token's source position.

    Returns:
        `(token_ids, scores[, alignments])` as `traced_search` returns them.
    """
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
    # needs reordering: a quarter of the memory at beam 4, and a faster step.
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
    # the finished sequences; without, nothing is carried (see `greedy_loop`
    # in keras_transformer.inference.search).
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
        logits, step_cache, positions = decode_step(
            model, inputs, index, {**cache, "self": self_cache}, source_mask,
            aligned_to)
        log_probs = masked_log_probs(logits, pad_id, bos_id)
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
        # hypothesis that finished first. (The candidates outside the beam
        # are masked rather than sliced off, because XLA's loop runs several
        # times slower with the slices.)
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
    state = phased_loop(model, cond, body, state, steps, paired_from)
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
