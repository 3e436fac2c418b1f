"""Tests of the greedy loop's token choice (keras_transformer/inference/greedy.py); the
loops themselves are tested through the searches in test_decoding.py."""

import numpy as np
from keras import ops

from keras_transformer.inference.greedy import most_probable


def test_the_most_probable_token_is_argmax_with_the_first_of_equals():
    log_probs = np.random.default_rng(3).normal(size=(6, 50)).astype("float32")
    log_probs[1, [4, 9, 30]] = 10.0  # a three-way tie: the first wins
    log_probs[2] = -np.inf  # every token impossible: the first, as argmax
    log_probs[3, -1] = 10.0  # the last token
    chosen = ops.convert_to_numpy(most_probable(ops.convert_to_tensor(log_probs), 0))
    assert chosen.dtype == np.int32
    np.testing.assert_array_equal(chosen, np.argmax(log_probs, axis=-1))
    np.testing.assert_array_equal(chosen[1:4], [4, 0, 49])


def test_a_nan_row_still_gets_a_token_of_the_vocabulary():
    log_probs = np.zeros((2, 8), "float32")
    log_probs[0, 3] = np.nan
    chosen = ops.convert_to_numpy(most_probable(ops.convert_to_tensor(log_probs), 0))
    assert 0 <= chosen[0] < 8 and chosen[1] == 0
