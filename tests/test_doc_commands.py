"""Every command line the pages show is one the program takes.

The ```bash blocks of README.md, docs/ and benchmarks/ are read as a shell would split
them (quotes, line continuations, pipes, redirections, environment assignments), and each
command of the project (`keras-transformer ...`, `python -m keras_transformer_app ...`,
`python -m recipes.NAME ...`, `python benchmarks/NAME.py ...`, `bash benchmarks/NAME.sh`)
is parsed by the parser that would run it. An unknown option, a wrong choice, a bad value or
a missing argument fails the test with the page and the line. Parsing checks no path (the
runs and files the pages name are the reader's), only the options. Each entry point's
`--help` also runs for real, as the program's `__main__` (all of them in one process).
"""

import glob
import importlib
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import REPOSITORY
from test_docs import code_blocks

pytestmark = pytest.mark.once("torch")

PAGES = sorted(["README.md", *(os.path.relpath(path, REPOSITORY) for path in
                               glob.glob(os.path.join(REPOSITORY, "docs", "*.md"))),
                "benchmarks/README.md", "benchmarks/RESULTS.md",
                "benchmarks/experiments/README.md"])
# What ends one command and starts the next, and what redirects a stream.
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "do", "done", "then", "fi",
              "while", "for"}
REDIRECTIONS = {"<", ">", ">>", "2>", "&>", ">&", "2>&1", "<<"}
WRAPPERS = {"time", "/usr/bin/time", "nohup", "exec", "env"}


def logical_lines(code, first_line):
    """(line number, text) of each logical line of a shell block: a line continued by
    a backslash, or whose quotes are still open, goes on with the next."""
    pending, start = "", None
    for number, line in enumerate(code.splitlines(), first_line):
        if start is None:
            start = number
        pending += line + "\n"
        if line.endswith("\\"):
            pending = pending[:-2] + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the line goes on
            continue
        yield start, pending
        pending, start = "", None


def simple_commands(text, variables=None):
    """The argument lists of the simple commands of one logical line. A command that
    only assigns (`OPTIONS="--steps 20"`) records its variables in `variables`, and
    a later `$OPTIONS` word is replaced by their words."""
    variables = {} if variables is None else variables
    # A file descriptor written against its redirection (2>, 2>&1) is no argument.
    text = re.sub(r"(^|\s)\d(>>?|>&|<)", r"\1\2", text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words, command, assigned = list(lexer), [], {}
    index = 0
    while index < len(words):
        word = words[index]
        if word in SEPARATORS or word == "\n":
            if command:
                yield command
            elif assigned:
                variables.update(assigned)
            command, assigned = [], {}
        elif word in REDIRECTIONS:
            index += 1  # the redirection's target
        elif not command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word):
            name, value = word.split("=", 1)
            assigned[name] = value  # an environment assignment
        elif not command and word in WRAPPERS:
            pass  # `time`
        elif word in ("$@", "$*"):
            pass  # a script's own arguments: none when the page is read
        elif re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", word) and \
                word.strip("${}") in variables:
            command += shlex.split(variables[word.strip("${}")])
        else:
            command.append(word)
        index += 1
    if command:
        yield command
    elif assigned:
        variables.update(assigned)


def project_command(argv):
    """(entry point, its arguments) of a command of the project, or None."""
    if argv[0] == "keras-transformer":
        return "keras-transformer", argv[1:]
    if argv[0] in ("python", "python3") and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2:
            if argv[2] in ("keras_transformer_app", "keras_transformer_app.cli"):
                return "keras-transformer", argv[3:]
            if argv[2].startswith("recipes."):
                return argv[2], argv[3:]
        if argv[1].startswith("benchmarks/") and argv[1].endswith(".py"):
            return argv[1], argv[2:]
    if argv[0] in ("bash", "sh") and len(argv) > 1 and argv[1].startswith("benchmarks/"):
        return argv[1], argv[2:]
    return None


def documented_commands():
    found = []
    for page in PAGES:
        with open(os.path.join(REPOSITORY, page), encoding="utf-8") as file:
            blocks = code_blocks(file.read())
        variables = {}  # a page's blocks build on each other ("OPTIONS as above")
        for label, first_line, code in blocks:
            if label not in ("bash", "sh", "shell"):
                continue
            for line, text in logical_lines(code, first_line):
                for argv in simple_commands(text, variables):
                    command = project_command(argv)
                    if command is not None:
                        found.append((f"{page}:{line}", *command))
    return found


COMMANDS = documented_commands()


def parse(entry_point, arguments):
    """Parses `arguments` as `entry_point` would, paths unchecked; raises
    SystemExit on a mistake."""
    if entry_point == "keras-transformer":
        from keras_transformer_app.cli import parser

        return parser.parse_args(arguments, check_paths=False)
    if entry_point.startswith("recipes."):
        module = importlib.import_module(entry_point)
        if entry_point == "recipes.average":
            return parse("keras-transformer", ["average", *arguments])
        return module.build_parser().parse_args(arguments)
    if entry_point.endswith(".sh"):
        assert os.path.isfile(os.path.join(REPOSITORY, entry_point)), entry_point
        return None
    folder, name = os.path.split(entry_point[:-3])
    sys.path.insert(0, os.path.join(REPOSITORY, folder))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.pop(0)
    return module.build_parser().parse_args(arguments)


def test_the_pages_show_commands_of_every_kind():
    kinds = {entry_point.split(".")[0] if entry_point.startswith("recipes") else
             entry_point.split("/")[0] for _, entry_point, _ in COMMANDS}
    assert {"keras-transformer", "recipes", "benchmarks"} <= kinds, kinds
    assert len(COMMANDS) > 60


def test_shell_lines_are_split_as_a_shell_splits_them():
    code = ('OPTIONS="--steps 4 --alpha 0.6"\n'
            'KERAS_BACKEND=jax python -m recipes.multi30k --direction de-en \\\n'
            '    $OPTIONS > out.txt 2>&1 &\n'
            'keras-transformer translate runs/x "a b" --n-best 4 < in.txt | cut -f3  # a comment\n'
            '(sleep 1; keras-transformer serve saved_models/x) &\n'
            'python -c "import x\n'
            'print(1)" > y.txt\n')
    variables = {}
    commands = [argv for _, text in logical_lines(code, 1)
                for argv in simple_commands(text, variables)]
    assert commands == [
        ["python", "-m", "recipes.multi30k", "--direction", "de-en", "--steps", "4", "--alpha",
         "0.6"],
        ["keras-transformer", "translate", "runs/x", "a b", "--n-best", "4"], ["cut", "-f3"],
        ["sleep", "1"], ["keras-transformer", "serve", "saved_models/x"],
        ["python", "-c", "import x\nprint(1)"]]


@pytest.mark.parametrize("where, entry_point, arguments", COMMANDS,
                         ids=[f"{where} {entry_point}" for where, entry_point, _ in COMMANDS])
def test_a_documented_command_parses(where, entry_point, arguments, capsys):
    try:
        parse(entry_point, arguments)
    except SystemExit as stop:
        if stop.code not in (0, None) or "--help" not in arguments:
            error = capsys.readouterr().err.strip().splitlines()[-1:]
            pytest.fail(f"{where}: `{entry_point} {shlex.join(arguments)}` is refused: {error}")


ENTRY_POINTS = sorted({entry_point for _, entry_point, _ in COMMANDS
                       if not entry_point.endswith(".sh")})


# Runs each entry point's `--help` as its `__main__`, one after the other in one
# process (a process each would import Keras and TensorFlow ~20 times over), and
# prints {entry point: [exit status, standard output, standard error]} as JSON.
HELP_OF_EACH = """
import contextlib, io, json, os, runpy, sys
results = {}
for entry_point in sys.argv[1:]:
    out, err, path = io.StringIO(), io.StringIO(), list(sys.path)
    sys.argv = [entry_point, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if entry_point == "keras-transformer":
                runpy.run_module("keras_transformer_app", run_name="__main__", alter_sys=True)
            elif entry_point.startswith("recipes."):
                runpy.run_module(entry_point, run_name="__main__", alter_sys=True)
            else:  # a script, run by its path as `python SCRIPT` runs it
                sys.path.insert(0, os.path.dirname(os.path.abspath(entry_point)))
                runpy.run_path(entry_point, run_name="__main__")
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException as error:
        status, err = 1, io.StringIO(f"{type(error).__name__}: {error}")
    finally:
        sys.path[:] = path
    results[entry_point] = [status, out.getvalue(), err.getvalue()[-2000:]]
print("\\n" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def help_of_each():
    result = subprocess.run([sys.executable, "-c", HELP_OF_EACH, *ENTRY_POINTS],
                            cwd=REPOSITORY, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_help_runs_for_real(entry_point, help_of_each):
    status, stdout, stderr = help_of_each[entry_point]
    assert status == 0, stderr
    assert stdout.startswith("usage: "), stdout[:200]
