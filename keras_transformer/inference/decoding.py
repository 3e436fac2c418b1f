"""§6.1 Machine Translation: greedy search, sampling and beam search with a key/value cache.

The paper decodes with "beam search with a beam size of 4 and length penalty
α = 0.6", a maximum output length of "input length + 50", and terminates early
when possible. `sample_search` (beyond the paper) draws each token instead,
with temperature, top-k and top-p, reproducibly for a seed.
`greedy_search`, `sample_search` and `beam_search` take a batch of encoder inputs
as NumPy arrays and give NumPy results: they check their arguments, compile
the search of `keras_transformer.inference.search` for the backend
(`keras_transformer.inference.compiled.compile_inference`: `jax.jit`,
`tf.function(jit_compile=True)`, PyTorch without gradients with each loop's
condition and body traced by `torch.jit.trace`), and cache the compiled
functions per model and per search setting, so JAX and TensorFlow reuse them
for every batch of the same shape.
"""

import weakref

import numpy as np
from keras import ops

from keras_transformer import validation
from keras_transformer.inference.compiled import compile_inference
from keras_transformer.inference.limits import LENGTH_OFFSET, position_limit
from keras_transformer.inference.sampling import check_sampling_options
from keras_transformer.inference.search import searched_beam_size, traced_search

__all__ = ["beam_search", "check_model", "check_search_options", "greedy_search",
           "sample_search"]


def check_search_options(beam_size=4, alpha=0.6, max_output_length=None, num_return=1):
    """Raises a ValueError that names a bad search setting.

    Args:
        beam_size: A positive integer (4 in §6.1).
        alpha: The length penalty's α, a number >= 0 (0.6 in §6.1).
        max_output_length: A positive integer, or None for source length + 50.
        num_return: Hypotheses returned per sentence, a positive integer no
            larger than `beam_size`.
    """
    validation.check_positive_int("beam_size", beam_size, "4 in §6.1")
    validation.check_non_negative_number(
        "alpha", alpha, "0.6 in §6.1; 0 disables the length penalty")
    if max_output_length is not None:
        validation.check_positive_int(
            "max_output_length", max_output_length,
            f"or None for source length + {LENGTH_OFFSET} (§6.1)")
    validation.check_positive_int("num_return", num_return, "1 for the best hypothesis only")
    if num_return > beam_size:
        raise ValueError(
            f"num_return={num_return} is more than beam_size={beam_size}: beam search "
            f"finishes at most beam_size hypotheses a step, so raise beam_size to at least "
            f"{num_return} or ask for fewer.")


def check_model(model):
    """Raises a TypeError unless `model` can decode (a `Transformer`)."""
    missing = [name for name in ("encode", "decode", "config", "initial_cache")
               if not hasattr(model, name)]
    if missing:
        raise TypeError(
            f"Decoding needs a keras_transformer.Transformer, got {type(model).__name__} "
            f"(no {', '.join(missing)}): build one with Transformer(config) or load one "
            "with keras.saving.load_model."
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
            alignment: the source position with the highest encoder-decoder
            attention of the last decoder block, averaged over heads, among
            the source's tokens before its last one (EOS), as fairseq's
            `--print-alignment` gives it.

    Returns:
        `(token_ids, scores)` as NumPy arrays: (batch, L) int32 output ids after
        BOS, up to and including EOS, then padding (0 by default), with L the
        longest hypothesis in the batch; and (batch,) float32 log P(Y | X), the
        sum of the chosen tokens' log-probabilities. A hypothesis that reaches
        its length limit has no EOS. With `return_alignment`, a third array
        shaped as `token_ids`: each output token's source position (0 under
        padding).

    Example:

    >>> ids, scores = greedy_search(model, source_ids, bos_id=2, eos_id=3)
    """
    return _search(model, source_ids, bos_id, eos_id, max_output_length, None, 0.0,
                   alignment=return_alignment)


def sample_search(model, source_ids, bos_id, eos_id, temperature=1.0, top_k=0, top_p=1.0,
                  seed=0, max_output_length=None, num_return=1, stream_ids=None,
                  return_alignment=False):
    """Sampling: at every step, a token drawn from the model's distribution.

    Beyond the paper, which decodes with beam search: sampling gives diverse
    outputs (back-translation, several candidates per sentence). Each step
    draws from softmax(logits / temperature), restricted to the `top_k` most
    probable tokens and then to the smallest set of the most probable ones
    whose probability reaches `top_p` (nucleus sampling), renormalised. It
    runs the same compiled, cached loop as greedy search, with the same
    length limits; the padding and BOS ids are never drawn.

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
        temperature: > 0; below 1 sharpens the distribution, above 1 flattens.
        top_k: Keep only the k most probable tokens; 0 keeps all.
        top_p: Keep the most probable tokens up to this total probability;
            1 keeps all.
        seed: An integer in [0, 2^31).
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

    >>> ids, scores = sample_search(model, source_ids, bos_id=2, eos_id=3,
    ...                             top_p=0.9, seed=1)
    """
    check_sampling_options(temperature, top_k, top_p, seed, num_return)
    check_model(model)
    source = _as_int_matrix(source_ids, "source_ids", model.config.vocab_size)
    batch = len(source)
    if stream_ids is None:
        stream_ids = np.arange(batch)
    stream_ids = np.asarray(stream_ids)
    if stream_ids.shape != (batch,) or not np.issubdtype(stream_ids.dtype, np.integer):
        raise ValueError(f"stream_ids must be ({batch},) ints, one per sentence, got shape "
                         f"{stream_ids.shape} and dtype {stream_ids.dtype}.")
    # Sample j of sentence i is row i * num_return + j, drawn from the stream
    # (seed, stream_ids[i], j): its first sample is the single one.
    streams = np.stack([np.full((batch, num_return), seed),
                        np.broadcast_to(stream_ids[:, None] % 2**31, (batch, num_return)),
                        np.broadcast_to(np.arange(num_return), (batch, num_return))],
                       axis=-1).reshape(batch * num_return, 3).astype("int32")
    sampling = (float(temperature), int(top_k), float(top_p))
    results = _search(model, np.repeat(source, num_return, axis=0), bos_id, eos_id,
                      max_output_length, None, 0.0, sampling=sampling, streams=streams,
                      alignment=return_alignment)
    if num_return == 1:
        return results
    return tuple(result.reshape(batch, num_return, *result.shape[1:]) for result in results)


def beam_search(model, source_ids, bos_id, eos_id, beam_size=4, alpha=0.6,
                max_output_length=None, num_return=1, return_alignment=False):
    """Beam search with the §6.1 length penalty, batched over sentences.

    Keeps the `beam_size` most probable unfinished hypotheses ("alive") per
    sentence. At each step it extends them by every token and ranks the
    2·beam_size most probable extensions. Those among the best `beam_size`
    that end (in EOS, or at the length limit) are finished and scored by
    log P / lp(Y); the best finished hypothesis so far is kept (the
    `num_return` best for an n-best list). The best
    `beam_size` extensions that do not end stay alive (ranking 2·beam_size
    guarantees there are enough of them). An extension that ends outside the
    best `beam_size` is pruned like any other, so `beam_size=1` with `alpha=0`
    is exactly greedy search, and runs greedy search's loop, which has less
    to do per step (`keras_transformer.inference.search.searched_beam_size`).

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
        return_alignment: As in `greedy_search`; the alignments follow each
            hypothesis through the beam.

    Returns:
        `(token_ids, scores)` as NumPy arrays: (batch, L) int32 ids of the best
        finished hypothesis after BOS, up to and including EOS, then padding,
        with L the longest hypothesis in the batch; and (batch,) float32 scores
        log P(Y | X) / lp(Y). With `num_return > 1`: (batch, num_return, L)
        ids and (batch, num_return) scores, best first. Should a sentence
        finish fewer hypotheses (only with a vocabulary of very few tokens),
        the missing ones score -inf and hold padding only.

    Example:

    >>> ids, scores = beam_search(model, source_ids, bos_id=2, eos_id=3,
    ...                           beam_size=4, alpha=0.6)
    >>> n_best_ids, n_best_scores = beam_search(model, source_ids, 2, 3, num_return=4)
    """
    check_search_options(beam_size, alpha, max_output_length, num_return)
    return _search(model, source_ids, bos_id, eos_id, max_output_length, int(beam_size),
                   float(alpha), int(num_return), alignment=return_alignment)


# The Python entry: checks, NumPy in and out, compiled functions per setting.


def _search(model, source_ids, bos_id, eos_id, max_output_length, beam_size, alpha,
            num_return=1, sampling=None, streams=None, alignment=False):
    check_model(model)
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
    check_search_options(max_output_length=max_output_length)
    max_output_length = None if max_output_length is None else int(max_output_length)

    source_ids = _as_int_matrix(source_ids, "source_ids", config.vocab_size)
    positions = position_limit(config)
    if positions is not None and source_ids.shape[1] > positions:
        raise ValueError(
            f"source_ids has {source_ids.shape[1]} positions but the model's learned "
            f"position embeddings cover max_length={positions}: remove trailing "
            "padding, or truncate or split the sentences."
        )
    n_best = () if num_return == 1 else (num_return,)
    if source_ids.shape[0] == 0:
        empty = (np.zeros((0, *n_best, 0), "int32"), np.zeros((0, *n_best), "float32"))
        return (*empty, empty[0]) if alignment else empty

    beam_size = searched_beam_size(beam_size, alpha)
    function = _compiled_search(model, beam_size, max_output_length, num_return, sampling,
                                alignment)
    if streams is None:
        streams = np.zeros((source_ids.shape[0], 3), "int32")  # read by sampling only
    token_ids, scores, *alignments = function(
        source_ids, np.array([bos_id, eos_id], "int32"), np.float32(alpha), streams)
    token_ids = ops.convert_to_numpy(token_ids).astype("int32")
    scores = ops.convert_to_numpy(scores).astype("float32")
    width = int(np.sum(token_ids != config.pad_id, axis=-1).max(initial=0))
    results = [token_ids[..., :width], scores]
    for positions in alignments:  # where padding follows a hypothesis, 0 and unused
        results.append(ops.convert_to_numpy(positions).astype("int32")[..., :width])
    return tuple(results)


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


# One dict of compiled searches per model, keyed by (beam_size,
# max_output_length, num_return, sampling, alignment): the settings that shape
# the graph.
# Ids, α, seeds and stream ids are arguments, so changing them compiles
# nothing new. The functions reach the model through a weak reference, so
# the cache does not keep it alive.
_COMPILED = weakref.WeakKeyDictionary()


def _compiled_search(model, beam_size, max_output_length, num_return=1, sampling=None,
                     alignment=False):
    functions = _COMPILED.setdefault(model, {})
    key = (beam_size, max_output_length, num_return, sampling, alignment)
    if key not in functions:
        def search(model, source_ids, special_ids, alpha, streams):
            return traced_search(model, source_ids, special_ids, alpha, beam_size,
                                 max_output_length, num_return, sampling, streams, alignment)

        functions[key] = compile_inference(weakref.ref(model), search)
    return functions[key]
