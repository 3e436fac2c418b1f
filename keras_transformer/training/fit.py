"""§5.2-§5.4 Training regime: `model.fit` with checkpoints, resumption and logs.

Training is counted in optimizer steps, as in the paper (100,000 steps for the
base model). `fit_steps` runs `model.fit` over a repeating dataset in windows of
`checkpoint_every` steps (Keras "epochs"), and after each window:

- `keras.callbacks.BackupAndRestore` backs up weights and optimizer state, so a
  killed run started again with the same command resumes from the last window
  and loses at most `checkpoint_every` steps;
- `StepCheckpoint` saves `checkpoints/step-NNNNNNN.keras`, keeping the last
  `keep_checkpoints` for checkpoint averaging (§6.1);
- `keras.callbacks.CSVLogger` and `keras.callbacks.TensorBoard` log the losses.

Its files go where `keras_transformer.run_dir` names them (backup/,
checkpoints/, logs/, training_log.csv).
"""

import glob
import os
import re
import time

import keras

from keras_transformer import run_dir as run_files
from keras_transformer import validation

CHECKPOINT_PATTERN = re.compile(r"step-(\d+)\.keras$")


def list_checkpoints(directory):
    """The step checkpoints in `directory`, oldest first."""
    paths = glob.glob(os.path.join(directory, "step-*.keras"))
    return sorted(
        (p for p in paths if CHECKPOINT_PATTERN.search(p)),
        key=lambda p: int(CHECKPOINT_PATTERN.search(p).group(1)),
    )


class StepCheckpoint(keras.callbacks.Callback):
    """Saves the model as `step-NNNNNNN.keras` after every Keras epoch.

    The step is the optimizer's iteration count, so names stay right across
    resumed runs. Writes go to a temporary file first, then are renamed, so a
    crash never leaves a truncated checkpoint. Only the newest `keep` are kept.

    Args:
        directory: Where checkpoints go.
        keep: How many of the newest checkpoints to keep (None keeps all).
    """

    def __init__(self, directory, keep=5):
        super().__init__()
        if keep is not None:
            validation.check_positive_int("keep", keep, "or None to keep every checkpoint")
        self.directory = directory
        self.keep = keep

    def on_epoch_end(self, epoch, logs=None):
        os.makedirs(self.directory, exist_ok=True)
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        run_files.save_model(self.model, os.path.join(self.directory, f"step-{step:07d}.keras"))
        if self.keep:
            for old in list_checkpoints(self.directory)[: -self.keep]:
                os.remove(old)


class TimeBudget(keras.callbacks.Callback):
    """Stops `model.fit` once `seconds` of training have passed.

    Checked after every batch, so training overruns by at most one step. Used
    by `recipes/table3.py` to give every variant the same training time.

    Args:
        seconds: The budget, counted from the start of this `fit` call.
    """

    def __init__(self, seconds):
        super().__init__()
        if not seconds > 0:
            raise ValueError(f"seconds={seconds!r} must be a positive number.")
        self.seconds = float(seconds)
        self.exhausted = False
        self._start = None

    def on_train_begin(self, logs=None):
        self._start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() - self._start >= self.seconds:
            self.exhausted = True
            self.model.stop_training = True


def fit_steps(
    model,
    train_dataset,
    run_dir,
    total_steps,
    checkpoint_every=1000,
    validation_dataset=None,
    keep_checkpoints=5,
    verbose="auto",
    extra_callbacks=(),
):
    """Trains `model` for `total_steps` optimizer steps with the callbacks above.

    Args:
        model: A compiled model.
        train_dataset: A repeating `tf.data.Dataset` (see
            `make_dataset(..., repeat=True)`).
        run_dir: The run directory (created if needed).
        total_steps: Optimizer steps in all, counting steps of earlier runs that
            this one resumes; rounded up to a multiple of `checkpoint_every`.
        checkpoint_every: Steps between checkpoints and backups.
        validation_dataset: A finite dataset evaluated after every window.
        keep_checkpoints: How many step checkpoints to keep.
        verbose: `model.fit` verbosity (a progress bar by default).
        extra_callbacks: More Keras callbacks.

    Returns:
        The `keras.callbacks.History` of this invocation.
    """
    if total_steps < 1 or checkpoint_every < 1:
        raise ValueError(
            f"total_steps={total_steps} and checkpoint_every={checkpoint_every} must be positive."
        )
    os.makedirs(run_dir, exist_ok=True)
    windows = -(-total_steps // checkpoint_every)
    callbacks = [
        keras.callbacks.BackupAndRestore(run_files.path(run_dir, run_files.BACKUP)),
        StepCheckpoint(run_files.path(run_dir, run_files.CHECKPOINTS), keep=keep_checkpoints),
        keras.callbacks.CSVLogger(run_files.path(run_dir, run_files.TRAINING_LOG), append=True),
        keras.callbacks.TensorBoard(run_files.path(run_dir, run_files.LOGS),
                                    update_freq="epoch"),
        *extra_callbacks,
    ]
    return model.fit(
        train_dataset,
        steps_per_epoch=checkpoint_every,
        epochs=windows,
        validation_data=validation_dataset,
        callbacks=callbacks,
        verbose=verbose,
        shuffle=False,  # the tf.data pipeline shuffles; Keras cannot shuffle a dataset
    )
