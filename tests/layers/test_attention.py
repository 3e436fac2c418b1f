"""Tests of §3.2 attention: eq. (1), multi-head attention, masks, the cache."""

import math

import keras
import numpy as np
import pytest
from helpers import run_layer_test, to_numpy

from keras_transformer.layers import MultiHeadAttention
from keras_transformer.layers import attention as attention_module

RNG = np.random.default_rng(0)


def numpy_attention(q, k, v, mask=None):
    """Eq. (1) for one head: softmax(q kᵀ / √d_k) v, with mask True = attend."""
    logits = q @ k.T / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return weights @ v, weights


def numpy_multi_head(layer, query, value, mask=None):
    """§3.2.2 with the layer's weights: per-head eq. (1), concat, W^O."""
    def project(dense, x):
        kernel, bias = (to_numpy(w) for w in dense.weights)
        return np.einsum("btd,dnh->btnh", x, kernel) + bias

    q, k, v = (project(layer.query_dense, query), project(layer.key_dense, value),
               project(layer.value_dense, value))
    heads = np.zeros(q.shape[:3] + (v.shape[-1],))
    weights = np.zeros((q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
    for b in range(q.shape[0]):
        for n in range(q.shape[2]):
            heads[b, :, n], weights[b, n] = numpy_attention(
                q[b, :, n], k[b, :, n], v[b, :, n], None if mask is None else mask[b]
            )
    kernel, bias = (to_numpy(w) for w in layer.output_dense.weights)
    return np.einsum("btnh,nhd->btd", heads, kernel) + bias, weights


def random(*shape):
    return RNG.normal(size=shape).astype("float32")


@pytest.fixture
def count_fused_calls(monkeypatch):
    """Counts calls of keras.ops.dot_product_attention (the fused path)."""
    calls = []
    fused = keras.ops.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(keras.ops, "dot_product_attention", spy)
    return calls


def test_layer_contract():
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4),
        {"query": random(2, 5, 8), "value": random(2, 6, 8)},
        expected_output_shape=(2, 5, 8),
    )


def test_layer_contract_causal_self_attention_with_padding():
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4, value_dim=3, output_dim=6),
        {"query": random(2, 5, 8), "key_padding_mask": mask},
        call_kwargs={"use_causal_mask": True},
        expected_output_shape=(2, 5, 6),
    )


def test_matches_numpy_multi_head_attention():
    layer = MultiHeadAttention(num_heads=3, key_dim=4, value_dim=5)
    query, value = random(2, 4, 6), random(2, 7, 6)
    output = layer(query, value)
    weights = layer.attention_weights(query, value)
    expected_output, expected_weights = numpy_multi_head(layer, query, value)
    np.testing.assert_allclose(to_numpy(output), expected_output, atol=1e-5)
    np.testing.assert_allclose(to_numpy(weights), expected_weights, atol=1e-6)


def test_fused_path_matches_explicit_path_and_numpy(count_fused_calls):
    layer = MultiHeadAttention(num_heads=4, key_dim=8)
    query = random(3, 6, 16)
    padding = np.array([[1] * 6, [1] * 4 + [0] * 2, [1] * 1 + [0] * 5], bool)
    fused = layer(query, key_padding_mask=padding, use_causal_mask=True)
    assert len(count_fused_calls) == 1
    layer.attention_weights(query, key_padding_mask=padding, use_causal_mask=True)
    assert len(count_fused_calls) == 1, "the weights come from the explicit path"
    layer._use_fused_attention = lambda training: False
    explicit = layer(query, key_padding_mask=padding, use_causal_mask=True)
    assert len(count_fused_calls) == 1
    np.testing.assert_allclose(to_numpy(fused), to_numpy(explicit), atol=1e-5)
    mask = padding[:, None, :] & np.tril(np.ones((6, 6), bool))[None]
    expected, _ = numpy_multi_head(layer, query, query, mask)
    np.testing.assert_allclose(to_numpy(fused), expected, atol=1e-5)


def test_causality_alone_reaches_the_fused_kernel_as_is_causal(monkeypatch):
    calls = []
    fused = keras.ops.dot_product_attention

    def spy(query, key, value, mask=None, is_causal=False, **kwargs):
        calls.append((mask, is_causal))
        return fused(query, key, value, mask=mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(keras.ops, "dot_product_attention", spy)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    query = random(2, 5, 8)
    output = layer(query, use_causal_mask=True)
    assert calls == [(None, True)], "no (batch, 1, T, T) mask tensor beside is_causal"
    expected, _ = numpy_multi_head(layer, query, query, np.tril(np.ones((2, 5, 5), bool)))
    np.testing.assert_allclose(to_numpy(output), expected, atol=1e-5)
    layer(query, key_padding_mask=np.ones((2, 5), bool), use_causal_mask=True)
    assert calls[1][0] is not None and not calls[1][1], "another mask: one mask tensor"


def test_attention_dropout_takes_explicit_path_only_in_training(count_fused_calls):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dropout_rate=0.5)
    query = random(2, 5, 8)
    layer(query, training=False)
    assert len(count_fused_calls) == 1
    first = layer(query, training=True)
    assert len(count_fused_calls) == 1
    second = layer(query, training=True)
    assert not np.allclose(to_numpy(first), to_numpy(second))


def test_padding_keys_get_zero_weight():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    query = random(2, 3, 8)
    value = random(2, 5, 8)
    padding = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], bool)
    weights = to_numpy(layer.attention_weights(query, value, key_padding_mask=padding))
    assert np.all(weights[0, :, :, 2:] == 0) and np.all(weights[1, :, :, 4:] == 0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    # Changing padded values changes nothing.
    changed = value.copy()
    changed[0, 2:] = 100.0
    np.testing.assert_allclose(
        to_numpy(layer(query, changed, key_padding_mask=padding)),
        to_numpy(layer(query, value, key_padding_mask=padding)),
        atol=1e-5,
    )


def test_causal_output_does_not_depend_on_later_positions():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = random(1, 6, 8)
    changed = x.copy()
    changed[:, 3:] = random(1, 3, 8)
    a = to_numpy(layer(x, use_causal_mask=True))
    b = to_numpy(layer(changed, use_causal_mask=True))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert not np.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_all_padding_row_is_finite(dtype):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dtype=dtype)
    x = random(2, 4, 8)
    padding = np.array([[0, 0, 0, 0], [1, 1, 0, 0]], bool)
    outputs = layer(x, key_padding_mask=padding, use_causal_mask=True)
    weights = layer.attention_weights(x, key_padding_mask=padding, use_causal_mask=True)
    for tensor in (outputs, weights):
        assert np.all(np.isfinite(to_numpy(tensor)))


def test_jit_compiled_call_matches_eager():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = random(2, 5, 8)
    padding = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
    model_inputs = {"x": keras.Input((5, 8), name="x"),
                    "mask": keras.Input((5,), dtype="bool", name="mask")}
    outputs = layer(model_inputs["x"], key_padding_mask=model_inputs["mask"],
                    use_causal_mask=True)
    model = keras.Model(model_inputs, outputs)
    model.compile(jit_compile=keras.backend.backend() != "torch")
    compiled = model.predict({"x": x, "mask": padding}, verbose=0)
    eager = layer(x, key_padding_mask=padding, use_causal_mask=True)
    np.testing.assert_allclose(compiled, to_numpy(eager), atol=1e-5)


@pytest.mark.parametrize("value_dim", [4, 6], ids=["d_v=d_k", "d_v!=d_k"])
def test_cached_self_attention_matches_full_attention(value_dim):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=value_dim)
    x = random(2, 6, 8)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = layer.initial_cache(2, 6)
    assert [tuple(part.shape) for part in cache] == [(2, 6, 2 * 4), (2, 6, 2 * value_dim)]
    steps = []
    for index in range(6):
        output, cache = layer(x[:, index : index + 1], use_causal_mask=True,
                              cache=cache, cache_update_index=index)
        steps.append(to_numpy(output))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_one_query_against_a_cache_matches_numpy(dtype):
    """The decoding step's path (one query, read from the cache) gives eq. (1)
    per head, with padding keys at zero weight (their values change nothing)."""
    layer = MultiHeadAttention(num_heads=3, key_dim=4, dtype=dtype)
    query, memory = random(2, 1, 8), random(2, 5, 8)
    padding = np.array([[True] * 5, [True, True, True, False, False]])
    layer(query, memory)  # builds the layer
    output, cache = layer(query, cache=layer.precompute_cache(memory), key_padding_mask=padding)
    expected, _ = numpy_multi_head(layer, query, memory, padding[:, None, :])
    tolerance = 1e-5 if dtype == "float32" else 5e-2
    np.testing.assert_allclose(to_numpy(output).astype("float32"), expected, atol=tolerance)
    changed = memory.copy()
    changed[1, 3:] = 100.0
    output_changed, _ = layer(query, cache=layer.precompute_cache(changed),
                              key_padding_mask=padding)
    np.testing.assert_allclose(to_numpy(output_changed), to_numpy(output), atol=tolerance)


@pytest.mark.parametrize("dtype", ["float32", "mixed_float16"])
@pytest.mark.parametrize("value_dim", [4, 6], ids=["d_v=d_k", "d_v!=d_k"])
def test_cross_cache_shared_by_groups_of_queries_matches_numpy(value_dim, dtype):
    # Beam search keeps one cross-attention row per sentence for its beams:
    # query rows 3b..3b+2 read cache row b.
    layer = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=value_dim, dtype=dtype)
    query, memory = random(6, 1, 8), random(2, 5, 8)
    padding = np.array([[True] * 5, [True, True, True, False, False]])
    layer(query, random(6, 5, 8))  # builds the layer
    output, _ = layer(query, cache=layer.precompute_cache(memory), key_padding_mask=padding)
    repeated = np.repeat(memory, 3, axis=0)
    expected, _ = numpy_multi_head(
        layer, query, repeated, np.repeat(padding, 3, axis=0)[:, None, :])
    tolerance = 1e-5 if dtype == "float32" else 5e-2
    assert tuple(output.shape) == (6, 1, 8)
    np.testing.assert_allclose(to_numpy(output).astype("float32"), expected, atol=tolerance)


def test_cross_cache_whose_batch_does_not_divide_the_querys_is_explained():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    query, memory = random(5, 1, 8), random(2, 5, 8)
    layer(query, random(5, 5, 8))  # builds the layer
    with pytest.raises(ValueError, match="not a multiple"):
        layer(query, cache=layer.precompute_cache(memory))


@pytest.mark.parametrize("value_dim", [4, 6], ids=["d_v=d_k", "d_v!=d_k"])
def test_precomputed_cross_attention_cache_matches_direct_call(value_dim):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=value_dim)
    query, memory = random(2, 3, 8), random(2, 5, 8)
    direct = to_numpy(layer(query, memory))
    cache = layer.precompute_cache(memory)
    cached, _ = layer(query, cache=cache)
    np.testing.assert_allclose(to_numpy(cached), direct, atol=1e-6)


def test_float16_explicit_fallback_only_for_jax_on_cpu():
    attention_module._fused_attention_fails_for_float16.cache_clear()
    expected = keras.backend.backend() == "jax" and all(
        d.lower().startswith("cpu") for d in keras.distribution.list_devices()
    )
    assert attention_module._fused_attention_fails_for_float16() == expected
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dtype="float16")
    assert layer._use_fused_attention(False) == (not expected)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_heads=0, key_dim=4), "num_heads=0"),
    (dict(num_heads=2, key_dim=-1), "key_dim=-1"),
    (dict(num_heads=2, key_dim=4, dropout_rate=1.0), "dropout_rate=1.0"),
])
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_logits_are_scaled_by_the_square_root_of_d_k():
    """Eq. (1) on numbers worked out by hand. d_model = 8, d_k = 4 and d_v = 3
    differ, so scaling by √d_model or √d_v instead of √d_k = 2 would show."""
    layer = MultiHeadAttention(num_heads=1, key_dim=4, value_dim=3)
    query = np.zeros((1, 1, 8), "float32")
    query[0, 0, 0] = 2.0
    keys = np.zeros((1, 2, 8), "float32")
    keys[0, 0, 0] = 1.0
    layer(query, keys)  # builds the layer
    # Queries and keys are the first four input features, unchanged.
    identity = np.zeros((8, 1, 4), "float32")
    identity[:4, 0, :] = np.eye(4)
    for dense in (layer.query_dense, layer.key_dense):
        dense.kernel.assign(identity)
        dense.bias.assign(np.zeros((1, 4), "float32"))
    weights = layer.attention_weights(query, keys)
    # q·k = (2, 0), divided by √4: logits (1, 0), softmax (e, 1) / (e + 1).
    np.testing.assert_allclose(to_numpy(weights)[0, 0, 0], [0.7310586, 0.2689414], rtol=1e-5)
