"""Decoding under PyTorch with the library's traced loops against the same search run eagerly:
why `keras_transformer.inference.compiled` keeps `torch.jit.trace`.

The Multi30k recipe's model (d_model 128, N 4, h 4, d_ff 512, two vocabularies of 8000),
untrained, so that every sentence runs to `--length` tokens: greedy and beam search (beam 4,
α 0.6) of 8 sources of 20 tokens, the median milliseconds per call of 5 after 2 that warm up,
and per decoding step. "traced" is the library as it runs; "eager" the same search under
`torch.no_grad` without the traces, as `tests/inference/test_compiled.py` runs it (Keras's
`while_loop`, the cache written by `ops.slice_update`).

    python benchmarks/torch_decoding.py
    python benchmarks/torch_decoding.py --output torch-decoding.json   # also the figures

The results file (`--output`) makes benchmarks/tables.py's kind `torch_decoding`.
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
    parser.add_argument("--output", help="also write the figures to this JSON file")
    return parser


def table(result):
    """The Markdown of a run's results (`--output`; benchmarks/tables.py's kind
    `torch_decoding`): the command, commit and machine, then a row per search."""
    import records
    import run_all

    made = result["machine"]
    rows = [(name, f"{row['traced_ms_per_step']:.2f}", f"{row['eager_ms_per_step']:.2f}",
             f"{row['eager_ms_per_step'] / row['traced_ms_per_step']:.1f}×")
            for name, row in result["searches"].items()]
    return "\n".join([
        f"`{result['command']}` at commit `{result['commit']}`, on {made['usable_cores']} "
        f"cores of {records._machine(made)}: batch {result['batch']}, {result['length']} "
        "tokens a sentence, the median of 5 calls:", "",
        run_all.table(("search", "traced, ms per step", "eager (`torch.no_grad`), ms per step",
                       "eager / traced"), rows)])


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
    result = common.completed({
        "script": "torch_decoding", "batch": len(source), "length": args.length,
        "searches": {name: {"traced_ms_per_step": traced / args.length,
                            "eager_ms_per_step": eager / args.length}
                     for name, (traced, eager) in figures.items()}})
    print(table(result))
    common.write_results(result, args.output)

if __name__ == "__main__":
    common.run_script(main)
