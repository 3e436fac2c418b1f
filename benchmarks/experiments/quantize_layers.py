"""Per-layer timing of Keras's int8 quantization: one `keras.layers.Dense`
against the same layer after `quantize("int8")`, at decoding shapes.

The widths are those of the benchmarks' default-size model (d_model 256, d_ff
1024, vocabulary 8000: the last is the shape of the output projection); the
rows are 8 (greedy, batch 8), 32 (beam 4) and 256. Each layer is compiled as
the library compiles its decoding loops (jax.jit with the weights as
arguments, tf.function with XLA, torch under no_grad) and called `--repeats`
times after 5 warm-up calls. Printed: the best and median microseconds per
call (Python dispatch included) and int8 / float32 of the best. It is how
It shows why `model.quantize("int8")` does not speed up decoding on a CPU
(quantize.py measures the whole model).

    KERAS_BACKEND=jax python benchmarks/experiments/quantize_layers.py
    KERAS_BACKEND=torch python benchmarks/experiments/quantize_layers.py --repeats 50
"""

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common  # noqa: E402  (also puts the repository on sys.path)

SHAPES = ((256, 256), (256, 1024), (1024, 256), (256, 8000))
ROWS = (8, 32, 256)


def timed_calls(function, x, repeats):
    """(best, median) microseconds of `function(x)`, after 5 warm-up calls."""
    def call():
        result = function(x)
        if hasattr(result, "block_until_ready"):
            result.block_until_ready()
        elif hasattr(result, "numpy"):
            result.numpy()

    for _ in range(5):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6, statistics.median(times) * 1e6


def compiled(layer):
    """`layer(x)` compiled as the library compiles its decoding loops."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        @jax.jit
        def call(trainable, non_trainable, x):
            mapping = list(zip(layer.trainable_variables, trainable)) + list(
                zip(layer.non_trainable_variables, non_trainable))
            with keras.StatelessScope(state_mapping=mapping):
                return layer(x)

        return lambda x: call(trainable, non_trainable, x)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(layer, jit_compile=True)
    import torch

    def call_without_gradients(x):
        with torch.no_grad():
            return layer(x)

    return call_without_gradients


def build_parser():
    """The script's command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per layer")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be positive")

    import keras

    rng = np.random.default_rng(0)
    print(f"backend {keras.backend.backend()}, best / median µs per call of {args.repeats}")
    print("| layer | rows | float32 µs | int8 µs | int8 / float32 (best) |")
    print("| --- | --- | --- | --- | --- |")
    for d_in, d_out in SHAPES:
        for rows in ROWS:
            x = keras.ops.convert_to_tensor(rng.standard_normal((rows, d_in)).astype("float32"))
            dense = keras.layers.Dense(d_out)
            dense.build((None, d_in))
            quantized = keras.layers.Dense(d_out)
            quantized.build((None, d_in))
            quantized.set_weights(dense.get_weights())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # NumPy 2's copy-keyword warning inside Keras
                quantized.quantize("int8")
            float_best, float_median = timed_calls(compiled(dense), x, args.repeats)
            int8_best, int8_median = timed_calls(compiled(quantized), x, args.repeats)
            print(f"| Dense {d_in}→{d_out} | {rows} | {float_best:.0f} / {float_median:.0f} | "
                  f"{int8_best:.0f} / {int8_median:.0f} | {int8_best / float_best:.2f} |",
                  flush=True)


if __name__ == "__main__":
    common.run_script(main)
