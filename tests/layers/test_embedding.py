"""Tests of §3.4 embeddings and §3.5 positional encodings."""

import math
import re

import keras
import numpy as np
import pytest
from helpers import run_layer_test, to_numpy

from keras_transformer.layers import (
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    sinusoidal_position_encoding,
)


def numpy_position_encoding(length, d_model, start=0):
    """§3.5 written out element by element."""
    pe = np.zeros((length, d_model))
    for pos in range(start, start + length):
        for dim in range(d_model):
            i = dim // 2
            angle = pos / 10000 ** (2 * i / d_model)
            pe[pos - start, dim] = math.sin(angle) if dim % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("length, d_model, start", [(50, 16, 0), (7, 9, 0), (5, 512, 100)])
def test_sinusoidal_encoding_matches_formula(length, d_model, start):
    np.testing.assert_allclose(
        to_numpy(sinusoidal_position_encoding(length, d_model, start_index=start)),
        numpy_position_encoding(length, d_model, start),
        atol=2e-5,
    )


def test_sinusoidal_layer_contract():
    run_layer_test(
        SinusoidalPositionEncoding, {}, {"inputs": np.zeros((2, 7, 6), "float32")},
        expected_output_shape=(2, 7, 6), run_training=False,
    )


def test_sinusoidal_layer_start_index_shifts_positions():
    layer = SinusoidalPositionEncoding()
    out = to_numpy(layer(np.zeros((1, 3, 8), "float32"), start_index=4))
    np.testing.assert_allclose(out[0], numpy_position_encoding(3, 8, start=4), atol=1e-5)


@pytest.mark.parametrize("make", [SinusoidalPositionEncoding,
                                  lambda: LearnedPositionEmbedding(max_length=8)],
                         ids=["sinusoidal", "learned"])
def test_position_encodings_pass_the_keras_mask_on(make):
    """Embedding(mask_zero=True) + positions keeps the mask: pooling skips the padding."""
    ids = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True)(ids)
    summed = keras.layers.Add()([embedded, make()(embedded)])
    model = keras.Model(ids, [summed, keras.layers.GlobalAveragePooling1D()(summed)])
    padded = np.array([[3, 4, 0, 0], [5, 6, 7, 8]])
    vectors, pooled = (to_numpy(x) for x in model(padded))
    np.testing.assert_allclose(pooled[0], vectors[0, :2].mean(0), atol=1e-6)
    np.testing.assert_allclose(pooled[1], vectors[1].mean(0), atol=1e-6)


def test_token_embedding_contract():
    run_layer_test(
        TokenEmbedding, dict(vocab_size=11, d_model=6),
        {"inputs": np.array([[1, 2, 3], [4, 0, 10]], "int32")},
        expected_output_shape=(2, 3, 6),
    )


def test_token_embedding_is_scaled_by_sqrt_d_model():
    layer = TokenEmbedding(vocab_size=5, d_model=16)
    out = to_numpy(layer(np.array([[3]])))
    np.testing.assert_allclose(out[0, 0], to_numpy(layer.embeddings)[3] * 4.0, rtol=1e-6)
    unscaled = TokenEmbedding(vocab_size=5, d_model=16, scale_embeddings=False)
    np.testing.assert_allclose(
        to_numpy(unscaled(np.array([[3]])))[0, 0], to_numpy(unscaled.embeddings)[3]
    )


def test_reverse_projection_shares_the_embedding_matrix():
    layer = TokenEmbedding(vocab_size=7, d_model=4, use_output_bias=True)
    layer.build()
    layer.output_bias.assign(np.arange(7, dtype="float32"))
    hidden = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
    logits = layer(hidden, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    expected = hidden @ to_numpy(layer.embeddings).T + np.arange(7)
    np.testing.assert_allclose(to_numpy(logits), expected, atol=1e-5)


def test_reverse_projection_by_the_kernel_made_beforehand():
    layer = TokenEmbedding(vocab_size=7, d_model=4, use_output_bias=True)
    layer.build()
    layer.output_bias.assign(np.arange(7, dtype="float32"))
    kernel = layer.reverse_kernel()
    assert tuple(kernel.shape) == (4, 7)
    np.testing.assert_array_equal(to_numpy(kernel), to_numpy(layer.embeddings).T)
    hidden = np.random.default_rng(1).normal(size=(2, 3, 4)).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(hidden, reverse=True, reverse_kernel=kernel)),
                               to_numpy(layer(hidden, reverse=True)), atol=1e-6)
    # The kernel given is the one multiplied by, not the layer's embeddings.
    doubled = to_numpy(layer(hidden, reverse=True, reverse_kernel=2 * to_numpy(kernel)))
    np.testing.assert_allclose(doubled, 2 * (hidden @ to_numpy(kernel)) + np.arange(7),
                               atol=1e-5)


def test_reverse_projection_is_float32_under_mixed_precision():
    layer = TokenEmbedding(vocab_size=7, d_model=4, dtype="mixed_bfloat16")
    vectors = layer(np.array([[1, 2]]))
    assert keras.backend.standardize_dtype(vectors.dtype) == "bfloat16"
    logits = layer(vectors, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


def test_learned_position_embedding_contract():
    run_layer_test(
        LearnedPositionEmbedding, dict(max_length=10),
        {"inputs": np.zeros((2, 7, 6), "float32")},
        expected_output_shape=(2, 7, 6),
    )


def test_learned_position_embedding_slices_from_start_index():
    layer = LearnedPositionEmbedding(max_length=10)
    layer.build((None, None, 4))
    out = to_numpy(layer(np.zeros((1, 3, 4), "float32"), start_index=5))
    np.testing.assert_allclose(out[0], to_numpy(layer.position_embeddings)[5:8])


def test_learned_position_embedding_rejects_long_inputs():
    layer = LearnedPositionEmbedding(max_length=4)
    with pytest.raises(ValueError, match="longer than max_length=4"):
        layer(np.zeros((1, 5, 2), "float32"))


@pytest.mark.parametrize("make, message", [
    (lambda: TokenEmbedding(vocab_size=0, d_model=4), "vocab_size=0 must be a positive integer"),
    (lambda: TokenEmbedding(vocab_size=10, d_model=4.0), "d_model=4.0 must be a positive integer"),
    (lambda: LearnedPositionEmbedding(max_length=-1), "max_length=-1 must be a positive integer"),
])
def test_bad_sizes_are_explained(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_numpy_sizes_give_a_serializable_config():
    layer = TokenEmbedding(vocab_size=np.int64(10), d_model=np.int32(4))
    config = layer.get_config()
    assert type(config["vocab_size"]) is type(config["d_model"]) is int


# The lookup's gradient under mixed precision (§5.4 trains in reduced precision
# on GPUs): a frequent token's row receives thousands of updates, which must be
# summed in float32. The row sums below need 12 significant bits, past
# bfloat16's 8, and under mixed_float16 the loss-scaled sum passes float16's
# largest value, so a sum in the compute dtype is wrong (bfloat16) or
# overflows and the loss scaler skips the step (float16).
ZIPF_IDS = ((np.random.default_rng(0).zipf(1.5, size=(4, 1024)) - 1) % 50).astype("int32")


class _WeightedSum(keras.losses.Loss):
    """sum(outputs * weights), with weights that bfloat16 and float16 hold exactly."""

    def __init__(self, weights):
        super().__init__(reduction="sum", dtype="float32")
        self.weights = weights

    def call(self, y_true, y_pred):
        return keras.ops.sum(keras.ops.multiply(keras.ops.cast(y_pred, "float32"),
                                                keras.ops.convert_to_tensor(self.weights)))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_the_lookup_gradient_is_summed_in_float32_under_mixed_precision(policy):
    keras.config.set_dtype_policy(policy)
    d_model = 16  # √d_model = 4, exact in every dtype
    weights = np.full((*ZIPF_IDS.shape, d_model), 2.0**-10, "float32")
    weights[..., ::2] = 2.0**-11
    layer = TokenEmbedding(vocab_size=50, d_model=d_model)
    model = keras.Sequential([keras.Input(ZIPF_IDS.shape[1:], dtype="int32"), layer])
    # SGD with rate 1: the update is the gradient. Under mixed_float16 Keras
    # wraps it in loss scaling, which skips a step whose gradient overflowed.
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=_WeightedSum(weights),
                  jit_compile=keras.backend.backend() != "torch")
    before = layer.get_weights()[0].astype("float64")
    model.train_on_batch(ZIPF_IDS, np.zeros(weights.shape, "float32"))
    update = before - layer.get_weights()[0]
    expected = np.zeros_like(before)
    np.add.at(expected, ZIPF_IDS.ravel(), 4.0 * weights.reshape(-1, d_model))
    assert np.bincount(ZIPF_IDS.ravel()).max() > 1000 and expected.max() > 4
    np.testing.assert_allclose(update, expected, rtol=0, atol=2e-6)


def _tiny_transformer_for_training(policy):
    import keras_transformer as kt

    keras.config.set_dtype_policy(policy)
    config = kt.TransformerConfig.tiny(vocab_size=300)
    model = kt.Transformer(config)
    model.compile(optimizer=kt.paper_adam(config.d_model, 10),
                  loss=kt.LabelSmoothedCrossEntropy(0.1))
    batch = ({"source": ZIPF_IDS[:2, :6] + 4, "target": ZIPF_IDS[2:, :6] + 4},
             ZIPF_IDS[:2, 1:7] + 4)
    return model, batch


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="lowers JAX's train step")
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_jax_train_step_scatters_the_embedding_gradient_in_float32(policy):
    """Keras's JAX trainer calls the model through `stateless_call`, with no
    autocast scope around it: each layer opens its own, whatever its
    `autocast`. The HLO of the jitted train step, before XLA's passes, must
    still sum the table's gradient into a float32 [vocab, d_model] buffer."""
    import jax

    model, batch = _tiny_transformer_for_training(policy)
    model.optimizer.build(model.trainable_variables)
    state = tuple([v.value for v in variables] for variables in (
        model.trainable_variables, model.non_trainable_variables,
        model.optimizer.variables, model.metrics_variables))
    hlo = jax.jit(model.train_step).lower(state, batch).as_text(dialect="hlo")
    scatters = re.findall(r"= (\w+)\[([0-9,]*)\]\S* scatter\(", hlo)
    assert ("f32", "300,32") in scatters, scatters
    assert not [s for s in scatters if s[0] in ("bf16", "f16")], scatters


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="reads a TensorFlow graph")
def test_tensorflow_train_step_sums_no_gradient_in_the_compute_dtype():
    """TensorFlow's lookup gradient is an IndexedSlices that the optimizer
    sums: no scatter or segment sum of the traced step may run in bfloat16."""
    import tensorflow as tf

    model, (inputs, labels) = _tiny_transformer_for_training("mixed_bfloat16")

    @tf.function
    def step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = model.loss(labels, model(inputs, training=True))
        variables = model.trainable_variables
        model.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    graph = step.get_concrete_function(inputs, labels).graph
    sums = [(op.type, op.get_attr("T")) for op in graph.get_operations()
            if re.search("Scatter|SegmentSum", op.type) and "T" in op.node_def.attr]
    assert sums and all(dtype == tf.float32 for _, dtype in sums), sums


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="reads torch's autograd graph")
def test_torch_lookup_reads_the_float32_table():
    """The backward of the lookup must feed the float32 table's gradient
    directly (its index_add runs in float32), not through a cast."""
    model, (inputs, labels) = _tiny_transformer_for_training("mixed_bfloat16")
    loss = model.loss(labels, model(inputs, training=True))
    table = model.source_embedding.embeddings.value
    consumers, seen, stack = set(), set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for child, _ in node.next_functions:
            if getattr(child, "variable", None) is table:
                consumers.add(type(node).__name__)
            stack.append(child)
    assert any(re.search("Index|Embedding|Take|Gather", name) for name in consumers), consumers
