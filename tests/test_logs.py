"""Quiet command lines (keras_transformer/logs.py): which processes are
quieted, what is set aside, and what still reaches the user."""

import io
import logging
import os
import re
import subprocess
import sys

import keras
import pytest
from helpers import REPOSITORY

from keras_transformer import logs

# The command lines' start-up does not depend on the backend under test: the
# tests that start a Python process run once, in the TensorFlow pass.
once = pytest.mark.once("tensorflow")



@pytest.mark.parametrize("argv0, expected", [
    ("/venv/bin/keras-transformer", True),
    (os.path.join(REPOSITORY, "recipes", "quickstart.py"), True),
    (os.path.join(REPOSITORY, "benchmarks", "serving.py"), True),
    ("/venv/bin/pytest", False),
    ("-c", False),
    ("", False),
    ("/home/me/notebook/recipes", False),
    # A program of the user's in a folder of the same name is not ours.
    ("/home/me/recipes/train.py", False),
    ("/home/me/benchmarks/serving.py", False),
])
def test_only_the_projects_command_lines_are_recognised(argv0, expected):
    assert logs.started_as_command_line([argv0, "--flag"]) is expected


class Package:
    def __init__(self, *folders):
        self.__path__ = list(folders)


@pytest.mark.parametrize("module, packages, expected", [
    ("keras_transformer.cli", {}, True),
    ("recipes.quickstart", {"recipes": Package(os.path.join(REPOSITORY, "recipes"))}, True),
    ("benchmarks.serving", {"benchmarks": Package(os.path.join(REPOSITORY, "benchmarks"))},
     True),
    ("recipes.train", {"recipes": Package("/home/me/project/recipes")}, False),
    ("pytest", {}, False), ("keras_transformer.inference", {}, False),
])
def test_python_dash_m_is_read_from_the_original_command_line(module, packages, expected):
    # While `python -m` imports the module's packages, sys.argv[0] is "-m".
    original = ["python", "-X", "utf8", "-m", module, "plot"]
    assert logs.started_as_command_line(["-m", "plot"], original, packages) is expected


def run_python(code, **environment):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **environment))


@once
def test_stderr_set_aside_hides_native_lines_unless_the_block_fails():
    code = (
        "import os, sys\n"
        "from keras_transformer.logs import stderr_set_aside\n"
        "with stderr_set_aside():\n"
        "    os.write(2, b'native noise\\n')\n"
        "print('after', file=sys.stderr)\n"
        "try:\n"
        "    with stderr_set_aside(tail_bytes=20):\n"
        "        os.write(2, b'early lines\\nthen the cause\\n')\n"
        "        raise RuntimeError('failed')\n"
        "except RuntimeError:\n"
        "    pass\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "native noise" not in result.stderr
    assert "after" in result.stderr  # stderr is back after the block
    # The last 20 bytes, from the start of the first whole line among them.
    assert "then the cause" in result.stderr and "lines" not in result.stderr


@once
def test_a_command_line_starts_without_tensorflows_native_lines(tmp_path):
    # The lines TensorFlow writes at start on a machine without CUDA: none of
    # them may reach the user of a command line.
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "plot", "positions",
         "--output", str(tmp_path / "positions.png")],
        capture_output=True, text=True, timeout=300, cwd=REPOSITORY,
        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert result.returncode == 0, result.stderr
    for line in ("absl::InitializeLog", "cudart_stub", "cpu_feature_guard", "cuInit"):
        assert line not in result.stderr, result.stderr
    assert (tmp_path / "positions.png").stat().st_size > 0


@once
def test_the_native_logs_can_be_asked_for():
    code = ("import os, sys\n"
            "sys.argv = ['keras-transformer', '--native-logs']\n"
            "import keras_transformer\n"
            "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL', 'unset'))\n")
    # (TensorFlow's own import may set a level of its own; the quiet one is 3.)
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=environment)
    assert result.returncode == 0 and result.stdout.strip() != "3", result.stderr
    quiet = subprocess.run([sys.executable, "-c", code.replace(", '--native-logs'", "")],
                           capture_output=True, text=True, timeout=120, env=environment)
    assert quiet.stdout.strip() == "3", quiet.stderr


def test_each_sacrebleu_warning_is_shown_once():
    logs.quiet_native_logs()  # TensorFlow is loaded already: only the filter applies
    logger = logging.getLogger("sacrebleu")

    def record(message):
        return logging.LogRecord("sacrebleu", logging.WARNING, __file__, 1, message, None,
                                 None)

    text = "That's 100 lines that end in a tokenized period ('.') (test_logs)"
    assert logger.filter(record(text)) and not logger.filter(record(text))
    assert logger.filter(record("It looks like you forgot to detokenize (test_logs)"))


def test_bleu_force_turns_the_tokenized_text_warning_off(caplog):
    from keras_transformer.evaluation import bleu_scores

    hypotheses = [f"word{i} ." for i in range(120)]
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        bleu_scores(hypotheses, hypotheses, force=True)
    assert not [r for r in caplog.records if r.name == "sacrebleu"]


LIBRARY_USE = (
    "from keras_transformer.tokenizers import SubwordTokenizer\n"
    "from keras_transformer.data.corpora import synthetic_translation\n"
    "pairs = synthetic_translation(200, seed=0)\n"
    "SubwordTokenizer.train(pairs.sources + pairs.targets, vocab_size=200)\n"
    "print('trained')\n"
)
# A native log line: absl's prefix (I0000 00:00:... file.cc:12]), or its notice.
NATIVE_LINE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog", re.MULTILINE)


def environment(**variables):
    """The test's environment without the log settings, with `variables`."""
    unset = ("TF_CPP_MIN_LOG_LEVEL", logs.NATIVE_LOGS_VARIABLE)
    return {**{k: v for k, v in os.environ.items() if k not in unset}, **variables}


@once
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_library_use_hides_native_lines_unless_asked_for(backend):
    # TensorFlow loads at `import keras_transformer` under its backend, at the
    # tokenizer's first use under JAX; SentencePiece's trainer logs either way.
    quiet = subprocess.run([sys.executable, "-c", LIBRARY_USE], capture_output=True, text=True,
                           timeout=300, env=environment(KERAS_BACKEND=backend))
    assert quiet.returncode == 0 and quiet.stdout == "trained\n", quiet.stderr
    assert not NATIVE_LINE.search(quiet.stderr), quiet.stderr
    loud = subprocess.run([sys.executable, "-c", LIBRARY_USE], capture_output=True, text=True,
                          timeout=300, env=environment(KERAS_BACKEND=backend,
                                                       KERAS_TRANSFORMER_NATIVE_LOGS="1"))
    assert loud.returncode == 0, loud.stderr
    assert "trainer_interface.cc" in loud.stderr  # SentencePiece's


@once
@pytest.mark.parametrize("code", [
    "import tensorflow\nimport keras_transformer\n",
    "import keras_transformer\nimport tensorflow\n",
])
def test_a_program_that_imports_tensorflow_itself_keeps_its_settings(code):
    code += "import os\nprint(os.environ.get('TF_CPP_MIN_LOG_LEVEL', 'unset'))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env=environment(KERAS_BACKEND="jax"))
    # (TensorFlow's import sets a level of its own; the quiet one is 3.)
    assert result.returncode == 0 and result.stdout.strip() != "3", result.stderr


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stderr, drawn", [(io.StringIO, False), (Terminal, True)])
def test_progress_bars_go_to_a_terminal_stderr_only(stderr, drawn, monkeypatch):
    out, err = io.StringIO(), stderr()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with logs.progress_bars_on_stderr():
        keras.utils.Progbar(2, verbose=1).update(2)  # a bar, with colour codes
        keras.utils.Progbar(2, verbose=2).update(2)  # one plain line
        print("result")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("2/2 - ") and lines[1] == "result"
    assert ("\x1b[" in err.getvalue()) is drawn
    assert "\x1b[" not in out.getvalue() and "\b" not in out.getvalue()
