"""The projection and the label-smoothed loss in chunks of positions
(`keras_transformer.chunked_loss`): the same values and gradients as the
projection followed by `LabelSmoothedCrossEntropy`, and the same training under `fit`,
on every backend."""

import dataclasses

import keras
import numpy as np
import pytest
from helpers import to_numpy
from keras import ops

import keras_transformer as kt
from keras_transformer import LabelSmoothedCrossEntropy, MaskedTokenAccuracy
from keras_transformer.chunked_loss import projected_loss

RNG = np.random.default_rng(3)


def gradients_of(function, arrays, compiled=False):
    """The backend's own autodiff of the scalar `function(*arrays)` with respect to
    each array, jit-compiled when `compiled`."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        grad = jax.grad(function, argnums=tuple(range(len(arrays))))
        return [np.asarray(g) for g in (jax.jit(grad) if compiled else grad)(*arrays)]
    if backend == "tensorflow":
        import tensorflow as tf

        def grad(*tensors):
            with tf.GradientTape() as tape:
                tape.watch(tensors)
                value = function(*tensors)
            return tape.gradient(value, tensors)

        if compiled:
            grad = tf.function(grad, jit_compile=True)
        return [np.asarray(g) for g in grad(*[tf.convert_to_tensor(a) for a in arrays])]
    import torch

    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    function(*tensors).backward()
    return [t.grad.numpy() for t in tensors]


def reference_sum(hidden, kernel, bias, labels, weights, eps):
    """Σ weights · loss through the full logits, the reference."""
    logits = ops.matmul(hidden, kernel)
    if bias is not None:
        logits = logits + ops.convert_to_tensor(bias)
    log_probs = ops.log_softmax(logits, axis=-1)
    losses = -(1 - eps) * ops.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]
    if eps:
        losses = losses - eps * ops.mean(log_probs, axis=-1)
    return ops.sum(losses * weights)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_size", [3, 64])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_the_chunked_loss_gives_the_full_logits_values_and_gradients(
        eps, chunk_size, with_bias, compiled):
    count, d_model, vocab = 10, 4, 9  # 10 positions in chunks of 3: 2 positions of padding
    hidden = RNG.normal(size=(count, d_model)).astype("float32")
    kernel = RNG.normal(size=(d_model, vocab)).astype("float32")
    bias = RNG.normal(size=(vocab,)).astype("float32")
    labels = RNG.integers(0, vocab, count).astype("int32")
    labels[3] = labels[4] = 5  # a label twice: its gradients add up
    weights = RNG.uniform(0.5, 2.0, count).astype("float32")
    weights[-3:] = 0.0  # padding

    def chunked(h, k, b=None):
        return projected_loss(h, k, b, ops.convert_to_tensor(labels),
                              ops.convert_to_tensor(weights), eps, chunk_size)[0]

    def full(h, k, b=None):
        return reference_sum(h, k, b, ops.convert_to_tensor(labels),
                             ops.convert_to_tensor(weights), eps)

    arrays = [hidden, kernel] + ([bias] if with_bias else [])
    np.testing.assert_allclose(float(to_numpy(chunked(*arrays))),
                               float(to_numpy(full(*arrays))), rtol=1e-5)
    got = gradients_of(chunked, arrays, compiled)
    expected = gradients_of(full, arrays, compiled)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=2e-5, rtol=1e-4)
    assert not got[0][-3:].any()  # padded positions get no gradient
    ids = to_numpy(projected_loss(hidden, kernel, bias if with_bias else None, labels,
                                  weights, eps, chunk_size)[1])
    logits = hidden @ kernel + (bias if with_bias else 0)
    np.testing.assert_array_equal(ids, logits.argmax(-1))


def test_without_gradient_it_scores_the_same():
    hidden = RNG.normal(size=(7, 4)).astype("float32")
    kernel = RNG.normal(size=(4, 6)).astype("float32")
    labels, weights = np.arange(7, dtype="int32") % 6, np.ones(7, "float32")
    scored = [to_numpy(projected_loss(hidden, kernel, None, labels, weights, 0.1, 2,
                                      with_gradient=flag)[0]) for flag in (True, False)]
    np.testing.assert_allclose(scored[0], scored[1], rtol=1e-6)


def batches(vocab, count=12, source_length=6, target_length=8):
    """Random pairs with right padding, and per-sequence sample weights."""
    source = RNG.integers(1, vocab, (count, source_length)).astype("int32")
    target = RNG.integers(1, vocab, (count, target_length + 1)).astype("int32")
    for row, length in enumerate(RNG.integers(2, target_length + 1, count)):
        target[row, length:] = 0
    weights = RNG.uniform(0.5, 1.5, count).astype("float32")
    return {"source": source, "target": target[:, :-1]}, target[:, 1:], weights


def trained(config, chunk_size, data, jit_compile="auto", policy=None):
    """Two epochs of fit, then evaluate: the history, the scores and the weights."""
    keras.utils.set_random_seed(7)
    model = kt.Transformer(config, dtype=policy)
    # SGD, whose updates follow the gradients' differences (Adam's normalised step can
    # turn a 1e-9 difference in a near-zero gradient into one of the learning rate).
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=LabelSmoothedCrossEntropy(0.1, chunk_size=chunk_size),
                  metrics=[MaskedTokenAccuracy()], jit_compile=jit_compile)
    x, y, weights = data
    history = model.fit(x, y, sample_weight=weights, batch_size=6, epochs=2, verbose=0,
                        shuffle=False)
    scores = model.evaluate(x, y, batch_size=6, verbose=0, return_dict=True)
    return model, history.history, scores


# The untied projection is the same arithmetic on other weights: one pass (the quickest).
@pytest.mark.parametrize("tied", [True, pytest.param(False, marks=pytest.mark.once("torch"))])
def test_fit_and_evaluate_train_as_with_the_full_logits(tied):
    config = dataclasses.replace(kt.TransformerConfig.tiny(vocab_size=23),
                                 tie_output_embedding=tied, share_embeddings=tied)
    data = batches(23)
    full, full_history, full_scores = trained(config, None, data)
    model, history, scores = trained(config, 5, data)
    for name in ("loss", "token_accuracy"):
        np.testing.assert_allclose(history[name], full_history[name], rtol=1e-5)
        np.testing.assert_allclose(scores[name], full_scores[name], rtol=1e-5)
    for got, expected in zip(model.get_weights(), full.get_weights()):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    # Outside fit and evaluate the model gives logits, in training mode too.
    x = {name: value[:2] for name, value in data[0].items()}
    assert tuple(model(x, training=True).shape) == (2, 8, 23)
    assert model.predict(x, verbose=0).shape == (2, 8, 23)


def test_a_batch_within_one_chunk_trains_as_with_the_full_logits():
    config = kt.TransformerConfig.tiny(vocab_size=23)
    data = batches(23)
    _, full_history, full_scores = trained(config, None, data)
    _, history, scores = trained(config, 1024, data)  # 6 × 8 positions a batch: one chunk
    for name in ("loss", "token_accuracy"):
        np.testing.assert_allclose(history[name], full_history[name], rtol=1e-5)
        np.testing.assert_allclose(scores[name], full_scores[name], rtol=1e-5)


@pytest.mark.once("tensorflow")
def test_fit_without_xla_on_tensorflow_takes_any_batch_shape():
    config = kt.TransformerConfig.tiny(vocab_size=19)
    data = batches(19, count=10)  # the last batch of 4 rows: another shape
    _, full_history, _ = trained(config, None, data, jit_compile=False)
    _, history, _ = trained(config, 7, data, jit_compile=False)
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=1e-5)


def test_mixed_precision_trains_as_with_the_full_logits():
    config = kt.TransformerConfig.tiny(vocab_size=21)
    data = batches(21)
    _, full_history, _ = trained(config, None, data, policy="mixed_float16")
    model, history, _ = trained(config, 4, data, policy="mixed_float16")
    # float16 products in both, summed in another order: close, not equal.
    np.testing.assert_allclose(history["loss"], full_history["loss"], rtol=2e-3)
    assert model.target_embedding.embeddings.dtype == "float32"


@pytest.mark.once("torch")
def test_a_saved_model_keeps_its_chunked_loss(tmp_path):
    config = kt.TransformerConfig.tiny(vocab_size=17)
    model, _, _ = trained(config, 6, batches(17))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.loss.chunk_size == 6
    x, y, _ = batches(17, count=4)
    np.testing.assert_allclose(loaded.evaluate(x, y, verbose=0), model.evaluate(x, y, verbose=0),
                               rtol=1e-5)


@pytest.mark.once("jax")
def test_the_loss_config_keeps_the_chunk_size_and_refuses_a_bad_one():
    loss = LabelSmoothedCrossEntropy(0.1, chunk_size=512)
    assert LabelSmoothedCrossEntropy.from_config(loss.get_config()).chunk_size == 512
    with pytest.raises(ValueError, match="chunk_size"):
        LabelSmoothedCrossEntropy(0.1, chunk_size=0)


def test_the_token_accuracy_takes_predicted_ids():
    metric = MaskedTokenAccuracy()
    metric.update_state(np.array([[1, 2, 0]]), np.array([[1, 3, 3]]))
    assert float(to_numpy(metric.result())) == 0.5
