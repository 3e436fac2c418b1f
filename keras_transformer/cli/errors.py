"""User mistakes as one line (not a paper section): the error handling of every command line.

The library raises; the command lines (`keras-transformer` and `python -m recipes.NAME`)
turn what a user can fix (a missing file, a bad value, an unknown backend, a missing
optional package) into one `error: ...` line on stderr and exit status 2, instead of a
traceback from deep inside Keras. Ctrl-C ends a command quietly with status 130, and a
closed stdout (`| head`) with status 1, as Unix tools do. Anything else is a bug and
keeps its traceback.

`command_line()` is the context both kinds of command line run in: these errors, and
Keras's progress bars kept off stdout (`keras_transformer.logs.progress_bars_on_stderr`).
"""

import contextlib
import os
import sys

# What a user's mistake raises: a file that is missing or in the way, a bad value, a
# wrong kind of file, a disk or network problem.
USER_ERRORS = (FileNotFoundError, FileExistsError, ValueError, TypeError, OSError)


def fail(message, status=2):
    """Prints `error: message` on stderr and exits with `status`."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def check_backend():
    """Exits with one line for an unknown `KERAS_BACKEND`, before Keras is imported
    (Keras's own error is a traceback). Every command line calls it first."""
    from keras_transformer.backend import check_backend_name

    try:
        check_backend_name(os.environ.get("KERAS_BACKEND"))
    except ValueError as error:
        fail(error)


@contextlib.contextmanager
def user_errors():
    """Runs the block; a user's mistake (`USER_ERRORS`, or a missing optional package)
    becomes one `error:` line and exit status 2, a NaN or infinite training loss or a
    cluster's lost process one line and status 1, Ctrl-C a quiet exit with status 130
    and a closed stdout (`| head`) a quiet exit with status 1, as Unix tools do."""
    try:
        yield
    except BrokenPipeError:
        _discard_stdout()
        sys.exit(1)
    except KeyboardInterrupt:
        print(file=sys.stderr)  # after the ^C the terminal shows
        sys.exit(130)
    except ImportError as error:
        # A package that is not installed (`pip install ...` fixes it); an import
        # that fails inside this package is a bug.
        name = error.name or ""
        if name == "keras_transformer" or name.startswith("keras_transformer."):
            raise
        fail(error)
    except (*USER_ERRORS, RuntimeError) as error:
        if _failed_run(error):
            fail(error, status=1)
        if not isinstance(error, USER_ERRORS):
            raise
        fail(error)


def _failed_run(error):
    """Whether `error` says that a run failed rather than that it was asked
    wrongly: training's NaN loss, or a cluster's lost process (only training
    raises them, so their modules are loaded by then)."""
    failed = [getattr(sys.modules.get(module), name, None) for module, name in (
        ("keras_transformer.training.fit", "NonFiniteLossError"),
        ("keras_transformer.training.distribution", "PeerLostError"))]
    return isinstance(error, tuple(kind for kind in failed if kind is not None))


@contextlib.contextmanager
def command_line():
    """The context of a command line's work: `user_errors`, with Keras's progress
    bars on stderr when it is a terminal and nowhere otherwise."""
    from keras_transformer import logs

    with user_errors(), logs.progress_bars_on_stderr():
        yield


def guarded(main, *args, **kwargs):
    """`main(*args, **kwargs)` after `check_backend`, inside `command_line`: how a
    recipe runs as a script (`if __name__ == "__main__": errors.guarded(main)`)."""
    check_backend()
    with command_line():
        return main(*args, **kwargs)


def _discard_stdout():
    """Points file descriptor 1 at the null device, so that the interpreter's last
    flush of stdout at exit does not fail on the closed pipe again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file
        pass
