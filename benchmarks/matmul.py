"""The machine's float32 matrix-multiplication rate (GFLOP/s): the limit the
training step is compared with.

Times C = A·B for square n × n float32 matrices (2n³ FLOPs) with NumPy and with
each installed backend library (TensorFlow, JAX, PyTorch) on the CPU, and
reports the median over `--repeats` calls after `--warmup` calls. A second,
model-shaped product (B·T × d_model)·(d_model × d_ff), the feed-forward matmul of
the large training configuration, shows the rate at the sizes the model runs.
Every library runs in this one process, one after another, with its default
thread count.

    python benchmarks/matmul.py                  # n = 2048
    python benchmarks/matmul.py --size 4096 --repeats 20
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start(keep_jax=True)  # JAX is timed beside the other libraries

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

LIBRARIES = ("numpy", "tensorflow", "jax", "torch")


def matmul_runner(library, a, b):
    """A function running one product with `library`, waiting for its result."""
    if library == "numpy":
        return lambda: a @ b
    if library == "tensorflow":
        import tensorflow as tf

        with tf.device("/CPU:0"):
            ta, tb = tf.constant(a), tf.constant(b)

        def run():
            with tf.device("/CPU:0"):
                return tf.linalg.matmul(ta, tb)  # eager CPU ops return when done

        return run
    if library == "jax":
        import jax
        import jax.numpy as jnp

        cpu = jax.devices("cpu")[0]
        ja, jb = jax.device_put(a, cpu), jax.device_put(b, cpu)
        product = jax.jit(jnp.matmul)
        return lambda: product(ja, jb).block_until_ready()
    if library == "torch":
        import torch

        pa, pb = torch.from_numpy(a), torch.from_numpy(b)
        return lambda: torch.matmul(pa, pb)
    raise ValueError(f"Unknown library {library!r}: choose from {LIBRARIES}.")


def threads(library):
    if library == "torch":
        import torch

        return torch.get_num_threads()
    return None


def rate(library, m, k, n, warmup, repeats, seed=0):
    """Median GFLOP/s of (m × k)·(k × n) float32 products."""
    import numpy as np

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype="float32")
    b = rng.standard_normal((k, n), dtype="float32")
    run = matmul_runner(library, a, b)
    for _ in range(warmup):
        run()
    seconds = [common.timed(run)[0] for _ in range(repeats)]
    return 2.0 * m * k * n / common.median(seconds) / 1e9


def available(library):
    try:
        __import__(library)
        return True
    except ImportError:
        return False


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--size", type=int, default=2048, help="n of the square n×n product")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    parser.add_argument("--libraries", default=",".join(LIBRARIES),
                        help=f"comma-separated subset of {','.join(LIBRARIES)}")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes to check that the script runs (figures meaningless)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    libraries = [name.strip() for name in args.libraries.split(",") if name.strip()]
    unknown = sorted(set(libraries) - set(LIBRARIES))
    if unknown:
        parser.error(f"unknown libraries {unknown}; choose from {','.join(LIBRARIES)}")
    if args.quick:
        args.size, args.repeats, args.warmup = 128, 2, 1
    if args.size < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--size and --repeats must be positive, --warmup non-negative")

    large = common.SIZES["quick" if args.quick else "large"]
    tokens = 8 * 8 if args.quick else 32 * 32  # the training batch: B × T target tokens
    shapes = {
        "square": (args.size, args.size, args.size),
        "ffn": (tokens, large["d_model"], large["d_ff"]),
    }
    results, skipped = {}, []
    for library in libraries:
        if not available(library):
            skipped.append(library)
            common.progress(f"matmul: {library} is not installed, skipped")
            continue
        results[library] = {}
        for name, (m, k, n) in shapes.items():
            gflops = rate(library, m, k, n, args.warmup, args.repeats)
            results[library][name] = gflops
            common.progress(f"matmul: {library:<10} {name:<6} ({m}×{k})·({k}×{n}) "
                            f"float32: {gflops:8.1f} GFLOP/s")
        results[library]["threads"] = threads(library)
    if not results:
        sys.exit("error: none of the libraries could be imported: install numpy at least.")
    best = max(results, key=lambda name: results[name]["square"])
    common.progress(f"matmul: best square rate {results[best]['square']:.1f} GFLOP/s ({best})")
    common.emit({
        "benchmark": "matmul",
        "quick": args.quick,
        "shapes": {name: list(shape) for name, shape in shapes.items()},
        "repeats": args.repeats,
        "gflops": results,
        "best_library": best,
        "best_gflops": results[best]["square"],
        "skipped": skipped,
        "machine": common.machine(),
    })


if __name__ == "__main__":
    common.run_script(main)
