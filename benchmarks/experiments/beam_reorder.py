"""Beam search's cache reorder (§6.1): three formulations of the same gather, timed.

After every beam step the self-attention cache (batch * beam, P, heads * width) is
reordered after the surviving hypotheses' parents (`Transformer.reorder_cache`). This times
that reorder alone for the benchmark's default size (batch 8, beam 4, d_model 256, six
cache tensors for N=3), inside a compiled 50-step loop (each step also multiplies the
result by a constant, so the loop cannot be folded away), best of 3 calls:

* take: `ops.take(cache, parents, axis=0)`, what `Transformer.reorder_cache` does;
* onehot: a (beam, beam) one-hot matrix per sentence times the sentence's rows;
* take_along: `ops.take_along_axis` over a (batch, beam, P * width) view.

JAX and TensorFlow compile the loop (`jax.jit`, `tf.function(jit_compile=True)`);
torch runs it eagerly, where the kernels dominate at these sizes.

    KERAS_BACKEND=jax python benchmarks/experiments/beam_reorder.py
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common  # noqa: E402  (also puts the repository on sys.path)

BATCH, BEAM, WIDTH, TENSORS = 8, 4, 256, 6


def by_take(x, parents):
    from keras import ops

    return ops.take(x, parents, axis=0)


def _local_parents(parents):
    """(batch, beam) parents as beam numbers within their sentence."""
    from keras import ops

    return ops.reshape(parents, (BATCH, BEAM)) - ops.arange(BATCH, dtype="int32")[:, None] * BEAM


def by_onehot(x, parents):
    from keras import ops

    length = ops.shape(x)[1]
    onehot = ops.one_hot(_local_parents(parents), BEAM, dtype=x.dtype)  # (batch, new, old)
    mixed = ops.matmul(onehot, ops.reshape(x, (BATCH, BEAM, length * WIDTH)))
    return ops.reshape(mixed, (BATCH * BEAM, length, WIDTH))


def by_take_along(x, parents):
    from keras import ops

    length = ops.shape(x)[1]
    taken = ops.take_along_axis(ops.reshape(x, (BATCH, BEAM, length * WIDTH)),
                                _local_parents(parents)[:, :, None], axis=1)
    return ops.reshape(taken, (BATCH * BEAM, length, WIDTH))


FORMULATIONS = {"take": by_take, "onehot": by_onehot, "take_along": by_take_along}


def reorder_loop(reorder, steps):
    """`steps` reorders of every tensor of a list, as a compiled loop."""
    from keras import ops

    def run(caches, parents):
        def body(i, caches):
            return i + 1, [reorder(cache, parents) * 1.0001 for cache in caches]

        return ops.while_loop(lambda i, caches: i < steps, body, (0, caches))[1]

    backend = common.backend_name()
    if backend == "jax":
        import jax

        return jax.jit(run)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(run, jit_compile=True)
    return run


def build_parser():
    """The script's command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="reorders per timed call")
    parser.add_argument("--lengths", default="32,64,128,256",
                        help="cache lengths P, comma-separated")
    parser.add_argument("--quick", action="store_true",
                        help="check that it runs: P = 8, 2 steps (figures meaningless)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    lengths = [8] if args.quick else [int(n) for n in args.lengths.split(",")]
    steps = 2 if args.quick else args.steps
    from keras import ops

    backend = common.backend_name()
    rng = np.random.default_rng(0)
    results = {}
    for length in lengths:
        caches = [ops.convert_to_tensor(
            rng.standard_normal((BATCH * BEAM, length, WIDTH)).astype("float32"))
            for _ in range(TENSORS)]
        parents = np.arange(BATCH)[:, None] * BEAM + rng.integers(0, BEAM, (BATCH, BEAM))
        parents = ops.convert_to_tensor(parents.reshape(-1).astype("int32"))
        row = {}
        for name, reorder in FORMULATIONS.items():
            loop = reorder_loop(reorder, steps)

            def call():  # waits for the result: JAX dispatches asynchronously
                return np.asarray(loop(caches, parents)[0][0, 0, :2])

            call()  # compiles
            best = min(common.timed(call)[0] for _ in range(3))
            row[name] = best / steps * 1e6
        results[str(length)] = row
        common.progress(f"{backend} P={length} | " + " | ".join(
            f"{name} {microseconds:.0f} us/step({TENSORS} tensors)"
            for name, microseconds in row.items()))
    common.emit({"benchmark": "beam_reorder", "backend": backend, "steps": steps,
                 "microseconds_per_step": results, "machine": common.machine()})


if __name__ == "__main__":
    common.run_script(main)
