"""Backend policy: the few decisions that need TensorFlow, JAX or PyTorch itself.

The layers, the model, the loss and the search loops use `keras.ops` only. What
depends on the backend beyond that lives here, in one adapter:

* `use_xla_for_training`: whether `Transformer.compile(jit_compile="auto")`
  turns XLA on where Keras would not (TensorFlow on a CPU);
* `global_sum`: a sum over the replicas of a `tf.distribute` strategy (§5.2),
  for the loss's token count;
* `compile_inference`: the decoding loops of §6.1 compiled for the backend
  (`jax.jit` with the weights as arguments, `tf.function` with XLA; under
  PyTorch, without gradients, each loop's condition and body traced by
  `torch.jit.trace`);
* `while_loop` and `write_cache`: what the search loops and the attention
  cache call instead of `ops.while_loop` and `ops.slice_update`, so that
  PyTorch runs traced loops and writes its cache in place;
* `use_compilation_cache`: JAX's persistent compilation cache, so that a
  resumed or repeated run does not compile its train step again;
* `copy_reverse_kernel`: whether a decoding cache holds the output
  projection's matrix made once for the search (XLA's backends).

Importing this module imports neither Keras nor a backend, so that
`check_backend_name` runs before Keras loads; each function imports what it
needs when called.
"""

import collections
import threading

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


def copy_reverse_kernel():
    """Whether `Transformer.initial_cache` makes the tied output projection's
    (d_model, vocab) matrix once, for every decoding step to read.

    Under XLA (JAX, TensorFlow) a product of a few rows by the transposed
    embeddings took about twice as long as by a transposed copy made
    beforehand: 180 against 98 µs per step in a JAX loop at 8 rows, d_model
    256, vocabulary 8000. Making the copy once per search paid for itself
    even with a vocabulary of 37,000 at 32 tokens (benchmarks/RESULTS.md,
    "Greedy decoding's last operations"). PyTorch multiplies by the
    transposed view as fast as by a copy (324 against 325 µs), and its
    greedy search took 8.9 times as long with the copy: no copy there.
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


def compile_inference(model_ref, function):
    """`function(model, *tensors)` compiled for the current backend.

    Args:
        model_ref: A callable returning the model (a `weakref.ref`, so that a
            cache of compiled functions does not keep the model alive).
        function: A traceable function of the model and tensors, built from
            `keras.ops`.

    Returns:
        A function of the tensors alone. JAX and TensorFlow compile it once per
        input shape and reuse it. PyTorch runs it without gradients, and the
        loops in it (`while_loop`) run a condition and body traced once per
        shape; the traces are kept with the function (at most `_MAX_TRACES`).
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

        traces = _Traces()  # this function's traced loops

        def run_without_gradients(*args):
            weights = [variable.value for variable in model_ref().weights]
            previous = getattr(_LOCAL, "loops", None)
            _LOCAL.loops = _TracedLoops(traces, weights)
            try:
                with torch.no_grad():
                    return run_eagerly(*args)
            finally:
                _LOCAL.loops = previous

        return run_without_gradients
    return run_eagerly


# The decoding loops under PyTorch.
#
# Run eagerly by Keras, a greedy step of the decoding benchmark's default
# model (benchmarks/decoding.py) took about 17 ms, nearly all of it Keras's
# own Python around each operation (argument checks, conversions, a layer's
# `__call__`), not the kernels. torch.compile removes that overhead but takes
# minutes to compile here. `torch.jit.trace` records the kernels a loop's
# condition and body run, in a fraction of a second, and the recorded graph
# runs them without the Python: the same step then takes about 3 ms. A body
# is a pure function of its loop variables, the tensors its closure holds
# (the cross-attention caches, the source mask, the length limits, the
# special ids...) and the model's weights; all three are the traced graph's
# inputs, so one trace serves every later call of the same shapes, whatever
# the values, and sees the weights as they are then.

_LOCAL = threading.local()
# Traced functions kept per compiled search (a loop's condition and body
# are two); the least recently used are dropped first.
_MAX_TRACES = 128
# The first failed trace's error, which warned; later failures are not kept.
_TRACE_FAILURES = []


def while_loop(cond, body, loop_vars):
    """`keras.ops.while_loop(cond, body, loop_vars)` for the search loops.

    Inside a search that `compile_inference` runs under PyTorch, `cond` and
    `body` are traced once per shape (`torch.jit.trace`) and the traced
    graphs run the iterations. Everywhere else this is
    `keras.ops.while_loop`.

    Args:
        cond: A function of the loop variables returning a scalar bool.
        body: A function of the loop variables returning new ones, of the
            same structure and shapes. Any tensor either function reads
            besides them and the model's weights must be in its closure
            (directly, in a list, tuple or dict there, or in the closure of a
            function there), so that the trace takes it as an input instead
            of keeping its value. Python values they read are kept: they
            must be the same on every call of the compiled search.
        loop_vars: A tuple of tensors and nested lists or tuples of tensors.

    Returns:
        The loop variables after the last iteration.
    """
    loops = getattr(_LOCAL, "loops", None)
    if loops is None:
        from keras import ops

        return ops.while_loop(cond, body, loop_vars)
    return loops.run(cond, body, tuple(loop_vars))


def write_cache(cache, index, update):
    """`cache` with `update` written at positions `index, index + 1, ...` of
    axis 1: `ops.slice_update(cache, [0, index, 0], update)`.

    Inside a search that `compile_inference` runs under PyTorch the write is
    in place: the search owns its caches and never reads an old one again,
    and copying the whole cache at every step took about half of a traced
    greedy step (torch.profiler, the decoding benchmark's default size at
    128 tokens). Everywhere else the result is a new tensor, as `keras.ops`
    promises.

    Args:
        cache: (batch, length, width) tensor.
        index: int or int scalar tensor, the first position written.
        update: (batch, n, width) tensor of the cache's dtype.
    """
    if getattr(_LOCAL, "loops", None) is None:
        from keras import ops

        return ops.slice_update(cache, [0, index, 0], update)
    cache.narrow(1, index, update.shape[1]).copy_(update)
    return cache


class _Traces:
    """Traced loop functions by key, the most recently used kept (at most
    `_MAX_TRACES`); safe to share between threads (a server's workers)."""

    def __init__(self):
        self._traces = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            traced = self._traces.get(key)
            if traced is not None:
                self._traces.move_to_end(key)
            return traced

    def put(self, key, traced):
        with self._lock:
            self._traces[key] = traced
            while len(self._traces) > _MAX_TRACES:
                self._traces.popitem(last=False)


class _TracedLoops:
    """The loops of one call of a compiled search under PyTorch.

    A loop's condition and body are traced apart, each keyed by the loop's
    place in the call (the n-th loop of the search) and the shapes and
    dtypes of all the trace's inputs, and kept in `traces`, which outlives
    the call.
    """

    def __init__(self, traces, weights):
        self.traces = traces
        self.weights = weights
        self.loops_run = 0

    def run(self, cond, body, state):
        import keras

        flat_state = keras.tree.flatten(state)
        shapes = tuple((tuple(t.shape), t.dtype) for t in flat_state)
        self.loops_run += 1
        # Both functions are traced: the loop then runs without packing and
        # unpacking its variables at every step, which took a tenth of a
        # traced greedy step.
        cond_inputs, body_inputs = self._fixed(cond, flat_state), self._fixed(body, flat_state)
        body_inputs = [*self.weights, *body_inputs]
        traced_cond = self._traced(("cond", self.loops_run, shapes), cond, state, flat_state,
                                   cond_inputs)
        traced_body = None
        while bool(traced_cond(*cond_inputs, *flat_state)[0]):
            if traced_body is None:
                traced_body = self._traced(("body", self.loops_run, shapes), body, state,
                                           flat_state, body_inputs)
            flat_state = list(traced_body(*body_inputs, *flat_state))
        return keras.tree.pack_sequence_as(state, flat_state)

    def _traced(self, key, function, state, flat_state, fixed):
        """`function` as a function of `(*fixed, *flat loop variables)`
        returning its flat outputs: traced, or from `self.traces` when traced
        before. Should tracing fail, the function itself (run by Keras at
        every step, as without a trace), with one warning."""
        import keras

        key = (*key, tuple((tuple(t.shape), t.dtype) for t in fixed))
        traced = self.traces.get(key)
        if traced is not None:
            return traced

        def flat_function(*inputs):
            # The first inputs are the fixed tensors: the function reads those
            # same tensor objects, which the tracer maps to these inputs.
            loop_vars = keras.tree.pack_sequence_as(state, list(inputs[len(fixed):]))
            return tuple(keras.tree.flatten(function(*loop_vars)))

        try:
            traced = _trace(flat_function, (*fixed, *flat_state))
        except Exception as error:  # noqa: BLE001 - any failure falls back to Keras's loop
            if not _TRACE_FAILURES:
                import warnings

                warnings.warn(f"torch.jit.trace failed on a decoding loop ({error!r}); "
                              "decoding runs it eagerly, several times slower.",
                              RuntimeWarning, stacklevel=2)
                _TRACE_FAILURES.append(repr(error))
            # Not kept: it reads this call's closure.
            return flat_function
        self.traces.put(key, traced)
        return traced

    @staticmethod
    def _fixed(function, flat_state):
        """The tensors `function` reads besides the loop variables: those its
        closure holds. A tensor that is a loop variable too (the first cache,
        before the loop) is the trace's loop-variable input, not a fixed one."""
        in_state = {id(t) for t in flat_state}
        return [t for t in _closure_tensors(function) if id(t) not in in_state]


def _trace(function, inputs):
    """`torch.jit.trace(function, inputs)`, without its warnings."""
    import warnings

    import torch

    with warnings.catch_warnings():
        # Keras converts Python numbers to tensors inside the loop; the
        # tracer warns that those become constants, which they are.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # torch 2.10+ marks torch.jit.trace deprecated in favour of
        # torch.compile, which costs minutes here (see above).
        warnings.filterwarnings("ignore", "`torch.jit.trace` is deprecated",
                                DeprecationWarning)
        return torch.jit.trace(function, inputs, check_trace=False)


def _closure_tensors(function):
    """The torch tensors a function's closure holds, in a fixed order: in its
    cells, in lists, tuples and dicts there, and in the closures of functions
    there."""
    import torch

    found, seen = [], set()

    def visit(value):
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif callable(value) and getattr(value, "__closure__", None):
            for cell in value.__closure__:
                try:
                    visit(cell.cell_contents)
                except ValueError:  # a cell not filled yet
                    pass

    visit(function)
    return found
