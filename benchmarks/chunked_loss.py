"""The training step with the pre-softmax projection and the loss in chunks of positions
(`LabelSmoothedCrossEntropy(chunk_size=...)`) against the whole logits at once: ms per
step and the process's peak memory, per backend and vocabulary size.

One process per (backend, vocabulary, chunk size), so that each peak RSS (the process's
high-water mark, ru_maxrss) is that configuration's alone, in `--rounds` interleaved rounds
(every configuration, then again), so that a slow spell of the machine does not fall on one
configuration only; the table gives the median of the rounds. Each trains the Multi30k
recipe's sizes (d_model 128, N 4, h 4, d_ff 512; post-norm, dropout 0.2, shared vocabulary, tied
projection) on one random batch of `--batch` × `--length` tokens a side, the paper's
optimizer and label smoothing, with `train_on_batch` (one shape: nothing compiles after
the warm-up), and reports the median of `--steps` timed steps. At 8,000 subwords a
step's float32 logits of 64 × 32 positions are 66 MB; at the paper's 37,000, 303 MB.

    TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/chunked_loss.py
    python benchmarks/chunked_loss.py --vocab-sizes 37000 --chunks 0,512,1024,2048
    python benchmarks/chunked_loss.py --quick    # a smoke run, figures meaningless
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from serving import git_commit

BACKENDS = ("tensorflow", "jax", "torch")
RECIPE_MODEL = dict(d_model=128, num_layers=4, num_heads=4, d_ff=512, dropout_rate=0.2)


def build_parser():
    parser = common.argument_parser(__doc__)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated (default: all three)")
    parser.add_argument("--vocab-sizes", default="8000,37000",
                        help="comma-separated (default: %(default)s)")
    parser.add_argument("--chunks", default="0,1024",
                        help="comma-separated chunk sizes; 0 is the whole logits at once "
                             "(default: %(default)s)")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--length", type=int, default=32, help="tokens per sentence and side")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over every configuration, one process each; the table "
                             "gives the median of the rounds (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model and few steps (figures meaningless)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def child(args):
    """One (vocabulary, chunk size) under this process's backend."""
    import keras
    import numpy as np

    import keras_transformer as kt
    from keras_transformer.training.compile import compile_model

    vocab, chunk = map(int, args.child.split(","))
    sizes = dict(d_model=32, num_layers=1, num_heads=2, d_ff=64) if args.quick else {}
    config = kt.TransformerConfig.small(vocab_size=vocab, **dict(RECIPE_MODEL, **sizes))
    keras.utils.set_random_seed(0)
    model = kt.Transformer(config)
    compile_model(model, config, loss_chunk_size=chunk or None)
    rng = np.random.default_rng(0)
    shape = (args.batch, args.length)
    x = {"source": rng.integers(1, vocab, shape).astype("int32"),
         "target": rng.integers(1, vocab, shape).astype("int32")}
    y = rng.integers(1, vocab, shape).astype("int32")

    def step():
        return float(np.asarray(model.train_on_batch(x, y)[0]))

    label = f"{keras.backend.backend()} V={vocab} chunk={chunk or 'none'}: "
    first, seconds = common.time_steps(step, warmup=3, steps=args.steps, label=label)
    common.emit({"backend": keras.backend.backend(), "vocab_size": vocab,
                 "chunk_size": chunk or None, "first_step_s": first,
                 "ms_per_step": seconds * 1e3, "peak_rss_mb": common.peak_rss_mb()})


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.child:
        return child(args)
    if args.quick:
        args.batch, args.length, args.steps, args.rounds = 4, 8, 2, 1
    commit = git_commit()  # the code measured: the checkout as the run starts
    configurations = [(backend, int(vocab), int(chunk))
                      for backend in args.backends.split(",")
                      for vocab in args.vocab_sizes.split(",")
                      for chunk in args.chunks.split(",")]
    runs = {configuration: [] for configuration in configurations}
    for round_ in range(args.rounds):
        for backend, vocab, chunk in configurations:
            common.progress(f"round {round_ + 1}/{args.rounds}: {backend}, vocabulary {vocab}, "
                            f"chunk {chunk}")
            command = [sys.executable, os.path.abspath(__file__), "--child", f"{vocab},{chunk}",
                       "--batch", str(args.batch), "--length", str(args.length),
                       "--steps", str(args.steps), *(["--quick"] if args.quick else [])]
            done = subprocess.run(command, env=dict(os.environ, KERAS_BACKEND=backend),
                                  capture_output=True, text=True, check=True)
            runs[backend, vocab, chunk].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = [{"backend": backend, "vocab_size": vocab, "chunk_size": chunk or None,
             "ms_per_step": common.median([r["ms_per_step"] for r in results]),
             "round_ms_per_step": [r["ms_per_step"] for r in results],
             "peak_rss_mb": common.median([r["peak_rss_mb"] for r in results])}
            for (backend, vocab, chunk), results in runs.items()]
    _print_table(rows)
    common.write_results({"script": "chunked_loss", "commit": commit,
                          "command": common.command_line("chunked_loss.py", argv),
                          "batch": [args.batch, args.length], "rows": rows}, args.output)


def _print_table(rows):
    """One line per (backend, vocabulary): each chunk size's ms per step and peak GiB,
    and the ratio of each to the whole logits' step."""
    print("| backend | vocabulary | chunk | ms per step | × whole logits | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- |")
    whole = {(r["backend"], r["vocab_size"]): r["ms_per_step"] for r in rows
             if r["chunk_size"] is None}
    for r in rows:
        base = whole.get((r["backend"], r["vocab_size"]))
        ratio = f"{r['ms_per_step'] / base:.2f}" if base else "—"
        print(f"| {r['backend']} | {r['vocab_size']:,} | {r['chunk_size'] or 'whole'} | "
              f"{r['ms_per_step']:.0f} | {ratio} | {r['peak_rss_mb'] / 1024:.2f} GiB |")


if __name__ == "__main__":
    common.run_script(main)
