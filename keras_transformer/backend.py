"""Backend policy: the few decisions that need TensorFlow, JAX or PyTorch itself.

No paper section of its own: it serves §5 (training) and §6.1 (decoding). The
layers, the model, the loss and the search loops use `keras.ops` only. What
depends on the backend beyond that lives here:

* `check_backend_name`, `check_keras_version`: the backends and the Keras releases
  this library runs on;
* `use_xla_for_training`: whether `Transformer.compile(jit_compile="auto")`
  turns XLA on where Keras would not (TensorFlow on a CPU);
* `copy_reverse_kernel`: whether a decoding cache holds the output
  projection's matrix made once for the search (XLA's backends);
* `use_compilation_cache`: JAX's persistent compilation cache, so that a
  resumed or repeated run does not compile its train step again;
* `global_sum`: a sum over the replicas of a `tf.distribute` strategy (§5.2),
  for the loss's token count;
* `dense_gradients`: a TensorFlow embedding's sparse gradient summed per row, for
  `keras_transformer.training.schedule.DenseGradientAdam` (§5.3);
* `call_part`: how a layer calls the layers it is made of (`Dense`,
  `LayerNormalization`, its blocks, ...), which under PyTorch skips Keras's
  `__call__` where that changes nothing;
* `write_cache`: what the attention cache calls instead of
  `ops.slice_update`, so that a traced PyTorch search
  (`keras_transformer.inference.compiled`, inside `cache_writes_in_place`)
  writes its cache in place.

Importing this module imports neither Keras nor a backend, so that
`check_backend_name` runs before Keras loads; each function imports what it
needs when called.
"""

import contextlib
import re
import threading

BACKENDS = ("tensorflow", "jax", "torch")


#: The oldest Keras the library runs on: older releases load crafted model files unsafely
#: (docs/serving.md, "Which files are trusted").
MINIMUM_KERAS = (3, 14)


def check_keras_version(version):
    """Raises a one-line ImportError for a Keras older than `MINIMUM_KERAS`.

    Args:
        version: `keras.__version__`, such as "3.15.1".
    """
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if len(found) < 2 or found < MINIMUM_KERAS:
        raise ImportError(
            f"keras-transformer needs Keras {'.'.join(map(str, MINIMUM_KERAS))} or newer, and "
            f"Keras {version} is installed (older releases load crafted model files unsafely): "
            "pip install -U keras")


def check_backend_name(name):
    """Raises a one-line ValueError for a `KERAS_BACKEND` this library does not run on.

    Args:
        name: The value of `KERAS_BACKEND`, or None (Keras's default).
    """
    if name is not None and name not in BACKENDS:
        raise ValueError(
            f"KERAS_BACKEND={name!r} is not a backend keras-transformer runs on: set it "
            f"to one of {', '.join(BACKENDS)} (or unset it for Keras's default)."
        )


def use_xla_for_training(model):
    """Whether `jit_compile="auto"` should pick XLA where Keras would not.

    Keras's "auto" leaves XLA off for TensorFlow on a CPU-only machine, but
    this model's training step runs faster with XLA there too. Keras keeps
    XLA off under `tf.distribute`, and so do we; on a GPU Keras picks XLA
    itself.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    # A model made under a strategy keeps it (the TensorFlow trainer's public
    # `distribute_strategy`); any other model answers the default strategy.
    strategy = getattr(model, "distribute_strategy", None)
    return not (tf.distribute.has_strategy()
                or (strategy is not None and strategy is not tf.distribute.get_strategy()))


def copy_reverse_kernel():
    """Whether `Transformer.initial_cache` makes the tied output projection's
    (d_model, vocab) matrix once, for every decoding step to read.

    Under XLA (JAX, TensorFlow) a product of a step's few rows by the
    transposed embeddings is slower than by a transposed copy, so the copy is
    made once per search. PyTorch multiplies by the transposed view as fast
    as by a copy, and its traced search runs slower with the copy: no copy
    there.
    """
    import keras

    return keras.backend.backend() in ("jax", "tensorflow")


def use_compilation_cache(directory):
    """Under JAX, keeps XLA's compiled programs in `directory`, so that another
    process compiling the same program (a resumed run, the same command again)
    reads it instead. Only compilations of a second or more are stored
    (`jax_persistent_cache_min_compile_time_secs`). Does nothing under the
    other backends (TensorFlow keeps no such cache; torch compiles nothing).

    Returns:
        Whether the cache is on.
    """
    import keras

    if keras.backend.backend() != "jax":
        return False
    import os

    import jax
    from jax.experimental.compilation_cache import compilation_cache

    os.makedirs(directory, exist_ok=True)
    # JAX opens its cache once per process; a second run in the same process
    # (the tests, a notebook) moves it to its own directory.
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", os.path.abspath(directory))
    return True


def global_sum(value):
    """`value` summed over the replicas of a TensorFlow distribution strategy
    (inside a replica of a `MirroredStrategy`); `value` itself otherwise.

    Under JAX's keras.distribution the step is one program over sharded arrays,
    so sums are global already; there is nothing to do.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return value
    import tensorflow as tf

    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return value
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def dense_gradients(gradients):
    """`gradients` (a list, None for a variable without one) as dense tensors: under
    TensorFlow, each `tf.IndexedSlices` (the gradient of an embedding lookup, or of a
    tied embedding's lookup and projection together) is summed into one row per index;
    under the other backends the list is returned as it is, at the cost of one check a
    step.

    Keras's TensorFlow optimizers apply their element-wise ops to an IndexedSlices
    slice by slice, duplicate indices included, so that Adam's second moment of a
    token seen k times in a batch gains the sum of its k gradients' squares instead
    of the square of their sum (JAX and PyTorch give dense gradients: there is
    nothing to do).
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return gradients
    import tensorflow as tf

    return [tf.convert_to_tensor(gradient) if isinstance(gradient, tf.IndexedSlices)
            else gradient for gradient in gradients]


def call_part(layer, inputs, *args, **kwargs):
    """`layer(inputs, *args, **kwargs)`, for a layer that a layer of ours builds as
    one of its parts: Keras's (`Dense`, `LayerNormalization`, `Dropout`, ...) or ours
    (the blocks, the attention, the embeddings), `training` given by the caller.

    Under PyTorch every eager call of `Layer.__call__` converts the inputs, binds the
    call's signature, resolves the call context and the masks and opens name and
    autocast scopes: more than a small model's op itself, and the largest share of its
    step's host time (`benchmarks/torch_overhead.py`). There the
    part runs its `call` directly when that gives what `__call__` would
    (`runs_directly`). The other backends pay `__call__` once, when they trace the
    step, and keep it.
    """
    if runs_directly(layer, inputs):
        return layer.call(inputs, *args, **kwargs)
    return layer(inputs, *args, **kwargs)


def runs_directly(layer, inputs):
    """Whether `call_part` runs `layer.call(inputs, ...)` without `Layer.__call__`:
    under PyTorch, for a built, unquantized layer whose variables are kept in its
    compute dtype, on a tensor that is already in that dtype (or not a float).

    Everything else goes through `__call__`: a mixed policy, which opens the
    autocast scope its variables are read in; NumPy or mistyped inputs, which it
    converts; and a symbolic call (tensors on the "meta" device), which it states.
    """
    import keras

    if (keras.backend.backend() != "torch" or not keras.ops.is_tensor(inputs)
            or inputs.is_meta or not layer.built or layer.quantization_mode is not None):
        return False
    policy = layer.dtype_policy
    if policy.compute_dtype != policy.variable_dtype:
        return False
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    return dtype == policy.compute_dtype or not keras.backend.is_float_dtype(dtype)


# Whether `write_cache` writes in place in this thread: only while a search
# that `keras_transformer.inference.compiled` traces under PyTorch runs.
_LOCAL = threading.local()


@contextlib.contextmanager
def cache_writes_in_place():
    """Within it, `write_cache` writes into the cache it is given (PyTorch).

    Entered by `keras_transformer.inference.compiled` around a traced torch
    search, which owns its caches and never reads an old one again; the
    layers do not import inference code, so the choice travels here.
    """
    previous = getattr(_LOCAL, "in_place", False)
    _LOCAL.in_place = True
    try:
        yield
    finally:
        _LOCAL.in_place = previous


def write_cache(cache, index, update):
    """`cache` with `update` written at positions `index, index + 1, ...` of
    axis 1: `ops.slice_update(cache, [0, index, 0], update)`.

    Within `cache_writes_in_place` (a traced PyTorch search) the write is in
    place, because copying the whole cache at every step would cost as much
    as the rest of the step. Everywhere else the result is a new tensor, as
    `keras.ops` promises.

    Args:
        cache: (batch, length, width) tensor.
        index: int or int scalar tensor, the first position written.
        update: (batch, n, width) tensor of the cache's dtype.
    """
    if not getattr(_LOCAL, "in_place", False):
        from keras import ops

        return ops.slice_update(cache, [0, index, 0], update)
    cache.narrow(1, index, update.shape[1]).copy_(update)
    return cache
