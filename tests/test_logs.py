"""Quiet command lines (keras_transformer/logs.py): the command lines hide the native
libraries' log lines, which `--native-logs` shows, the library leaves them to the program
that uses it, and what is set aside comes back when something fails."""

import io
import logging
import os
import re
import subprocess
import sys

import keras
import pytest
from helpers import REPOSITORY

from keras_transformer_app import logs

# The command lines' start-up does not depend on the backend under test: the tests that
# start a Python process run once, in the torch pass, their processes under TensorFlow's
# backend, which loads TensorFlow at start.
once = pytest.mark.once("torch")


def run_python(code, **environment):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **environment))


@pytest.mark.once("torch")  # logs and files, not the backend
@once
def test_stderr_set_aside_hides_native_lines_unless_the_block_fails():
    code = (
        "import os, sys\n"
        "from keras_transformer_app.logs import stderr_set_aside\n"
        "with stderr_set_aside():\n"
        "    os.write(2, b'native noise\\n')\n"
        "print('after', file=sys.stderr)\n"
        "try:\n"
        "    with stderr_set_aside(tail_bytes=20):\n"
        "        os.write(2, b'early lines\\nthen the cause\\n')\n"
        "        raise RuntimeError('failed')\n"
        "except RuntimeError:\n"
        "    pass\n"
        "try:\n"
        "    with stderr_set_aside():\n"
        "        os.write(2, b'interrupted work\\n')\n"
        "        raise KeyboardInterrupt\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "native noise" not in result.stderr
    assert "after" in result.stderr  # stderr is back after the block
    # The last 20 bytes, from the start of the first whole line among them.
    assert "then the cause" in result.stderr and "lines" not in result.stderr
    assert "interrupted work" not in result.stderr  # Ctrl-C is reported in one line


@once
def test_a_command_line_shows_the_native_logs_when_asked(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer_app", "--native-logs", "plot", "positions",
         "--output", str(tmp_path / "positions.png")],
        capture_output=True, text=True, timeout=300, cwd=REPOSITORY,
        env=environment(KERAS_BACKEND="tensorflow"))
    assert result.returncode == 0, result.stderr
    assert NATIVE_LINE.search(result.stderr), result.stderr


@pytest.mark.once("torch")  # the decision alone, on given mappings
@pytest.mark.parametrize("backend, loaded, hidden", [
    ("tensorflow", False, True), ("torch", False, True), ("jax", False, False),
    ("numpy", False, False), ("", False, False), (None, False, False),
    ("tensorflow", True, False),
])
def test_jax_is_skipped_only_under_tensorflow_or_torch_before_it_loads(backend, loaded,
                                                                          hidden):
    environ = {} if backend is None else {"KERAS_BACKEND": backend}
    jax = object()
    modules = {"jax": jax} if loaded else {}
    logs.skip_jax_unless_backend(environ, modules)
    if hidden:
        assert modules == {"jax": None}  # import jax: ModuleNotFoundError
    else:
        assert modules == ({"jax": jax} if loaded else {})


@once
def test_a_command_line_under_tensorflow_starts_quietly_without_loading_jax(tmp_path):
    # The lines TensorFlow writes at start on a machine without CUDA: none of them may
    # reach the user of a command line. And Keras and TensorFlow try to import JAX under
    # every backend; an entry point under another backend lets them go on without it
    # (`skip_jax_unless_backend`).
    code = ("import sys\nfrom keras_transformer_app import main\nstatus = main(sys.argv[1:])\n"
            "import keras\nprint(keras.backend.backend(), sys.modules.get('jax', 'absent'),"
            " file=sys.__stderr__)\nsys.exit(status)\n")
    result = subprocess.run(
        [sys.executable, "-c", code, "plot", "positions", "--output", str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=300, cwd=REPOSITORY,
        env=environment(KERAS_BACKEND="tensorflow"))
    assert result.returncode == 0, result.stderr
    for line in ("absl::InitializeLog", "cudart_stub", "cpu_feature_guard", "cuInit"):
        assert line not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == "tensorflow None", result.stderr
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.once("torch")  # logs and files, not the backend
def test_each_sacrebleu_warning_is_shown_once():
    logs.quiet_python_warnings()
    logger = logging.getLogger("sacrebleu")

    def record(message):
        return logging.LogRecord("sacrebleu", logging.WARNING, __file__, 1, message, None,
                                 None)

    text = "That's 100 lines that end in a tokenized period ('.') (test_logs)"
    assert logger.filter(record(text)) and not logger.filter(record(text))
    assert logger.filter(record("It looks like you forgot to detokenize (test_logs)"))


@pytest.mark.once("torch")  # logs and files, not the backend
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
def test_library_use_leaves_the_native_logs_to_the_program():
    # SentencePiece's trainer and TensorFlow write to stderr as they would
    # without the library: hiding them is a command line's choice, not the
    # library's (tests/test_imports.py checks the rest of the host's state).
    result = subprocess.run([sys.executable, "-c", LIBRARY_USE], capture_output=True,
                            text=True, timeout=300, env=environment(KERAS_BACKEND="jax"))
    assert result.returncode == 0 and result.stdout == "trained\n", result.stderr
    assert "trainer_interface.cc" in result.stderr  # SentencePiece's


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.once("torch")  # logs and files, not the backend
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
