"""§6.1 Machine Translation: the search loops compiled for the backend.

`compile_inference` compiles a search of `keras_transformer.inference.search`
once per input shape: `jax.jit` with the weights as arguments, and
`tf.function(jit_compile=True)`. Under PyTorch a search runs without
gradients, and each of its loops (`while_loop`) runs a condition and a body
recorded once per shape by `torch.jit.trace`: run eagerly, a decoding step
spends most of its time in Keras's Python around each operation, which
`torch.compile` would remove only after minutes of compiling, while a trace
records the kernels in a fraction of a second and replays them without the
Python.

A traced body is a pure function of its loop variables, the tensors its
closure holds (the cross-attention caches, the source mask, the length limits,
the special ids...) and the model's weights: all three are inputs of the
traced graph, so one trace serves every later call of the same shapes,
whatever the values, and sees the weights as they are then. While such a
search runs, `keras_transformer.backend.write_cache` writes the attention
caches in place (`backend.cache_writes_in_place`).

`torch.jit.trace` is deprecated since torch 2.10 in favour of `torch.compile`;
it is kept, through `keras_transformer.compat.torch_trace` (which says why and
the torch version tested), and a trace that fails falls back to the eager loop
with one warning.
"""

import collections
import threading

from keras_transformer import backend, compat

# The traced loops of the compiled search running in this thread, if any.
_LOCAL = threading.local()
# Traced functions kept per compiled search (a loop's condition and body
# are two); the least recently used are dropped first.
_MAX_TRACES = 128
# The first failed trace's error, which warned; later failures are not kept.
_TRACE_FAILURES = []


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

    backend_name = keras.backend.backend()

    if backend_name == "jax":
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

    if backend_name == "tensorflow":
        import tensorflow as tf

        # XLA fuses the many small ops of a decoding step, which a plain
        # tf.function graph runs one by one. The search has no Python control
        # flow on tensors (it runs under jax.jit too), so AutoGraph would only
        # rewrite every function it calls: traced without it, in about 0.6 of
        # the time.
        return tf.function(lambda *args: function(model_ref(), *args), jit_compile=True,
                           autograph=False)

    def run_eagerly(*args):
        return function(model_ref(), *[keras.ops.convert_to_tensor(a) for a in args])

    if backend_name == "torch":
        import torch

        traces = _Traces()  # this function's traced loops

        def run_without_gradients(*args):
            weights = [variable.value for variable in model_ref().weights]
            previous = getattr(_LOCAL, "loops", None)
            _LOCAL.loops = _TracedLoops(traces, weights)
            try:
                # The search owns its caches and never reads an old one again.
                with torch.no_grad(), backend.cache_writes_in_place():
                    return run_eagerly(*args)
            finally:
                _LOCAL.loops = previous

        return run_without_gradients
    return run_eagerly


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
        # Both functions are traced, so that the loop does not pack and unpack
        # its variables through Keras at every step.
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

        # What the function reads, let go of once it is traced: the trace keeps
        # `flat_function`, and through `function`'s closure it would keep the model,
        # the key of the cache that holds the trace (`search._COMPILED`), alive.
        held = [function, state]
        count = len(fixed)

        def flat_function(*inputs):
            # The first inputs are the fixed tensors: the function reads those
            # same tensor objects, which the tracer maps to these inputs.
            function, state = held
            loop_vars = keras.tree.pack_sequence_as(state, list(inputs[count:]))
            return tuple(keras.tree.flatten(function(*loop_vars)))

        try:
            traced = compat.torch_trace(flat_function, (*fixed, *flat_state))
        except Exception as error:  # noqa: BLE001 - any failure falls back to Keras's loop
            if not _TRACE_FAILURES:
                import warnings

                warnings.warn(f"torch.jit.trace failed on a decoding loop ({error!r}); "
                              "decoding runs it eagerly, several times slower.",
                              RuntimeWarning, stacklevel=2)
                _TRACE_FAILURES.append(repr(error))
            # Not kept: it reads this call's closure.
            return flat_function
        held.clear()
        self.traces.put(key, traced)
        return traced

    @staticmethod
    def _fixed(function, flat_state):
        """The tensors `function` reads besides the loop variables: those its
        closure holds. A tensor that is a loop variable too (the first cache,
        before the loop) is the trace's loop-variable input, not a fixed one."""
        in_state = {id(t) for t in flat_state}
        return [t for t in _closure_tensors(function) if id(t) not in in_state]


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
