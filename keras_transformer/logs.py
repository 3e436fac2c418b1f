"""Quiet output (not a paper section): native log lines hidden, progress bars off stdout.

TensorFlow and the libraries it loads write C++ log lines to stderr when they start
(`cudart_stub`, `cpu_feature_guard`, "All log messages before absl::InitializeLog() is
called are written to STDERR", and on a machine without a GPU an error-level
`failed call to cuInit`), under every Keras backend, since the tokenizers and the data
pipeline use TensorFlow. `TF_CPP_MIN_LOG_LEVEL` hides TensorFlow's own lines only if it
is set before TensorFlow loads, and absl writes its first lines before any level
applies. So `hide_native_logs`, which the package's `__init__` calls before Keras
loads, puts an import hook in place: when the package's code (Keras's TensorFlow
backend, a tokenizer, the data pipeline, export) imports TensorFlow first, the hook
sets the levels (keeping any the user set), then loads TensorFlow and its device
plugins with file descriptor 2 set aside, and shows what was set aside only if loading
fails. A program that imports TensorFlow itself, before or after the package, gets
TensorFlow's lines as usual. SentencePiece's trainer logs too; `hidden_native_lines`
sets it aside the same way.

`KERAS_TRANSFORMER_NATIVE_LOGS=1`, or `--native-logs` given to one of the project's
command lines (`keras-transformer`, `python -m recipes.NAME`, the scripts of
`benchmarks/`), shows every line.

The command lines also call `progress_bars_on_stderr`: Keras draws its progress bars
on stdout with colour codes and backspaces, which would land in a redirected
`> out.txt`; there they go to stderr, and only when stderr is a terminal. And
`quiet_python_warnings` shows each of sacreBLEU's warnings once per process (it repeats
them for every score).
"""

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile

NATIVE_LOGS_VARIABLE = "KERAS_TRANSFORMER_NATIVE_LOGS"
NATIVE_LOGS_FLAG = "--native-logs"
_PACKAGE = __name__.rsplit(".", 1)[0]
_REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def native_logs_requested():
    """Whether `KERAS_TRANSFORMER_NATIVE_LOGS` asks for the native logs."""
    return os.environ.get(NATIVE_LOGS_VARIABLE, "").strip().lower() not in (
        "", "0", "false", "no")


def started_as_command_line(argv=None, orig_argv=None, modules=None):
    """Whether this process runs one of the project's command lines: the
    `keras-transformer` script, `python -m keras_transformer.cli`, a recipe
    (`python -m recipes.NAME`) or a script of this repository's `benchmarks/`.

    Recipes and benchmarks are recognised by where their files are, not by a
    folder's name, so a program of yours in a folder called `recipes` is not
    taken for ours. `python -m` sets `sys.argv[0]` to "-m" while it imports the
    module's packages (this package's `__init__` among them), so the module is
    then read from `sys.orig_argv`.
    """
    argv = sys.argv if argv is None else argv
    modules = sys.modules if modules is None else modules
    if argv and argv[0] == "-m":
        original = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
        module = original[original.index("-m") + 1] if "-m" in original[:-1] else ""
        if module == "keras_transformer.cli":
            return True
        package = module.split(".")[0]
        # Imported by `python -m` before this package: its folders tell whose it is.
        folders = list(getattr(modules.get(package), "__path__", None) or ())
        return package in _SCRIPT_FOLDERS and _repository_folder(package) in map(
            os.path.realpath, folders)
    name = os.path.basename(argv[0]) if argv else ""
    return (name in ("keras-transformer", "keras-transformer.exe")
            or (name.endswith(".py") and os.path.dirname(os.path.realpath(argv[0])) in map(
                _repository_folder, _SCRIPT_FOLDERS)))


_SCRIPT_FOLDERS = ("recipes", "benchmarks")


def _repository_folder(folder):
    return os.path.realpath(os.path.join(_REPOSITORY, folder))


def hide_native_logs(argv=None):
    """Hides TensorFlow's native log lines for the process from the moment the
    package's code loads TensorFlow, unless `KERAS_TRANSFORMER_NATIVE_LOGS` or a
    command line's `--native-logs` asks for them. The package's `__init__` calls
    it before it imports Keras."""
    argv = sys.argv if argv is None else argv
    if NATIVE_LOGS_FLAG in argv[1:] and started_as_command_line(argv):
        show_native_logs()
    if native_logs_requested() or "tensorflow" in sys.modules:
        return
    if not any(isinstance(finder, _QuietTensorFlowImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())


def show_native_logs():
    """Shows every native log line from now on (`--native-logs`), in this process and
    in the processes it starts (the export's TensorFlow process)."""
    os.environ[NATIVE_LOGS_VARIABLE] = "1"
    sys.meta_path[:] = [finder for finder in sys.meta_path
                        if not isinstance(finder, _QuietTensorFlowImport)]


def quiet_native_logs(native_logs=False):
    """What a command line does once its options are read: shows the native logs if
    `native_logs` (its `--native-logs`), and quiets Python's warnings that do not
    concern its user."""
    if native_logs:
        show_native_logs()
    quiet_python_warnings()


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """An import hook that loads TensorFlow quietly when the package imports it."""

    _searching = False

    def find_spec(self, name, path=None, target=None):
        if (name != "tensorflow" or self._searching or native_logs_requested()
                or not _imported_by_package()):
            return None
        self._searching = True  # the search below asks every finder, this one too
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._searching = False
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self)
        return spec


def _imported_by_package():
    """Whether one of the calls on the stack is the package's own code."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if (module == _PACKAGE or module.startswith(_PACKAGE + ".")) and module != __name__:
            return True
        frame = frame.f_back
    return False


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with the log levels set and stderr set aside."""

    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # Once loading, never again (a search alone, `find_spec`, loads nothing).
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self.finder]
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        try:
            with stderr_set_aside():
                self.loader.exec_module(module)
                module.config.list_physical_devices()  # the device plugins log too
        finally:
            # The module keeps TensorFlow's loader, as if imported without the hook.
            module.__loader__ = module.__spec__.loader = self.loader


@contextlib.contextmanager
def hidden_native_lines(tail_bytes=None):
    """`stderr_set_aside(tail_bytes)` unless the native logs are asked for: for a
    native library that logs while it works (SentencePiece's trainer)."""
    if native_logs_requested():
        yield
        return
    with stderr_set_aside(tail_bytes):
        yield


@contextlib.contextmanager
def stderr_set_aside(tail_bytes=None):
    """Sends file descriptor 2 (C++ logging included) to a temporary file for the
    block; its content, or its last `tail_bytes` from a line's start, is written
    back to stderr if the block raises."""
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
            if tail_bytes and len(text) > tail_bytes:
                text = text[-tail_bytes:]
                start = text.find(b"\n") + 1
                text = text[start:] if start < len(text) else text  # from a line's start
            os.write(2, text)
            raise
        else:
            _restore(saved)
        finally:
            os.close(saved)


def _restore(saved):
    sys.stderr.flush()
    os.dup2(saved, 2)


def quiet_python_warnings():
    """Lets each distinct sacreBLEU warning through once per process."""
    logger = logging.getLogger("sacrebleu")
    if _once_filter not in logger.filters:
        logger.addFilter(_once_filter)


_SHOWN = set()


def _once_filter(record):
    """Lets each distinct message through once."""
    message = record.getMessage()
    if message in _SHOWN:
        return False
    _SHOWN.add(message)
    return True


# What only a progress bar writes: a carriage return, a backspace, a colour code.
_PROGRESS_BAR = re.compile(r"[\r\b]|\x1b\[")


@contextlib.contextmanager
def progress_bars_on_stderr():
    """Within the block, Keras's progress bars (`keras.utils.Progbar`: `model.fit`'s,
    the translator's, the export's) are drawn on stderr when it is a terminal and
    not at all otherwise; Keras's other lines stay on stdout. So stdout holds only
    results when redirected."""
    try:
        from keras.src.utils import io_utils
    except ImportError:  # another Keras layout: its bars stay where it draws them
        yield
        return
    print_message = io_utils.print_msg
    if getattr(print_message, "routes_progress_bars", False):
        yield  # already routed by an enclosing block
        return

    def route(message, line_break=True):
        text = str(message) + ("\n" if line_break else "")
        if not _PROGRESS_BAR.search(text) or not io_utils.is_interactive_logging_enabled():
            return print_message(message, line_break)
        if _is_terminal(sys.stderr):
            sys.stdout.flush()  # the lines printed before the bar come first
            sys.stderr.write(text)
            sys.stderr.flush()

    route.routes_progress_bars = True
    io_utils.print_msg = route
    try:
        yield
    finally:
        io_utils.print_msg = print_message


def _is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
