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
one line rather than a traceback. The commands themselves are `keras_transformer_app.cli`.
"""

import os
import sys

from keras_transformer_app import logs


def main(argv=None):
    """Runs `keras-transformer` with `argv` (the process's arguments by default), in a
    process it owns: set up first, then the command (`keras_transformer_app.cli.main`).

    A command that needs the TensorFlow backend under another (`export` of a
    SavedModel under JAX or PyTorch) runs again in this process under TensorFlow
    (`os.execv`): one process from start to end, which a signal reaches as it
    would any other command. Once the command is done, a signal is ignored
    (`logs.finished`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    logs.start(native_logs=logs.NATIVE_LOGS_FLAG in argv)
    from keras_transformer_app.cli import main as run_command

    try:
        status = run_command(argv)
    except RuntimeError as error:
        from keras_transformer.export.saved_model import TensorFlowBackendRequired

        if not isinstance(error, TensorFlowBackendRequired):
            raise
        run_again_under_tensorflow(argv)
    logs.finished()  # a signal during the shutdown finds nothing left to stop
    return status


def run_again_under_tensorflow(argv):
    """Replaces this process with `keras-transformer argv` under the TensorFlow
    backend."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.execv(sys.executable, [sys.executable, "-m", "keras_transformer_app", *argv])


__all__ = ["main"]
