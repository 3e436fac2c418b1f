"""Quiet output of the program's processes (not a paper section): native log lines
hidden, progress bars off stdout.

TensorFlow and the libraries it loads write C++ log lines to stderr when they start
(`cudart_stub`, `cpu_feature_guard`, "All log messages before absl::InitializeLog() is
called are written to STDERR", and on a machine without a GPU an error-level
`failed call to cuInit`), under every Keras backend, since the tokenizers and the data
pipeline use TensorFlow. SentencePiece's trainer writes hundreds of lines too.

Hiding them changes the process, so the library never does it: importing and using
it leaves TensorFlow's log level, stderr and the import system as they are. The
project's own entry points (`keras-transformer`, `python -m recipes.NAME`, the
scripts of `benchmarks/`) own their process and call `start` as their first
statement, before anything loads TensorFlow; `keras_transformer_app.cli.errors.command_line`
calls `quiet_native_logs` again when their work starts. That sets
`TF_CPP_MIN_LOG_LEVEL=3` and `GRPC_VERBOSITY=ERROR` (keeping any value the user set),
puts an import hook in place that loads TensorFlow and its device plugins with file
descriptor 2 set aside (absl writes its first lines before any level applies) and
shows what was set aside only if loading fails, and lets `hidden_native_lines` set
SentencePiece's trainer lines aside the same way. `KERAS_TRANSFORMER_NATIVE_LOGS=1`,
or `--native-logs` given to one of the command lines, shows every line instead.

The command lines also draw Keras's progress bars on stderr (`progress_bars_on_stderr`):
Keras draws them on stdout with colour codes and backspaces, which would land in a
redirected `> out.txt`; there they go to stderr, and only when stderr is a terminal.
And sacreBLEU's warnings show once per process (`quiet_python_warnings`: it repeats
them for every score).
"""

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import re
import signal
import sys
import tempfile
import threading

NATIVE_LOGS_VARIABLE = "KERAS_TRANSFORMER_NATIVE_LOGS"
NATIVE_LOGS_FLAG = "--native-logs"
# Whether this process's command line quiets the native logs (`quiet_native_logs`).
_QUIET = False


def native_logs_requested():
    """Whether `KERAS_TRANSFORMER_NATIVE_LOGS` asks for the native logs."""
    return os.environ.get(NATIVE_LOGS_VARIABLE, "").strip().lower() not in (
        "", "0", "false", "no")


def quiet_native_logs(native_logs=False):
    """What a command line does first, before anything loads TensorFlow: hides the
    native libraries' log lines for the rest of the process, unless `native_logs`
    (its `--native-logs`) or `KERAS_TRANSFORMER_NATIVE_LOGS` asks for them, and
    quiets Python's warnings that do not concern its user. Only for a process the
    command line owns: a library must not call it."""
    global _QUIET
    quiet_python_warnings()
    if native_logs:
        # The processes it starts (the export's TensorFlow process) show them too.
        os.environ[NATIVE_LOGS_VARIABLE] = "1"
    if native_logs_requested():
        _QUIET = False
        sys.meta_path[:] = [finder for finder in sys.meta_path
                            if not isinstance(finder, _QuietTensorFlowImport)]
        return
    _QUIET = True
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if "tensorflow" not in sys.modules and not any(
            isinstance(finder, _QuietTensorFlowImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())


def start(native_logs=None, keep_jax=False):
    """What an entry point of the program (`keras-transformer`, a recipe or a
    benchmark script run as `__main__`) does first, before anything loads Keras or
    TensorFlow: quiets the native logs (`quiet_native_logs`), leaves JAX unloaded
    under the TensorFlow and PyTorch backends (`skip_jax_unless_backend`), and ends the process
    quietly on SIGINT (status 130) or SIGTERM (143) until the command installs its
    own handlers (`keras_transformer_app.cli.errors.command_line`): nothing has begun
    that could be lost. Never called on import: a program that imports the library,
    or this package, keeps its process as it was.

    Args:
        native_logs: Whether to show the native logs instead (`--native-logs`);
            None looks for that flag among the process's own arguments.
        keep_jax: Whether JAX stays importable under another backend (a benchmark
            that times JAX beside the backend).
    """
    if native_logs is None:
        native_logs = NATIVE_LOGS_FLAG in sys.argv[1:]
    quiet_native_logs(native_logs)
    if not keep_jax:
        skip_jax_unless_backend()
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, _exit_while_starting)


def skip_jax_unless_backend(environ=os.environ, modules=sys.modules):
    """Under `KERAS_BACKEND` TensorFlow or PyTorch, makes `import jax` fail as it would
    if JAX were not installed, for the rest of the process. Keras (its Orbax
    checkpoint callback) and TensorFlow (TFLite) import JAX under every backend when
    it is installed, only to patch or wrap it, and both go on without it: that import
    is CPU time each process spends for nothing (docs/installation.md measures it),
    and nothing of the program uses JAX unless it is the backend. A `None` in
    `sys.modules` is Python's own way to say a module is absent: `import jax` raises
    ModuleNotFoundError and `importlib.util.find_spec("jax")` returns None.

    Only when `KERAS_BACKEND` names one of the two (one chosen in keras.json, and
    Keras's numpy backend, which imports JAX itself, leave JAX as it is), and only
    before JAX has loaded. An entry point's (`start`); never the library's."""
    if environ.get("KERAS_BACKEND", "").strip() in ("tensorflow", "torch") and (
            "jax" not in modules):
        modules["jax"] = None


@contextlib.contextmanager
def signals_end_the_process():
    """Within the block, SIGINT and SIGTERM end the process at once and quietly, with the
    shell's status, as during start-up (`start`): for a phase that loses nothing if cut
    and that runs native code an exception must not unwind through, such as the
    library's import (a KeyboardInterrupt raised in Python code that a C++ extension
    calls while it loads can abort the process). Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = (signal.SIGINT, signal.SIGTERM)
    previous = [signal.signal(number, _exit_while_starting) for number in numbers]
    try:
        yield
    finally:
        for number, handler in zip(numbers, previous):
            signal.signal(number, handler)


def finished():
    """What an entry point does once its command's work is done: Ctrl-C and SIGTERM are
    ignored from then on, since they would find nothing left to stop, only the
    interpreter's and the native libraries' shutdown (about a second for TensorFlow's),
    and would turn a finished command's status into 130 or 143."""
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_IGN)


def _exit_while_starting(number, frame):
    """A signal during a command line's start-up: the shell's status, no traceback."""
    os._exit(128 + number)


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """An import hook that loads TensorFlow with stderr set aside (a command line's)."""

    _searching = False

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow" or self._searching:
            return None
        self._searching = True  # the search below asks every finder, this one too
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._searching = False
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self)
        return spec


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with stderr set aside and Ctrl-C deferred."""

    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # Once loading, never again (a search alone, `find_spec`, loads nothing).
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self.finder]
        try:
            with signals_deferred(), stderr_set_aside():
                self.loader.exec_module(module)
                module.config.list_physical_devices()  # the device plugins log too
        finally:
            # The module keeps TensorFlow's loader, as if imported without the hook.
            module.__loader__ = module.__spec__.loader = self.loader


@contextlib.contextmanager
def signals_deferred():
    """Holds back SIGINT and SIGTERM in the main thread (and the threads it starts)
    while the block runs: one that arrives meanwhile is delivered when the block
    ends. A command line loads TensorFlow this way, so that Ctrl-C during its
    import ends the command cleanly after it instead of inside its C++ start-up."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
            signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def hidden_native_lines(tail_bytes=None):
    """`stderr_set_aside(tail_bytes)` in a command line that quiets the native logs
    (`quiet_native_logs`), for a native library that logs while it works
    (SentencePiece's trainer); nothing anywhere else."""
    if not _QUIET or native_logs_requested():
        yield
        return
    with stderr_set_aside(tail_bytes):
        yield


@contextlib.contextmanager
def stderr_set_aside(tail_bytes=None):
    """Sends file descriptor 2 (C++ logging included) to a temporary file for the
    block; its content, or its last `tail_bytes` from a line's start, is written
    back to stderr if the block fails (an `Exception`: not when Ctrl-C or a
    signal's exception ends it, which the command line reports in one line)."""
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
        except BaseException as error:
            _restore(saved)
            if not isinstance(error, Exception):
                raise
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
    results when redirected.

    Keras writes its lines to whatever `sys.stdout` is when it writes them, so the
    block puts a stream in its place (`contextlib.redirect_stdout`) that passes
    every write through but a bar's; a command line owns its process's stdout."""
    if isinstance(sys.stdout, _ProgressBarsAside):
        yield  # already routed by an enclosing block
        return
    with contextlib.redirect_stdout(_ProgressBarsAside(sys.stdout)):
        yield


class _ProgressBarsAside:
    """A text stream that writes to `stream`, except what only a progress bar writes,
    which goes to stderr when stderr is a terminal and nowhere otherwise."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        if not _PROGRESS_BAR.search(text):
            return self._stream.write(text)
        if _is_terminal(sys.stderr):
            self._stream.flush()  # the lines printed before the bar come first
            sys.stderr.write(text)
            sys.stderr.flush()
        return len(text)

    def __getattr__(self, name):  # flush, fileno, isatty, encoding...: the stream's
        return getattr(self._stream, name)


def _is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
