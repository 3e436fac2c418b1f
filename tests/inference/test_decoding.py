"""Tests of §6.1 decoding: cached greedy search and beam search with length penalty."""

import itertools
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import REPOSITORY, tiny_model
from keras import ops

from keras_transformer.data.toy_tasks import ToyVocabulary
from keras_transformer.inference import beam_search, greedy_search, length_penalty
from keras_transformer.inference.beam import beam_loop

BACKENDS = ("tensorflow", "jax", "torch")
# The special ids of every test here, read from a tokenizer-like vocabulary.
VOCABULARY = ToyVocabulary(20)
BOS, EOS = VOCABULARY.bos_id, VOCABULARY.eos_id


def source_batch(batch_size=3, width=7, vocab_size=20, seed=0):
    source = np.random.default_rng(seed).integers(3, vocab_size, size=(batch_size, width))
    source = source.astype("int32")
    source[1, 4:] = 0
    source[2:, 6:] = 0
    return source


def set_output_bias(model, token_id, value):
    """Pushes one token's logit up or down through the shared output bias."""
    bias = np.zeros(model.config.resolved_target_vocab_size, "float32")
    bias[token_id] = value
    model.target_embedding.output_bias.assign(bias)


def strip(ids, pad_id=0):
    return [[int(t) for t in row if t != pad_id] for row in ids]


def sequence_log_probs(model, source, outputs, bos_id):
    """log P(y | x) of each output sequence, by one full forward pass (no cache)."""
    width = max(len(y) for y in outputs)
    targets = np.zeros((len(outputs), width), "int32")
    labels = np.zeros((len(outputs), width), "int32")
    for row, y in enumerate(outputs):
        targets[row, : len(y)] = [bos_id, *y[:-1]]
        labels[row, : len(y)] = y
    sources = np.repeat(source[None], len(outputs), axis=0)
    logits = model.predict_on_batch({"source": sources, "target": targets})
    log_probs = ops.convert_to_numpy(ops.log_softmax(logits, axis=-1))
    picked = np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    lengths = np.array([len(y) for y in outputs])
    return np.where(np.arange(width)[None] < lengths[:, None], picked, 0).sum(1), lengths


def naive_greedy(model, source, bos_id, eos_id, max_output_length):
    """Greedy decoding by re-running the whole model on the prefix at every step.

    The target is a fixed-width buffer; positions after the prefix are padding,
    which the causal mask hides from the prefix anyway.
    """
    pad_id = model.config.pad_id
    batch_size = len(source)
    targets = np.full((batch_size, max_output_length), pad_id, "int32")
    targets[:, 0] = bos_id
    outputs = [[] for _ in range(batch_size)]
    scores = np.zeros(batch_size, "float32")
    for step in range(max_output_length):
        # predict_on_batch compiles the forward pass once for the fixed shapes.
        logits = model.predict_on_batch({"source": source, "target": targets})
        log_probs = ops.convert_to_numpy(ops.log_softmax(logits[:, step], axis=-1))
        log_probs[:, [pad_id, bos_id]] = -np.inf  # never generated
        for row in range(batch_size):
            if outputs[row][-1:] == [eos_id] or len(outputs[row]) == max_output_length:
                continue
            token = int(np.argmax(log_probs[row]))
            outputs[row].append(token)
            scores[row] += log_probs[row, token]
            if step + 1 < max_output_length:
                targets[row, step + 1] = token
    return outputs, scores


# The tests of the search's loop (its phases, caps and compilations)
# decode with one layer per stack: what they check does not depend on the depth,
# and a layer fewer halves what JAX and TensorFlow compile. The tests of the
# results (cached against full recomputation, paired beam steps, exhaustive beams,
# n-best lists, alignments) keep two, so that every layer's cache is read and
# reordered.
@pytest.fixture(scope="module")
def model():
    """An untrained post-norm model shared by the tests that only read it."""
    return tiny_model(seed=3)


CONFIGS = {
    "post_norm": {},
    "pre_norm": {"norm_position": "pre"},
    "untied_learned": {"share_embeddings": False, "tie_output_embedding": False,
                       "target_vocab_size": 17, "position_encoding": "learned"},
    # Table 3 row (B): d_k halved alone, d_v kept.
    "key_dim_unequal_value_dim": {"key_dim": 4, "value_dim": 8},
}


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_cached_greedy_matches_full_recomputation(model, overrides):
    model = tiny_model(**overrides) if overrides else model
    source = source_batch()
    ids, scores = greedy_search(model, source, bos_id=BOS, eos_id=EOS, max_output_length=8)
    expected_ids, expected_scores = naive_greedy(model, source, BOS, EOS, max_output_length=8)
    assert strip(ids) == expected_ids
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)


def test_beam_size_one_without_length_penalty_equals_greedy(model):
    """The beam loop with one hypothesis and α = 0 is greedy search: what lets
    `beam_search` run greedy search's loop for it (`searched_beam_size`). The
    beam loop is run here directly, uncompiled."""
    source = source_batch()
    greedy_ids, greedy_scores = greedy_search(model, source, BOS, EOS, max_output_length=8)
    beam_ids, beam_scores = beam_loop(
        model, ops.convert_to_tensor(source), ops.convert_to_tensor([BOS, EOS], "int32"),
        ops.convert_to_tensor(0.0), beam_size=1, max_output_length=8)
    beam_ids = ops.convert_to_numpy(beam_ids)[:, :greedy_ids.shape[1]]
    np.testing.assert_array_equal(beam_ids, greedy_ids)
    np.testing.assert_allclose(ops.convert_to_numpy(beam_scores), greedy_scores, rtol=1e-5)


def test_a_beam_of_one_runs_the_greedy_loop_without_a_length_penalty_only(monkeypatch):
    """`beam_search` with `beam_size=1` and α = 0 runs greedy search's loop,
    which gives what the beam loop would (the test above). With α > 0 it
    keeps the beam loop, which may finish another hypothesis than greedy
    search: here a longer one, that scores better by log P / lp(Y)."""
    from keras_transformer.inference import beam

    loops = []
    for name in ("greedy_loop", "beam_loop"):
        def spy(*args, _name=name, _loop=getattr(beam, name), **kwargs):
            loops.append(_name)
            return _loop(*args, **kwargs)

        monkeypatch.setattr(beam, name, spy)
    model = tiny_model(seed=3, num_layers=1)
    set_output_bias(model, EOS, 5.0)  # EOS is the most probable first token
    source = source_batch()
    ids, scores = beam_search(model, source, BOS, EOS, beam_size=1, alpha=0.0,
                              max_output_length=3)
    assert set(loops) == {"greedy_loop"}
    greedy_ids, greedy_scores = greedy_search(model, source, BOS, EOS, max_output_length=3)
    np.testing.assert_array_equal(greedy_ids, [[EOS]] * 3)
    np.testing.assert_array_equal(ids, greedy_ids)
    np.testing.assert_array_equal(scores, greedy_scores)

    # So strong a penalty (lp(2) > 2000) lets a longer hypothesis beat EOS.
    loops.clear()
    alpha = 50.0
    ids, scores = beam_search(model, source, BOS, EOS, beam_size=1, alpha=alpha,
                              max_output_length=3)
    assert set(loops) == {"beam_loop"}
    for row in range(len(source)):
        hypotheses = [strip(ids)[row], [EOS]]
        log_probs, lengths = sequence_log_probs(model, source[row], hypotheses, bos_id=BOS)
        normalized = log_probs / ops.convert_to_numpy(length_penalty(lengths, alpha))
        assert lengths[0] > 1 and normalized[0] > normalized[1], (row, hypotheses)
        np.testing.assert_allclose(scores[row], normalized[0], rtol=1e-4)


@pytest.mark.parametrize("overrides", [{}, CONFIGS["key_dim_unequal_value_dim"]],
                         ids=["d_v=d_k", "d_v!=d_k"])
def test_wide_beam_finds_the_exhaustive_best(overrides):
    """With a beam as wide as every step's candidates, beam search is exact search
    (its reordered caches included)."""
    vocab_size, max_length = 6, 3
    model = tiny_model(vocab_size=vocab_size, **overrides)
    model.target_embedding.output_bias.assign(
        np.random.default_rng(2).normal(scale=2.0, size=vocab_size).astype("float32")
    )
    source = source_batch(batch_size=2, width=4, vocab_size=vocab_size)
    # Every output of at most 3 tokens; EOS may only come last. Padding and BOS
    # are never generated; every other id is.
    tokens = [t for t in range(vocab_size) if t not in (VOCABULARY.pad_id, BOS, EOS)]
    assert len(tokens) == 3
    candidates = [[EOS]] + [[*prefix, EOS] for prefix in itertools.product(tokens, repeat=1)]
    candidates += [[*prefix, last] for prefix in itertools.product(tokens, repeat=2)
                   for last in (EOS, *tokens)]
    candidates = [list(c) for c in candidates]
    log_probs = [sequence_log_probs(model, row, candidates, bos_id=BOS) for row in source]
    for alpha in (0.0, 0.6, 2.0):
        # A step has at most 3^2 alive hypotheses x 4 tokens = 36 candidates.
        ids, scores = beam_search(model, source, BOS, EOS, beam_size=36, alpha=alpha,
                                  max_output_length=max_length)
        n_best_ids, n_best_scores = beam_search(model, source, BOS, EOS, beam_size=36,
                                                alpha=alpha, max_output_length=max_length,
                                                num_return=5)
        for row, (row_log_probs, lengths) in enumerate(log_probs):
            normalized = row_log_probs / ops.convert_to_numpy(length_penalty(lengths, alpha))
            best = int(np.argmax(normalized))
            assert strip(ids)[row] == candidates[best], f"alpha={alpha}, sentence {row}"
            np.testing.assert_allclose(scores[row], normalized[best], rtol=1e-5)
            # The n-best list is the exhaustive top 5, in order: the early stop
            # waits for the 5th as it waits for the best.
            top = np.argsort(-normalized)[:5]
            assert strip(n_best_ids[row]) == [candidates[i] for i in top], f"alpha={alpha}"
            np.testing.assert_allclose(n_best_scores[row], normalized[top], rtol=1e-5)


def test_n_best_hypotheses_are_distinct_best_first_and_led_by_the_best(model):
    source = source_batch()
    ids, scores = beam_search(model, source, BOS, EOS, beam_size=4, max_output_length=8)
    assert ids.ndim == 2 and scores.shape == (3,)
    one_ids, one_scores = beam_search(model, source, BOS, EOS, beam_size=4,
                                      max_output_length=8, num_return=1)
    np.testing.assert_array_equal(one_ids, ids)
    np.testing.assert_array_equal(one_scores, scores)

    n_best_ids, n_best_scores = beam_search(model, source, BOS, EOS, beam_size=4,
                                            max_output_length=8, num_return=4)
    assert n_best_ids.shape[:2] == (3, 4) and n_best_scores.shape == (3, 4)
    assert n_best_ids.dtype == np.int32 and n_best_scores.dtype == np.float32
    assert np.all(np.isfinite(n_best_scores))
    assert np.all(np.diff(n_best_scores, axis=1) <= 0), "best first"
    for row in range(3):
        hypotheses = strip(n_best_ids[row])
        assert len({tuple(h) for h in hypotheses}) == 4, "distinct hypotheses"
        assert hypotheses[0] == strip(ids)[row]
        # Each score is its own hypothesis's log P / lp(Y), by a full forward pass.
        log_probs, lengths = sequence_log_probs(model, source[row], hypotheses, bos_id=BOS)
        np.testing.assert_allclose(
            n_best_scores[row], log_probs / ops.convert_to_numpy(length_penalty(lengths, 0.6)),
            rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(n_best_scores[:, 0], scores, rtol=1e-6)


def naive_alignment_weights(model, source_row, output_ids):
    """The last block's encoder-decoder attention averaged over heads, (T, S),
    from one full forward pass without a cache, and the candidate positions:
    the source's tokens before its last one (EOS)."""
    target = np.array([[BOS, *output_ids[:-1]]], "int32")
    weights = model.attention_weights(source_row[None], target)
    cross = ops.convert_to_numpy(weights["cross"][-1])[0].mean(axis=0)
    length = int(np.sum(source_row != 0))
    return cross, np.arange(len(source_row)) < length - 1


@pytest.mark.parametrize("search", ["greedy", "beam", "n_best"])
def test_each_token_is_aligned_to_its_highest_cross_attention_source_position(model, search):
    source = source_batch()
    if search == "greedy":
        ids, _, positions = greedy_search(model, source, BOS, EOS, max_output_length=8,
                                          return_alignment=True)
        ids, positions = ids[:, None], positions[:, None]
    else:
        num_return = 2 if search == "n_best" else 1
        ids, _, positions = beam_search(model, source, BOS, EOS, beam_size=3,
                                        max_output_length=8, num_return=num_return,
                                        return_alignment=True)
        if num_return == 1:
            ids, positions = ids[:, None], positions[:, None]
    assert positions.shape == ids.shape
    checked = 0
    for row in range(len(source)):
        for hypothesis, aligned in zip(strip(ids[row]), positions[row]):
            cross, candidates = naive_alignment_weights(model, source[row], hypothesis)
            for t, position in enumerate(aligned[: len(hypothesis)]):
                assert candidates[position], (row, t, position)
                # The argmax, up to the rounding between the cached and full paths.
                assert cross[t, position] >= cross[t][candidates].max() - 1e-5
                checked += 1
    assert checked >= len(source) * ids.shape[1]


def test_a_loop_in_three_cache_phases_decodes_as_one_phase(monkeypatch):
    """40 forced tokens run in phases of 8, 16 and 40 cache positions (three
    compiled loops: TensorFlow's XLA once failed on a third loop with a
    constant passed through, tensorflow/tensorflow#122886). The first phase is
    made small so that the test runs few steps; the library starts at 32."""
    from keras_transformer.inference import search, step

    assert step.cache_phases(130) == [32, 64, 130]
    monkeypatch.setattr(step, "FIRST_CACHE_PHASE", 8)
    assert step.cache_phases(40) == [8, 16, 40]
    model = tiny_model(seed=4, num_layers=1)
    set_output_bias(model, EOS, -1e9)  # no hypothesis ends: every phase runs
    source = source_batch()
    options = dict(max_output_length=40)
    phased = [greedy_search(model, source, BOS, EOS, **options),
              beam_search(model, source, BOS, EOS, beam_size=2, **options)]
    monkeypatch.setattr(step, "FIRST_CACHE_PHASE", 1024)  # one phase
    search._COMPILED.pop(model, None)
    single = [greedy_search(model, source, BOS, EOS, **options),
              beam_search(model, source, BOS, EOS, beam_size=2, **options)]
    for phased_results, single_results in zip(phased, single):
        assert phased_results[0].shape == (len(source), 40)
        np.testing.assert_array_equal(phased_results[0], single_results[0])
        np.testing.assert_allclose(phased_results[1], single_results[1], rtol=1e-5)


@pytest.mark.parametrize("max_output_length", [17, 40])
def test_two_beam_steps_per_loop_iteration_decode_as_one(monkeypatch, max_output_length):
    """Beam search runs two steps per iteration of its loop in the cache
    phases from `PAIRED_BEAM_STEPS_FROM` on, so that XLA copies less. Its
    n-best lists and scores are those of one step per iteration:
    with an odd length (17: phases of 8 and 18 positions, the second paired,
    one step past every limit), with two paired phases (40: 8, 16 and 40),
    and with hypotheses that end at different steps. The phases are made
    small so that the test runs few steps; the library starts at 32 and
    pairs from 128."""
    from keras_transformer.inference import beam, search, step

    assert beam.PAIRED_BEAM_STEPS_FROM == 128
    monkeypatch.setattr(step, "FIRST_CACHE_PHASE", 8)
    monkeypatch.setattr(beam, "PAIRED_BEAM_STEPS_FROM", 16)
    model = tiny_model(seed=5)
    set_output_bias(model, EOS, 1.0)
    source = source_batch()
    options = dict(beam_size=3, max_output_length=max_output_length, num_return=3)
    paired = beam_search(model, source, BOS, EOS, **options)
    monkeypatch.setattr(beam, "PAIRED_BEAM_STEPS_FROM", None)
    search._COMPILED.pop(model, None)
    single = beam_search(model, source, BOS, EOS, **options)
    # Hypotheses end at different steps, some past the first (unpaired) phase.
    lengths = {len(hypothesis) for row in paired[0] for hypothesis in strip(row)}
    assert len(lengths) >= 2 and max(lengths) > 8, lengths
    np.testing.assert_array_equal(paired[0], single[0])
    np.testing.assert_allclose(paired[1], single[1], rtol=1e-5)


def test_batched_search_equals_one_sentence_at_a_time(model):
    source = source_batch()
    ids, scores = beam_search(model, source, BOS, EOS, max_output_length=8)
    # Each sentence's beams are gathered from its own rows only: reordering
    # the batch reorders the results.
    order = [2, 0, 1]
    reordered_ids, reordered_scores = beam_search(model, source[order], BOS, EOS,
                                                  max_output_length=8)
    assert strip(reordered_ids) == [strip(ids)[i] for i in order]
    np.testing.assert_allclose(reordered_scores, scores[order], rtol=1e-5)
    # Padding a sentence to the batch width changes nothing.
    alone_ids, alone_scores = beam_search(model, source[1:2, :4], BOS, EOS, max_output_length=8)
    assert strip(alone_ids) == strip(ids[1:2])
    np.testing.assert_allclose(alone_scores, scores[1:2], rtol=1e-4)


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_output_ends_at_eos_or_at_source_length_plus_50(search):
    model = tiny_model(num_layers=1)
    source = source_batch()
    set_output_bias(model, EOS, -1e4)  # EOS never wins: every sentence runs to its limit
    ids, _ = search(model, source, bos_id=BOS, eos_id=EOS)
    source_lengths = np.sum(source != 0, axis=1)
    np.testing.assert_array_equal(np.sum(ids != 0, axis=1), source_lengths + 50)
    assert ids.shape[1] == source_lengths.max() + 50 and not np.any(ids == 2)
    set_output_bias(model, EOS, 1e4)  # EOS always wins
    ids, scores = search(model, source, bos_id=BOS, eos_id=EOS)
    np.testing.assert_array_equal(ids, [[EOS]] * 3)
    np.testing.assert_allclose(scores, 0.0, atol=1e-3)


@pytest.mark.parametrize("max_length", [16, 15])
def test_learned_positions_cap_the_output_length(monkeypatch, max_length):
    """An odd cap ends in a phase of one beam step per loop iteration: a
    second step would embed a position past the table (an error under
    PyTorch)."""
    from keras_transformer.inference import beam, step

    monkeypatch.setattr(step, "FIRST_CACHE_PHASE", 4)
    monkeypatch.setattr(beam, "PAIRED_BEAM_STEPS_FROM", 8)
    model = tiny_model(position_encoding="learned", max_length=max_length, num_layers=1)
    set_output_bias(model, EOS, -1e4)
    ids, _ = beam_search(model, source_batch(), bos_id=BOS, eos_id=EOS)
    assert ids.shape == (3, max_length) and np.all(ids != 0)


def test_compiled_once_per_shape_and_sees_new_weights(monkeypatch):
    # JAX and TensorFlow compile the search per shape; PyTorch traces its loop
    # body per shape (keras_transformer.inference.compiled.while_loop).
    traces = []
    model = tiny_model(num_layers=1)
    original = model.decode

    def counting_decode(*args, **kwargs):
        traces.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "decode", counting_decode)
    source = source_batch()
    first, _ = beam_search(model, source, BOS, EOS, max_output_length=8)
    traced = len(traces)
    assert traced > 0
    beam_search(model, source + 0, BOS, EOS, max_output_length=8)
    # ids and α are arguments
    beam_search(model, source, BOS, EOS + 1, alpha=1.0, max_output_length=8)
    assert len(traces) == traced, "same shapes must reuse the compiled search"
    # New weights reach the compiled function without tracing it again.
    set_output_bias(model, EOS, 1e4)
    forced, _ = beam_search(model, source, BOS, EOS, max_output_length=8)
    assert len(traces) == traced
    np.testing.assert_array_equal(forced, [[EOS]] * 3)
    assert not np.array_equal(first[:, :1], forced)


def test_mixed_precision_models_decode():
    keras.config.set_dtype_policy("mixed_float16")
    model = tiny_model()
    ids, scores = beam_search(model, source_batch(), BOS, EOS, max_output_length=6)
    assert ids.dtype == np.int32 and scores.dtype == np.float32
    assert np.all(np.isfinite(scores)) and np.all((ids >= 0) & (ids < 20))


def test_bad_arguments_are_explained():
    model = tiny_model()
    source = source_batch()
    with pytest.raises(ValueError, match="beam_size=0 must be a positive integer"):
        beam_search(model, source, BOS, EOS, beam_size=0)
    with pytest.raises(ValueError, match="alpha=-0.5 must be a number >= 0"):
        beam_search(model, source, BOS, EOS, alpha=-0.5)
    with pytest.raises(ValueError, match=r"bos_id=20 must be .*\(0 <= bos_id < 20\)"):
        greedy_search(model, source, 20, 2)
    with pytest.raises(ValueError, match="eos_id=0 equals the padding id"):
        greedy_search(model, source, 1, 0)
    with pytest.raises(ValueError, match="max_output_length=0 must be a positive integer"):
        greedy_search(model, source, BOS, EOS, max_output_length=0)
    with pytest.raises(ValueError, match=r"add a batch axis"):
        greedy_search(model, source[0], BOS, EOS)
    with pytest.raises(ValueError, match="ragged"):
        greedy_search(model, [[3, 4, 5], [3]], BOS, EOS)
    with pytest.raises(ValueError, match=r"ids from 3 to 25, outside .* id < 20"):
        greedy_search(model, [[3, 25]], BOS, EOS)
    with pytest.raises(TypeError, match="needs a keras_transformer.Transformer"):
        beam_search(keras.Sequential(), source, BOS, EOS)
    learned = tiny_model(position_encoding="learned", max_length=8)
    with pytest.raises(ValueError, match="max_length=8"):
        beam_search(learned, np.ones((1, 9), "int32"), BOS, EOS)


# Token ids: out of range, wrong shapes, empty batches.
@pytest.mark.parametrize("source_ids, message", [
    (np.array([[5, 20, 3]]), "outside the vocabulary"),
    (np.array([[5, -1, 3]]), "outside the vocabulary"),
    (np.array([5, 6, 3]), "add a batch axis"),
    ([[5, 6, 3], [7, 3]], "ragged list"),
    (np.array([[0.5, 3.0]]), "matrix of int ids"),
])
def test_bad_token_ids_are_rejected_before_decoding(model, source_ids, message):
    with pytest.raises(ValueError, match=message):
        beam_search(model, source_ids, bos_id=BOS, eos_id=EOS)


@pytest.mark.parametrize("options, message", [
    (dict(beam_size=0), "beam_size=0 must be a positive integer"),
    (dict(alpha=-0.5), "alpha=-0.5 must be a number >= 0"),
    (dict(max_output_length=0), "max_output_length=0 must be a positive integer"),
    (dict(eos_id=VOCABULARY.pad_id), "equals the padding id"),
    (dict(bos_id=99), "bos_id=99 must be an integer id of the target vocabulary"),
    (dict(num_return=0), "num_return=0 must be a positive integer"),
    (dict(num_return=2.0), "num_return=2.0 must be a positive integer"),
    (dict(num_return=True), "num_return=True must be a positive integer"),
    (dict(num_return=5), "num_return=5 is more than beam_size=4: .* raise beam_size"),
])
def test_bad_search_options_say_what_to_pass(model, options, message):
    arguments = dict(bos_id=BOS, eos_id=EOS)
    arguments.update(options)
    with pytest.raises(ValueError, match=message):
        beam_search(model, np.array([[5, 6, EOS]]), **arguments)


def test_an_empty_batch_decodes_to_an_empty_result(model):
    ids, scores = greedy_search(model, np.zeros((0, 4), "int32"), bos_id=BOS, eos_id=EOS)
    assert ids.shape == (0, 0) and scores.shape == (0,)
    ids, scores = beam_search(model, np.zeros((0, 4), "int32"), BOS, EOS, num_return=3)
    assert ids.shape == (0, 3, 0) and scores.shape == (0, 3)



def test_trained_model_reverses_sequences_with_beam_search(reversal):
    source, expected = reversal.held_out()
    vocabulary = reversal.vocabulary
    ids, scores = beam_search(reversal.model, source, vocabulary.bos_id, vocabulary.eos_id)
    exact = np.mean([got == want for got, want in zip(strip(ids), expected)])
    assert exact >= 0.85, f"only {exact:.0%} of held-out sequences reversed exactly"
    assert np.all(scores <= 0)


SEARCH_SCRIPT = """
import sys, numpy as np, keras
from keras_transformer.inference import beam_search
model = keras.saving.load_model(sys.argv[1])
source = np.load(sys.argv[2])
ids, scores = beam_search(model, source, bos_id=int(sys.argv[4]), eos_id=int(sys.argv[5]),
                          beam_size=4, alpha=0.6)
n_best_ids, n_best_scores = beam_search(model, source, int(sys.argv[4]), int(sys.argv[5]),
                                        beam_size=4, alpha=0.6, num_return=4)
np.savez(sys.argv[3], ids=ids, scores=scores, n_best_ids=n_best_ids, n_best_scores=n_best_scores)
"""


@pytest.mark.once("torch")  # runs the other two backends in processes of their own
@pytest.mark.backs("README.md", "loads under any of the three backends")
def test_same_weights_give_the_same_beam_search_under_every_backend(tmp_path, reversal):
    model, vocabulary = reversal.model, reversal.vocabulary
    source = reversal.held_out(32)[0]
    ids, scores = beam_search(model, source, vocabulary.bos_id, vocabulary.eos_id,
                              beam_size=4, alpha=0.6)
    n_best_ids, n_best_scores = beam_search(model, source, vocabulary.bos_id,
                                            vocabulary.eos_id, beam_size=4, alpha=0.6,
                                            num_return=4)
    model_path, source_path = tmp_path / "model.keras", tmp_path / "source.npy"
    model.save(model_path)
    np.save(source_path, source)
    # One subprocess per other backend, run side by side.
    runs = {}
    for backend in BACKENDS:
        if backend == keras.backend.backend():
            continue
        out_path, log_path = tmp_path / f"search_{backend}.npz", tmp_path / f"{backend}.log"
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=REPOSITORY + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [sys.executable, "-c", SEARCH_SCRIPT, str(model_path), str(source_path),
                 str(out_path), str(vocabulary.bos_id), str(vocabulary.eos_id)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        runs[backend] = (process, out_path, log_path)
    try:
        for backend, (process, out_path, log_path) in runs.items():
            process.wait(timeout=300)
            assert process.returncode == 0, f"{backend}: {log_path.read_text()[-3000:]}"
            other = np.load(out_path)
            np.testing.assert_array_equal(other["ids"], ids, err_msg=backend)
            np.testing.assert_allclose(other["scores"], scores, atol=1e-4, err_msg=backend)
            np.testing.assert_array_equal(other["n_best_ids"], n_best_ids, err_msg=backend)
            np.testing.assert_allclose(other["n_best_scores"], n_best_scores, atol=1e-4,
                                       err_msg=backend)
    finally:
        for process, _, _ in runs.values():
            if process.poll() is None:
                process.kill()
