"""Bad values for every option of every command and recipe, generated from their parsers.

For each option of `keras-transformer`'s commands and of the recipes, bad values are
derived from the option's type and its documented range (`BAD_VALUES`): a count of 0, a
negative rate, a port past 65535, a missing file, a file where a folder is expected, an
output that must not be overwritten, a choice that is not one. Each must end the command
with one `error:` line that names the option (its flag, never the library's Python name
for it), exit status 2, no traceback, and no file written. The matrix is generated, so an
option added later is covered without a test of its own; an option of a type the matrix
does not know fails `test_every_option_has_a_type_the_matrix_knows` until it is given a
checked type (`keras_transformer_app.cli.options`).

The commands run in-process; a bad value that is not refused would reach the command's
work, which is replaced here by a stop that fails the test (`ReachedTheWork`).
"""

import argparse
import importlib
import os
import sys

import pytest
from helpers import untrained_run_dir

from keras_transformer_app.cli import errors, options
from keras_transformer_app.cli import parser as cli_parser

pytestmark = pytest.mark.once("torch")


class ReachedTheWork(BaseException):
    """A command got past its checks to its work with a bad value."""


# Bad values by type, as functions of the test's folder (a path or a text each).
BAD_VALUES = {
    "positive_int": ["0", "-3", "x"],
    "beam_size": ["0", "-3", "x"],
    "non_negative_int": ["-1", "1.5"],
    "positive_float": ["0", "-1", "nan"],
    "non_negative_float": ["-0.5", "nan"],
    "probability": ["0", "1.5"],
    "rate": ["-0.1", "1"],
    "port": ["-1", "65536"],
    "positive_ints": ["0,2", "x"],
    "length_penalty": ["-0.5", "nan", "inf", "1e308"],
    "length_penalties": ["-1", "0.6,x", "0.6,inf"],
    "steps_or_percent": ["-1", "101%"],
    "model_name": ["a/b", ""],
    "text": [],  # any text: checked where it is used
    "file": ["{dir}/missing.txt", "{dir}/a_folder"],
    "folder": ["{dir}/missing", "{dir}/a_file"],
    "model": ["{dir}/missing.keras"],
    "output_file": ["{dir}/a_folder", "{dir}/a_file/out.txt"],
    "new_file": ["{dir}/a_file", "{dir}/a_folder"],
    "output_folder": ["{dir}/a_file", "{dir}/a_file/below"],
}


def type_name(action):
    if action.choices is not None:
        return "choice"
    kind = getattr(action.type, "path_kind", None)
    if kind is not None:
        return kind.replace(" ", "_")
    return getattr(action.type, "__name__", repr(action.type))


def takes_no_value(action):
    return action.nargs == 0 or isinstance(action, (argparse._HelpAction,
                                                    argparse.BooleanOptionalAction))


# Valid command lines of the commands and recipes, the options' bad values added to
# them; a positional argument is a (destination, value) pair, replaced by a bad value.
COMMANDS = {
    "translate": ["translate", ("model", "{run}"), ("sentences", "kave")],
    "evaluate": ["evaluate", ("model", "{run}"), "--source", "{dir}/test.src", "--reference",
                 "{dir}/test.ref"],
    "plot attention": ["plot", "attention", ("model", "{run}"), ("sentence", "kave")],
    "plot positions": ["plot", "positions", "--output", "{dir}/out/p.png"],
    "plot schedule": ["plot", "schedule", "--output", "{dir}/out/s.png"],
    "plot training": ["plot", "training", ("runs", "{run}"), "--output", "{dir}/out/t.png"],
    "plot validation": ["plot", "validation", ("runs", "{run}"), "--output", "{dir}/out/v.png"],
    "average": ["average", ("checkpoints", "{run}/model.keras"), "--output",
                "{dir}/out/a.keras"],
    "export": ["export", ("model", "{run}"), ("export_base", "{dir}/out/exported")],
    "serve": ["serve", ("saved_model", "{dir}/a_folder")],
}
# Where an option cannot join the command line above (--run-dir replaces the checkpoints).
OPTION_BASES = {("average", "--run-dir"): ["average", "--output", "{dir}/out/a.keras"]}
RECIPES = {
    "quickstart": [],
    "multi30k": ["--data-dir", "{dir}/multi30k"],
    "anki": ["--data", "{dir}/anki.txt"],
    "wmt14": [],
    "table3": ["--data-dir", "{dir}/multi30k"],
}


def subparser(words):
    parser = cli_parser.build_parser()
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def parser_of(name):
    if name in RECIPES:
        return importlib.import_module(f"recipes.{name}").build_parser()
    return subparser(name.split())


def command_line(base, replaced=None, value=None):
    """`base` as words: its positional pairs as their values, the one named
    `replaced` as `value`."""
    return [word if isinstance(word, str) else (value if word[0] == replaced else word[1])
            for word in base]


def cases():
    """(command, option, argv with the bad value, bad value) for every option."""
    found = []
    for name in [*COMMANDS, *RECIPES]:
        base = COMMANDS.get(name) or RECIPES[name]
        for action in parser_of(name)._actions:
            if takes_no_value(action) or isinstance(action, argparse._SubParsersAction):
                continue
            values = (["not-a-choice"] if action.choices is not None
                      else BAD_VALUES.get(type_name(action), []))
            for value in values:
                if action.option_strings:
                    flag = max(action.option_strings, key=len)
                    argv = [*command_line(OPTION_BASES.get((name, flag), base)), flag, value]
                else:
                    flag = action.dest
                    argv = command_line(base, flag, value)
                found.append((name, flag, argv, value))
    return found


CASES = cases()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The test's files: a run directory, good inputs, and things in the way."""
    root = tmp_path_factory.mktemp("matrix")
    untrained_run_dir(root / "run", sentences=100, vocab_size=100)
    (root / "test.src").write_text("kave tomi\n")
    (root / "test.ref").write_text("a b .\n")
    (root / "anki.txt").write_text("Hello.\tHola.\n" * 20)
    (root / "a_file").write_text("in the way")
    (root / "a_folder").mkdir()
    (root / "multi30k").mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        for language in ("de", "en"):
            (root / "multi30k" / f"{stem}.{language}").write_text("ein hund\n" * 5)
    return root


@pytest.fixture
def stopped_work(monkeypatch):
    """The commands' work replaced by `ReachedTheWork`, and the command line's process
    settings kept to the test (the native-log quieting, the SIGTERM handler)."""
    def stop(*args, **kwargs):
        raise ReachedTheWork()

    from keras_transformer.data import corpora
    from keras_transformer_app import logs
    from keras_transformer_app.cli import commands
    from keras_transformer_app.cli import translate as translate_command
    from keras_transformer_app.training import run, vocabulary

    for module, name in ((commands, "load_translator"), (translate_command, "run"),
                         (commands, "plot"), (commands, "average"), (commands, "export"),
                         (commands, "serve"), (run, "run"), (corpora, "load_wmt14"),
                         (vocabulary, "learn_or_load_tokenizers")):
        monkeypatch.setattr(module, name, stop)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(logs, "_QUIET", logs._QUIET)
    for variable in ("TF_CPP_MIN_LOG_LEVEL", "GRPC_VERBOSITY"):
        monkeypatch.setenv(variable, os.environ.get(variable, "3"))


def run_command(name, argv):
    if name in RECIPES:
        module = importlib.import_module(f"recipes.{name}")
        errors.guarded(module.main, argv)
    else:
        from keras_transformer_app import cli

        cli.main(argv)


def files_in(root):
    return sorted(os.path.relpath(os.path.join(top, name), root)
                  for top, folders, names in os.walk(root) for name in folders + names)


def test_every_option_has_a_type_the_matrix_knows():
    unknown = [f"{name} {'/'.join(action.option_strings) or action.dest}: {type_name(action)}"
               for name in [*COMMANDS, *RECIPES] for action in parser_of(name)._actions
               if not takes_no_value(action) and action.choices is None
               and not isinstance(action, argparse._SubParsersAction)
               and type_name(action) not in BAD_VALUES]
    assert unknown == []


def test_the_matrix_covers_every_command_and_recipe():
    assert {name for name, *_ in CASES} == {*COMMANDS, *RECIPES}
    assert len(CASES) > 300


@pytest.mark.parametrize("name, option, argv, value", CASES,
                         ids=[f"{name} {option} {value!r}" for name, option, _, value in CASES])
def test_a_bad_value_is_one_error_line_naming_the_option(name, option, argv, value, folder,
                                                        stopped_work, capsys):
    argv = [word.format(dir=folder, run=folder / "run") for word in argv]
    before = files_in(folder)
    with pytest.raises(SystemExit) as stop:
        run_command(name, argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines and ("error: " in lines[-1]), err
    assert option in lines[-1], f"the error line does not name {option}: {lines[-1]}"
    python_names = [dest for dest in errors.option_flags(parser_of(name)) if f"{dest}=" in err]
    assert python_names == [], lines[-1]
    assert files_in(folder) == before, "nothing is written"


def test_a_cross_option_mistake_names_the_flags(folder, stopped_work, capsys):
    """A check across options (RunOptions) names both flags, not their fields."""
    with pytest.raises(SystemExit):
        run_command("quickstart", ["--tokens-per-batch", "16", "--max-sentence-length", "32",
                                   "--run-dir", str(folder / "out" / "run")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--tokens-per-batch 16 is below --max-sentence-length 32" in line, line


def test_path_kinds_are_what_check_paths_checks():
    assert {kind.replace(" ", "_") for kind in options.PATH_KINDS} <= set(BAD_VALUES)
