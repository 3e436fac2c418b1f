"""keras_transformer/inference/compiled.py: the search loops compiled for the
backend. `while_loop` is Keras's outside a compiled search; under PyTorch the
traced loop bodies (and the cache they write in place) give the eager search's
results on new values of the same shapes, and a failed trace falls back to it."""

import keras
import numpy as np
import pytest
from helpers import tiny_model

from keras_transformer import backend, compat
from keras_transformer.data.toy_tasks import ToyVocabulary
from keras_transformer.inference import compiled

VOCABULARY = ToyVocabulary(20)
BOS, EOS = VOCABULARY.bos_id, VOCABULARY.eos_id


def test_while_loop_outside_a_search_is_keras_while_loop():
    total = compiled.while_loop(lambda i, s: i < 4, lambda i, s: (i + 1, s + i),
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

    found = compiled._closure_tensors(body)
    assert sorted(float(t) for t in found) == [0.0, 1.0, 2.0, 3.0]
    assert [id(t) for t in compiled._closure_tensors(body)] == [id(t) for t in found]  # one order


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
            patch.setattr(compiled, "while_loop", keras.ops.while_loop)
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

    monkeypatch.setattr(compat, "torch_trace", failing_trace)
    monkeypatch.setattr(compiled, "_TRACE_FAILURES", [])
    other = tiny_model(seed=0)  # its own compiled search: nothing traced yet
    with pytest.warns(RuntimeWarning, match="no tracer here"):
        got = beam_search(other, source, BOS, EOS, beam_size=3)
    for g, w in zip(got, expected):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert compiled._TRACE_FAILURES


@pytest.mark.slow
def test_a_model_is_freed_once_its_compiled_searches_are_the_only_thing_left():
    # The compiled searches are cached per model in a weak-keyed cache; a trace that
    # kept the model through its closure kept the model, its traces and the caches
    # alive for the process's life (under PyTorch ~550 MB a Multi30k model).
    import gc
    import weakref

    from keras_transformer.inference import beam_search

    freed = []
    for seed in (1, 2):
        model = tiny_model(VOCABULARY.vocab_size, seed=seed, num_layers=1)
        beam_search(model, np.array([[5, 6, EOS]], "int32"), BOS, EOS, beam_size=2,
                    max_output_length=4)
        reference = weakref.ref(model)
        del model
        gc.collect()
        freed.append(reference() is None)
    assert freed == [True, True]
