"""Tests of the shared argument checks: what each accepts, and what its errors say."""

import math
import re

import numpy as np
import pytest

from keras_transformer.validation import (
    NORM_POSITIONS,
    POSITION_ENCODINGS,
    check_choice,
    check_non_negative_int,
    check_non_negative_number,
    check_positive_int,
    check_positive_range,
    check_rate,
    head_dims,
)

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")


@pytest.mark.parametrize("value", [1, 7, np.int32(3), np.int64(2**40)])
def test_positive_int_accepts_python_and_numpy_integers_as_int(value):
    result = check_positive_int("num_layers", value)
    assert result == value and type(result) is int


@pytest.mark.parametrize("value", [0, -1, 2.0, 2.5, "3", None, True, np.float32(2)])
def test_positive_int_rejects_non_integers_bools_and_values_below_one(value):
    with pytest.raises(ValueError, match=re.escape(f"num_layers={value!r} must be a positive "
                                                   "integer.")):
        check_positive_int("num_layers", value)


def test_hint_says_how_to_fix():
    with pytest.raises(ValueError) as error:
        check_positive_int("beam_size", 0, "use 1 for greedy search")
    assert str(error.value) == "beam_size=0 must be a positive integer: use 1 for greedy search."


@pytest.mark.parametrize("value", [0, 5, np.int16(0)])
def test_non_negative_int_accepts_zero(value):
    assert check_non_negative_int("pad_id", value) == value


@pytest.mark.parametrize("value", [-1, 0.0, False, "0"])
def test_non_negative_int_rejects(value):
    with pytest.raises(ValueError, match=re.escape(f"pad_id={value!r} must be a non-negative "
                                                   "integer.")):
        check_non_negative_int("pad_id", value)


@pytest.mark.parametrize("value", [0, 0.0, 0.1, 0.999, np.float32(0.5)])
def test_rate_accepts_numbers_in_zero_one(value):
    result = check_rate("dropout_rate", value)
    assert result == pytest.approx(float(value)) and type(result) is float


@pytest.mark.parametrize("value", [1, 1.0, -0.1, 2, math.nan, math.inf, True, "0.1", None])
def test_rate_rejects_numbers_outside_zero_one(value):
    with pytest.raises(ValueError, match=re.escape(f"dropout_rate={value!r} must be a number "
                                                   "in [0, 1).")):
        check_rate("dropout_rate", value)


@pytest.mark.parametrize("value", [0, 0.6, 3, math.inf, np.float64(1.5)])
def test_non_negative_number_accepts(value):
    assert check_non_negative_number("alpha", value) == float(value)


@pytest.mark.parametrize("value", [-0.5, -1, math.nan, False, "1", None])
def test_non_negative_number_rejects_negatives_nan_and_non_numbers(value):
    with pytest.raises(ValueError, match=re.escape(f"alpha={value!r} must be a number >= 0")):
        check_non_negative_number("alpha", value, "0 turns the length penalty off")


def test_choice_returns_the_value_or_lists_the_choices():
    assert check_choice("norm_position", "pre", NORM_POSITIONS) == "pre"
    with pytest.raises(ValueError) as error:
        check_choice("position_encoding", "rotary", POSITION_ENCODINGS)
    assert str(error.value) == ("position_encoding='rotary' must be one of "
                                "('sinusoidal', 'learned').")


def test_option_lists():
    assert NORM_POSITIONS == ("post", "pre")
    assert POSITION_ENCODINGS == ("sinusoidal", "learned")


@pytest.mark.parametrize("arguments, expected", [
    ((512, 8), (64, 64)),
    ((1024, 16), (64, 64)),
    ((512, 1), (512, 512)),
    ((500, 8, 64), (64, 64)),  # an explicit d_k lifts the divisibility rule
    ((512, 8, 32), (32, 32)),  # d_v follows d_k
    ((512, 8, 32, 64), (32, 64)),  # Table 3 row (B): d_k alone shrinks
    ((512, 8, None, 16), (64, 16)),
])
def test_head_dims(arguments, expected):
    assert head_dims(*arguments) == expected


def test_head_dims_explains_indivisible_d_model():
    with pytest.raises(ValueError) as error:
        head_dims(500, 8)
    assert str(error.value) == ("d_model=500 is not divisible by num_heads=8: choose d_model "
                                "as a multiple of num_heads, or pass key_dim.")


@pytest.mark.parametrize("arguments, message", [
    ((0, 8), "d_model=0 must be a positive integer"),
    ((512, 0), "num_heads=0 must be a positive integer"),
    ((512, 8, 0), "key_dim=0 must be a positive integer"),
    ((512, 8, 64, -1), "value_dim=-1 must be a positive integer"),
    ((512.0, 8), "d_model=512.0 must be a positive integer"),
])
def test_head_dims_checks_each_size(arguments, message):
    with pytest.raises(ValueError, match=message):
        head_dims(*arguments)


def test_check_positive_range():
    assert check_positive_range("low", 2, "high", 2) == (2, 2)
    assert check_positive_range("low", 1, "high", np.int64(5)) == (1, 5)
    with pytest.raises(ValueError, match="low=3 is above high=2: the lower bound cannot"):
        check_positive_range("low", 3, "high", 2)
    with pytest.raises(ValueError, match="high=0 must be a positive integer"):
        check_positive_range("low", 1, "high", 0)
