"""Tests of beam search's pieces (keras_transformer/inference/beam.py): the §6.1 length
penalty and the ranking of finished hypotheses. The search itself is tested in
test_decoding.py."""

import numpy as np
from keras import ops

from keras_transformer.inference.beam import _best_first, length_penalty


def test_length_penalty_is_the_papers():
    np.testing.assert_allclose(ops.convert_to_numpy(length_penalty(1, 0.6)), 1.0)
    np.testing.assert_allclose(ops.convert_to_numpy(length_penalty(7, 0.6)), 2.0**0.6,
                               rtol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(length_penalty(30, 0.0)), 1.0)


def test_equal_scores_rank_in_the_order_they_came_on_every_backend():
    # ops.top_k leaves ties to the backend; the n-best merge must not, so that
    # a hypothesis finished earlier keeps its place against an equal newcomer.
    scores = np.array([[-1.0, -2.0, -1.0, -np.inf, -0.5, -np.inf],
                       [-np.inf, -np.inf, -3.0, -3.0, -3.0, -3.0]], "float32")
    best = ops.convert_to_numpy(_best_first(scores, 4))
    np.testing.assert_array_equal(best, [[4, 0, 2, 1], [2, 3, 4, 5]])
    np.testing.assert_array_equal(ops.convert_to_numpy(_best_first(scores, 6))[:, 4:],
                                  [[3, 5], [0, 1]])
