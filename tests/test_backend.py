"""keras_transformer/backend.py: JAX's persistent compilation cache, and the
search loops' adapter (`while_loop`, `write_cache`: PyTorch's traced loop
bodies, checked against the eager search). The backend's other decisions are
tested where they act: test_model.py, test_distribution.py and the decoding
tests."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import REPOSITORY, tiny_model

from keras_transformer import backend
from keras_transformer.training.toy_tasks import ToyVocabulary

VOCABULARY = ToyVocabulary(20)
BOS, EOS = VOCABULARY.bos_id, VOCABULARY.eos_id

# Compiles one program with the cache on, in a process of its own (JAX's
# cache settings are global), and prints JAX's count of cache hits.
COMPILE = """
import sys
import jax, jax.numpy as jnp
from keras_transformer import backend
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kwargs: hits.append(event) if event.endswith("cache_hits") else None)
assert backend.use_compilation_cache(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
x = jnp.ones((64, 64))
jax.jit(lambda x: jnp.tanh(x @ x.T) @ x)(x).block_until_ready()
print("hits", len(hits))
"""


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the cache is JAX's")
def test_a_second_process_reads_the_compiled_program_from_the_cache(tmp_path):
    cache = str(tmp_path / "compilation_cache")
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    listings = []
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", COMPILE, cache], cwd=REPOSITORY, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        listings.append((sorted(os.listdir(cache)), result.stdout.split()[-1]))
    assert listings[0][0], "nothing was written to the cache"
    # The first process compiled and wrote; the second read the program back.
    assert listings[0][1] == "0" and int(listings[1][1]) >= 1, listings
    assert listings[1][0] == listings[0][0]


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="JAX's cache is tested above")
def test_other_backends_keep_no_cache(tmp_path):
    assert backend.use_compilation_cache(str(tmp_path / "compilation_cache")) is False
    assert not os.path.exists(tmp_path / "compilation_cache")


# The search loops' adapter: backend.while_loop and backend.write_cache.


def test_write_cache_outside_a_search_leaves_the_cache_as_it_was():
    cache = keras.ops.zeros((2, 5, 3))
    update = keras.ops.ones((2, 1, 3))
    written = backend.write_cache(cache, 2, update)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(cache), np.zeros((2, 5, 3)))
    expected = np.zeros((2, 5, 3))
    expected[:, 2] = 1.0
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(written), expected)


def test_while_loop_outside_a_search_is_keras_while_loop():
    total = backend.while_loop(lambda i, s: i < 4, lambda i, s: (i + 1, s + i),
                               (keras.ops.convert_to_tensor(0), keras.ops.convert_to_tensor(0)))
    assert [int(keras.ops.convert_to_numpy(v)) for v in total] == [4, 6]


torch_only = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="only PyTorch traces its loop bodies")


@torch_only
def test_closure_tensors_are_found_in_cells_containers_and_nested_closures():
    import torch

    a, b, c, d = (torch.full((1,), float(i)) for i in range(4))
    table = {"x": [a, (b, 7)], "y": "text"}

    def inner():
        return c

    def body():
        return table, inner, d, a, 3  # `a` twice: found once

    found = backend._closure_tensors(body)
    assert sorted(float(t) for t in found) == [0.0, 1.0, 2.0, 3.0]
    assert [id(t) for t in backend._closure_tensors(body)] == [id(t) for t in found]  # one order


@torch_only
@pytest.mark.parametrize("search", ["greedy", "beam", "n_best", "sample", "aligned"])
def test_traced_torch_loops_equal_the_eager_search_on_new_values_of_the_same_shape(
        monkeypatch, search):
    import torch

    from keras_transformer.inference import beam_search, greedy_search, sample_search

    traces = []
    trace = torch.jit.trace
    monkeypatch.setattr(torch.jit, "trace", lambda *a, **k: traces.append(1) or trace(*a, **k))
    model = tiny_model(seed=0)
    rng = np.random.default_rng(0)
    run = {
        "greedy": lambda s: greedy_search(model, s, BOS, EOS),
        "beam": lambda s: beam_search(model, s, BOS, EOS, beam_size=3),
        "n_best": lambda s: beam_search(model, s, BOS, EOS, beam_size=3, num_return=2),
        "sample": lambda s: sample_search(model, s, BOS, EOS, top_k=5, seed=int(s[0, 0])),
        "aligned": lambda s: greedy_search(model, s, BOS, EOS, return_alignment=True),
    }[search]

    def eager(source):
        """The same search with Keras's own loop and functional cache writes."""
        with monkeypatch.context() as patch:
            patch.setattr(backend, "while_loop", keras.ops.while_loop)
            patch.setattr(backend, "write_cache", lambda cache, index, update:
                          keras.ops.slice_update(cache, [0, index, 0], update))
            return run(source)

    for attempt in range(3):  # new ids each time, the same shapes
        source = rng.integers(3, 20, size=(3, 6)).astype("int32")
        source[:, -1] = EOS
        if attempt == 2:  # new weights too: they are the trace's inputs
            model.set_weights([w * 1.5 for w in model.get_weights()])
        got = run(source)
        if attempt == 0:
            traced = len(traces)
        want = eager(source)
        assert len(traces) == traced, "the same shapes must reuse the traces"
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert traced >= 1


@torch_only
def test_a_failed_trace_warns_and_decodes_eagerly(monkeypatch):
    from keras_transformer.inference import beam_search

    model = tiny_model(seed=0)
    source = np.array([[5, 9, 7, EOS], [4, EOS, 0, 0]], "int32")
    expected = beam_search(model, source, BOS, EOS, beam_size=3)

    def failing_trace(function, inputs):
        raise RuntimeError("no tracer here")

    monkeypatch.setattr(backend, "_trace", failing_trace)
    monkeypatch.setattr(backend, "_TRACE_FAILURES", [])
    other = tiny_model(seed=0)  # its own compiled search: nothing traced yet
    with pytest.warns(RuntimeWarning, match="no tracer here"):
        got = beam_search(other, source, BOS, EOS, beam_size=3)
    for g, w in zip(got, expected):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert backend._TRACE_FAILURES
