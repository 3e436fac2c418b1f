"""The option types and the options that `keras-transformer` and the recipes share (§6.1
decoding options; no other paper section).

Each shared option is defined here once, with its type, default and help, so that
`keras-transformer translate --beam-size` and `python -m recipes.multi30k --beam-size`
accept the same values and say the same thing. A type rejects a bad value while the
command line is parsed, with argparse's one-line usage error and exit status 2.

Paths are typed by what they must be (`PATH_KINDS`: a file to read, a folder to write
into, ...) and checked after parsing, by `check_paths`, with the same usage error naming
the option. Parsing alone checks no path, so that a command written in the docs parses
anywhere (`tests/test_doc_commands.py`).
"""

import argparse
import os

from keras_transformer_app import compat

#: CTranslate2's compute types and weight types, as the library names them
#: (`keras_transformer.inference.ctranslate2.COMPUTE_TYPES`,
#: `keras_transformer.export.ctranslate2.QUANTIZATIONS`): written here so that the
#: parser loads neither; `tests/test_cli.py` checks that they agree.
COMPUTE_TYPES = ("default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16",
                 "int16", "float16", "bfloat16", "float32")
QUANTIZATIONS = COMPUTE_TYPES[2:]

NATIVE_LOGS_HELP = ("show the native libraries' log lines (TensorFlow's, absl's, "
                    "SentencePiece's; hidden by default)")


def positive_int(text):
    """An int >= 1."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


#: Beams wider than this are warned of: the paper's is 4, and each step of a beam of B
#: scores B × the vocabulary and keeps B sequences' keys and values per sentence.
WIDE_BEAM = 64


def beam_size(text):
    """A beam size, an int >= 1; one above `WIDE_BEAM` is taken with a warning on
    standard error, since time and memory grow with it."""
    import sys

    value = positive_int(text)
    if value > WIDE_BEAM:
        print(f"warning: --beam-size {value} keeps {value} hypotheses a sentence: each step "
              f"scores {value} × the vocabulary and caches {value} sequences' keys and "
              "values, so time and memory grow with it (the paper's beam is 4; beams above "
              f"{WIDE_BEAM} seldom translate better)", file=sys.stderr)
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


def non_negative_float(text):
    """A float >= 0 (not NaN)."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


#: The largest --alpha: the library's `keras_transformer.inference.search.MAX_ALPHA`,
#: written here so that parsing loads no library (tests/test_cli.py checks they agree).
MAX_ALPHA = 10.0


def length_penalty(text):
    """A length penalty α: a float from 0 to `MAX_ALPHA` (inf and NaN refused)."""
    value = float(text)
    if not 0 <= value <= MAX_ALPHA:
        raise argparse.ArgumentTypeError(
            f"must be a number from 0 to {MAX_ALPHA:g} (§6.1: 0.6), got {text}")
    return value


def rate(text):
    """A float in [0, 1): a dropout rate, a label-smoothing ε, a fraction."""
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text}")
    return value


def port(text):
    """A TCP port, an int from 0 (a free one) to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {text}")
    return value


def text(value):
    """Any text (a sentence, a host name, a language code): checked where it is used."""
    return value


def model_name(value):
    """A model name for the server's URLs (/v1/models/NAME): letters, digits, '.', '-'
    and '_'."""
    if not value or not all(c.isalnum() or c in "._-" for c in value):
        raise argparse.ArgumentTypeError(
            f"must be letters, digits, '.', '-' and '_' (it is part of a URL), got {value!r}")
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


def length_penalties(text):
    """A tuple of length penalties α (each from 0 to `MAX_ALPHA`) from "0.6,0.8,1.0"."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not 0 <= value <= MAX_ALPHA for value in values):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated numbers from 0 to {MAX_ALPHA:g} such as 0.6,0.8,1.0, "
            f"got {text!r}")
    return values


def steps_or_percent(text):
    """Steps as an int >= 0, or a share of a run's steps as a str such as "40%"
    (resolved by `keras_transformer_app.training.run.cooldown_steps`)."""
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
    "beam_size": dict(type=beam_size, default=4, help="beam size (§6.1: 4)"),
    "alpha": dict(type=length_penalty, default=0.6, help="length penalty α (§6.1: 0.6)"),
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


def add_engine_options(parser):
    """--compute-type and --intra-threads: how CTranslate2 runs an export of its own."""
    group = parser.add_argument_group("CTranslate2 exports (export --format ctranslate2)")
    group.add_argument("--compute-type", choices=COMPUTE_TYPES, default="default",
                       help="CTranslate2's compute type (default: the type the weights were "
                            "exported in)")
    group.add_argument("--intra-threads", type=non_negative_int, default=0,
                       help="CTranslate2's threads per translation (default 0: its own "
                            "choice)")


def add_max_source_length(parser, default):
    """--max-source-length; `default` says in words what applies without it."""
    parser.add_argument("--max-source-length", type=positive_int,
                        help="longest input (tokens + EOS); longer sentences are truncated to "
                             f"it and flagged (default: {default})")


# What a path option must name, checked by `check_paths` after parsing.
PATH_KINDS = {
    "file": "an existing file",
    "folder": "an existing folder",
    "model": "a .keras file or a folder holding a model (a run directory, an export)",
    "output file": "a file to write (not a folder, in a folder that can be made)",
    "new file": "a file to write that does not exist yet (unless --force)",
    "output folder": "a folder to write into (not a file, in a folder that can be made)",
}


def path(kind):
    """An argparse type for a path of `kind` (one of `PATH_KINDS`): the text
    itself, checked by `check_paths` once the command line is parsed."""
    if kind not in PATH_KINDS:
        raise ValueError(f"kind={kind!r} must be one of {tuple(PATH_KINDS)}")

    def accept(text):
        return text

    accept.path_kind = kind
    accept.__name__ = kind.replace(" ", "_")
    return accept


def check_paths(parser, args):
    """Checks every path option of `parser` (and of the subcommand chosen) that
    `args` gives against its kind; a path that cannot be right is a usage error
    naming the option, before anything runs."""
    for action in _actions(parser, args):
        kind = getattr(action.type, "path_kind", None)
        values = getattr(args, action.dest, None)
        if kind is None or values is None:
            continue
        for value in values if isinstance(values, list) else [values]:
            problem = _path_problem(kind, value, getattr(args, "force", False))
            if problem:
                name = "/".join(action.option_strings) or action.dest
                parser.error(f"argument {name}: {value!r} {problem}")


def _actions(parser, args):
    """The actions of `parser` and of the subcommands `args` chose."""
    for action, subparsers in compat.parser_actions(parser):
        if subparsers is not None:
            chosen = subparsers.get(getattr(args, action.dest, None))
            if chosen is not None:
                yield from _actions(chosen, args)
        else:
            yield action


def _path_problem(kind, value, force=False):
    """What is wrong with `value` as a path of `kind`, or None."""
    if kind == "file" and not os.path.isfile(value):
        return "is a folder, not a file" if os.path.isdir(value) else "does not exist"
    if kind == "folder" and not os.path.isdir(value):
        return "is a file, not a folder" if os.path.exists(value) else "does not exist"
    if kind == "model" and not os.path.exists(value):
        return "does not exist"
    if kind in ("output file", "new file"):
        if os.path.isdir(value):
            return "is a folder, not a file to write"
        if kind == "new file" and os.path.exists(value) and not force:
            return "exists: add --force to replace it, or give another path"
        return _unmakeable(os.path.dirname(os.path.abspath(value)))
    if kind == "output folder":
        if os.path.exists(value) and not os.path.isdir(value):
            return "is a file, not a folder to write into"
        return _unmakeable(value)
    return None


def _unmakeable(folder):
    """Why `folder` cannot be made or written into (a file in the way, a read-only
    folder or file system), or None: found before the command's work, not after."""
    folder = os.path.abspath(folder)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return f"cannot be written: {folder!r} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        read_only = os.statvfs(folder).f_flag & os.ST_RDONLY
        return (f"cannot be written: {folder!r} is "
                + ("on a read-only file system" if read_only else "not writable by this user"))
    return None
