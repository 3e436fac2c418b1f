"""Decoding under PyTorch with the library's traced loops against the same search run eagerly:
why `keras_transformer.inference.compiled` keeps `torch.jit.trace`.

The Multi30k recipe's model (d_model 128, N 4, h 4, d_ff 512, two vocabularies of 8000),
untrained, so that every sentence runs to `--length` tokens: greedy and beam search (beam 4,
α 0.6) of 8 sources of 20 tokens, the median milliseconds per call of 5 after 2 that warm up,
and per decoding step. "traced" is the library as it runs; "eager" the same search under
`torch.no_grad` without the traces, as `tests/inference/test_compiled.py` runs it (Keras's
`while_loop`, the cache written by `ops.slice_update`).

    python benchmarks/torch_decoding.py
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import os

    os.environ["KERAS_BACKEND"] = "torch"
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import statistics
import time

import common
import numpy as np


def timed(search, calls=5):
    search()
    search()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        search()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--length", type=int, default=32, help="tokens decoded per sentence")
    return parser


def main():
    args = build_parser().parse_args()
    import keras
    from keras import ops

    import keras_transformer as kt
    from keras_transformer import backend
    from keras_transformer.inference import beam_search, compiled, greedy_search

    keras.utils.set_random_seed(0)
    config = kt.TransformerConfig(vocab_size=8000, target_vocab_size=8000, share_embeddings=False,
                                  num_layers=4, d_model=128, num_heads=4, d_ff=512,
                                  dropout_rate=0.2, max_length=128)
    model = kt.Transformer(config)
    source = np.random.default_rng(0).integers(4, 8000, (8, 20)).astype("int32")
    searches = {
        "greedy": lambda: greedy_search(model, source, 2, 3, max_output_length=args.length),
        "beam 4": lambda: beam_search(model, source, 2, 3, beam_size=4, alpha=0.6,
                                      max_output_length=args.length),
    }
    figures = {name: [timed(search)] for name, search in searches.items()}
    compiled.while_loop = ops.while_loop  # the eager search: no traces
    backend.write_cache = lambda cache, index, update: ops.slice_update(
        cache, [0, index, 0], update)
    for name, search in searches.items():
        figures[name].append(timed(search))
    machine = common.machine()
    print(f"CPU: {machine['cpu']} ({machine['isa']}), {machine['usable_cores']} cores; "
          f"torch, batch 8, {args.length} tokens")
    print("| search | traced, ms per step | eager, ms per step | eager / traced |")
    print("| --- | --- | --- | --- |")
    for name, (traced, eager) in figures.items():
        print(f"| {name} | {traced / args.length:.2f} | {eager / args.length:.2f} | "
              f"{eager / traced:.1f}× |")


if __name__ == "__main__":
    common.run_script(main)
