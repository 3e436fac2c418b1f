"""Quiet output for the command lines and recipes (not a paper section).

TensorFlow and the libraries it loads write C++ log lines to stderr at every
start (`cudart_stub`, `cpu_feature_guard`, "All log messages before
absl::InitializeLog() is called are written to STDERR", `cuInit`), under every
Keras backend, since the tokenizers load TensorFlow. `TF_CPP_MIN_LOG_LEVEL`
hides TensorFlow's own lines only if it is set before TensorFlow loads, and
absl writes its lines before any level applies; so `quiet_native_logs` sets
the levels, then loads TensorFlow and its devices with the process's stderr
(file descriptor 2) set aside, and shows what was set aside only if loading
fails. Python's own warnings and errors are untouched after that.

It also shows each of sacreBLEU's warnings once per process (it repeats them
for every score it computes; the synthetic task, where " ." is a word, turns
them off with `force`).

The package's `__init__` calls `quiet_command_line()` before it imports
Keras, so every command line of the project (`keras-transformer`, `python -m
recipes.NAME`, `python benchmarks/NAME.py`) starts quiet, unless it is given
`--native-logs` or `KERAS_TRANSFORMER_NATIVE_LOGS=1`. Importing the library
from your own program or a notebook changes nothing.
"""

import contextlib
import logging
import os
import sys
import tempfile

NATIVE_LOGS_VARIABLE = "KERAS_TRANSFORMER_NATIVE_LOGS"


def native_logs_requested():
    """Whether `KERAS_TRANSFORMER_NATIVE_LOGS` asks for the native logs."""
    return os.environ.get(NATIVE_LOGS_VARIABLE, "").strip().lower() not in (
        "", "0", "false", "no")


def started_as_command_line(argv=None, orig_argv=None):
    """Whether this process runs one of the project's command lines: the
    `keras-transformer` script, `python -m keras_transformer.cli`, or a script
    of `recipes/` or `benchmarks/`.

    `python -m` sets `sys.argv[0]` to "-m" while it imports the module's
    packages (this package's `__init__` among them), so the module is then
    read from `sys.orig_argv`.
    """
    argv = sys.argv if argv is None else argv
    if argv and argv[0] == "-m":
        original = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
        module = original[original.index("-m") + 1] if "-m" in original[:-1] else ""
        return module == "keras_transformer.cli" or module.startswith(("recipes.",
                                                                       "benchmarks."))
    path = os.path.abspath(argv[0]) if argv and argv[0] else ""
    parent, name = os.path.split(path)
    return (name in ("keras-transformer", "keras-transformer.exe")
            or path.endswith(os.path.join("keras_transformer", "cli.py"))
            or (os.path.basename(parent) in ("recipes", "benchmarks") and name.endswith(".py")))


def quiet_command_line(argv=None):
    """`quiet_native_logs()` for the project's command lines, unless
    `--native-logs` is among their arguments; nothing for other programs."""
    from keras_transformer.backend import check_backend_name

    argv = sys.argv if argv is None else argv
    if not started_as_command_line(argv) or "--native-logs" in argv[1:]:
        return
    try:
        check_backend_name(os.environ.get("KERAS_BACKEND"))
    except ValueError:
        return  # TensorFlow would fail to import Keras; the command line says why
    quiet_native_logs()


def quiet_native_logs(native_logs=False):
    """Hides the native log lines of TensorFlow and absl, and warnings that are
    not the user's concern; call it before anything imports TensorFlow.

    Args:
        native_logs: Show everything instead (as does
            `KERAS_TRANSFORMER_NATIVE_LOGS=1`); a log level the user set in
            `TF_CPP_MIN_LOG_LEVEL` is kept either way.
    """
    if native_logs or native_logs_requested():
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    logging.getLogger("sacrebleu").addFilter(_once_filter)
    if "tensorflow" in sys.modules:
        return  # too late to set anything aside
    with stderr_set_aside():
        try:
            import tensorflow as tf
        except Exception:  # noqa: BLE001  the code that needs it will raise, unquieted
            return
        tf.config.list_physical_devices()  # loads the device plugins, which log too


_SHOWN = set()


def _once_filter(record):
    """Lets each distinct message through once."""
    message = record.getMessage()
    if message in _SHOWN:
        return False
    _SHOWN.add(message)
    return True


@contextlib.contextmanager
def stderr_set_aside(tail_bytes=None):
    """Sends file descriptor 2 (C++ logging included) to a temporary file for
    the block; its content, or its last `tail_bytes`, is written back to stderr
    if the block raises."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable descriptor 2
        yield
        return
    with tempfile.TemporaryFile() as aside:
        os.dup2(aside.fileno(), 2)
        try:
            yield
        except BaseException:
            _restore(saved)
            aside.seek(0)
            text = aside.read()
            os.write(2, text[-tail_bytes:] if tail_bytes else text)
            raise
        else:
            _restore(saved)
        finally:
            os.close(saved)


def _restore(saved):
    sys.stderr.flush()
    os.dup2(saved, 2)
