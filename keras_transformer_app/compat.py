"""What the program uses of its dependencies beyond their stable public API, in one place (no
paper section; the library's own such uses are `keras_transformer.compat`).

- `parser_actions`: argparse's `ArgumentParser._actions` and `_SubParsersAction`, to walk the
  options of a parser and its subcommands (flag names in error messages, path checks of the
  command line); argparse has no public listing. Tested with Python 3.11.7
  (`tests/test_compat.py`).
- `forget_unhandled_keyboard_interrupt`: CPython's `_Py_UnhandledKeyboardInterrupt`. CPython
  3.11 sets it when a KeyboardInterrupt leaves code that `exec` runs from a string (the
  dataclasses module does, and torch's import makes dataclasses), even if the program catches
  the KeyboardInterrupt further up; at exit it then ends the process with SIGINT instead of the
  status the program chose (a Ctrl-C during a command's imports ended it with -2, not 130).
  The command line clears it once it has handled the interruption. Tested with Python 3.11.7
  (`tests/test_signals.py`).

The server stands on asyncio and httptools' public parser API
(`keras_transformer_app.serving.protocol`), with nothing of uvicorn's.
"""

import argparse
import ctypes


def parser_actions(parser):
    """`[(action, subparsers)]` of an `argparse.ArgumentParser`: each of its actions, with
    `{command: parser}` for the action of its subcommands and None for any other."""
    return [(action, action.choices if isinstance(action, argparse._SubParsersAction)
             else None) for action in parser._actions]


def forget_unhandled_keyboard_interrupt():
    """Clears CPython's record of a KeyboardInterrupt that left `exec`'d code, once the
    program has handled it, so that the interpreter exits with the program's status; a
    no-op where CPython has no such flag."""
    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ValueError, AttributeError):  # not CPython, or renamed
        pass
