"""User mistakes as one line (not a paper section): the error handling of every command line.

The library raises; the command lines (`keras-transformer` and `python -m recipes.NAME`)
turn what a user can fix (a missing file, a bad value, an unknown backend, a missing
optional package) into one `error: ...` line on stderr and exit status 2, instead of a
traceback from deep inside Keras; the line names the command's flags
(`--tokens-per-batch`), not the library's Python names. Ctrl-C (SIGINT) ends a command
quietly with status 130, SIGTERM with status 143, and a closed stdout (`| head`) with
status 1, as Unix tools do; files being written are removed, never left half-written.
An error that a library raises once the signal has come (its work or its cleanup
cut short) ends as the signal would. Anything else is a bug and keeps its traceback.

`command_line()` is the context both kinds of command line run in, from their first
line: the native logs quieted, SIGTERM turned into a clean exit, these errors, and
Keras's progress bars kept off stdout (`keras_transformer_app.logs.progress_bars_on_stderr`).
"""

import _thread
import contextlib
import gc
import os
import re
import signal
import sys
import threading
import time
import traceback

from keras_transformer_app import compat

# What a user's mistake raises: a file that is missing or in the way, a bad value, a
# wrong kind of file, a disk or network problem.
USER_ERRORS = (FileNotFoundError, FileExistsError, ValueError, TypeError, OSError)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread by a command line's handler: it unwinds
    like Ctrl-C (files being written are removed) and ends with status 143."""


# The interruptions the command's handlers have raised, latest last (`_signal_first`).
_SIGNALLED = []


def _terminate(signum, frame):
    _SIGNALLED.append(Terminated)
    raise Terminated()


def _interrupt(signum, frame):
    """Ctrl-C: `signal.default_int_handler`, noted as `_terminate` notes SIGTERM."""
    _SIGNALLED.append(KeyboardInterrupt)
    raise KeyboardInterrupt()


def signal_answered():
    """Forgets the signals noted so far: for a command that answered one itself and
    goes on (an export whose version was complete when the signal came), so that an
    error after it is not taken for the signal's."""
    del _SIGNALLED[:]


# The signal each interruption stands for, for `_signal_again`.
_SIGNAL_OF = {Terminated: signal.SIGTERM, KeyboardInterrupt: signal.SIGINT}


def _signal_again(previous_hook):
    """A `sys.unraisablehook` for a command line. Python runs a signal's handler in
    whatever the main thread is running, a garbage collector's callback or a
    finaliser too (JAX has one), and there the exception it raises is not
    propagated but printed ("Exception ignored in ...") and dropped: the command
    went on as if never signalled (a SIGTERM'd training ran on). This hook gives
    the main thread the same signal again instead, without a line, so that its
    handler raises once more where the exception unwinds the command. It is given
    from another thread a moment later, once the main thread has left the hook: a
    handler run in the hook would be dropped the same way (and if the main thread
    is in such a callback again, this happens again)."""

    def hook(unraisable):
        number = _SIGNAL_OF.get(unraisable.exc_type)
        if number is None:
            previous_hook(unraisable)
        else:  # a thread that the hook does not wait for (`Thread.start` would)
            _thread.start_new_thread(_interrupt_main_later, (number,))

    return hook


def _interrupt_main_later(number, delay=0.05):
    """The signal `number`, sent to the main thread after `delay` seconds (a real
    one: it also ends a wait of the main thread's, as a sleep, a read or a join)."""
    time.sleep(delay)
    signal.pthread_kill(threading.main_thread().ident, number)


def fail(message, status=2):
    """Prints `error: message` on stderr and exits with `status`."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


#: The backends the library runs on (`keras_transformer.backend.BACKENDS`), written here
#: so that the check below loads neither the library nor Keras; `tests/test_cli.py`
#: checks that they agree, and that the line is the library's own.
BACKENDS = ("tensorflow", "jax", "torch")


def check_backend():
    """Exits with one line for an unknown `KERAS_BACKEND`, before Keras is imported
    (Keras's own error is a traceback), with the message of the library's
    `check_backend_name`. Every command line calls it first."""
    name = os.environ.get("KERAS_BACKEND")
    if name is not None and name not in BACKENDS:
        fail(f"KERAS_BACKEND={name!r} is not a backend keras-transformer runs on: set it "
             f"to one of {', '.join(BACKENDS)} (or unset it for Keras's default).")


@contextlib.contextmanager
def user_errors(flags=None):
    """Runs the block; a user's mistake (`USER_ERRORS`, or a missing optional package)
    becomes one `error:` line and exit status 2, a NaN or infinite training loss, a
    cluster's lost process, a full disk or exhausted memory one line and status 1,
    Ctrl-C a quiet exit with status 130, SIGTERM (`Terminated`) one with status 143,
    and a closed stdout (`| head`) a quiet exit with status 1, as Unix tools do.
    `flags` ({destination: flag}, by default those of the parser given to
    `name_options_of`) names the command's options in the line (`flag_names`)."""
    try:
        with _signal_first():
            yield
    except BrokenPipeError:
        _discard_stdout()
        sys.exit(1)
    except KeyboardInterrupt:
        print(file=sys.stderr)  # after the ^C the terminal shows
        compat.forget_unhandled_keyboard_interrupt()  # handled: the status is 130
        sys.exit(130)
    except Terminated:
        sys.exit(143)
    except ImportError as error:
        # A package that is not installed (`pip install ...` fixes it); an import
        # that fails inside this package is a bug.
        name = error.name or ""
        if name == "keras_transformer" or name.startswith("keras_transformer."):
            raise
        fail(flag_names(_text(error), flags or _flags_of_the_command_line()))
    except Exception as error:  # noqa: BLE001  what is not answered below is a bug
        _answer(error, flags or _flags_of_the_command_line())
        raise


def _answer(error, flags):
    """Exits with one line for an `error` that is not a bug: a full disk or memory
    (status 1: the machine's), a failed run (1), a user's mistake (2). Returns for
    anything else, which the caller raises again."""
    if _disk_full(error):
        fail(_text(error).strip().splitlines()[0], status=1)
    if _out_of_memory(error):
        fail(_OUT_OF_MEMORY.format(_first_line(error)), status=1)
    if _failed_run(error):
        _release_the_failed_work(error)
        if getattr(error, "runtime_waits", False):
            _end_at_once(flag_names(_text(error), flags), status=1)
        fail(flag_names(_text(error), flags), status=1)
    if isinstance(error, USER_ERRORS):
        fail(flag_names(_text(error), flags))


def _end_at_once(message, status):
    """Prints `error: message` and ends the process now, without the interpreter's exit
    handlers: JAX's waits for a lost process of the cluster (its shutdown barrier) until
    the heartbeat timeout aborts this one with a native stack trace, about 45 s later,
    while the coordinator's port stays taken for the same command run again. What was
    being written has been unwound by then; the streams are flushed first."""
    print(f"error: {message}", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader has gone
            pass
    os._exit(status)


def _release_the_failed_work(error):
    """Frees what the frames of `error`'s chain held, now, while the interpreter still
    runs. TensorFlow's all-reduce leaves a `multiprocessing` ThreadPool open in its frame
    when a lost worker raises through it; freed only at the interpreter's exit, the pool
    printed `Exception ignored in: <function Pool.__del__ ...>` and a traceback after the
    one error line."""
    for link in _chain(error):
        traceback.clear_frames(link.__traceback__)
    gc.collect()


@contextlib.contextmanager
def _signal_first():
    """Runs the block; an error raised once a signal's handler has run is replaced by
    that signal's exception again: the signal is what ended the command. Such an
    error is either raised while the signal's exception unwound (a library's cleanup
    that failed because the interruption cut its work short: TensorFlow's graph stack
    asserts "Concurrent access?" when a Ctrl-C lands inside a trace), or made of it
    with no link back (a SIGTERM whose handler ran while TensorFlow's C++ built an
    exception of its own became pybind11's `RuntimeError: ... MISMATCH of original and
    normalized active exception types`, status 1 and a traceback)."""
    del _SIGNALLED[:]
    try:
        yield
    except Exception as error:
        interruption = _interruption_behind(error)
        if interruption is None and _SIGNALLED:
            interruption = _SIGNALLED[-1]()
        if interruption is None:
            raise
        raise interruption from None


def _interruption_behind(error):
    """The KeyboardInterrupt or `Terminated` that `error` was raised while handling,
    however far back in its chain of causes and contexts; None if there is none."""
    return next((link for link in _chain(error)
                 if isinstance(link, (KeyboardInterrupt, Terminated))), None)


def _chain(error):
    """`error`, then the error it was raised from or while handling, and so on back,
    each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


_OUT_OF_MEMORY = ("out of memory ({}): ask for less at once, e.g. a smaller --beam-size or "
                  "--batch-size (or --tokens-per-batch when training)")


def _disk_full(error):
    """Whether `error` says a disk is full (the library's writes raise it as an
    `OSError` naming the file)."""
    from keras_transformer.saving import is_disk_full  # an error: the library is loaded

    return is_disk_full(error)


def _out_of_memory(error):
    """Whether `error` says the machine ran out of memory: Python's MemoryError, or the
    backends' own (TensorFlow's ResourceExhaustedError, XLA's RESOURCE_EXHAUSTED, torch's
    allocator)."""
    text = str(error)
    if _disk_full(error):  # TensorFlow says RESOURCE_EXHAUSTED for a full disk too
        return False
    return (isinstance(error, MemoryError)
            or type(error).__name__ in ("ResourceExhaustedError", "OutOfMemoryError")
            or "RESOURCE_EXHAUSTED" in text or "not enough memory" in text)


def _text(error):
    """`str(error)` without an `OSError`'s "[Errno 28] " before its words."""
    return re.sub(r"^\[Errno \d+\] ", "", str(error))


def _first_line(error):
    lines = _text(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:200]


# The parser of the command line this process runs (`name_options_of`).
_PARSER = []


def name_options_of(parser):
    """Makes `user_errors` write the options of `parser` (and of its subcommands,
    those added later too) as their flags in an error line: the command line's
    parser, once it is made."""
    _PARSER[:] = [parser]


def _flags_of_the_command_line():
    return option_flags(_PARSER[0]) if _PARSER else {}


def option_flags(parser):
    """{destination: flag} of every option of `parser` and its subcommands
    (`beam_size` → `--beam-size`); an option that is on or off has both of its flags
    (`separate_vocabularies` → `("--separate-vocabularies", "--no-separate-vocabularies")`)."""
    import argparse

    flags = {}
    for action, subparsers in compat.parser_actions(parser):
        if subparsers is not None:
            for subparser in subparsers.values():
                flags.update(option_flags(subparser))
        elif action.option_strings and action.dest not in ("help", argparse.SUPPRESS):
            if isinstance(action, argparse.BooleanOptionalAction):
                off = [flag for flag in action.option_strings if flag.startswith("--no-")]
                on = [flag for flag in action.option_strings if flag not in off]
                flags.setdefault(action.dest, (max(on, key=len), max(off, key=len)))
            else:
                flags.setdefault(action.dest, max(action.option_strings, key=len))
    return flags


def flag_names(message, flags):
    """`message` with each `name=value` of an option written as its flag and value:
    "tokens_per_batch=100 is below max_sentence_length=128" becomes
    "--tokens-per-batch 100 is below --max-sentence-length 128", and an on-or-off
    option's `name=True` or `name=False` becomes its flag alone ("--no-separate-vocabularies")."""
    if not flags:
        return message
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, flags), key=len,
                                                    reverse=True)) + r")=(?:(True|False)\b)?")

    def flag(match):
        name, switch = match.groups()
        if isinstance(flags[name], str):
            return flags[name] + " " + (switch or "")
        on, off = flags[name]
        return {"True": on, "False": off}.get(switch, on + " ")

    return pattern.sub(flag, message)


def _failed_run(error):
    """Whether `error` says that a run failed rather than that it was asked
    wrongly: training's NaN loss, or a cluster's lost process (only training
    raises them, so their modules are loaded by then)."""
    failed = [getattr(sys.modules.get(module), name, None) for module, name in (
        ("keras_transformer_app.training.fit", "NonFiniteLossError"),
        ("keras_transformer_app.training.distribution", "PeerLostError"))]
    return isinstance(error, tuple(kind for kind in failed if kind is not None))


@contextlib.contextmanager
def command_line(native_logs=None, flags=None):
    """The context of a command line's work, from its first line: the native logs
    quieted (unless `native_logs`, its `--native-logs`, which is looked for among the
    process's arguments when None: they hide lines printed before the parser runs), SIGTERM
    turned into `Terminated`, `user_errors` naming `flags`, and Keras's progress bars
    on stderr when it is a terminal and nowhere otherwise. Only for a process the
    command line owns."""
    from keras_transformer_app import logs

    if native_logs is None:
        native_logs = logs.NATIVE_LOGS_FLAG in sys.argv[1:]
    logs.quiet_native_logs(native_logs)
    # Signal handlers belong to the main thread (a test may run a command in another).
    main_thread = threading.current_thread() is threading.main_thread()
    # Ctrl-C raises KeyboardInterrupt again (the start-up's quiet exit, if the package
    # set one, ends here), so that the work can stop cleanly.
    previous = ((signal.signal(signal.SIGTERM, _terminate),
                 signal.signal(signal.SIGINT, _interrupt), sys.unraisablehook)
                if main_thread else None)
    if main_thread:
        sys.unraisablehook = _signal_again(previous[2])
    try:
        with user_errors(flags):
            check_backend()  # before anything imports Keras (the progress bars do)
            with logs.progress_bars_on_stderr():
                yield
    finally:
        if main_thread:
            # The handlers this block installed give way to those before it; a signal
            # the command has since chosen to ignore (`logs.finished`: its work is
            # done) stays ignored, or a SIGTERM in the interpreter's shutdown would
            # find the start-up's handler again and end a finished command with 143.
            for number, handler, ours in ((signal.SIGTERM, previous[0], _terminate),
                                          (signal.SIGINT, previous[1], _interrupt)):
                if signal.getsignal(number) is ours:
                    signal.signal(number, handler)
            sys.unraisablehook = previous[2]


def guarded(main, *args, **kwargs):
    """`main(*args, **kwargs)` inside `command_line`: how a recipe runs as a script
    (`if __name__ == "__main__": errors.guarded(main)`). Once `main` has returned, a
    signal is ignored (`logs.finished`), as after the program's commands: what is left is
    the interpreter's and TensorFlow's shutdown, and the start-up's handler would end the
    finished recipe with 130 or 143."""
    from keras_transformer_app import logs

    with command_line():
        result = main(*args, **kwargs)
        logs.finished()
    return result


def _discard_stdout():
    """Points file descriptor 1 at the null device, so that the interpreter's last
    flush of stdout at exit does not fail on the closed pipe again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file
        pass
