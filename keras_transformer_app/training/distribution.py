"""§5.2 Hardware: training on several devices, as the paper trains on 8 GPUs, and on
several hosts.

`setup(kind)` picks the engine of the current backend:

* JAX, `kind="data"`: `keras.distribution.DataParallel`, one replica per
  device; batches are split along the batch axis, weights replicated.
* JAX, `kind="model"`: `keras.distribution.ModelParallel` on a
  (batch, model) device mesh, with `Transformer.get_layout_map`: embeddings split
  by vocabulary rows, attention projections by heads, the feed-forward layers
  by their inner width (the Megatron-LM split), the rest replicated.
* TensorFlow, `kind="data"`: `tf.distribute.MirroredStrategy` over the local
  GPUs, else the logical CPUs; model parallelism runs on JAX.
* PyTorch: one device; `kind` must be "none".

Several processes (one per host, or several on one machine) form a cluster by the
engines' own conventions, read from the environment (`cluster_from_environment`):

* JAX: `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator, process 0, first),
  `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`, the
  variables of `keras.distribution.initialize`. `kind="data"` starts JAX's
  distributed runtime and runs `DataParallel` over the devices of every process;
  each process feeds its own rows of every global batch (`Distributed.input_shard`).
* TensorFlow: a `TF_CONFIG` naming more than one worker. `kind="data"` runs
  `tf.distribute.MultiWorkerMirroredStrategy`, which gives each worker its part of
  every global batch (the pipeline asks for `AutoShardPolicy.DATA`).

Process 0 is the chief: it alone writes the run directory (`Distributed.writes_to`).
The processes of a JAX cluster wait `JOIN_TIMEOUT` seconds for each other at start-up,
then stop with a `PeerLostError`.
A process that dies stops the others: under JAX the next collective that sees its
connection close fails, which `lost_peers` turns into a `PeerLostError` (and the
command line ends at once), and the coordinator ends a process that meets none once it
has missed the dead process's heartbeats for `peer_timeout` seconds; TensorFlow's
coordination service fails the collectives after its own heartbeat timeout (10 s),
and `lost_peers` turns its error into a `PeerLostError`. PyTorch has no multi-process
`fit` in Keras, and a cluster is refused there.

On one device and with the same global batch, data parallelism computes the
same loss: `LabelSmoothedCrossEntropy` divides by the token count of the whole
global batch (`keras_transformer.backend.global_sum`), not by each replica's.
"""

import contextlib
import functools
import os
import re
import shutil
import tempfile
import threading

import keras

from keras_transformer.model import Transformer
from keras_transformer_app.training.clusters import (  # noqa: F401 - part of this API
    JAX_VARIABLES,
    Cluster,
    cluster_from_environment,
)

KINDS = ("none", "data", "model")
# Seconds of silence after which JAX's coordinator ends a cluster (JAX's default: 100).
PEER_TIMEOUT = 60
# Seconds the processes of a JAX cluster wait for each other at start-up.
JOIN_TIMEOUT = 300


class PeerLostError(ConnectionError):
    """Another process of the cluster stopped, or never joined: training cannot go on
    without it.

    `runtime_waits` is True where the engine's runtime, left to end as usual, would
    wait at the interpreter's exit for the lost process (JAX's shutdown barrier) until
    its heartbeat timeout aborts this process: a command line then ends at once, after
    its error line (keras_transformer_app/cli/errors.py)."""

    runtime_waits = False


class Distributed:
    """What `setup` chose: `scope()` wraps model creation and `compile`;
    `batch_multiple` is what every global batch size must be a multiple of;
    `input_shard` = (index, count) says which rows of every global batch this
    process feeds (row block `index` of `count`), None when the engine splits
    batches itself; `cluster` is the `Cluster` of a multi-process run, or None."""

    def __init__(self, kind, description, batch_multiple=1, strategy=None, cluster=None,
                 input_shard=None):
        self.kind = kind
        self.description = description
        self.batch_multiple = batch_multiple
        self.strategy = strategy
        self.cluster = cluster
        self.input_shard = input_shard

    def feed(self, dataset):
        """`dataset` (a `tf.data.Dataset` of global batches, or None) as `fit` should
        get it: under one process's `MirroredStrategy`, each replica reads its row block
        of every global batch from an iterator of its own on the host
        (`distribute_datasets_from_function`, `InputReplicationMode.PER_REPLICA`,
        `experimental_fetch_to_device=False`); elsewhere `dataset` itself.

        Given a plain dataset, Keras distributes it through a `MultiDeviceIterator`,
        and drops the validation split's at every evaluation (`EpochIterator.reset`),
        while its devices' prefetches still wait ("GetNextFromShard was cancelled").
        On 2 CPU cores that drop ended the process with a segmentation fault: in CI's walk
        of docs/distributed.md at 1d12c46 and 93d2c48, and in both runs of 80 one-step
        windows that went to their end with three others beside them (fed this way, 10
        of 10 ended normally; docs/distributed.md). The rows are the ones
        `experimental_distribute_dataset` gives each replica (block `i` of the batch goes
        to replica `i`), so training is unchanged; each replica runs the pipeline itself,
        and the ids reach its device in the step. Keras's per-batch id check
        (`IdCheckedModel.fit`) sees a plain dataset only: the pipeline has checked the
        ids already."""
        if dataset is None or self.strategy is None or self.cluster is not None:
            return dataset
        import tensorflow as tf

        from keras_transformer.data.batches import row_block

        def replica_dataset(context):
            return dataset.map(row_block(context.input_pipeline_id,
                                         context.num_input_pipelines))

        return self.strategy.distribute_datasets_from_function(
            replica_dataset, tf.distribute.InputOptions(
                experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
                experimental_fetch_to_device=False))

    @property
    def is_chief(self):
        """Whether this process writes the run's files: process 0, or the only one."""
        return self.cluster is None or self.cluster.process_id == 0

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def writes_to(self, run_dir):
        """The folder this process writes the run's files to: `run_dir` for the chief;
        for the others a temporary folder, deleted when the block ends, so that every
        process runs the same saving code (the rule of TensorFlow's
        MultiWorkerMirroredStrategy, where a save may take part in collectives) while
        only the chief's files are kept."""
        if self.is_chief:
            yield run_dir
            return
        folder = tempfile.mkdtemp(prefix=f"keras-transformer-process-{self.cluster.process_id}-")
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def barrier(self, name):
        """Returns once every process of the cluster has called `barrier(name)`: the
        others wait here for the chief (its tokenizer, its last phase)."""
        if self.cluster is None:
            return
        if keras.backend.backend() == "jax":
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(name)
            return
        import tensorflow as tf

        @tf.function
        def meet():  # an all-reduce of one number, traced as the strategy asks
            return self.strategy.reduce("SUM", self.strategy.run(lambda: tf.constant(1.0)),
                                        axis=None)

        with self.lost_peers():
            meet()

    def after_training(self):
        """Ends the cluster's collective work. Under JAX every process calls it, and
        its runtime shuts down (at once, no process waiting on another), so the chief
        goes on alone on its own devices and the others may exit. Under TensorFlow the
        workers stay connected until `finish`."""
        if self.cluster is None or keras.backend.backend() != "jax":
            return
        import jax

        jax.distributed.shutdown()
        keras.distribution.set_distribution(None)

    def finish(self):
        """The cluster's last meeting: under TensorFlow the workers wait here for the
        chief's last phase, so no worker leaves while the chief's coordination service
        still watches its heartbeats."""
        if self.cluster is not None and keras.backend.backend() == "tensorflow":
            self.barrier("finished")

    @contextlib.contextmanager
    def lost_peers(self):
        """Turns the engine's error for a dead process of the cluster into a
        `PeerLostError`: TensorFlow's names the process; JAX's collectives name its
        address, and JAX's coordinator then ends this process with a message naming
        the task it stopped hearing from."""
        if self.cluster is None:
            yield
            return
        if keras.backend.backend() == "jax":
            import jax

            # A step's collective raises JaxRuntimeError; the same failure in a checkpoint's
            # save (`device_put` checks that every process holds the same value, an
            # all-gather) comes as a ValueError. JAX's runtime would then wait at exit for
            # the lost process (`runtime_waits`).
            lost, name, waits = (jax.errors.JaxRuntimeError, ValueError), _jax_peer, True
        else:
            import tensorflow as tf

            lost = (tf.errors.UnavailableError, tf.errors.AbortedError)
            name, waits = functools.partial(_tf_tasks, own=self.cluster.task), False
        try:
            yield
        except lost as error:
            if not name(error):
                raise
            peer_lost = PeerLostError(
                f"Lost {name(error)}, so training stopped. Start every process again with "
                "the same command: training resumes from the chief's last backup.")
            peer_lost.runtime_waits = waits
            raise peer_lost from error

    def __repr__(self):
        return f"Distributed({self.description})"


def _jax_peer(error):
    """What JAX's `error` says of a lost process (its collectives' transport, Gloo on a
    CPU, names the address), or None for another error."""
    if "Gloo" in str(error):
        return f"a process of the cluster (JAX's collectives: {str(error).strip().splitlines()[0]})"
    return None


def _tf_tasks(error, own):
    """The tasks other than `own` that TensorFlow's `error` names, those it stopped
    hearing from when it lists them."""
    listed = error.message.split("unhealthy", 1)[-1]
    tasks = {f"{job} {task}" for job, task in re.findall(
        r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", listed)} - {own}
    return " and ".join(f"{task} of TF_CONFIG" for task in sorted(tasks)) or (
        "a process of the cluster")


def setup(kind="none", model_parallel=2, devices=None, peer_timeout=PEER_TIMEOUT):
    """Sets up `kind` ("none", "data" or "model") parallel training, over the
    processes that the environment names (`cluster_from_environment`) if any.

    Args:
        kind: "none" (one device), "data" or "model".
        model_parallel: With "model", devices along the model axis of the mesh
            (the rest form the batch axis).
        devices: Device names; None means every local device of the backend.
        peer_timeout: Seconds after which JAX's coordinator declares a silent
            process dead and stops the others.

    Returns:
        A `Distributed`. Build and compile the model inside its `scope()` and
        make batches with `batch_multiple=distributed.batch_multiple` and
        `shard=distributed.input_shard`.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}.")
    backend = keras.backend.backend()
    cluster = cluster_from_environment()
    if cluster is not None:
        return _setup_cluster(cluster, kind, backend, devices, peer_timeout)
    if kind == "none":
        return Distributed("none", "one device")
    if backend == "jax":
        return _setup_jax(kind, model_parallel, devices)
    if backend == "tensorflow":
        if kind == "model":
            raise ValueError(
                "Model parallelism runs on the JAX backend (keras.distribution.ModelParallel): "
                "set KERAS_BACKEND=jax, or use kind='data' (MirroredStrategy) on TensorFlow."
            )
        import tensorflow as tf

        # Every local device: the GPUs, else the logical CPUs (`virtual_cpu_devices`).
        devices = devices or [device.name for device in (
            tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU"))]
        strategy = tf.distribute.MirroredStrategy(devices)
        # Equal replica batches: Keras builds the model from their mean (a reduce).
        replicas = strategy.num_replicas_in_sync
        return Distributed("data", f"tf.distribute.MirroredStrategy over {replicas} replicas",
                           batch_multiple=replicas, strategy=strategy)
    raise ValueError(
        f"Distributed training is not wired for the {backend} backend: use KERAS_BACKEND=jax "
        "(data or model parallel) or tensorflow (data parallel), or --distribute none."
    )


def _setup_cluster(cluster, kind, backend, devices, peer_timeout):
    engine = {"KERAS_DISTRIBUTION_*": "jax", "TF_CONFIG": "tensorflow"}[cluster.variables]
    if backend == "torch":
        raise ValueError(f"{cluster.variables} names {cluster.process_count} processes, but "
                         "Keras's torch backend has no multi-process fit: train on one process "
                         "(unset it), or use KERAS_BACKEND=jax or tensorflow.")
    if backend != engine:
        raise ValueError(f"{cluster.variables} names a {engine} cluster, but KERAS_BACKEND="
                         f"{backend}: set KERAS_BACKEND={engine}, or name the cluster with "
                         f"{'TF_CONFIG' if engine == 'jax' else ', '.join(JAX_VARIABLES)}.")
    if kind != "data":
        raise ValueError(
            f"{cluster.variables} names {cluster.process_count} processes, which train data "
            f"parallel: pass --distribute data (distribute={kind!r} "
            + ("would train a copy of the model in each process, each writing the run)."
               if kind == "none" else "splits weights across hosts, which Keras's "
               "checkpoints cannot read back on one process).")
        )
    if devices is not None:
        raise ValueError("devices cannot be chosen for a cluster: each process uses its own.")
    role = f"process {cluster.process_id} of {cluster.process_count}" + (
        " (chief)" if cluster.process_id == 0 else "")
    if engine == "jax":
        import jax
        from keras import distribution

        _join_jax_cluster(cluster, role, peer_timeout)
        devices = distribution.list_devices()
        if jax.local_device_count() * cluster.process_count != len(devices):
            raise ValueError("Every process of a JAX cluster must have as many devices.")
        distribution.set_distribution(distribution.DataParallel(
            devices=devices, auto_shard_dataset=False))  # each process feeds its own rows
        return Distributed("data", f"keras.distribution.DataParallel over {len(devices)} "
                           f"devices of {cluster.process_count} processes; this is {role}",
                           batch_multiple=len(devices), cluster=cluster,
                           input_shard=(cluster.process_id, cluster.process_count))
    strategy = _multi_worker_strategy()
    return Distributed("data", "tf.distribute.MultiWorkerMirroredStrategy over "
                       f"{strategy.num_replicas_in_sync} replicas of {cluster.process_count} "
                       f"workers; this is {role}", batch_multiple=strategy.num_replicas_in_sync,
                       strategy=strategy, cluster=cluster)


def _join_jax_cluster(cluster, role, peer_timeout):
    """Starts JAX's distributed runtime (`jax.distributed.initialize`), waiting at
    most `JOIN_TIMEOUT` seconds for every process to join.

    `keras.distribution.initialize` reads the same variables, but leaves JAX's
    heartbeat timeout at 100 s; and at JAX's own start-up deadline a process that
    is still waiting ends with a C++ stack trace (a fatal error, no exception). So
    the call runs in a thread with a deadline past ours, and when ours passes first,
    this stops the runtime (`jax.distributed.shutdown`) and raises `PeerLostError`
    saying what to check; the thread, still waiting in JAX, ends with the process.

    Raises:
        PeerLostError: The cluster did not form within `JOIN_TIMEOUT` seconds.
    """
    import jax

    joined, failures = threading.Event(), []

    def join():
        try:
            jax.distributed.initialize(
                cluster.coordinator, cluster.process_count, cluster.process_id,
                initialization_timeout=JOIN_TIMEOUT + 60, heartbeat_timeout_seconds=peer_timeout)
        except Exception as error:  # raised again in the calling thread
            failures.append(error)
        finally:
            joined.set()

    threading.Thread(target=join, name="jax-cluster-join", daemon=True).start()
    if not joined.wait(JOIN_TIMEOUT):
        # Process 0's coordination service stops now (its logs come before the error),
        # not while the interpreter exits.
        jax.distributed.shutdown()
        raise PeerLostError(
            f"The JAX cluster did not form within {JOIN_TIMEOUT} s: this is {role}, and "
            f"some of the {cluster.process_count} processes never joined the coordinator at "
            f"{cluster.coordinator}. Start every process within {JOIN_TIMEOUT} s of the "
            "first, each with the same KERAS_DISTRIBUTION_JOB_ADDRESSES and "
            "KERAS_DISTRIBUTION_NUM_PROCESSES and its own KERAS_DISTRIBUTION_PROCESS_ID, "
            "and check that every host can reach that address."
        )
    if failures:
        raise failures[0]


def _multi_worker_strategy():
    """A `tf.distribute.MultiWorkerMirroredStrategy` (from TF_CONFIG) whose `reduce`
    takes what Keras 3's TensorFlow trainer gives it (keras-team/keras#20585): a nest
    of values, as MirroredStrategy's `reduce` does, and the logs' scalars with axis=0."""
    import tensorflow as tf

    class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        def reduce(self, reduce_op, value, axis):
            reduce = super().reduce

            def one(value):
                first = value.values[0] if isinstance(
                    value, tf.distribute.DistributedValues) else value
                rank = len(getattr(first, "shape", ()))
                return reduce(reduce_op, value, axis if rank else None)

            return tf.nest.map_structure(one, value)

    return MultiWorkerMirroredStrategy()


def _setup_jax(kind, model_parallel, devices):
    from keras import distribution

    devices = devices or distribution.list_devices()
    if kind == "data":
        distribution.set_distribution(distribution.DataParallel(devices=devices))
        return Distributed("data", f"keras.distribution.DataParallel over {len(devices)} "
                           "devices", batch_multiple=len(devices))
    if isinstance(model_parallel, bool) or not isinstance(model_parallel, int) or (
        model_parallel < 1 or len(devices) % model_parallel
    ):
        raise ValueError(
            f"model_parallel={model_parallel!r} must be a positive divisor of the "
            f"{len(devices)} devices."
        )
    mesh = distribution.DeviceMesh(
        shape=(len(devices) // model_parallel, model_parallel),
        axis_names=("batch", "model"), devices=devices,
    )
    distribution.set_distribution(distribution.ModelParallel(
        layout_map=Transformer.get_layout_map(mesh), batch_dim_name="batch"))
    return Distributed("model", f"keras.distribution.ModelParallel on a {mesh.shape} "
                       "(batch, model) mesh", batch_multiple=mesh.shape[0])


def virtual_cpu_devices(count):
    """Splits the CPU into `count` devices, for tests and trying things out.

    Must run before the backend initializes its devices: for JAX it sets
    XLA_FLAGS (so call it before importing jax); for TensorFlow it configures
    logical devices (before any TensorFlow op).
    """
    backend = keras.backend.backend()
    if backend == "jax":
        flag = f"--xla_force_host_platform_device_count={count}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
        return
    if backend == "tensorflow":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
        return
    raise ValueError(f"virtual devices are set up for jax and tensorflow, not {backend}.")
