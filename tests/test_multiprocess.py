"""Training on several processes (keras_transformer/distribution.py's clusters): two
processes on 127.0.0.1 are two hosts to JAX's distributed runtime and to TensorFlow's
MultiWorkerMirroredStrategy.

- Two processes train like one process with as many devices, on the same global
  batches: the loss of every step, the validation losses and the weights agree, and
  the run directory holds what a one-process run leaves, written by the chief alone.
- A process killed mid-run stops the other within the peer timeout, with the command
  line's one line naming it; the same two commands then resume from the chief's backup
  and finish.

Each engine runs in its backend's pass (JAX in the jax pass, TensorFlow in the
tensorflow pass): the processes are started fresh, with their devices split before
the backend starts. Keras's torch backend has no multi-process fit.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from helpers import REPOSITORY, benchmark_module

from keras_transformer import saving
from keras_transformer_app import run_files

BACKEND = keras.backend.backend()
# The one-process run's devices, and each of the two processes' (TensorFlow's
# MultiWorkerMirroredStrategy has one replica per worker on a CPU).
DEVICES = {"jax": (4, 2), "tensorflow": (2, 0)}
PEER_TIMEOUT = 10
LIMIT = 600  # seconds a run of the tests' processes may take

# One process of a run: `run()` on synthetic pairs, in the cluster the environment names,
# as a recipe's command line runs it (`errors.guarded`).
# argv: run_dir steps checkpoint_every devices validation
SCRIPT = r"""
import json, sys
run_dir, steps, every, devices, validation = sys.argv[1:]
from keras_transformer_app.training import distribution
if int(devices):
    distribution.virtual_cpu_devices(int(devices))
from keras_transformer import TransformerConfig
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer_app.cli import errors
from keras_transformer_app.training.run import RunOptions, run

config = TransformerConfig.tiny(vocab_size=320, d_model=32, d_ff=64, num_heads=2, num_layers=1,
                                warmup_steps=10, dropout_rate=0.0)
splits = {"train": synthetic_translation(200, seed=1)}
if validation == "yes":
    splits["validation"] = synthetic_translation(8, seed=2)
options = RunOptions(run_dir, steps=int(steps), checkpoint_every=int(every), vocab_size=320,
                     max_sentence_length=32, tokens_per_batch=512, verbose=0,
                     distribute="data", peer_timeout=%d)
print("RESULTS", json.dumps(errors.guarded(run, splits, config, options)))
""" % PEER_TIMEOUT

pytestmark = pytest.mark.skipif(
    BACKEND == "torch", reason="Keras's torch backend has no multi-process fit")


def cluster_environments():
    """The environment of each of two processes on 127.0.0.1, by the engine's rules: those
    of benchmarks/cluster_faults.py, which starts the same clusters."""
    return benchmark_module("cluster_faults").cluster_environments(BACKEND)


def start(started, run_dir, steps, every, devices, tmp, environment=None, validation="no"):
    """A process of a run (added to `started`), its output in RUN_DIR.PROCESS.log, its
    temporary files in `tmp`."""
    name = environment and (environment.get("KERAS_DISTRIBUTION_PROCESS_ID") or str(
        json.loads(environment["TF_CONFIG"])["task"]["index"]))
    log = open(f"{run_dir}.{name or 'single'}.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(run_dir), str(steps), str(every), str(devices),
         validation], cwd=REPOSITORY, stdout=log, stderr=subprocess.STDOUT,
        env=dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3", TMPDIR=str(tmp),
                 **(environment or {})))
    process.log = log.name
    started.append(process)
    return process


def finish(process, timeout=LIMIT):
    """The exit status and output of `process`."""
    try:
        status = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    with open(process.log) as log:
        return status, log.read()


def training_log(run_dir):
    with open(run_files.path(run_dir, run_files.TRAINING_LOG)) as f:
        return list(csv.DictReader(f))


def files(run_dir):
    """The run directory's files, but for TensorBoard's and JAX's compilation cache,
    whose names change from run to run."""
    found = {os.path.relpath(os.path.join(folder, name), run_dir)
             for folder, _, names in os.walk(run_dir) for name in names}
    return {name for name in found
            if name.split(os.sep)[0] not in (run_files.LOGS, run_files.COMPILATION_CACHE)}


@pytest.fixture
def started():
    """The processes a test starts; those still running at its end are killed."""
    processes = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_two_processes_train_like_one_process_on_the_same_global_batches(tmp_path, started):
    one, two, tmp = tmp_path / "one", tmp_path / "two", tmp_path / "tmp"
    tmp.mkdir()
    single_devices, cluster_devices = DEVICES[BACKEND]
    # One step per window: training_log.csv holds the loss of every step.
    processes = [start(started, one, 4, 1, single_devices, tmp, validation="yes")] + [
        start(started, two, 4, 1, cluster_devices, tmp, environment, validation="yes")
        for environment in cluster_environments()]
    outcomes = [finish(process) for process in processes]
    for status, output in outcomes:
        assert status == 0, output[-3000:]
    assert "of 2 processes; this is process 0 of 2 (chief)" in outcomes[1][1] or (
        "of 2 workers; this is process 0 of 2 (chief)" in outcomes[1][1])
    assert "Tokenizer: reading the chief's" in outcomes[2][1]
    assert "Training done: the chief (process 0)" in outcomes[2][1]

    single, cluster = training_log(one), training_log(two)
    assert [row["step"] for row in cluster] == ["1", "2", "3", "4"]
    for name in ("loss", "val_loss", "token_accuracy"):
        assert np.allclose([float(r[name]) for r in single], [float(r[name]) for r in cluster],
                           rtol=0, atol=1e-4), name
    # The attention key biases are left out: their gradient is zero in exact arithmetic
    # (softmax ignores a constant added to every score of a query), and Adam scales the
    # rounding noise that stands for it, which differs with the order of the sums, to
    # full-size steps.
    models = [saving.load_model(run_files.path(d, saving.MODEL)) for d in (one, two)]
    compared = 0
    for a, b in zip(*(model.weights for model in models)):
        if not a.path.endswith("key/bias"):
            difference = np.abs(keras.ops.convert_to_numpy(a) - keras.ops.convert_to_numpy(b))
            assert difference.max() <= 1e-4, a.path
            compared += 1
    assert compared > 20
    # One writer: the same files as the one-process run, and the other process's
    # temporary folder gone.
    assert files(two) == files(one)
    assert [name for name in os.listdir(tmp) if name.startswith("keras-transformer")] == []


@pytest.mark.backs('docs/distributed.md', "resumes from the chief's last backup.")
def test_a_killed_process_stops_the_other_and_the_same_commands_resume(tmp_path, started):
    run_dir, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    devices = DEVICES[BACKEND][1]
    environments = cluster_environments()
    chief, other = (start(started, run_dir, 24, 4, devices, tmp, e) for e in environments)
    state = run_files.path(run_files.path(run_dir, run_files.BACKUP), "state.json")
    deadline = time.monotonic() + LIMIT
    while not os.path.exists(state):  # the first window is backed up
        assert chief.poll() is None, finish(chief)[1][-3000:]
        assert time.monotonic() < deadline, "no backup"
        time.sleep(0.1)
    other.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    status, output = finish(chief)
    stopped = time.monotonic() - killed
    assert status != 0
    assert stopped < PEER_TIMEOUT + 30, stopped
    # The command line's one line, and under JAX no wait for JAX's heartbeat timeout at exit
    # (its abort: status 134 and a native stack trace).
    assert status == 1, output[-3000:]
    if BACKEND == "jax":  # JAX's collectives name the address of the process lost
        assert "error: Lost a process of the cluster (JAX's collectives: " in output, (
            output[-3000:])
    else:
        assert "error: Lost worker 1 of TF_CONFIG, so training stopped." in output, (
            output[-3000:])
    assert "Traceback" not in output, output[-3000:]
    backed_up = saving.read_json(state)["step"]
    assert 4 <= backed_up < 24

    environments = cluster_environments()
    chief, other = (start(started, run_dir, 24, 4, devices, tmp, e) for e in environments)
    (status, output), (other_status, other_output) = finish(chief), finish(other)
    assert status == 0 and other_status == 0, (output[-3000:], other_output[-3000:])
    assert f"Trained to step 24 ({24 - backed_up} steps in this run)" in output
    assert saving.read_json(run_files.path(run_dir, run_files.RESULTS))["steps"] == 24


ALONE = r"""
import sys
from keras_transformer_app.training import distribution
distribution.JOIN_TIMEOUT = 5  # the 5 minutes of the page, shortened
from keras_transformer_app.cli import errors
from recipes import quickstart
errors.guarded(quickstart.main)
"""


@pytest.mark.skipif(BACKEND != "jax", reason="TensorFlow's workers wait for each other")
@pytest.mark.backs("docs/distributed.md", "whose cluster has not formed after 5 minutes stops")
@pytest.mark.parametrize("process_id", ["0", "1"])
def test_a_process_whose_cluster_never_forms_stops_with_one_line(tmp_path, process_id):
    environment = dict(cluster_environments()[0], KERAS_DISTRIBUTION_PROCESS_ID=process_id)
    began = time.monotonic()
    process = subprocess.run(
        [sys.executable, "-c", ALONE, "--distribute", "data", "--steps", "2", "--run-dir",
         str(tmp_path / "run"), "--train-pairs", "50", "--test-pairs", "4", "--no-export"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3", **environment))
    # Ours, not JAX's deadline (a minute later: a C++ stack trace and SIGABRT).
    assert process.returncode == 1, process.stderr[-3000:]
    assert time.monotonic() - began < 60
    lines = process.stderr.strip().splitlines()
    address = environment["KERAS_DISTRIBUTION_JOB_ADDRESSES"]
    assert lines[-1].startswith("error: The JAX cluster did not form within 5 s: this is "
                                f"process {process_id} of 2"), process.stderr[-3000:]
    assert address in lines[-1] and "Traceback" not in process.stderr
