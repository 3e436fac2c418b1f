"""Beam search's cache reorder (§6.1): three formulations of the same gather, timed.

After every beam step the self-attention cache (batch * beam, P, heads * width) is
reordered after the surviving hypotheses' parents (`Transformer.reorder_cache`). This times
that reorder alone for the benchmark's default size (batch 8, beam 4, d_model 256, six
cache tensors for N=3), inside a compiled 50-step loop (each step also multiplies the
result by a constant, so the loop cannot be folded away):

* take: `ops.take(cache, parents, axis=0)`, what the library does;
* onehot: a (beam, beam) one-hot matrix per sentence times the sentence's rows;
* take_along: `ops.take_along_axis` over a (batch, beam, P * width) view.

    KERAS_BACKEND=jax python benchmarks/beam_reorder.py
"""

import time

import keras
import numpy as np
from keras import ops


B, BEAM, HD = 8, 4, 256
backend = keras.backend.backend()


def by_take(x, parents):
    return ops.take(x, parents, axis=0)


def by_onehot(x, parents):
    P = ops.shape(x)[1]
    local = ops.reshape(parents, (B, BEAM)) - ops.arange(B, dtype="int32")[:, None] * BEAM
    onehot = ops.one_hot(local, BEAM, dtype=x.dtype)  # (B, beam_new, beam_old)
    y = ops.matmul(onehot, ops.reshape(x, (B, BEAM, P * HD)))
    return ops.reshape(y, (B * BEAM, P, HD))


def by_take_along(x, parents):
    P = ops.shape(x)[1]
    local = ops.reshape(parents, (B, BEAM)) - ops.arange(B, dtype="int32")[:, None] * BEAM
    y = ops.take_along_axis(ops.reshape(x, (B, BEAM, P * HD)), local[:, :, None], axis=1)
    return ops.reshape(y, (B * BEAM, P, HD))


def loop(fn, steps):
    def run(x, parents):
        def body(i, x):
            return i + 1, [fn(t, parents) * 1.0001 for t in x]
        return ops.while_loop(lambda i, x: i < steps, body, (0, x))[1]
    return run


def compiled(f):
    if backend == "jax":
        import jax
        return jax.jit(f)
    if backend == "tensorflow":
        import tensorflow as tf
        return tf.function(f, jit_compile=True)
    return f  # torch: eager; the kernels dominate at these sizes


def main():
    rng = np.random.default_rng(0)
    for P in (32, 64, 128, 256):
        xs = [ops.convert_to_tensor(rng.standard_normal((B * BEAM, P, HD)).astype("float32"))
              for _ in range(6)]
        parents = np.arange(B)[:, None] * BEAM + rng.integers(0, BEAM, (B, BEAM))
        parents = ops.convert_to_tensor(parents.reshape(-1).astype("int32"))
        row = [f"P={P}"]
        for name, fn in (("take", by_take), ("onehot", by_onehot), ("take_along", by_take_along)):
            f = compiled(loop(fn, 50))
            np.asarray(f(xs, parents)[0][0, 0, :2])  # compile
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                np.asarray(f(xs, parents)[0][0, 0, :2])
                best = min(best, time.perf_counter() - start)
            row.append(f"{name} {best / 50 * 1e6:.0f} us/step(6 tensors)")
        print(backend, " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
