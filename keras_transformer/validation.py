"""The argument checks every module shares, and the option lists they check against.

No paper section: this is the one home of rules that several modules enforce,
such as "d_model must be divisible by num_heads unless key_dim is given" (§3.2.2),
so that a layer, the config and a recipe reject a bad value with the same words.

Every check returns the value it accepted and raises a `ValueError` that says
what was wrong, what was expected and, through `hint`, how to fix it:

>>> check_positive_int("num_layers", 6)
6
>>> check_rate("dropout_rate", 1.0)
Traceback (most recent call last):
...
ValueError: dropout_rate=1.0 must be a number in [0, 1).
"""

import math
import numbers

NORM_POSITIONS = ("post", "pre")
POSITION_ENCODINGS = ("sinusoidal", "learned")
# The Keras dtype policies training runs under (mixed_* keep float32 variables).
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def _fail(name, value, rule, hint):
    raise ValueError(f"{name}={value!r} must be {rule}{': ' + hint if hint else ''}.")


def _is_integer(value):
    # numbers.Integral covers numpy integers; bool is an int to Python but never
    # a meaningful size or count.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_int(name, value, hint=""):
    """Returns `value` as an int if it is an integer >= 1, else raises ValueError."""
    if not _is_integer(value) or value < 1:
        _fail(name, value, "a positive integer", hint)
    return int(value)


def check_non_negative_int(name, value, hint=""):
    """Returns `value` as an int if it is an integer >= 0, else raises ValueError."""
    if not _is_integer(value) or value < 0:
        _fail(name, value, "a non-negative integer", hint)
    return int(value)


def check_positive_range(low_name, low, high_name, high):
    """Returns `(low, high)` as ints if both are positive integers and low <=
    high (e.g. the shortest and longest sentence), else raises ValueError."""
    low = check_positive_int(low_name, low)
    high = check_positive_int(high_name, high)
    if low > high:
        raise ValueError(
            f"{low_name}={low} is above {high_name}={high}: the lower bound cannot exceed "
            "the upper one."
        )
    return low, high


def check_rate(name, value, hint=""):
    """Returns `value` as a float if it is a number in [0, 1) (a dropout rate, a
    label-smoothing ε, a fraction), else raises ValueError."""
    if not _is_real(value) or not 0 <= value < 1:
        _fail(name, value, "a number in [0, 1)", hint)
    return float(value)


def check_non_negative_number(name, value, hint=""):
    """Returns `value` as a float if it is a number >= 0 (NaN is not), else
    raises ValueError."""
    if not _is_real(value) or math.isnan(value) or value < 0:
        _fail(name, value, "a number >= 0", hint)
    return float(value)


def check_positive_number(name, value, hint=""):
    """Returns `value` as a float if it is a finite number > 0, else raises
    ValueError."""
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        _fail(name, value, "a finite number > 0", hint)
    return float(value)


def check_unit_interval(name, value, hint=""):
    """Returns `value` as a float if it is a number in (0, 1] (a probability
    mass to keep), else raises ValueError."""
    if not _is_real(value) or not 0 < value <= 1:
        _fail(name, value, "a number in (0, 1]", hint)
    return float(value)


def check_choice(name, value, choices):
    """Returns `value` if it is one of `choices`, else raises ValueError."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {tuple(choices)}.")
    return value


def head_dims(d_model, num_heads, key_dim=None, value_dim=None):
    """d_k and d_v of multi-head attention (§3.2.2).

    The paper uses d_k = d_v = d_model / h. An explicit `key_dim` lifts the
    divisibility rule, and `value_dim` defaults to `key_dim`.

    Returns:
        (key_dim, value_dim) as ints.
    """
    d_model = check_positive_int("d_model", d_model)
    num_heads = check_positive_int("num_heads", num_heads)
    if key_dim is None:
        if d_model % num_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}: choose "
                "d_model as a multiple of num_heads, or pass key_dim."
            )
        key_dim = d_model // num_heads
    key_dim = check_positive_int("key_dim", key_dim)
    if value_dim is None:
        return key_dim, key_dim
    return key_dim, check_positive_int("value_dim", value_dim)
