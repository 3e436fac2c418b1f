"""Tests of the §6.1 length limits ("input length + 50") that the Python path and the
SavedModel share (keras_transformer/inference/limits.py)."""

import numpy as np
from helpers import tiny_model
from keras import ops

from keras_transformer.inference.limits import (
    output_limits,
    position_limit,
    smallest_bucket,
    source_limit,
    source_width,
    truncate_source,
)

PAD = 0
SOURCE = np.array([[5, 6, 7, 3], [5, 3, PAD, PAD]], "int32")


def test_each_sentence_may_grow_to_its_own_length_plus_50():
    buffer_length, limits = output_limits(SOURCE, PAD)
    assert buffer_length == 4 + 50  # the batch's width + 50: room for the longest
    np.testing.assert_array_equal(ops.convert_to_numpy(limits), [4 + 50, 2 + 50])


def test_a_fixed_output_length_applies_to_every_sentence():
    buffer_length, limits = output_limits(SOURCE, PAD, max_output_length=9)
    assert buffer_length == 9
    np.testing.assert_array_equal(ops.convert_to_numpy(limits), [9, 9])


def test_learned_positions_cap_the_output_length():
    buffer_length, limits = output_limits(SOURCE, PAD, positions=20)
    assert buffer_length == 20
    np.testing.assert_array_equal(ops.convert_to_numpy(limits), [20, 20])
    assert position_limit(tiny_model(position_encoding="learned", max_length=20).config) == 20
    assert position_limit(tiny_model().config) is None  # sinusoids extend to any position


def test_source_width_rounds_up_to_a_multiple_of_8_within_the_model_limit():
    assert [source_width(n, 64) for n in (1, 8, 9, 17)] == [8, 8, 16, 24]
    assert source_width(13, 14) == 14  # never past max_length
    assert source_width(14, 14) == 14
    assert int(source_width(ops.convert_to_tensor(9), 64)) == 16  # tensors too, as in the graph


def test_smallest_bucket_for_ints_and_tensors():
    sizes = (1, 2, 4, 8)
    for value, expected in ((1, 1), (3, 4), (8, 8), (9, 8)):
        assert smallest_bucket(value, sizes) == expected
        tensor = ops.convert_to_tensor(value, "int32")
        assert int(ops.convert_to_numpy(smallest_bucket(tensor, sizes))) == expected


def test_sources_over_the_limit_keep_their_first_tokens_and_eos():
    assert truncate_source([5, 6, 7, 3], 4, 3) == ([5, 6, 7, 3], False)
    assert truncate_source([5, 6, 7, 8, 3], 4, 3) == ([5, 6, 7, 3], True)
    sinusoidal = tiny_model(vocab_size=20).config  # max_length 64
    assert source_limit(sinusoidal) == 1024 and source_limit(sinusoidal, 2000) == 2000
