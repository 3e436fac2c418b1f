"""A SavedModel from a process of another backend: `keras-transformer export` run in a
TensorFlow-backend child process (the program's, not the paper's library).

Only the TensorFlow backend writes a SavedModel (`saved_model.TensorFlowBackendRequired`).
`keras-transformer export` under JAX or PyTorch runs itself again under TensorFlow, in
the same process (`keras_transformer_app`). A program that must go on after the export,
as a training run with `--export-dir` does, runs the command line in a child process
instead, on the saved `.keras` file (`export_in_tensorflow_process`;
`export_from_any_backend` exports in-process under TensorFlow). The child writes
its progress, its summary and any `error:` line to this process's stdout and stderr as
it goes; this process reads its exit status only.
"""

import os
import subprocess
import sys

from keras_transformer.export import versions


class ExportProcessError(RuntimeError):
    """The export's TensorFlow-backend process ended with a status other than 0; what
    went wrong is in its lines on stderr, above."""

    def __init__(self, status):
        super().__init__(f"The export's TensorFlow-backend process ended with status {status}: "
                         "its error is above.")
        self.status = status


def export_in_tensorflow_process(model, export_base, version=None, beam_size=4, alpha=0.6,
                                 max_output_length=None, max_source_length=None,
                                 batch_sizes=None, lengths=None, n_best=None, verbose=True):
    """`export_saved_model(model, export_base, ...)` in a TensorFlow-backend child
    process (`python -m keras_transformer_app export ...`), from any backend.

    Args:
        model: A `.keras` file with its tokenizer beside it, or a run directory.
        export_base, version, beam_size, alpha, max_output_length,
        max_source_length, batch_sizes, lengths, n_best, verbose: As in
            `keras_transformer.export.saved_model.export_saved_model`.

    Returns:
        The path of the new version directory.

    Raises:
        ExportProcessError: The child failed (its own error line or traceback
            is on stderr). A Ctrl-C or SIGTERM that interrupts this process
            stops the child first, which publishes no partial version.
    """
    version = versions.next_version(export_base, version)
    command = [sys.executable, "-m", "keras_transformer_app", "export", os.fspath(model),
               os.fspath(export_base), "--version", str(version), "--beam-size", str(beam_size),
               "--alpha", str(alpha)] + ([] if verbose else ["--quiet"])
    for flag, value in (("--max-output-length", max_output_length),
                        ("--max-source-length", max_source_length), ("--n-best", n_best)):
        if value is not None:
            command += [flag, str(value)]
    for flag, values in (("--batch-sizes", batch_sizes), ("--lengths", lengths)):
        if values is not None:
            command += [flag, ",".join(str(v) for v in values)]
    process = subprocess.Popen(command, env=dict(os.environ, KERAS_BACKEND="tensorflow"),
                               stdout=None if verbose else subprocess.DEVNULL)
    try:
        status = process.wait()
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): the export stops too, cleaning up after
        # itself, before this process goes on with the interruption.
        process.terminate()
        process.wait()
        raise
    if status != 0:
        raise ExportProcessError(status)
    return os.path.join(export_base, str(version))


def export_from_any_backend(model, export_base, **options):
    """`export_saved_model(model, export_base, **options)`: in this process under the
    TensorFlow backend, in a TensorFlow-backend child process under another
    (`export_in_tensorflow_process`)."""
    from keras_transformer.export.saved_model import (
        TensorFlowBackendRequired,
        export_saved_model,
    )

    try:
        return export_saved_model(model, export_base, **options)
    except TensorFlowBackendRequired:
        return export_in_tensorflow_process(model, export_base, **options)
