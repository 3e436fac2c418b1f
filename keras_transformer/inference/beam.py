"""§6.1 Machine Translation: beam search with the length penalty of Wu et al. (2016).

The paper decodes with "beam search with a beam size of 4 and length penalty
α = 0.6", ranking finished hypotheses by

    lp(Y) = ((5 + |Y|) / 6)^α,        score(Y) = log P(Y | X) / lp(Y),

and "terminate[s] early when possible". `beam_loop` keeps the `beam_size`
most probable unfinished hypotheses of each sentence, finishes those that end
in EOS or at their length limit (`keras_transformer.inference.limits`), and
stops when no alive hypothesis can beat the `num_return`-th finished one. Each
step of the loop expands the alive hypotheses by every token (`_expand`),
lets those that end compete for the finished places (`_finish`), keeps the
best that go on (`_prune`) and reorders the self-attention cache after their
parents (`Transformer.reorder_cache`). `beam_search` is the entry point on
NumPy arrays; `beam_loop` is the loop as `keras.ops` on tensors, which the
exported SavedModel traces too.

In the cache phases of `PAIRED_BEAM_STEPS_FROM` positions or more, the loop
runs two steps per iteration, which spares XLA copies of the cache
(`beam_loop` says why).
"""

from keras import ops

from keras_transformer.inference.greedy import greedy_loop
from keras_transformer.inference.limits import output_limits, position_limit
from keras_transformer.inference.search import check_search_options, run_search
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


def searched_beam_size(beam_size, alpha):
    """The `beam_size` to run: None (greedy search) for a beam of one without
    a length penalty, else `beam_size`.

    Beam search with `beam_size=1` and α = 0 is exactly greedy search (see
    `beam_search`), and greedy search's loop has less to do per step. With
    α > 0 a beam of one may finish another hypothesis than greedy search, and
    keeps the beam loop.

    Args:
        beam_size: Hypotheses kept per sentence (a Python int), or None.
        alpha: α of the length penalty (a Python number).
    """
    return None if beam_size == 1 and alpha == 0 else beam_size


def beam_search(model, source_ids, bos_id, eos_id, beam_size=4, alpha=0.6,
                max_output_length=None, num_return=1, return_alignment=False):
    """Beam search with the §6.1 length penalty, batched over sentences.

    Keeps the `beam_size` most probable unfinished hypotheses ("alive") per
    sentence. At each step it extends them by every token and ranks the
    2·beam_size most probable extensions. Those among the best `beam_size`
    that end (in EOS, or at the length limit) are finished and scored by
    log P / lp(Y); the best finished hypothesis so far is kept (the
    `num_return` best for an n-best list). The best `beam_size` extensions
    that do not end stay alive (ranking 2·beam_size guarantees there are
    enough of them). An extension that ends outside the best `beam_size` is
    pruned like any other, so `beam_size=1` with `alpha=0` is exactly greedy
    search, and runs greedy search's loop, which has less to do per step
    (`searched_beam_size`).

    A sentence is done when no alive hypothesis can beat its best finished
    one (its `num_return`-th best) any more: log-probabilities only fall as a
    hypothesis grows and lp(Y) is at most lp(limit), so for α ≥ 0 this early
    stop never changes the result. Of two hypotheses with equal scores, the
    one that finished first ranks first. The padding and BOS ids are never
    generated.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int ids fed to the encoder, padded with
            `model.config.pad_id`.
        bos_id: Begin-of-sentence id, the first decoder input.
        eos_id: End-of-sentence id that ends a hypothesis.
        beam_size: Hypotheses kept per sentence (4 in the paper).
        alpha: α of the length penalty (0.6 in the paper); must be >= 0.
        max_output_length: Most output tokens per sentence (EOS included).
            None means each sentence's source length (its non-padding tokens)
            + 50, as in §6.1. With learned position embeddings it is further
            capped at `model.config.max_length`.
        num_return: How many of the best finished hypotheses to return per
            sentence (n-best), from 1 to `beam_size`.
        return_alignment: As in `greedy_search`.

    Returns:
        `(token_ids, scores)` as NumPy arrays: (batch, L) int32 ids of the best
        finished hypothesis after BOS, up to and including EOS, then padding,
        with L the longest hypothesis in the batch; and (batch,) float32 scores
        log P(Y | X) / lp(Y). With `num_return > 1`: (batch, num_return, L)
        ids and (batch, num_return) scores, best first. Should a sentence
        finish fewer hypotheses (only with a vocabulary of very few tokens),
        the missing ones score -inf and hold padding only.

    Example:

    >>> import numpy as np
    >>> import keras_transformer as kt
    >>> model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=20))
    >>> source_ids = np.array([[5, 6, 7, 3], [8, 3, 0, 0]])
    >>> ids, scores = beam_search(model, source_ids, bos_id=2, eos_id=3, beam_size=4,
    ...                           alpha=0.6, max_output_length=6)
    >>> n_best_ids, n_best_scores = beam_search(model, source_ids, 2, 3, num_return=4,
    ...                                         max_output_length=6)
    >>> scores.shape, n_best_ids.shape[:2], n_best_scores.shape
    ((2,), (2, 4), (2, 4))
    """
    check_search_options(beam_size, alpha, max_output_length, num_return)
    beam_size, alpha, num_return = searched_beam_size(int(beam_size), alpha), float(alpha), \
        int(num_return)
    setting = ("beam", beam_size, max_output_length, num_return)

    def loop(model, source_ids, special_ids, alpha, streams):
        if beam_size is None:
            return greedy_loop(model, source_ids, special_ids, max_output_length)
        return beam_loop(model, source_ids, special_ids, alpha, beam_size, max_output_length,
                         num_return)

    return run_search(model, source_ids, (bos_id, eos_id), loop, setting, alpha=alpha,
                      n_best=() if num_return == 1 else (num_return,),
                      return_alignment=return_alignment)


def beam_loop(model, source_ids, special_ids, alpha, beam_size, max_output_length=None,
              num_return=1):
    """Beam search as `keras.ops` on tensors (no checks; `beam_search`
    describes the search).

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int32 encoder inputs, padded with `pad_id`.
        special_ids: (2,) int32, [bos_id, eos_id].
        alpha: α of the length penalty, a float32 scalar.
        beam_size: Hypotheses kept per sentence (a Python int).
        max_output_length: As in `beam_search`.
        num_return: Finished hypotheses returned per sentence.

    Returns:
        `(token_ids, scores)`: (batch, buffer_length) int32 ids after BOS,
        padded with `pad_id`, and (batch,) float32 scores; with
        `num_return > 1`, (batch, num_return, buffer_length) ids and
        (batch, num_return) scores, best first.
    """
    pad_id = model.config.pad_id
    bos_id, eos_id = special_ids[0], special_ids[1]
    buffer_length, limits = output_limits(source_ids, pad_id, max_output_length,
                                          position_limit(model.config))
    steps, rounded = _paired_steps(buffer_length, model.config)
    batch_size = ops.shape(source_ids)[0]
    flat_size = batch_size * beam_size
    encoded, source_mask = model.encode(source_ids, training=False)
    # Rows of the flat (batch * beam) tensors are sentence-major: b * beam + k.
    # Every beam of a sentence reads the same source, so the cross-attention
    # cache keeps one row per sentence, which its beams share and which never
    # needs reordering: a quarter of the memory at beam 4, and a faster step.
    cache = model.initial_cache(encoded, cache_phases(steps)[0], beam_size=beam_size)
    batch_offsets = ops.arange(batch_size, dtype="int32")[:, None] * beam_size
    max_penalty = length_penalty(limits, alpha)

    def cond(phase_end, index, alive_sequences, alive_log_probs, finished_sequences,
             finished_scores, self_cache):
        # A sentence is decided when the best score an alive hypothesis could
        # still reach does not beat its num_return-th finished one.
        best_possible = alive_log_probs[:, 0] / max_penalty
        undecided = ops.any(ops.less(finished_scores[:, num_return - 1], best_possible))
        return ops.logical_and(ops.less(index, phase_end), undecided)

    def body(index, alive_sequences, alive_log_probs, finished_sequences, finished_scores,
             self_cache):
        inputs = ops.reshape(
            ops.slice(alive_sequences, (0, 0, index), (batch_size, beam_size, 1)),
            (flat_size, 1))
        logits, step_cache = decode_step(model, inputs, index, {**cache, "self": self_cache},
                                         source_mask)
        log_probs = masked_log_probs(logits, pad_id, bos_id)
        top_log_probs, top_beams, top_sequences, ends = _expand(
            log_probs, index, alive_sequences, alive_log_probs, eos_id, limits, batch_offsets)
        finished_sequences, finished_scores = _finish(
            index, top_log_probs, top_sequences, ends, finished_sequences, finished_scores,
            alpha, num_return)
        alive_log_probs, alive_sequences, parents = _prune(
            top_log_probs, top_beams, top_sequences, ends, batch_offsets)
        step_cache = model.reorder_cache(step_cache, parents)
        return (index + 1, alive_sequences, alive_log_probs, finished_sequences,
                finished_scores, step_cache["self"])

    state = phased_loop(model, cond, body,
                        _initial_state(batch_size, beam_size, steps, num_return, bos_id,
                                       cache["self"]),
                        steps, PAIRED_BEAM_STEPS_FROM)
    after_bos = slice(1, buffer_length + 1 if rounded else None)
    finished_sequences, finished_scores = state[3][:, :, after_bos], state[4]
    if num_return == 1:
        return finished_sequences[:, 0], finished_scores[:, 0]
    return finished_sequences, finished_scores


def _paired_steps(buffer_length, config):
    """`(steps, rounded)`: the steps the loop runs for `buffer_length`, and
    whether they were rounded up to an even number.

    In the phases of large caches (`PAIRED_BEAM_STEPS_FROM`) the loop runs two
    steps per iteration. XLA cannot reorder a cache in place: with one step
    per iteration it gathers each cache tensor into a new buffer and copies
    that back into the loop's (a copy per tensor and step in the loop body's
    HLO). With two, the first step gathers into a scratch buffer and the
    second from it back into the loop's, and JAX's loop has no copy left. The
    price is a loop body twice the size to compile, and up to one step more
    than needed, so small caches, where the copy costs least, keep one step.
    A phase is paired only if it has an even number of steps, so an odd
    length that would end in a paired phase is rounded up to an even number
    of steps: a step past every sentence's limit changes nothing returned. A
    model with learned positions cannot embed a position past its table: an
    odd length it caps is not rounded, and its last phase runs one step per
    iteration.
    """
    paired_from = PAIRED_BEAM_STEPS_FROM
    if paired_from is None or not isinstance(buffer_length, int) \
            or buffer_length < paired_from or not buffer_length % 2:
        return buffer_length, False
    positions = position_limit(config)
    rounded = positions is None or buffer_length < positions
    return buffer_length + rounded, rounded


def _initial_state(batch_size, beam_size, steps, num_return, bos_id, self_cache):
    """The loop's first state: step 0; every alive hypothesis BOS, only the
    first beam of each sentence with probability 1 (the beams start
    identical); no finished hypothesis (a slot that nothing has finished into
    scores -inf and holds padding); the empty self-attention caches."""
    width = steps + 1  # BOS + the longest hypothesis
    alive_sequences = ops.concatenate(
        [ops.ones((batch_size, beam_size, 1), "int32") * bos_id,
         ops.zeros((batch_size, beam_size, steps), "int32")], axis=2)
    first_beam = ops.equal(ops.arange(beam_size), 0)
    alive_log_probs = ops.broadcast_to(ops.where(first_beam, 0.0, _NEG_INF)[None, :],
                                       (batch_size, beam_size))
    return (ops.convert_to_tensor(0, "int32"), alive_sequences, alive_log_probs,
            ops.zeros((batch_size, num_return, width), "int32"),
            ops.full((batch_size, num_return), _NEG_INF, "float32"), self_cache)


def _expand(log_probs, index, alive_sequences, alive_log_probs, eos_id, limits,
            batch_offsets):
    """Every alive hypothesis extended by every token: the 2·beam_size most
    probable extensions of each sentence, as `(top_log_probs, top_beams,
    top_sequences, ends)`: their log-probabilities, their parents' beams, their
    sequences with the new token at `index + 1`, and whether each ends (EOS,
    or the sentence's length limit)."""
    batch_size, beam_size, width = ops.shape(alive_sequences)
    vocab_size = log_probs.shape[-1]
    candidates = alive_log_probs[:, :, None] + ops.reshape(
        log_probs, (batch_size, beam_size, vocab_size))
    top_log_probs, top_indices = ops.top_k(
        ops.reshape(candidates, (batch_size, beam_size * vocab_size)), 2 * beam_size)
    top_indices = ops.cast(top_indices, "int32")
    top_beams = ops.floor_divide(top_indices, vocab_size)
    top_tokens = ops.mod(top_indices, vocab_size)
    parents = ops.take(ops.reshape(alive_sequences, (batch_size * beam_size, width)),
                       top_beams + batch_offsets, axis=0)
    top_sequences = ops.slice_update(parents, (0, 0, index + 1), top_tokens[:, :, None])
    ends = ops.logical_or(ops.equal(top_tokens, eos_id),
                          ops.greater_equal(index + 1, limits)[:, None])
    return top_log_probs, top_beams, top_sequences, ends


def _finish(index, top_log_probs, top_sequences, ends, finished_sequences, finished_scores,
            alpha, num_return):
    """The `num_return` best finished hypotheses after this step: the
    candidates that end within the best beam_size compete with those finished
    before, scored by log P / lp(Y); a tie keeps the hypothesis that finished
    first. (The candidates outside the beam are masked rather than sliced off,
    because XLA's loop runs several times slower with the slices.)"""
    beam_size = ops.shape(top_log_probs)[1] // 2
    in_beam = ops.less(ops.arange(2 * beam_size), beam_size)[None, :]
    ended_scores = ops.where(ops.logical_and(ends, in_beam),
                             top_log_probs / length_penalty(index + 1, alpha), _NEG_INF)
    pool_scores = ops.concatenate([finished_scores, ended_scores], axis=1)
    pool_sequences = ops.concatenate([finished_sequences, top_sequences], axis=1)
    best = _best_first(pool_scores, num_return)
    return (ops.take_along_axis(pool_sequences, best[:, :, None], axis=1),
            ops.take_along_axis(pool_scores, best, axis=1))


def _prune(top_log_probs, top_beams, top_sequences, ends, batch_offsets):
    """The best beam_size candidates that do not end stay alive: `(their
    log-probabilities, their sequences, the flat rows of their parents)`, the
    rows the self-attention cache is reordered by."""
    beam_size = ops.shape(top_log_probs)[1] // 2
    alive_log_probs, keep = ops.top_k(ops.where(ends, _NEG_INF, top_log_probs), beam_size)
    keep = ops.cast(keep, "int32")
    alive_sequences = ops.take_along_axis(top_sequences, keep[:, :, None], axis=1)
    parents = ops.reshape(ops.take_along_axis(top_beams, keep, axis=1) + batch_offsets, (-1,))
    return alive_log_probs, alive_sequences, parents


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
