"""keras_transformer_app/training/fit.py: the non-finite guard, the atomic backup
and the time budget of the Table 3 script (fit_steps itself also runs in every
recipe smoke test)."""

import csv
import json
import os
import signal
import time

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import saving
from keras_transformer.data.toy_tasks import reverse_task
from keras_transformer_app import run_files
from keras_transformer_app.training.fit import (
    NonFiniteLossError,
    TimeBudget,
    WindowClock,
    fit_steps,
    list_checkpoints,
    stall_seconds,
    weights_are_finite,
)
from keras_transformer_app.training.interruptions import SignalsBetweenSteps
from tests.helpers import tiny_model


def reverse_dataset():
    import tensorflow as tf

    inputs, labels = reverse_task(64, seed=3)
    return tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(16).repeat()


def compiled_tiny_model(learning_rate):
    """A tiny Transformer whose constant learning rate is a schedule, so that
    restoring a backup (which holds the optimizer's variables) keeps it."""
    model = tiny_model(vocab_size=16, num_layers=1)
    schedule = keras.optimizers.schedules.ExponentialDecay(learning_rate, 1, 1.0)
    model.compile(optimizer=keras.optimizers.Adam(schedule),
                  loss=kt.LabelSmoothedCrossEntropy(0.1))
    return model


# What a test below checks is the callbacks' file handling, the same under every
# backend: it runs in the torch pass. Saving and restoring a model and its optimizer
# mid-run, which does depend on the backend, is the first test's, on every backend.
file_handling = pytest.mark.once("torch")


def checkpoint_steps(directory):
    return [int(os.path.basename(p)[5:12]) for p in list_checkpoints(directory)]


def logged_windows(run_dir):
    with open(run_files.path(run_dir, run_files.TRAINING_LOG)) as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


@pytest.mark.slow
@pytest.mark.backs("docs/training.md", "status 1). Nothing of that window is saved")
def test_non_finite_loss_stops_training_and_the_run_resumes_from_its_last_finite_state(
        tmp_path):
    checkpoints = run_files.path(tmp_path, run_files.CHECKPOINTS)
    state_path = os.path.join(run_files.path(tmp_path, run_files.BACKUP), "state.json")
    fit_steps(compiled_tiny_model(1e-3), reverse_dataset(), tmp_path, 4, checkpoint_every=2,
              verbose=0)
    assert checkpoint_steps(checkpoints) == [2, 4]

    # A learning rate of 1e30 overflows the weights within a step or two.
    exploding = compiled_tiny_model(1e30)
    with pytest.raises(NonFiniteLossError, match=r"The loss became (nan|inf) at step [56]"):
        fit_steps(exploding, reverse_dataset(), tmp_path, 8, checkpoint_every=2, verbose=0)
    assert not weights_are_finite(exploding)
    assert checkpoint_steps(checkpoints) == [2, 4]  # nothing written for the bad window
    assert logged_windows(tmp_path) == [0, 1]
    with open(state_path) as f:
        assert json.load(f)["step"] == 4
    for path in list_checkpoints(checkpoints):
        assert weights_are_finite(saving.load_model(path))

    # The same run with a sane rate resumes from step 4, not from the NaN state.
    model = compiled_tiny_model(1e-3)
    history = fit_steps(model, reverse_dataset(), tmp_path, 8, checkpoint_every=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert np.all(np.isfinite(history.history["loss"]))
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 8
    assert checkpoint_steps(checkpoints) == [2, 4, 6, 8]
    assert logged_windows(tmp_path) == [0, 1, 2, 3]  # window 2 once, as trained again


@file_handling
def test_backup_ignores_a_write_that_a_kill_interrupted(tmp_path):
    backup = run_files.path(tmp_path, run_files.BACKUP)
    fit_steps(compiled_tiny_model(1e-3), reverse_dataset(), tmp_path, 2, checkpoint_every=2,
              verbose=0)
    assert sorted(os.listdir(backup)) == ["state.json", "window-000001.weights.h5"]
    # Killed while writing window 2: a truncated file under its temporary
    # name; killed after its rename but before state.json: a complete file
    # that state.json does not name yet.
    with open(os.path.join(backup, ".partial-999999999-window-000002.weights.h5"), "wb") as f:
        f.write(b"\x89HDF\r\n")
    with open(os.path.join(backup, "window-000002.weights.h5"), "wb") as f:
        f.write(b"not read")
    model = compiled_tiny_model(1e-3)
    history = fit_steps(model, reverse_dataset(), tmp_path, 4, checkpoint_every=2, verbose=0)
    assert len(history.history["loss"]) == 1  # resumed after window 1
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4
    assert sorted(os.listdir(backup)) == ["state.json", "window-000002.weights.h5"]


@file_handling
def test_a_backup_that_keras_backup_and_restore_wrote_is_restored(tmp_path):
    # Runs from before RunBackup kept Keras's layout: latest.weights.h5 and
    # training_metadata.json.
    backup = run_files.path(tmp_path, run_files.BACKUP)
    model = compiled_tiny_model(1e-3)
    model.fit(reverse_dataset(), steps_per_epoch=2, epochs=1, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    assert {"latest.weights.h5", "training_metadata.json"} <= set(os.listdir(backup))
    model = compiled_tiny_model(1e-3)
    history = fit_steps(model, reverse_dataset(), tmp_path, 4, checkpoint_every=2, verbose=0)
    assert len(history.history["loss"]) == 1  # resumed after Keras's window 1
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4


def tiny_regression():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model, np.ones((64, 4), "float32"), np.zeros((64, 1), "float32")


def test_time_budget_stops_fit_after_the_batch_that_exhausts_it():
    model, x, y = tiny_regression()
    budget = TimeBudget(1e-9)
    model.fit(x, y, batch_size=8, epochs=3, callbacks=[budget], verbose=0)
    assert budget.exhausted
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1


def test_time_budget_does_not_stop_a_run_that_fits_in_it():
    model, x, y = tiny_regression()
    budget = TimeBudget(3600)
    model.fit(x, y, batch_size=8, epochs=2, callbacks=[budget], verbose=0)
    assert not budget.exhausted
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 16


class Interrupted(BaseException):
    pass


def interrupt(number, frame):
    raise Interrupted(number)


class SignalDuringStep(keras.callbacks.Callback):
    """Sends `number` to this process as step `at` begins (its handler would run
    inside the step) and, if `busy`, keeps the step busy that many seconds."""

    def __init__(self, number, at, busy=0.0):
        super().__init__()
        self.number, self.at, self.busy = number, at, busy

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.at:
            signal.raise_signal(self.number)
            time.sleep(self.busy)


def steps_taken(model):
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


@pytest.fixture
def interrupting():
    """SIGINT and SIGTERM raise `Interrupted` during the test (the program's own
    handlers, as a command line's), and get their handlers back after it."""
    previous = {number: signal.signal(number, interrupt)
                for number in SignalsBetweenSteps.SIGNALS}
    yield
    for number, handler in previous.items():
        signal.signal(number, handler)


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_step_runs_its_handler_after_the_step_and_the_handlers_come_back(
        number, interrupting):
    model, x, y = tiny_regression()
    signals = SignalsBetweenSteps()
    with pytest.raises(Interrupted), signals.installed():
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[signals, SignalDuringStep(number, at=2)])
    assert steps_taken(model) == 3  # the step under way finished, no other began
    assert signal.getsignal(number) is interrupt


def test_a_step_that_outlasts_the_longest_wait_gets_the_handler_where_it_is(interrupting):
    model, x, y = tiny_regression()
    signals = SignalsBetweenSteps(longest_wait=0.2)
    with pytest.raises(Interrupted), signals.installed():
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[signals, SignalDuringStep(signal.SIGTERM, at=2, busy=30)])
    assert steps_taken(model) == 2  # raised in the busy step, not after it


class SignalAtTheEnd(keras.callbacks.Callback):
    def on_train_end(self, logs=None):
        signal.raise_signal(signal.SIGTERM)


def test_a_signal_after_the_last_step_is_not_lost(interrupting):
    model, x, y = tiny_regression()
    signals = SignalsBetweenSteps()
    with pytest.raises(Interrupted), signals.installed():
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[signals, SignalAtTheEnd()])
    assert steps_taken(model) == 8


def test_signals_at_their_default_are_left_alone():
    signals = SignalsBetweenSteps()
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with signals.installed():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stall_seconds_counts_slow_steps_beyond_the_median():
    # Two compilations (2.0 s and 1.1 s steps) among 0.1 s steps.
    durations = [2.0, 0.1, 0.1, 1.1, 0.1, 0.12, 0.09]
    assert stall_seconds(durations) == pytest.approx((2.0 - 0.1) + (1.1 - 0.1))
    assert stall_seconds([0.1, 0.12, 0.25]) == 0.0  # within 3x the median: no stall
    assert stall_seconds([]) == 0.0


def test_window_clock_times_each_window_and_its_validation_pass():
    model, x, y = tiny_regression()
    clock, seen = WindowClock(), []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(
        dict(logs)))
    model.fit(x, y, batch_size=8, epochs=2, validation_data=(x[:16], y[:16]),
              callbacks=[clock, record], verbose=0)
    assert [logs["step"] for logs in seen] == [8, 16]  # 64 rows in batches of 8
    for logs in seen:
        assert logs["seconds"] > 0
        assert 0 < logs["validation_seconds"] < logs["seconds"]
        assert 0 <= logs["compile_seconds"] < logs["seconds"]


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan")])
def test_time_budget_must_be_positive(seconds):
    with pytest.raises(ValueError, match="positive"):
        TimeBudget(seconds)


def files_of(directory):
    """{relative path: (size, modification time)} of every file under `directory`."""
    found = {}
    for folder, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, directory)] = (os.path.getsize(path),
                                                        os.stat(path).st_mtime_ns)
    return found


@file_handling
def test_a_process_other_than_the_chief_restores_the_chiefs_backup_and_writes_elsewhere(
        tmp_path):
    run_dir, own = tmp_path / "run", tmp_path / "own"
    fit_steps(compiled_tiny_model(1e-3), reverse_dataset(), run_dir, 2, checkpoint_every=2,
              verbose=0)
    before = files_of(run_dir)
    model = compiled_tiny_model(1e-3)
    history = fit_steps(model, reverse_dataset(), run_dir, 4, checkpoint_every=2, verbose=0,
                        save_dir=own)
    assert len(history.history["loss"]) == 1  # resumed from the chief's window 1
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4
    assert files_of(run_dir) == before  # untouched
    assert checkpoint_steps(run_files.path(own, run_files.CHECKPOINTS)) == [4]
    with open(os.path.join(run_files.path(own, run_files.BACKUP), "state.json")) as f:
        assert json.load(f)["step"] == 4
    assert os.path.exists(run_files.path(own, run_files.TRAINING_LOG))
