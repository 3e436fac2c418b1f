"""Tests of §5.4 label smoothing and the masked token accuracy."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import LabelSmoothedCrossEntropy, MaskedTokenAccuracy

RNG = np.random.default_rng(0)


def numpy_smoothed_loss(labels, logits, eps, pad_id=0):
    """Mean over non-padding tokens of -Σ q'(k) log p(k), q' = (1-ε)δ + ε/K."""
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    vocab = logits.shape[-1]
    target = np.full(logits.shape, eps / vocab)
    target += (1 - eps) * np.eye(vocab)[labels]
    per_token = -(target * log_probs).sum(-1)
    mask = labels != pad_id
    return (per_token * mask).sum() / mask.sum()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_numpy_definition(eps):
    labels = np.array([[3, 1, 4, 0, 0], [2, 2, 0, 0, 0]])
    logits = RNG.normal(size=(2, 5, 6)).astype("float32") * 3
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)(labels, logits)
    np.testing.assert_allclose(float(ops.convert_to_numpy(loss)),
                               numpy_smoothed_loss(labels, logits, eps), rtol=1e-5)


def test_zero_smoothing_equals_sparse_categorical_crossentropy_on_real_tokens():
    labels = np.array([[3, 1, 4, 1]])
    logits = RNG.normal(size=(1, 4, 6)).astype("float32")
    ours = LabelSmoothedCrossEntropy(label_smoothing=0.0)(labels, logits)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    np.testing.assert_allclose(ops.convert_to_numpy(ours), ops.convert_to_numpy(keras_loss),
                               rtol=1e-5)


def test_padding_positions_are_ignored():
    labels = np.array([[3, 1, 0, 0]])
    logits = RNG.normal(size=(1, 4, 6)).astype("float32")
    changed = logits.copy()
    changed[:, 2:] = 1000.0
    loss = LabelSmoothedCrossEntropy(0.1)
    np.testing.assert_allclose(ops.convert_to_numpy(loss(labels, logits)),
                               ops.convert_to_numpy(loss(labels, changed)), rtol=1e-6)


def test_all_padding_batch_gives_zero_not_nan():
    loss = LabelSmoothedCrossEntropy(0.1)(np.zeros((2, 3), "int32"), np.zeros((2, 3, 5), "float32"))
    assert float(ops.convert_to_numpy(loss)) == 0.0


def test_sample_weight_per_sequence():
    labels = np.array([[3, 1, 0], [2, 2, 2]])
    logits = RNG.normal(size=(2, 3, 6)).astype("float32")
    loss = LabelSmoothedCrossEntropy(0.0)
    weighted = loss(labels, logits, sample_weight=np.array([1.0, 0.0]))
    only_first = numpy_smoothed_loss(labels[:1], logits[:1], 0.0) * 2 / 5
    np.testing.assert_allclose(float(ops.convert_to_numpy(weighted)), only_first, rtol=1e-5)


def test_loss_is_float32_for_low_precision_logits():
    labels = np.array([[1, 2, 3]])
    logits = ops.cast(RNG.normal(size=(1, 3, 6)), "bfloat16")
    loss = LabelSmoothedCrossEntropy(0.1)(labels, logits)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32"
    # Computed in float32 from the bfloat16 values, not in bfloat16.
    exact = numpy_smoothed_loss(labels, ops.convert_to_numpy(ops.cast(logits, "float32")), 0.1)
    np.testing.assert_allclose(float(ops.convert_to_numpy(loss)), exact, rtol=1e-5)


def test_loss_config_round_trip():
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.2, pad_id=3)
    revived = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(revived, LabelSmoothedCrossEntropy)
    assert revived.get_config() == loss.get_config()
    # The revived loss smooths by 0.2 and skips id 3, not id 0.
    labels = np.array([[3, 1, 0, 3]])
    logits = RNG.normal(size=(1, 4, 6)).astype("float32")
    np.testing.assert_allclose(float(ops.convert_to_numpy(revived(labels, logits))),
                               numpy_smoothed_loss(labels, logits, 0.2, pad_id=3), rtol=1e-5)


def test_bad_label_smoothing_raises():
    with pytest.raises(ValueError, match="label_smoothing=1.0"):
        LabelSmoothedCrossEntropy(label_smoothing=1.0)


def test_masked_token_accuracy_ignores_padding():
    labels = np.array([[1, 2, 0], [3, 0, 0]])
    logits = np.zeros((2, 3, 4), "float32")
    logits[0, 0, 1] = logits[0, 1, 3] = logits[1, 0, 3] = 1.0
    logits[0, 2, 2] = logits[1, 1:, 1] = 1.0  # wrong at padding: must not count
    metric = MaskedTokenAccuracy()
    metric.update_state(labels, logits)
    np.testing.assert_allclose(float(ops.convert_to_numpy(metric.result())), 2 / 3, rtol=1e-6)


def test_masked_token_accuracy_config_round_trip():
    metric = MaskedTokenAccuracy(pad_id=5, name="acc")
    revived = keras.metrics.deserialize(keras.metrics.serialize(metric))
    assert isinstance(revived, MaskedTokenAccuracy)
    assert revived.get_config() == metric.get_config()
    assert revived.name == "acc"
    # The revived metric skips id 5: one right of the two other tokens.
    labels = np.array([[0, 2, 5]])
    logits = np.zeros((1, 3, 6), "float32")
    logits[0, 0, 0] = logits[0, 1, 1] = logits[0, 2, 1] = 1.0
    revived.update_state(labels, logits)
    np.testing.assert_allclose(float(ops.convert_to_numpy(revived.result())), 0.5, rtol=1e-6)


# The fused form: one pass over the logits, its gradient written out. It must give
# the log-softmax form's values and gradients, padding included, on every backend,
# compiled, and in half precision.


def gradient_of(function, logits, compiled=False):
    """d function(logits) / d logits with the backend's own autodiff (compiled with
    jax.jit or tf.function(jit_compile=True) when `compiled`)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        grad = jax.grad(lambda z: function(z))
        return np.asarray((jax.jit(grad) if compiled else grad)(logits), "float32")
    if backend == "tensorflow":
        import tensorflow as tf

        def grad(z):
            with tf.GradientTape() as tape:
                tape.watch(z)
                value = function(z)
            return tape.gradient(value, z)

        if compiled:
            grad = tf.function(grad, jit_compile=True)
        return np.asarray(grad(tf.convert_to_tensor(logits)), "float32")
    import torch

    z = torch.tensor(ops.convert_to_numpy(ops.cast(logits, "float32"))).to(
        getattr(torch, keras.backend.standardize_dtype(logits.dtype)))
    z.requires_grad_(True)
    function(z).backward()
    return z.grad.float().numpy()


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("compiled", [False, True])
def test_the_fused_loss_gives_the_log_softmax_values_and_gradients(eps, compiled):
    labels = np.array([[3, 1, 4, 0, 0], [2, 5, 0, 0, 0]])
    logits = (RNG.normal(size=(2, 5, 7)) * 4).astype("float32")
    logits[:, 3:] = 1000.0  # padding: huge logits there change nothing
    weights = np.array([1.0, 0.5], "float32")
    fused = LabelSmoothedCrossEntropy(eps, fused=True)
    reference = LabelSmoothedCrossEntropy(eps, fused=False)
    values = [float(ops.convert_to_numpy(loss(labels, logits, sample_weight=weights)))
              for loss in (fused, reference)]
    np.testing.assert_allclose(values[0], values[1], rtol=1e-6)
    gradients = [gradient_of(lambda z, loss=loss: loss(labels, z, sample_weight=weights),
                             logits, compiled) for loss in (fused, reference)]
    np.testing.assert_allclose(gradients[0], gradients[1], atol=1e-7)
    assert not gradients[0][labels == 0].any()  # padding gets no gradient
    # ∂/∂z = (softmax(z) - q') / tokens, by hand, for one real position.
    z = logits[1, 1].astype("float64")
    softmax = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    target = (1 - eps) * np.eye(7)[5] + eps / 7
    np.testing.assert_allclose(gradients[0][1, 1], 0.5 * (softmax - target) / 5, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_fused_loss_in_half_precision_computes_in_float32(dtype):
    labels = np.array([[1, 2, 3, 0]])
    logits = ops.cast(RNG.normal(size=(1, 4, 6)) * 3, dtype)
    loss = LabelSmoothedCrossEntropy(0.1, fused=True)
    value = loss(labels, logits)
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    exact = numpy_smoothed_loss(labels, ops.convert_to_numpy(ops.cast(logits, "float32")), 0.1)
    np.testing.assert_allclose(float(ops.convert_to_numpy(value)), exact, rtol=1e-5)
    gradient = gradient_of(lambda z: loss(labels, z), logits)
    reference = gradient_of(lambda z: LabelSmoothedCrossEntropy(0.1, fused=False)(labels, z),
                            ops.cast(logits, "float32"))
    # The fused gradient comes back in the logits' dtype, rounded to it.
    np.testing.assert_allclose(gradient, reference, atol=2e-3, rtol=1e-2)
