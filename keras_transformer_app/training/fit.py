"""§5.2-§5.4 Training regime: `model.fit` with checkpoints, resumption and logs.

Training is counted in optimizer steps, as in the paper (100,000 steps for the
base model). `fit_steps` runs `model.fit` over a repeating dataset in windows of
`checkpoint_every` steps (Keras "epochs"), and after each window:

- `RunBackup` (a callback on `model.save_weights` and a JSON state file, whose
  every write is atomic) backs up weights and optimizer state, so a run killed
  at any moment and started again with the same command resumes from the last
  window (`fit`'s `initial_epoch`) and loses at most `checkpoint_every` steps;
- `StepCheckpoint` saves `checkpoints/step-NNNNNNN.keras`, keeping the last
  `keep_checkpoints` for checkpoint averaging (§6.1);
- `WindowClock` times the window (its `seconds`, validation included, and its
  `compile_seconds`, the stalls of steps that compiled a new batch shape) and
  `WindowLog` (a `keras.callbacks.CSVLogger`) and `keras.callbacks.TensorBoard` log
  it with the losses, so `training_log.csv` says how long each window took.

`SignalsBetweenSteps` (interruptions.py) holds a Ctrl-C or SIGTERM that comes
during a step until the step ends (10 seconds at most), so that its exception
unwinds from Python code rather than from inside the engine's copy of the
step's logs.

`NonFiniteGuard` watches every step's loss. The first NaN or infinite loss
stops training, and neither the checkpoint, the backup nor the
`training_log.csv` row of that window is written, so the run directory keeps
its last finite state: `fit_steps` raises `NonFiniteLossError` naming the
step, and the same command, with a lower learning rate for instance, resumes
from that state.

Its files go where `keras_transformer_app.run_files` names them (backup/,
checkpoints/, logs/, training_log.csv). In a multi-process run every process runs
the same callbacks, and those of the processes other than the chief write into a
`save_dir` of their own (`keras_transformer_app.training.distribution.Distributed.writes_to`),
while all restore the chief's backup.
"""

import glob
import math
import os
import re
import time

import keras
import numpy as np

from keras_transformer import saving, validation
from keras_transformer_app import run_files
from keras_transformer_app.training.interruptions import SignalsBetweenSteps

CHECKPOINT_PATTERN = re.compile(r"step-(\d+)\.keras$")


def list_checkpoints(directory):
    """The step checkpoints in `directory`, oldest first."""
    paths = glob.glob(os.path.join(directory, "step-*.keras"))
    return sorted(
        (p for p in paths if CHECKPOINT_PATTERN.search(p)),
        key=lambda p: int(CHECKPOINT_PATTERN.search(p).group(1)),
    )


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; the run directory keeps the
    last finite state."""


def optimizer_step(model):
    """The optimizer's iteration count: the number of steps trained so far."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def model_and_optimizer_variables(model):
    """The model's variables and its optimizer's, if it has one: what
    `model.save_weights` writes."""
    optimizer = getattr(model, "optimizer", None)
    return list(model.weights) + (list(optimizer.variables) if optimizer is not None else [])


def weights_are_finite(model):
    """Whether every floating-point variable of the model and its optimizer
    is finite (one pass over the weights, done once per window)."""
    return all(
        np.isfinite(keras.ops.convert_to_numpy(v)).all()
        for v in model_and_optimizer_variables(model) if keras.backend.is_float_dtype(v.dtype)
    )


class NonFiniteGuard(keras.callbacks.Callback):
    """Stops `model.fit` at the first step whose loss is NaN or infinite.

    It reads the loss that `fit` reports after every step, so it costs one
    scalar per step. After it trips, `step` and `loss` say where, and
    `StepCheckpoint` and `RunBackup` given this guard write nothing more.
    """

    def __init__(self):
        super().__init__()
        self.step = None
        self.loss = None

    @property
    def tripped(self):
        return self.step is not None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or self.tripped:
            return
        loss = float(keras.ops.convert_to_numpy(loss))
        if not math.isfinite(loss):
            self.step, self.loss = optimizer_step(self.model), loss
            self.model.stop_training = True

    def error(self, run_dir):
        return NonFiniteLossError(
            f"The loss became {self.loss} at step {self.step}: training stopped, and "
            f"{run_dir!r} keeps the last finite checkpoint and backup. Lower the learning "
            "rate (e.g. --lr-scale) or check the data, then run the same command again to "
            "resume from that state."
        )


def _may_save(model, guard):
    """Whether this window's state is fit to be saved: the guard has not
    tripped (a window cut short) and every weight is finite."""
    return (guard is None or not guard.tripped) and weights_are_finite(model)


class StepCheckpoint(keras.callbacks.Callback):
    """Saves the model as `step-NNNNNNN.keras` after every Keras epoch.

    The step is the optimizer's iteration count, so names stay right across
    resumed runs. Writes go to a temporary file first, then are renamed, so a
    crash never leaves a truncated checkpoint. Only the newest `keep` are kept.
    A model with a non-finite weight is never saved, so it never pushes a good
    checkpoint out.

    Args:
        directory: Where checkpoints go.
        keep: How many of the newest checkpoints to keep (None keeps all).
        guard: A `NonFiniteGuard`; once it has tripped, nothing is saved.
    """

    def __init__(self, directory, keep=5, guard=None):
        super().__init__()
        if keep is not None:
            validation.check_positive_int("keep", keep, "or None to keep every checkpoint")
        self.directory = directory
        self.keep = keep
        self.guard = guard

    def on_epoch_end(self, epoch, logs=None):
        if not _may_save(self.model, self.guard):
            return
        os.makedirs(self.directory, exist_ok=True)
        step = optimizer_step(self.model)
        saving.save_model(self.model, os.path.join(self.directory, f"step-{step:07d}.keras"))
        if self.keep:
            for old in list_checkpoints(self.directory)[: -self.keep]:
                os.remove(old)


def backup_step(run_dir):
    """The optimizer step of the run's last backup (`RunBackup`), or None when it
    has none (a backup in Keras's own layout gives 0: it records no step)."""
    state = RunBackup(run_files.path(run_dir, run_files.BACKUP)).state()
    return None if state is None else int(state.get("step", 0))


class RunBackup(keras.callbacks.Callback):
    """The run's backup after every window, which survives a kill at any moment.

    Every window's weights and optimizer state go to a new file,
    `window-NNNNNN.weights.h5` (`model.save_weights`, written under a temporary
    name, then renamed), and only then does `state.json` (also renamed into
    place) point at it; older windows are deleted after that. Whatever the
    moment of the kill, `state.json` names a complete file. When training
    begins the model loads it, and `windows_done` gives `fit` its
    `initial_epoch`. The backup is kept when training ends (a run given more
    steps trains on from it), and nothing is written for a window with
    non-finite weights or one the guard cut short. A backup that
    `keras.callbacks.BackupAndRestore` wrote (runs from before:
    `latest.weights.h5`, `training_metadata.json`) is still restored.

    Args:
        backup_dir: The backup folder (`run_files.BACKUP`), restored from.
        guard: A `NonFiniteGuard`, or None.
        save_dir: Where the backups are written; None for `backup_dir`. (A
            process other than the chief restores the chief's backup and
            writes its own elsewhere.)
    """

    STATE = "state.json"
    # What keras.callbacks.BackupAndRestore writes.
    KERAS_WEIGHTS, KERAS_STATE = "latest.weights.h5", "training_metadata.json"

    def __init__(self, backup_dir, guard=None, save_dir=None):
        super().__init__()
        self.backup_dir = backup_dir
        self.guard = guard
        self.save_dir = save_dir or backup_dir

    def state(self):
        """The last backup's `{"epoch": windows done, "weights": file name or None}`
        in `backup_dir`, or None when there is none yet."""
        state = saving.read_json(os.path.join(self.backup_dir, self.STATE))
        return self._keras_state() if state is None else state

    def windows_done(self):
        """The windows the last backup had finished: `fit`'s `initial_epoch`."""
        state = self.state()
        return 0 if state is None else int(state["epoch"])

    def on_train_begin(self, logs=None):
        # Inside fit, as Keras's own BackupAndRestore: the model and its optimizer
        # are built there (under a distribution strategy, in its scope).
        saving.remove_partials(self.save_dir)  # writes that a kill interrupted
        state = self.state()
        if state is None or state["weights"] is None:
            return
        if not self.model.built:
            raise ValueError("RunBackup needs a built model: call it on a batch first.")
        self._load_weights(self.model, os.path.join(self.backup_dir, state["weights"]))

    def _keras_state(self):
        """The state of a backup in BackupAndRestore's layout, or None."""
        weights = os.path.join(self.backup_dir, self.KERAS_WEIGHTS)
        metadata = saving.read_json(os.path.join(self.backup_dir, self.KERAS_STATE))
        if metadata is None and not os.path.exists(weights):
            return None
        return {"epoch": (metadata or {}).get("epoch", 0),
                "weights": self.KERAS_WEIGHTS if os.path.exists(weights) else None}

    @staticmethod
    def _load_weights(model, weights_path):
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)  # its variables, to load
        try:
            model.load_weights(weights_path)
        except Exception as error:
            first_line = (str(error).strip().splitlines() or [""])[0][:160]
            raise ValueError(  # Keras's message goes on with every variable: its first line
                f"Cannot restore the backup {weights_path!r} ({type(error).__name__}: "
                f"{first_line}): it does not match this model. A run directory holds one "
                "model; pass another --run-dir for a different configuration."
            ) from error

    def on_epoch_end(self, epoch, logs=None):
        if not _may_save(self.model, self.guard):
            return
        windows = epoch + 1
        os.makedirs(self.save_dir, exist_ok=True)
        name = f"window-{windows:06d}.weights.h5"
        with saving.atomic_path(os.path.join(self.save_dir, name),
                                size=_weights_bytes(self.model)) as partial:
            self.model.save_weights(partial, overwrite=True)
        saving.write_json(os.path.join(self.save_dir, self.STATE),
                             {"epoch": windows, "weights": name,
                              "step": optimizer_step(self.model)})
        for old in glob.glob(os.path.join(self.save_dir, "*.weights.h5")):
            if os.path.basename(old) != name:
                os.remove(old)


def _weights_bytes(model):
    """The bytes of what `model.save_weights` writes (HDF5's own few kilobytes aside)."""
    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize
               for v in model_and_optimizer_variables(model))


class WindowClock(keras.callbacks.Callback):
    """Adds the optimizer `step` at the window's end and wall-clock figures
    to every window's logs (before `WindowLog` writes them):

    - `seconds`: the window, from its first step to the end of its
      validation pass;
    - `validation_seconds`: the validation pass alone;
    - `compile_seconds`: what the window's slow steps took beyond the median
      step, a step being slow when it took more than `slow_factor` times the
      median. A compiled train step stalls the first time it meets a new
      batch shape (JAX and TensorFlow compile each shape once), so this is
      the compilation time of the window's new shapes, plus any other stall;
      it is near zero once every bucket shape has been seen, or when a
      persistent compilation cache already holds them.

    Step durations come from `on_train_batch_begin/end`, which `fit` calls
    after each step's outputs are ready (the `NonFiniteGuard` reads the loss).
    """

    def __init__(self, slow_factor=3.0):
        super().__init__()
        self.slow_factor = slow_factor
        self._window = self._step = self._validation = None
        self._durations = []
        self._validation_seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._window = time.monotonic()
        self._durations = []
        self._validation_seconds = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._step = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self._step is not None:
            self._durations.append(time.monotonic() - self._step)

    def on_test_begin(self, logs=None):
        self._validation = time.monotonic()

    def on_test_end(self, logs=None):
        if self._validation is not None:
            self._validation_seconds += time.monotonic() - self._validation

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self._window is None:
            return
        logs["step"] = optimizer_step(self.model)
        logs["seconds"] = time.monotonic() - self._window
        logs["validation_seconds"] = self._validation_seconds
        logs["compile_seconds"] = stall_seconds(self._durations, self.slow_factor)


def stall_seconds(durations, slow_factor=3.0):
    """The time that steps slower than `slow_factor` × the median step took
    beyond the median (0 for no steps)."""
    if not len(durations):
        return 0.0
    median = float(np.median(durations))
    return float(sum(d - median for d in durations if d > slow_factor * median))


class WindowLog(keras.callbacks.CSVLogger):
    """`keras.callbacks.CSVLogger` appending one row per window to
    `training_log.csv`, but for a window that the `NonFiniteGuard` stopped: like
    its checkpoint and backup, that window is trained again on resuming, and its
    row would stand twice in the log."""

    def __init__(self, filename, guard):
        super().__init__(filename, append=True)
        self.guard = guard

    def on_epoch_end(self, epoch, logs=None):
        if not self.guard.tripped:
            super().on_epoch_end(epoch, logs)


class TimeBudget(keras.callbacks.Callback):
    """Stops `model.fit` once `seconds` of training have passed.

    Checked after every batch, so training overruns by at most one step. Used
    by `variants.train_and_measure` to give every Table 3 variant the same
    training time.

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
    save_dir=None,
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
        save_dir: Where this process writes checkpoints, backups and logs; None
            for `run_dir`. Training restores the backup of `run_dir` either way.

    Returns:
        The `keras.callbacks.History` of this invocation.

    Raises:
        NonFiniteLossError: The loss became NaN or infinite; the run directory
            keeps its last finite checkpoint and backup.
    """
    if total_steps < 1 or checkpoint_every < 1:
        raise ValueError(
            f"total_steps={total_steps} and checkpoint_every={checkpoint_every} must be positive."
        )
    save_dir = save_dir or run_dir
    os.makedirs(save_dir, exist_ok=True)
    windows = -(-total_steps // checkpoint_every)
    guard = NonFiniteGuard()
    signals = SignalsBetweenSteps()
    backup = RunBackup(run_files.path(run_dir, run_files.BACKUP), guard=guard,
                       save_dir=run_files.path(save_dir, run_files.BACKUP))
    callbacks = [
        signals,  # first: an interruption comes before this window's files are written
        guard,
        backup,
        StepCheckpoint(run_files.path(save_dir, run_files.CHECKPOINTS), keep=keep_checkpoints,
                       guard=guard),
        WindowClock(),
        WindowLog(run_files.path(save_dir, run_files.TRAINING_LOG), guard=guard),
        keras.callbacks.TensorBoard(run_files.path(save_dir, run_files.LOGS),
                                    update_freq="epoch"),
        *extra_callbacks,
    ]
    with signals.installed():
        history = model.fit(
            train_dataset,
            steps_per_epoch=checkpoint_every,
            epochs=windows,
            initial_epoch=backup.windows_done(),
            validation_data=validation_dataset,
            callbacks=callbacks,
            verbose=verbose,
            shuffle=False,  # the tf.data pipeline shuffles; Keras cannot shuffle a dataset
        )
    if guard.tripped:
        raise guard.error(run_dir)
    return history
