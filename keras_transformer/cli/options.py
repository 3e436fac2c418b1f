"""The option types and the options that `keras-transformer` and the recipes share (§6.1
decoding options; no other paper section).

Each shared option is defined here once, with its type, default and help, so that
`keras-transformer translate --beam-size` and `python -m recipes.multi30k --beam-size`
accept the same values and say the same thing. A type rejects a bad value while the
command line is parsed, with argparse's one-line usage error and exit status 2.
"""

import argparse

NATIVE_LOGS_HELP = ("show the native libraries' log lines (TensorFlow's, absl's, "
                    "SentencePiece's; hidden by default)")


def positive_int(text):
    """An int >= 1."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text):
    """An int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def positive_float(text):
    """A float > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def probability(text):
    """A float in (0, 1]."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


def positive_ints(text):
    """A tuple of ints >= 1 from "1,2,4"."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated positive integers such as 1,2,4, got {text!r}")
    return tuple(values)


def non_negative_floats(text):
    """A tuple of floats >= 0 from "0.6,0.8,1.0" (length penalties to try)."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not value >= 0 for value in values):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated non-negative numbers such as 0.6,0.8,1.0, got {text!r}")
    return values


def steps_or_percent(text):
    """Steps as an int >= 0, or a share of a run's steps as a str such as "40%"
    (resolved by `keras_transformer.training.run.cooldown_steps`)."""
    if isinstance(text, int):  # a default given as a number
        return text
    try:
        value = float(text[:-1]) if text.endswith("%") else int(text)
    except ValueError:
        value = -1
    if value < 0 or (isinstance(value, float) and value > 100):
        raise argparse.ArgumentTypeError(
            f"must be 0 or positive steps, or a percentage such as 40%, got {text!r}")
    return text if text.endswith("%") else value


# The options of both the commands and the recipes: argparse's keywords by destination;
# the flag is the destination with dashes (`beam_size` is --beam-size).
SHARED = {
    "beam_size": dict(type=positive_int, default=4, help="beam size (§6.1: 4)"),
    "alpha": dict(type=float, default=0.6, help="length penalty α (§6.1: 0.6)"),
    "native_logs": dict(action="store_true", help=NATIVE_LOGS_HELP),
}


def add(parser, name, table=SHARED, **changes):
    """Adds the option `name` of `table` to `parser` (or an argument group), with
    `changes` to its keywords (another default, a help that says more)."""
    return parser.add_argument("--" + name.replace("_", "-"), **{**table[name], **changes})


def add_search_options(parser):
    """--beam-size and --alpha: the beam search of §6.1."""
    add(parser, "beam_size")
    add(parser, "alpha")


def add_max_source_length(parser, default):
    """--max-source-length; `default` says in words what applies without it."""
    parser.add_argument("--max-source-length", type=positive_int,
                        help="longest input (tokens + EOS); longer sentences are truncated to "
                             f"it and flagged (default: {default})")
