"""Property tests (hypothesis) of the §3.2 masks and the §3.5 encodings, for
shapes and values the example-based tests do not pick."""

import numpy as np
from helpers import to_numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_transformer as kt
from keras_transformer.layers import MultiHeadAttention
from keras_transformer.layers.embedding import sinusoidal_position_encoding

# Each example builds or runs a small model; keep the count modest and let
# compilation take what it takes.
SETTINGS = settings(max_examples=10, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
_MODELS = {}


def cached(key, build):
    """One layer or model per key for all examples (building is the slow part)."""
    if key not in _MODELS:
        _MODELS[key] = build()
    return _MODELS[key]


@SETTINGS
@given(
    key_lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    query_length=st.integers(1, 5),
    num_heads=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
)
def test_attention_gives_padding_keys_zero_weight(key_lengths, query_length, num_heads, seed):
    batch, width = len(key_lengths), 7
    rng = np.random.default_rng(seed)
    query = rng.normal(size=(batch, query_length, 8)).astype("float32")
    value = rng.normal(size=(batch, width, 8)).astype("float32")
    mask = np.arange(width)[None, :] < np.array(key_lengths)[:, None]
    attention = cached(num_heads, lambda: MultiHeadAttention(num_heads=num_heads, key_dim=4))
    weights = attention.attention_weights(query, value, key_padding_mask=mask)
    weights = to_numpy(weights)  # (batch, heads, T, S)
    assert np.all(weights[~np.broadcast_to(mask[:, None, None, :], weights.shape)] == 0.0)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)


@SETTINGS
# Three lengths (the shortest, a middle one, the longest), so that JAX, which
# compiles each op of an eager call anew for each shape, compiles three times;
# the cut and the values vary freely.
@given(length=st.sampled_from([2, 5, 9]), cut=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_causal_decoder_outputs_do_not_depend_on_later_positions(length, cut, seed):
    cut = min(cut, length - 1)
    model = cached("decoder", lambda: kt.Transformer(
        kt.TransformerConfig.tiny(vocab_size=20, num_layers=1, dropout_rate=0.0)))
    rng = np.random.default_rng(seed)
    source = rng.integers(3, 20, size=(1, 5)).astype("int32")
    target = rng.integers(3, 20, size=(1, length)).astype("int32")
    changed = target.copy()
    changed[:, cut:] = rng.integers(3, 20, size=(1, length - cut))
    encoded, source_mask = model.encode(source)
    before = to_numpy(model.decode(target, encoded, source_mask))
    after = to_numpy(model.decode(changed, encoded, source_mask))
    np.testing.assert_allclose(before[:, :cut], after[:, :cut], rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(start=st.integers(0, 5000), half_d_model=st.integers(1, 256))
def test_position_encoding_matches_the_formula(start, half_d_model):
    """Every entry of eight positions of PE, from `start`, against the formula
    computed in float64."""
    d_model = 2 * half_d_model
    encoding = to_numpy(sinusoidal_position_encoding(8, d_model, start_index=start))
    positions = np.arange(start, start + 8, dtype="float64")[:, None]
    angles = positions / 10000 ** (2 * np.arange(half_d_model) / d_model)
    # float32 arguments: an angle of up to 5000 radians carries ~3e-4 rounding.
    tolerance = 1e-6 + 4e-7 * positions
    assert np.all(np.abs(encoding[:, 0::2] - np.sin(angles)) <= tolerance)
    assert np.all(np.abs(encoding[:, 1::2] - np.cos(angles)) <= tolerance)
