"""Backend policy: the few decisions that need TensorFlow, JAX or PyTorch itself.

The layers, the model, the loss and the search loops use `keras.ops` only. What
depends on the backend beyond that lives here, in one adapter:

* `use_xla_for_training`: whether `Transformer.compile(jit_compile="auto")`
  turns XLA on where Keras would not (TensorFlow on a CPU);
* `global_sum`: a sum over the replicas of a `tf.distribute` strategy (§5.2),
  for the loss's token count;
* `compile_inference`: the decoding loops of §6.1 compiled for the backend
  (`jax.jit` with the weights as arguments, `tf.function` with XLA, eager
  PyTorch without gradients);
* `use_compilation_cache`: JAX's persistent compilation cache, so that a
  resumed or repeated run does not compile its train step again.

Importing this module imports neither Keras nor a backend, so that
`check_backend_name` runs before Keras loads; each function imports what it
needs when called.
"""

BACKENDS = ("tensorflow", "jax", "torch")


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

    Keras's "auto" leaves XLA off for TensorFlow on a CPU-only machine. For this
    model XLA pays there too: one training step of the benchmark's default size
    (d_model 256, 3+3 blocks, 32 × 32 tokens) took 375 ms with XLA against 444
    ms without, and 1150 against 1256 ms at d_model 512
    (`benchmarks/RESULTS.md`). Keras keeps XLA off under `tf.distribute`, and
    so do we; on a GPU Keras picks XLA itself.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return not (tf.distribute.has_strategy() or getattr(model, "_distribute_strategy", None))


def use_compilation_cache(directory):
    """Under JAX, keeps XLA's compiled programs in `directory`, so that another
    process compiling the same program (a resumed run, the same command again)
    reads it instead. Only compilations of a second or more are stored
    (`jax_persistent_cache_min_compile_time_secs`). Does nothing under the
    other backends (TensorFlow keeps no such cache; torch runs eagerly).

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


def compile_inference(model_ref, function):
    """`function(model, *tensors)` compiled for the current backend.

    Args:
        model_ref: A callable returning the model (a `weakref.ref`, so that a
            cache of compiled functions does not keep the model alive).
        function: A traceable function of the model and tensors, built from
            `keras.ops`.

    Returns:
        A function of the tensors alone. JAX and TensorFlow compile it once per
        input shape and reuse it; PyTorch runs it eagerly without gradients.
    """
    import keras

    backend = keras.backend.backend()

    if backend == "jax":
        import jax

        @jax.jit
        def compiled(trainable, non_trainable, *args):
            model = model_ref()
            mapping = list(zip(model.trainable_variables, trainable)) + list(
                zip(model.non_trainable_variables, non_trainable)
            )
            with keras.StatelessScope(state_mapping=mapping):
                return function(model, *args)

        def run(*args):
            model = model_ref()
            # Weights are arguments, not constants: the compiled function
            # stays valid when they change (more training, load_weights).
            return compiled(
                [v.value for v in model.trainable_variables],
                [v.value for v in model.non_trainable_variables],
                *args,
            )

        return run

    if backend == "tensorflow":
        import tensorflow as tf

        # XLA fuses the many small ops of a decoding step: on a CPU it made
        # steady-state decoding 2-5x faster than a plain tf.function graph,
        # for about one more second of compilation per shape.
        return tf.function(lambda *args: function(model_ref(), *args), jit_compile=True)

    def run_eagerly(*args):
        return function(model_ref(), *[keras.ops.convert_to_tensor(a) for a in args])

    if backend == "torch":
        import torch

        def run_without_gradients(*args):
            with torch.no_grad():
                return run_eagerly(*args)

        return run_without_gradients
    return run_eagerly
