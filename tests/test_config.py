"""Tests of TransformerConfig: presets, derived sizes, errors for bad values, and the
Table 3 variants."""

import dataclasses
import json

import numpy as np
import pytest

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.config import TABLE3_VARIANT_NAMES, table3_variants

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")


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


# Invalid configurations: the error names the field, the value and the rule.
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
    (dict(label_smoothing=1.0), r"label_smoothing=1.0 must be a number in \[0, 1\)"),
    (dict(position_encoding="rotary"),
     r"position_encoding='rotary' must be one of \('sinusoidal', 'learned'\)"),
    (dict(norm_position="middle"), r"norm_position='middle' must be one of \('post', 'pre'\)"),
    (dict(pad_id=100),
     r"pad_id=100 must be an id inside both vocabularies \(0 <= pad_id < 37\)"),
    (dict(pad_id=-1), "pad_id=-1 must be a non-negative integer"),
    (dict(pad_id=True), "pad_id=True must be a non-negative integer"),
    (dict(value_dim=0), "value_dim=0 must be a positive integer"),
    (dict(num_layers=True), "num_layers=True must be a positive integer"),
    (dict(target_vocab_size=50), "share_embeddings=True needs one shared vocabulary"),
    (dict(layer_norm_epsilon=0), "layer_norm_epsilon=0"),
    (dict(max_length=0), "max_length=0"),
])
def test_bad_values_name_the_field_value_and_rule(overrides, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.base(vocab_size=overrides.pop("vocab_size", 37), **overrides)


def test_explicit_key_dim_lifts_divisibility_rule():
    config = TransformerConfig(vocab_size=10, d_model=500, num_heads=8, key_dim=64)
    assert config.resolved_key_dim == 64


def test_value_dim_defaults_to_key_dim_and_can_differ():
    assert TransformerConfig(vocab_size=10, key_dim=32).resolved_value_dim == 32
    row_b = TransformerConfig(vocab_size=10, key_dim=32, value_dim=64)
    assert (row_b.resolved_key_dim, row_b.resolved_value_dim) == (32, 64)


def test_numpy_sizes_are_stored_as_python_numbers():
    c = TransformerConfig.tiny(vocab_size=np.int64(50), d_model=np.int32(32),
                               dropout_rate=np.float32(0.25), pad_id=np.int64(0))
    assert type(c.vocab_size) is type(c.d_model) is type(c.pad_id) is int
    assert type(c.dropout_rate) is float and c.dropout_rate == 0.25
    assert TransformerConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c


# The counts README.md states (a shared vocabulary of 37,000, `model.count_params()`).
# Building the models takes a few seconds each.
@pytest.mark.parametrize("preset, count", [("base", 63_119_496), ("big", 214_282_376)])
def test_parameter_counts_are_the_ones_the_readme_states(preset, count):
    config = getattr(TransformerConfig, preset)(vocab_size=37000)
    assert Transformer(config).count_params() == count


def small_variants():
    return table3_variants(TransformerConfig.small(vocab_size=100))


def test_table3_variants_have_the_papers_rows_in_order():
    variants = small_variants()
    assert tuple(variants) == TABLE3_VARIANT_NAMES and len(variants) == 15
    rows = {}
    for name, (row, _) in variants.items():
        rows.setdefault(row, []).append(name)
    assert rows == {
        "": ["base"],
        "A": ["heads1", "heads8", "heads16"],
        "B": ["key_dim_half"],
        "C": ["layers2", "layers4", "d_model_half", "d_model_double", "d_ff_half",
              "d_ff_double"],
        "D": ["dropout0", "dropout0.2", "no_label_smoothing"],
        "E": ["learned_positions"],
    }
    assert all(isinstance(config, TransformerConfig) for _, config in variants.values())


def fields(config):
    return (config.num_layers, config.d_model, config.num_heads, config.d_ff,
            config.resolved_key_dim, config.resolved_value_dim, config.dropout_rate,
            config.label_smoothing, config.position_encoding)


def test_each_table3_variant_changes_its_own_fields_of_the_base_row():
    base = TransformerConfig.small(vocab_size=100)
    assert fields(base) == (3, 256, 4, 1024, 64, 64, 0.1, 0.1, "sinusoidal")
    expected = {
        "base": fields(base),
        # (A) h · d_k = h · d_v = d_model.
        "heads1": (3, 256, 1, 1024, 256, 256, 0.1, 0.1, "sinusoidal"),
        "heads8": (3, 256, 8, 1024, 32, 32, 0.1, 0.1, "sinusoidal"),
        "heads16": (3, 256, 16, 1024, 16, 16, 0.1, 0.1, "sinusoidal"),
        # (B) d_k alone is halved; d_v keeps d_model / h.
        "key_dim_half": (3, 256, 4, 1024, 32, 64, 0.1, 0.1, "sinusoidal"),
        # (C) d_k = d_v = d_model / h follows d_model.
        "layers2": (2, 256, 4, 1024, 64, 64, 0.1, 0.1, "sinusoidal"),
        "layers4": (4, 256, 4, 1024, 64, 64, 0.1, 0.1, "sinusoidal"),
        "d_model_half": (3, 128, 4, 1024, 32, 32, 0.1, 0.1, "sinusoidal"),
        "d_model_double": (3, 512, 4, 1024, 128, 128, 0.1, 0.1, "sinusoidal"),
        "d_ff_half": (3, 256, 4, 512, 64, 64, 0.1, 0.1, "sinusoidal"),
        "d_ff_double": (3, 256, 4, 2048, 64, 64, 0.1, 0.1, "sinusoidal"),
        "dropout0": (3, 256, 4, 1024, 64, 64, 0.0, 0.1, "sinusoidal"),
        "dropout0.2": (3, 256, 4, 1024, 64, 64, 0.2, 0.1, "sinusoidal"),
        "no_label_smoothing": (3, 256, 4, 1024, 64, 64, 0.1, 0.0, "sinusoidal"),
        "learned_positions": (3, 256, 4, 1024, 64, 64, 0.1, 0.1, "learned"),
    }
    assert {name: fields(config) for name, (_, config) in small_variants().items()} == expected
    # Fields no row changes keep the base's values.
    for _, config in small_variants().values():
        assert (config.vocab_size, config.max_length, config.warmup_steps) == (100, 256, 1000)


def test_table3_variants_follow_the_given_base_row():
    base = TransformerConfig.base(vocab_size=37000)
    variants = table3_variants(base, ["key_dim_half", "heads16", "d_model_double"])
    assert list(variants) == ["key_dim_half", "heads16", "d_model_double"]
    row_b = variants["key_dim_half"][1]
    assert (row_b.resolved_key_dim, row_b.resolved_value_dim, row_b.num_heads) == (32, 64, 8)
    assert variants["heads16"][1].resolved_key_dim == 32
    assert variants["d_model_double"][1].resolved_key_dim == 128


def test_table3_variants_name_the_variant_that_does_not_fit():
    base = TransformerConfig.small(vocab_size=100, d_model=100, num_heads=4)
    assert table3_variants(base, ["base", "heads1"])["heads1"][1].resolved_key_dim == 100
    with pytest.raises(ValueError, match="variant 'heads8' .* d_model=100 is not divisible by "
                                         "num_heads=8"):
        table3_variants(base)
    with pytest.raises(ValueError, match=r"Unknown Table 3 variant\(s\) \['heads3'\]"):
        table3_variants(base, ["base", "heads3"])


def test_unknown_config_fields_are_listed_with_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown TransformerConfig fields \['heads'\]; "
                                         r"known fields are \[.*'num_heads'"):
        TransformerConfig.from_dict({"vocab_size": 10, "heads": 3})
