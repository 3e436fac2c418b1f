"""§6.1 Machine Translation: greedy search and beam search with a key/value cache.

The paper decodes with "beam search with a beam size of 4 and length penalty
α = 0.6", a maximum output length of "input length + 50", and terminates early
when possible. The length penalty is the one of Wu et al. (2016):

    lp(Y) = ((5 + |Y|) / 6)^α,        score(Y) = log P(Y | X) / lp(Y)

Decoding runs the encoder once per batch, then the decoder one position at a
time:

* decoder self-attention keys and values are written into a fixed-size cache
  at the current index (`Transformer.initial_cache` layout, one tensor per
  block), so each step costs O(t) instead of re-running the whole prefix;
* encoder-decoder (cross) attention keys and values depend only on the source,
  so they are projected once per batch (`cross_attention_caches`) and reused at
  every step and by every beam.

Every shape is fixed before the loop (the output buffer has room for the
longest allowed hypothesis), so the loop is a `keras.ops.while_loop` that
compiles with `jax.jit` and `tf.function(jit_compile=True)`. Sizes are read
with `ops.shape`, so the same loops also trace with an unknown batch size and
source width (the SavedModel of `keras_transformer.export`, where XLA fixes
them per input shape). On PyTorch it runs
eagerly under `torch.no_grad()`. Compiled functions are cached per model and
per search setting; JAX and TensorFlow then reuse them for every batch of the
same shape.
"""

import collections
import weakref

import keras
import numpy as np
from keras import ops

# "Maximum output length to input length + 50" (§6.1).
LENGTH_OFFSET = 50

_NEG_INF = float("-inf")


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


def cross_attention_caches(model, encoder_outputs):
    """Projects the encoder output into each decoder block's cross-attention K/V.

    Cross-attention keys and values depend only on the source sentence, so
    they are computed once per batch instead of once per decoding step.

    Args:
        model: A `keras_transformer.Transformer`.
        encoder_outputs: (batch, S, d_model) from `model.encode`.

    Returns:
        A list with one (batch, 2, S, num_heads, key_dim) tensor per decoder
        block: keys at index 0, values at index 1, the layout
        `MultiHeadAttention` accepts as a precomputed `cache`.

    Example:

    >>> encoded, mask = model.encode(source_ids)
    >>> caches = cross_attention_caches(model, encoded)
    """
    config = model.config
    if config.resolved_key_dim != config.resolved_value_dim:
        raise ValueError(
            "Cached decoding stores keys and values in one tensor and needs "
            f"key_dim == value_dim, got {config.resolved_key_dim} and "
            f"{config.resolved_value_dim}: such a model trains and scores with "
            "model(...), but cannot translate."
        )
    caches = []
    for block in model.decoder_blocks:
        attention = block.cross_attention
        caches.append(ops.stack(
            [attention.key_dense(encoder_outputs), attention.value_dense(encoder_outputs)],
            axis=1,
        ))
    return caches


def initial_self_attention_caches(model, batch_size, max_length):
    """Zero self-attention caches, one (batch, 2, max_length, heads, key_dim) per block.

    The zeros of `model.initial_cache`, split into a list of per-block tensors
    so that a decoding step updates each block's cache without slicing and
    re-stacking one (batch, N, 2, ...) tensor.
    """
    cache = model.initial_cache(batch_size, max_length)
    return [cache[:, i] for i in range(len(model.decoder_blocks))]


def decode_step(model, token_ids, index, self_attention_caches, cross_caches,
                source_padding_mask):
    """Runs the decoder for one position, reading and updating the caches.

    Equals the last row of `model.decode` on the whole prefix (inference mode):
    target embedding · √d_model + positional encoding of position `index`, the N
    decoder blocks, the final LayerNorm of pre-norm stacks and the pre-softmax
    projection.

    Args:
        model: A `keras_transformer.Transformer`.
        token_ids: (batch, 1) int ids of the decoder input at position `index`.
        index: int scalar (or scalar tensor), the position of `token_ids`.
        self_attention_caches: list of (batch, 2, T_max, heads, key_dim) tensors,
            one per block, from `initial_self_attention_caches` or the last step.
        cross_caches: list of (batch, 2, S, heads, key_dim) tensors from
            `cross_attention_caches`.
        source_padding_mask: (batch, S) bool, True for real source tokens.

    Returns:
        `(logits, updated_self_attention_caches)`: (batch, vocab) float32 logits
        of the next token and the list of updated caches.
    """
    x = model.target_embedding(token_ids)
    x = x + model.target_position(x, start_index=index)
    updated = []
    for block, self_cache, cross_cache in zip(
        model.decoder_blocks, self_attention_caches, cross_caches
    ):
        # The cross-attention reads its keys and values from `cross_cache`, so
        # the encoder output itself is not needed here.
        x, self_cache = block(
            x,
            None,
            encoder_padding_mask=source_padding_mask,
            self_attention_cache=self_cache,
            cache_update_index=index,
            cross_attention_cache=cross_cache,
            training=False,
        )
        updated.append(self_cache)
    return model.project_outputs(x)[:, 0, :], updated


def greedy_search(model, source_ids, bos_id, eos_id, max_length=None):
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
        max_length: Most output tokens per sentence (EOS included). None means
            each sentence's own source length (its non-padding tokens) + 50, as
            in §6.1. With learned position embeddings it is further capped at
            `model.config.max_length`.

    Returns:
        `(token_ids, scores)` as NumPy arrays: (batch, L) int32 output ids after
        BOS, up to and including EOS, then padding (0 by default), with L the
        longest hypothesis in the batch; and (batch,) float32 log P(Y | X), the
        sum of the chosen tokens' log-probabilities. A hypothesis that reaches
        its length limit has no EOS.

    Example:

    >>> ids, scores = greedy_search(model, source_ids, bos_id=2, eos_id=3)
    """
    return _search(model, source_ids, bos_id, eos_id, max_length, beam_size=None, alpha=0.0)


def beam_search(model, source_ids, bos_id, eos_id, beam_size=4, alpha=0.6, max_length=None):
    """Beam search with the §6.1 length penalty, batched over sentences.

    Keeps the `beam_size` most probable unfinished hypotheses ("alive") per
    sentence. At each step it extends them by every token and ranks the
    2·beam_size most probable extensions. Those among the best `beam_size`
    that end (in EOS, or at the length limit) are finished and scored by
    log P / lp(Y); the best finished hypothesis so far is kept. The best
    `beam_size` extensions that do not end stay alive (ranking 2·beam_size
    guarantees there are enough of them). An extension that ends outside the
    best `beam_size` is pruned like any other, so `beam_size=1` with `alpha=0`
    is exactly greedy search.

    A sentence is done when no alive hypothesis can beat its best finished
    one any more: log-probabilities only fall as a hypothesis grows and lp(Y)
    is at most lp(limit), so for α ≥ 0 this early stop never changes the
    result. The padding and BOS ids are never generated.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: (batch, S) int ids fed to the encoder, padded with
            `model.config.pad_id`.
        bos_id: Begin-of-sentence id, the first decoder input.
        eos_id: End-of-sentence id that ends a hypothesis.
        beam_size: Hypotheses kept per sentence (4 in the paper).
        alpha: α of the length penalty (0.6 in the paper); must be >= 0.
        max_length: Most output tokens per sentence (EOS included). None means
            each sentence's source length (its non-padding tokens) + 50, as in
            §6.1. With learned position embeddings it is further capped at
            `model.config.max_length`.

    Returns:
        `(token_ids, scores)` as NumPy arrays: (batch, L) int32 ids of the best
        finished hypothesis after BOS, up to and including EOS, then padding,
        with L the longest hypothesis in the batch; and (batch,) float32 scores
        log P(Y | X) / lp(Y).

    Example:

    >>> ids, scores = beam_search(model, source_ids, bos_id=2, eos_id=3,
    ...                           beam_size=4, alpha=0.6)
    """
    _check_search_options(beam_size, alpha, max_length)
    return _search(model, source_ids, bos_id, eos_id, max_length, int(beam_size), float(alpha))


# The search itself: backend-agnostic, keras.ops only, fixed shapes.


def _masked_log_probs(logits, pad_id, bos_id):
    """log_softmax over the vocabulary; padding and BOS are made impossible.

    Neither is a valid output token: padding would read as the end of the
    hypothesis, and BOS only ever starts the decoder input.
    """
    log_probs = ops.log_softmax(logits, axis=-1)
    vocab = ops.arange(ops.shape(logits)[-1], dtype="int32")
    never = ops.logical_or(ops.equal(vocab, pad_id), ops.equal(vocab, bos_id))
    return ops.where(never[None, :], _NEG_INF, log_probs)


def _greedy_loop(model, source_ids, limits, special_ids, alpha, options):
    pad_id = model.config.pad_id
    batch_size, buffer_length = ops.shape(source_ids)[0], options.buffer_length
    encoded, source_mask = model.encode(source_ids, training=False)
    cross = cross_attention_caches(model, encoded)
    caches = initial_self_attention_caches(model, batch_size, buffer_length)
    bos_id, eos_id = special_ids[0], special_ids[1]
    sequences = ops.concatenate(
        [ops.ones((batch_size, 1), "int32") * bos_id,
         ops.zeros((batch_size, buffer_length), "int32")],
        axis=1,
    )
    scores = ops.zeros((batch_size,), "float32")
    finished = ops.zeros((batch_size,), "bool")

    def cond(index, sequences, scores, finished, caches):
        return ops.logical_and(
            ops.less(index, buffer_length), ops.logical_not(ops.all(finished))
        )

    def body(index, sequences, scores, finished, caches):
        inputs = ops.slice(sequences, (0, index), (batch_size, 1))
        logits, caches = decode_step(model, inputs, index, caches, cross, source_mask)
        log_probs = _masked_log_probs(logits, pad_id, bos_id)
        tokens = ops.cast(ops.argmax(log_probs, axis=-1), "int32")
        token_log_probs = ops.max(log_probs, axis=-1)
        tokens = ops.where(finished, pad_id, tokens)
        scores = scores + ops.where(finished, 0.0, token_log_probs)
        sequences = ops.slice_update(sequences, (0, index + 1), tokens[:, None])
        finished = ops.logical_or(
            finished,
            ops.logical_or(ops.equal(tokens, eos_id),
                           ops.greater_equal(index + 1, limits)),
        )
        return index + 1, sequences, scores, finished, caches

    state = (ops.convert_to_tensor(0, "int32"), sequences, scores, finished, caches)
    _, sequences, scores, _, _ = ops.while_loop(cond, body, state)
    return sequences[:, 1:], scores


def _beam_loop(model, source_ids, limits, special_ids, alpha, options):
    pad_id = model.config.pad_id
    beam_size = options.beam_size
    bos_id, eos_id = special_ids[0], special_ids[1]
    batch_size, buffer_length = ops.shape(source_ids)[0], options.buffer_length
    width = buffer_length + 1  # BOS + the longest hypothesis
    flat_size = batch_size * beam_size

    encoded, source_mask = model.encode(source_ids, training=False)
    # Rows of the flat (batch * beam) tensors are sentence-major: b * beam + k.
    # Cross-attention keys and values are the same for every beam of a
    # sentence and never need reordering.
    cross = [ops.repeat(c, beam_size, axis=0) for c in cross_attention_caches(model, encoded)]
    source_mask = ops.repeat(source_mask, beam_size, axis=0)
    caches = initial_self_attention_caches(model, flat_size, buffer_length)

    alive_sequences = ops.concatenate(
        [ops.ones((batch_size, beam_size, 1), "int32") * bos_id,
         ops.zeros((batch_size, beam_size, buffer_length), "int32")],
        axis=2,
    )
    # All beams start identical; only the first may expand at step 0.
    first_beam = ops.equal(ops.arange(beam_size), 0)
    alive_log_probs = ops.broadcast_to(
        ops.where(first_beam, 0.0, _NEG_INF)[None, :], (batch_size, beam_size)
    )
    finished_sequences = ops.zeros((batch_size, width), "int32")
    finished_scores = ops.full((batch_size,), _NEG_INF, "float32")
    batch_offsets = ops.arange(batch_size, dtype="int32")[:, None] * beam_size
    max_penalty = length_penalty(limits, alpha)

    def gather_beams(tensor, beam_indices):
        """tensor[b, beam_indices[b, j]] for (batch, beam, ...) tensors."""
        flat = ops.reshape(tensor, (flat_size, *ops.shape(tensor)[2:]))
        return ops.take(flat, beam_indices + batch_offsets, axis=0)

    def cond(index, alive_sequences, alive_log_probs, finished_sequences,
             finished_scores, caches):
        # The best score an alive hypothesis could still reach.
        best_possible = alive_log_probs[:, 0] / max_penalty
        undecided = ops.any(ops.less(finished_scores, best_possible))
        return ops.logical_and(ops.less(index, buffer_length), undecided)

    def body(index, alive_sequences, alive_log_probs, finished_sequences,
             finished_scores, caches):
        inputs = ops.reshape(
            ops.slice(alive_sequences, (0, 0, index), (batch_size, beam_size, 1)),
            (flat_size, 1),
        )
        logits, caches = decode_step(model, inputs, index, caches, cross, source_mask)
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

        # The best candidate that ends within the beam replaces the finished
        # hypothesis if it scores higher.
        in_beam = ops.less(ops.arange(2 * beam_size), beam_size)[None, :]
        ended_scores = ops.where(
            ops.logical_and(ends, in_beam),
            top_log_probs / length_penalty(index + 1, alpha),
            _NEG_INF,
        )
        best = ops.cast(ops.argmax(ended_scores, axis=1), "int32")
        best_scores = ops.max(ended_scores, axis=1)
        improves = ops.greater(best_scores, finished_scores)
        best_sequences = ops.take_along_axis(top_sequences, best[:, None, None], axis=1)[:, 0]
        finished_sequences = ops.where(improves[:, None], best_sequences, finished_sequences)
        finished_scores = ops.where(improves, best_scores, finished_scores)

        # The best beam_size candidates that do not end stay alive.
        alive_log_probs, keep = ops.top_k(
            ops.where(ends, _NEG_INF, top_log_probs), beam_size
        )
        keep = ops.cast(keep, "int32")
        alive_sequences = ops.take_along_axis(top_sequences, keep[:, :, None], axis=1)
        parents = ops.reshape(ops.take_along_axis(top_beams, keep, axis=1) + batch_offsets,
                              (flat_size,))
        caches = [ops.take(cache, parents, axis=0) for cache in caches]
        return (index + 1, alive_sequences, alive_log_probs, finished_sequences,
                finished_scores, caches)

    state = (ops.convert_to_tensor(0, "int32"), alive_sequences, alive_log_probs,
             finished_sequences, finished_scores, caches)
    state = ops.while_loop(cond, body, state)
    finished_sequences, finished_scores = state[3], state[4]
    return finished_sequences[:, 1:], finished_scores


# Checks, limits, and the per-backend compiled wrappers.


# The static settings of one compiled search, and the key of the cache of
# compiled functions. `beam_size` is None for greedy search. Ids and α are
# traced arguments, so changing them compiles nothing new.
_Options = collections.namedtuple("_Options", ["beam_size", "buffer_length"])


def _search(model, source_ids, bos_id, eos_id, max_length, beam_size, alpha):
    _check_model(model)
    config = model.config
    vocab_size = config.resolved_target_vocab_size
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            0 <= value < vocab_size
        ):
            raise ValueError(
                f"{name}={value!r} must be an integer id of the target vocabulary "
                f"(0 <= {name} < {vocab_size}): take it from the tokenizer."
            )
    if eos_id == config.pad_id:
        raise ValueError(
            f"eos_id={eos_id} equals the padding id {config.pad_id}, which decoding "
            "never generates: pass the tokenizer's end-of-sentence id."
        )
    _check_search_options(1, 0.0, max_length)

    source_ids = _as_int_matrix(source_ids, "source_ids", config.vocab_size)
    batch_size, source_width = source_ids.shape
    learned = config.position_encoding == "learned"
    if learned and source_width > config.max_length:
        raise ValueError(
            f"source_ids has {source_width} positions but the model's learned position "
            f"embeddings cover max_length={config.max_length}: remove trailing "
            "padding, or truncate or split the sentences."
        )
    source_lengths = np.sum(source_ids != config.pad_id, axis=1).astype("int32")
    if max_length is None:
        buffer_length = source_width + LENGTH_OFFSET
        limits = source_lengths + LENGTH_OFFSET
    else:
        buffer_length = int(max_length)
        limits = np.full((batch_size,), buffer_length, "int32")
    if learned:
        # Decoder position t needs a learned embedding: t < config.max_length.
        buffer_length = min(buffer_length, config.max_length)
    limits = np.minimum(limits, buffer_length).astype("int32")
    if batch_size == 0:
        return np.zeros((0, 0), "int32"), np.zeros((0,), "float32")

    function = _compiled_search(model, _Options(beam_size, buffer_length))
    token_ids, scores = function(
        source_ids, limits, np.array([bos_id, eos_id], "int32"), np.float32(alpha)
    )
    token_ids = ops.convert_to_numpy(token_ids).astype("int32")
    scores = ops.convert_to_numpy(scores).astype("float32")
    lengths = np.sum(token_ids != config.pad_id, axis=1)
    return token_ids[:, : int(lengths.max(initial=0))], scores


def _check_search_options(beam_size, alpha, max_length):
    if isinstance(beam_size, bool) or not isinstance(beam_size, (int, np.integer)) or (
        beam_size < 1
    ):
        raise ValueError(f"beam_size={beam_size!r} must be a positive integer (4 in §6.1).")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)) or not alpha >= 0:
        raise ValueError(
            f"alpha={alpha!r} must be a number >= 0 (0.6 in §6.1; 0 disables the "
            "length penalty)."
        )
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer))
        or max_length < 1
    ):
        raise ValueError(
            f"max_length={max_length!r} must be a positive integer, or None for "
            f"source length + {LENGTH_OFFSET} (§6.1)."
        )


def _check_model(model):
    missing = [name for name in ("encode", "decoder_blocks", "config", "initial_cache")
               if not hasattr(model, name)]
    if missing:
        raise TypeError(
            f"Decoding needs a keras_transformer.Transformer, got {type(model).__name__} "
            f"(no {', '.join(missing)}): build one with Transformer(config) or load one "
            "with keras.saving.load_model."
        )


def _as_int_matrix(values, name, vocab_size):
    if isinstance(values, (list, tuple)):
        try:
            values = np.asarray(values)
        except ValueError:
            raise ValueError(
                f"{name} is a ragged list; it must be a (batch, length) matrix of int "
                "ids: pad the rows with the padding id first."
            ) from None
    elif not isinstance(values, np.ndarray):
        values = ops.convert_to_numpy(values)
    if values.ndim == 1:
        raise ValueError(
            f"{name} must be a (batch, length) matrix of int ids, got shape "
            f"{values.shape}: add a batch axis for one sentence (ids[None, :])."
        )
    if values.ndim != 2 or not (np.issubdtype(values.dtype, np.integer) or values.size == 0):
        raise ValueError(
            f"{name} must be a (batch, length) matrix of int ids, got shape "
            f"{values.shape} and dtype {values.dtype}."
        )
    if values.size and (values.min() < 0 or values.max() >= vocab_size):
        raise ValueError(
            f"{name} holds ids from {values.min()} to {values.max()}, outside the "
            f"source vocabulary (0 <= id < {vocab_size}): tokenize with the model's "
            "tokenizer."
        )
    return values.astype("int32")


# One dict of compiled functions per model, keyed by `_Options`. The functions
# reach the model through a weak reference, so the cache does not keep it alive.
_COMPILED = weakref.WeakKeyDictionary()


def _compiled_search(model, options):
    functions = _COMPILED.setdefault(model, {})
    if options not in functions:
        functions[options] = _compile(weakref.ref(model), options)
    return functions[options]


def _compile(model_ref, options):
    """The search loop for `options`, compiled for the current backend.

    Returns a function `(source_ids, limits, [bos_id, eos_id], alpha) ->
    (token_ids, scores)`.
    """
    loop = _greedy_loop if options.beam_size is None else _beam_loop
    backend = keras.backend.backend()

    if backend == "jax":
        import jax

        @jax.jit
        def compiled(trainable, non_trainable, source_ids, limits, special_ids, alpha):
            model = model_ref()
            mapping = list(zip(model.trainable_variables, trainable)) + list(
                zip(model.non_trainable_variables, non_trainable)
            )
            with keras.StatelessScope(state_mapping=mapping):
                return loop(model, source_ids, limits, special_ids, alpha, options)

        def run(*args):
            model = model_ref()
            # Weights are arguments, not constants: the compiled function
            # stays valid when they change (more training, load_weights).
            return compiled(
                [v.value for v in model.trainable_variables],
                [v.value for v in model.non_trainable_variables],
                *args,
            )

        return run

    if backend == "tensorflow":
        import tensorflow as tf

        # XLA fuses the many small ops of a decoding step: on a CPU it made
        # steady-state decoding 2-5x faster than a plain tf.function graph,
        # for about one more second of compilation per shape.
        return tf.function(
            lambda *args: loop(model_ref(), *args, options), jit_compile=True
        )

    def run_eagerly(*args):
        return loop(model_ref(), *[ops.convert_to_tensor(a) for a in args], options)

    if backend == "torch":
        import torch

        def run_without_gradients(*args):
            with torch.no_grad():
                return run_eagerly(*args)

        return run_without_gradients
    return run_eagerly
