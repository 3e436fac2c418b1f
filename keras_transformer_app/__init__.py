"""The program around the library: the `keras-transformer` command's entry point and
what the program's processes set up (not a paper section).

`keras_transformer` is the paper's library: importing it changes nothing in the
program that imports it, whatever that program is called. A process that runs one of
the project's entry points is the program's own, and sets itself up here before
anything loads Keras or TensorFlow (`logs.start`: native log lines hidden, a signal
during start-up ending it quietly):

- `keras-transformer` (this package's `main`, also `python -m keras_transformer_app`);
- `python -m recipes.NAME`, whose first statement calls `logs.start` when run as
  `__main__`;
- the scripts of `benchmarks/`, the same way.

Nothing here imports Keras until a command runs, so that an unknown `KERAS_BACKEND` is
one line rather than a traceback. The commands themselves are `keras_transformer.cli`.
"""

import sys

from keras_transformer_app import logs


def main(argv=None):
    """Runs `keras-transformer` with `argv` (the process's arguments by default), in a
    process it owns: set up first, then the command (`keras_transformer.cli.main`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    logs.start(native_logs=logs.NATIVE_LOGS_FLAG in argv)
    from keras_transformer.cli import main as run_command

    return run_command(argv)


__all__ = ["main"]
