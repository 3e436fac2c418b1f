"""keras_transformer/backend.py: JAX's persistent compilation cache, and the
attention cache's writes (`write_cache`, in place only within
`cache_writes_in_place`). The backend's other decisions are tested where they
act: test_model.py, test_distribution.py, the decoding tests, and
tests/inference/test_compiled.py for the traced PyTorch search that writes in
place."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import REPOSITORY

from keras_transformer import backend

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


# The attention cache's writes.


def test_write_cache_outside_a_search_leaves_the_cache_as_it_was():
    cache = keras.ops.zeros((2, 5, 3))
    update = keras.ops.ones((2, 1, 3))
    written = backend.write_cache(cache, 2, update)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(cache), np.zeros((2, 5, 3)))
    expected = np.zeros((2, 5, 3))
    expected[:, 2] = 1.0
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(written), expected)


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="only PyTorch's traced search writes in place")
def test_write_cache_within_cache_writes_in_place_writes_into_the_cache():
    cache = keras.ops.zeros((2, 5, 3))
    with backend.cache_writes_in_place():
        written = backend.write_cache(cache, 2, keras.ops.ones((2, 1, 3)))
    assert written is cache
    expected = np.zeros((2, 5, 3))
    expected[:, 2] = 1.0
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(cache), expected)
    # Outside it again, a new tensor.
    assert backend.write_cache(cache, 0, keras.ops.ones((2, 1, 3))) is not cache


@pytest.mark.once("jax")  # a version check, not the backend
@pytest.mark.parametrize("version, refused", [
    ("3.13.2", True), ("3.0.5", True), ("2.15.0", True), ("3.14.0", False), ("3.15.1", False),
    ("3.14.0.dev2026010103", False), ("4.0.0", False)])
@pytest.mark.backs("docs/installation.md", "Keras below 3.14 is refused")
def test_keras_below_3_14_is_refused(version, refused):
    if refused:
        with pytest.raises(ImportError, match=f"needs Keras 3.14 or newer, and Keras {version} "
                                              "is installed"):
            backend.check_keras_version(version)
    else:
        backend.check_keras_version(version)
