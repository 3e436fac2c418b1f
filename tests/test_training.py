"""End-to-end training with model.fit (§5): mixed precision, and a model that learns."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.training.toy_tasks import reverse_task


def compile_model(model, learning_rate=None, warmup_steps=100, scale=1.0):
    optimizer = (
        keras.optimizers.Adam(learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
        if learning_rate else kt.paper_adam(model.config.d_model, warmup_steps, scale)
    )
    model.compile(
        optimizer=optimizer,
        loss=kt.LabelSmoothedCrossEntropy(model.config.label_smoothing),
        metrics=[kt.MaskedTokenAccuracy()],
    )


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_fit_gives_finite_decreasing_loss(policy):
    keras.config.set_dtype_policy(policy)
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=16, dropout_rate=0.1))
    compile_model(model, learning_rate=3e-3)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    inputs, labels = reverse_task(64, seed=3)
    history = model.fit(inputs, labels, batch_size=32, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] - 0.2, losses


def test_small_model_learns_to_reverse_sequences():
    """≥ 95% token accuracy on held-out sequences after a test-sized budget."""
    model = kt.Transformer(kt.TransformerConfig.tiny(
        vocab_size=16, d_model=64, d_ff=128, num_heads=4, label_smoothing=0.0
    ))
    compile_model(model, warmup_steps=100, scale=0.5)
    train_inputs, train_labels = reverse_task(4096, seed=1)
    test_inputs, test_labels = reverse_task(512, seed=2)
    model.fit(train_inputs, train_labels, batch_size=64, epochs=12, verbose=0)
    results = model.evaluate(test_inputs, test_labels, verbose=0, return_dict=True)
    assert results["token_accuracy"] >= 0.95, results
