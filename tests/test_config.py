"""Tests of TransformerConfig: presets, derived sizes, and errors for bad values."""

import dataclasses

import pytest

from keras_transformer import TransformerConfig


def test_base_preset_has_the_papers_values():
    c = TransformerConfig.base(vocab_size=37000)
    assert (c.num_layers, c.d_model, c.num_heads, c.d_ff) == (6, 512, 8, 2048)
    assert (c.resolved_key_dim, c.resolved_value_dim) == (64, 64)
    assert (c.dropout_rate, c.label_smoothing, c.warmup_steps) == (0.1, 0.1, 4000)
    assert c.position_encoding == "sinusoidal" and c.norm_position == "post"
    assert c.share_embeddings and c.tie_output_embedding and c.pad_id == 0
    assert c.attention_dropout_rate == 0 and c.activation_dropout_rate == 0


def test_big_preset_has_the_papers_values():
    c = TransformerConfig.big(vocab_size=37000)
    assert (c.d_model, c.num_heads, c.d_ff, c.dropout_rate) == (1024, 16, 4096, 0.3)
    assert c.resolved_key_dim == 64


def test_presets_take_overrides():
    assert TransformerConfig.big(vocab_size=10, dropout_rate=0.1).dropout_rate == 0.1
    assert TransformerConfig.tiny(vocab_size=10, num_layers=1).num_layers == 1


def test_table_3_rows_are_configs():
    base = TransformerConfig.base(vocab_size=100)
    one_head = dataclasses.replace(base, num_heads=1, key_dim=512)
    assert one_head.resolved_key_dim == one_head.resolved_value_dim == 512
    row_b = dataclasses.replace(base, key_dim=16)
    assert row_b.resolved_key_dim == 16 and row_b.num_heads == 8
    assert dataclasses.replace(base, position_encoding="learned").position_encoding == "learned"


def test_dict_round_trip():
    c = TransformerConfig.small(vocab_size=123, target_vocab_size=77, share_embeddings=False)
    assert TransformerConfig.from_dict(c.to_dict()) == c


def test_unknown_dict_field_is_named():
    with pytest.raises(ValueError, match="hidden_dim"):
        TransformerConfig.from_dict({"vocab_size": 10, "hidden_dim": 3})


@pytest.mark.parametrize("overrides, message", [
    (dict(d_model=500), "d_model=500 is not divisible by num_heads=8"),
    (dict(vocab_size=0), "vocab_size=0 must be a positive integer"),
    (dict(num_layers=-1), "num_layers=-1 must be a positive integer"),
    (dict(d_ff=2.5), "d_ff=2.5 must be a positive integer"),
    (dict(num_heads=0), "num_heads=0 must be a positive integer"),
    (dict(key_dim=0), "key_dim=0 must be a positive integer"),
    (dict(dropout_rate=1.0), r"dropout_rate=1.0 must be a number in \[0, 1\)"),
    (dict(dropout_rate=-0.1), "dropout_rate=-0.1"),
    (dict(attention_dropout_rate=2), "attention_dropout_rate=2"),
    (dict(label_smoothing=1.5), "label_smoothing=1.5"),
    (dict(position_encoding="rotary"), "position_encoding='rotary' must be one of"),
    (dict(norm_position="middle"), "norm_position='middle' must be one of"),
    (dict(pad_id=100), "pad_id=100 must be an integer id inside both vocabularies"),
    (dict(target_vocab_size=50), "share_embeddings=True needs one shared vocabulary"),
    (dict(layer_norm_epsilon=0), "layer_norm_epsilon=0"),
    (dict(max_length=0), "max_length=0"),
])
def test_bad_values_name_the_field_value_and_rule(overrides, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.base(vocab_size=overrides.pop("vocab_size", 37), **overrides)


def test_explicit_key_dim_lifts_divisibility_rule():
    assert TransformerConfig(vocab_size=10, d_model=500, num_heads=8, key_dim=64).resolved_key_dim == 64
