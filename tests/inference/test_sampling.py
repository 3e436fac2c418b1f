"""Tests of sampling (temperature, top-k, top-p) against naive references."""

import numpy as np
import pytest
from helpers import tiny_model
from keras import ops
from test_decoding import BOS, EOS, sequence_log_probs, source_batch, strip

from keras_transformer.inference import greedy_search, sample_search
from keras_transformer.inference.sampling import sample_tokens, uniform_for_stream

DRAWS = 20000
# One row's log-probabilities over 8 tokens: token 0 (padding) and 1 are never
# generated (-inf), as `_masked_log_probs` makes them.
LOG_PROBS = np.array([-np.inf, -np.inf, *np.log([0.30, 0.22, 0.18, 0.12, 0.10, 0.08])])


def filtered_distribution(temperature, top_k, top_p):
    """The distribution `sample_tokens` draws from, written out with NumPy:
    softmax at the temperature, the top k renormalised, then the smallest
    most-probable set reaching top_p of that, renormalised."""
    probs = np.exp(LOG_PROBS / temperature)
    order = np.argsort(-probs, kind="stable")
    if top_k:
        probs[order[top_k:]] = 0
    probs /= probs.sum()
    kept_mass = 0.0
    for token in order:
        if kept_mass >= top_p:
            probs[token] = 0
        kept_mass += probs[token]
    return probs / probs.sum()


def uniforms(count, seed=7, step=0, sample=0):
    streams = np.stack([np.full(count, seed), np.arange(count), np.full(count, sample)],
                       axis=1).astype("int32")
    return ops.convert_to_numpy(uniform_for_stream(streams, step))


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.6),
     (1.5, 4, 0.7)],
    ids=["plain", "cold", "hot", "top_k=3", "top_p=0.6", "all_three"])
def test_sampled_frequencies_match_the_filtered_distribution(temperature, top_k, top_p):
    log_probs = np.repeat(LOG_PROBS[None].astype("float32"), DRAWS, axis=0)
    tokens = ops.convert_to_numpy(
        sample_tokens(log_probs, uniforms(DRAWS), temperature, top_k, top_p))
    frequencies = np.bincount(tokens, minlength=len(LOG_PROBS)) / DRAWS
    expected = filtered_distribution(temperature, top_k, top_p)
    # Tokens outside the filtered set are never drawn; the others within about
    # 4 standard deviations of a binomial count (sqrt(p(1 - p) / N) <= 0.0036).
    assert np.all(frequencies[expected == 0] == 0)
    np.testing.assert_allclose(frequencies, expected, atol=0.015)


def test_the_random_numbers_are_uniform_and_fixed_by_seed_stream_and_step():
    values = uniforms(DRAWS)
    assert values.min() >= 0 and values.max() < 1
    np.testing.assert_allclose(np.histogram(values, bins=10, range=(0, 1))[0] / DRAWS, 0.1,
                               atol=0.01)
    np.testing.assert_array_equal(values, uniforms(DRAWS))
    for other in (uniforms(DRAWS, seed=8), uniforms(DRAWS, step=1), uniforms(DRAWS, sample=1),
                  values[1:]):
        # Other seeds, steps, samples and streams give uncorrelated numbers.
        assert abs(np.corrcoef(values[: len(other)], other[: len(values)])[0, 1]) < 0.03


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5, num_layers=1)


@pytest.mark.slow
def test_the_same_seed_gives_the_same_samples_whatever_the_batch(model):
    source = source_batch(batch_size=4)
    ids, scores = sample_search(model, source, BOS, EOS, seed=11, max_output_length=8)
    again, again_scores = sample_search(model, source, BOS, EOS, seed=11, max_output_length=8)
    np.testing.assert_array_equal(ids, again)
    np.testing.assert_array_equal(scores, again_scores)
    # Sentence 2 alone, with its stream id, samples what it sampled in the batch.
    alone, alone_scores = sample_search(model, source[2:3], BOS, EOS, seed=11,
                                        max_output_length=8, stream_ids=[2])
    assert strip(alone) == strip(ids[2:3])
    np.testing.assert_allclose(alone_scores, scores[2:3], rtol=1e-5)
    others = [strip(sample_search(model, source, BOS, EOS, seed=seed, max_output_length=8)[0])
              for seed in (12, 13)]
    assert strip(ids) != others[0] or strip(ids) != others[1]


@pytest.mark.slow
def test_top_k_one_is_greedy_search(model):
    source = source_batch()
    ids, scores = sample_search(model, source, BOS, EOS, top_k=1, seed=3, max_output_length=8)
    greedy_ids, greedy_scores = greedy_search(model, source, BOS, EOS, max_output_length=8)
    np.testing.assert_array_equal(ids, greedy_ids)
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-5)


def test_scores_are_the_model_log_probability_of_each_sample(model):
    source = source_batch()
    ids, scores = sample_search(model, source, BOS, EOS, temperature=1.5, seed=4,
                                max_output_length=8)
    for row, sample in enumerate(strip(ids)):
        expected, _ = sequence_log_probs(model, source[row], [sample], BOS)
        np.testing.assert_allclose(scores[row], expected[0], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_several_samples_per_sentence(model):
    source = source_batch()
    ids, scores = sample_search(model, source, BOS, EOS, num_return=5, seed=2,
                                max_output_length=8)
    assert ids.shape[:2] == (3, 5) and scores.shape == (3, 5)
    # The first sample of each sentence is its single sample.
    single, _ = sample_search(model, source, BOS, EOS, seed=2, max_output_length=8)
    assert strip(ids[:, 0]) == strip(single)
    assert any(len({tuple(s) for s in strip(ids[row])}) > 1 for row in range(3))


@pytest.mark.parametrize("options, message", [
    ({"temperature": 0}, "temperature=0 must be a finite number > 0"),
    ({"top_k": -1}, "top_k=-1 must be a non-negative integer"),
    ({"top_p": 0}, r"top_p=0 must be a number in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p=1.5 must be a number in \(0, 1\]"),
    ({"seed": 2**31}, "must be below 2\\*\\*31"),
    ({"num_return": 0}, "num_return=0 must be a positive integer"),
    ({"stream_ids": [0, 1]}, r"stream_ids must be \(3,\) ints"),
])
def test_bad_sampling_options_say_what_to_pass(model, options, message):
    with pytest.raises(ValueError, match=message):
        sample_search(model, source_batch(), BOS, EOS, **options)
