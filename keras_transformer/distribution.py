"""§5.2 Hardware: training on several devices, as the paper trains on 8 GPUs.

`setup(kind)` picks the engine of the current backend:

* JAX, `kind="data"`: `keras.distribution.DataParallel`, one replica per
  device; batches are split along the batch axis, weights replicated.
* JAX, `kind="model"`: `keras.distribution.ModelParallel` on a
  (batch, model) device mesh, with `transformer_layout_map`: embeddings split
  by vocabulary rows, attention projections by heads, the feed-forward layers
  by their inner width (the Megatron-LM split), the rest replicated.
* TensorFlow, `kind="data"`: `tf.distribute.MirroredStrategy` over the local
  devices. Several hosts: `tf.distribute.MultiWorkerMirroredStrategy` with a
  `TF_CONFIG` per host (see the README); model parallelism runs on JAX.
* PyTorch: one device; `kind` must be "none".

On one device and with the same global batch, data parallelism computes the
same loss: `LabelSmoothedCrossEntropy` divides by the token count of the whole
global batch (`keras_transformer.backend.global_sum`), not by each replica's.
"""

import contextlib
import os

import keras

KINDS = ("none", "data", "model")


class Distributed:
    """What `setup` chose: `scope()` wraps model creation and `compile`;
    `batch_multiple` is what every batch size must be a multiple of."""

    def __init__(self, kind, description, batch_multiple=1, strategy=None):
        self.kind = kind
        self.description = description
        self.batch_multiple = batch_multiple
        self.strategy = strategy

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def __repr__(self):
        return f"Distributed({self.description})"


def setup(kind="none", model_parallel=2, devices=None):
    """Sets up `kind` ("none", "data" or "model") parallel training.

    Args:
        kind: "none" (one device), "data" or "model".
        model_parallel: With "model", devices along the model axis of the mesh
            (the rest form the batch axis).
        devices: Device names; None means every local device of the backend.

    Returns:
        A `Distributed`. Build and compile the model inside its `scope()` and
        make batches with `batch_multiple=distributed.batch_multiple`.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}.")
    backend = keras.backend.backend()
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

        strategy = tf.distribute.MirroredStrategy(devices)
        return Distributed("data", f"tf.distribute.MirroredStrategy over "
                           f"{strategy.num_replicas_in_sync} replicas", strategy=strategy)
    raise ValueError(
        f"Distributed training is not wired for the {backend} backend: use KERAS_BACKEND=jax "
        "(data or model parallel) or tensorflow (data parallel), or --distribute none."
    )


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
        layout_map=transformer_layout_map(mesh), batch_dim_name="batch"))
    return Distributed("model", f"keras.distribution.ModelParallel on a {mesh.shape} "
                       "(batch, model) mesh", batch_multiple=mesh.shape[0])


def transformer_layout_map(mesh):
    """A `keras.distribution.LayoutMap` that splits a `Transformer`'s large
    weights along the mesh's "model" axis (variable paths as regexes):

    - token embeddings (vocab, d_model) and the output bias: by vocabulary rows;
    - attention query/key/value kernels (d_model, h, d_k) and biases: by heads;
      the output projection (h, d_v, d_model): by heads;
    - feed-forward inner kernel (d_model, d_ff) and bias: by d_ff columns; the
      outer kernel (d_ff, d_model): by d_ff rows.

    A dimension must divide by the model axis size (h, d_ff and the vocabulary
    size usually do); layer norms and the other biases stay replicated.
    """
    from keras import distribution

    layout_map = distribution.LayoutMap(mesh)
    layout_map[r".*embeddings"] = ("model", None)
    layout_map[r".*output_bias"] = ("model",)
    layout_map[r".*attention/(query|key|value)/kernel"] = (None, "model", None)
    layout_map[r".*attention/(query|key|value)/bias"] = ("model", None)
    layout_map[r".*attention/attention_output/kernel"] = ("model", None, None)
    layout_map[r".*feed_forward/inner_dense/kernel"] = (None, "model")
    layout_map[r".*feed_forward/inner_dense/bias"] = ("model",)
    layout_map[r".*feed_forward/output_dense/kernel"] = ("model", None)
    return layout_map


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
