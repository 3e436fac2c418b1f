"""The training step of the Multi30k recipe's model, per backend, for the library of each
checkout given: what a change to the layers costs or saves, measured side by side.

One process per (backend, checkout), each importing the `keras_transformer` of its checkout:
the recipe's sizes (d_model 128, N 4, h 4, d_ff 512; post-norm, dropout 0.2, two vocabularies
of 8000) compiled with the paper's optimizer and loss (`compile_model`), trained with
`train_on_batch` on one fixed batch of 64 sentences (32 source and 33 target positions,
the last 4 of each padding), 3 steps to compile, then the median milliseconds of `--steps`
steps. A synthetic batch, so the data pipeline is not timed.

    git worktree add /tmp/before HEAD~1
    TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/step_by_checkout.py /tmp/before .
    TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/step_by_checkout.py /tmp/before . --output ab.json

A checkout given twice is measured twice (a process each). The results file (`--output`:
each checkout's commit, a figure per backend and checkout given) makes benchmarks/tables.py's
kind `step_by_checkout`, one run's or a folder of runs'.
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import os
import subprocess
import sys

import common

CHILD = r'''
import os, statistics, sys, time
checkout, steps = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, checkout)
import numpy as np, keras
import keras_transformer as kt
from keras_transformer.training.compile import compile_model
assert os.path.realpath(kt.__file__).startswith(os.path.realpath(checkout)), kt.__file__
keras.utils.set_random_seed(0)
config = kt.TransformerConfig(vocab_size=8000, target_vocab_size=8000, share_embeddings=False,
                              num_layers=4, d_model=128, num_heads=4, d_ff=512,
                              dropout_rate=0.2, max_length=64, warmup_steps=1000)
model = kt.Transformer(config)
compile_model(model, config)
rng = np.random.default_rng(0)
source = rng.integers(3, 8000, (64, 32)).astype("int32")
target = rng.integers(3, 8000, (64, 33)).astype("int32")
source[:, 28:] = 0
target[:, 29:] = 0
inputs, labels = {"source": source, "target": target[:, :-1]}, target[:, 1:]
for _ in range(3):
    model.train_on_batch(inputs, labels)
times = []
for _ in range(steps):
    start = time.perf_counter()
    model.train_on_batch(inputs, labels)
    times.append(time.perf_counter() - start)
print(f"{1000 * statistics.median(times):.1f}")
'''


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("checkouts", nargs="+", help="folders holding keras_transformer/")
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per process")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    return parser


def checkout_commit(folder):
    """The short commit a checkout's tree is at, "(uncommitted changes)" added when its
    library differs from it."""
    def git(*argv):
        return subprocess.run(["git", "-C", folder, *argv], capture_output=True,
                              text=True).stdout.strip()

    changed = git("status", "--porcelain", "--", "keras_transformer")
    return git("rev-parse", "--short", "HEAD") + (" (uncommitted changes)" if changed else "")


def table(runs):
    """The Markdown of runs' results (`--output`; benchmarks/tables.py's kind
    `step_by_checkout`): a line per run (its command, commit and machine), then a row per
    backend and a column per checkout's commit, each process's median ms per step."""
    import records
    import run_all

    runs = runs if isinstance(runs, list) else [runs]
    lines, commits, cells = [], [], {}
    for run in runs:
        made = run["machine"]
        lines.append(f"- `{run['command']}` at commit `{run['commit']}`, on "
                     f"{made['usable_cores']} cores of {records._machine(made)}: the median "
                     f"of {run['steps']} steps a process")
        for row in run["rows"]:
            if row["checkout"] not in commits:  # the columns, in the order met
                commits.append(row["checkout"])
            cells.setdefault(row["backend"], {}).setdefault(row["checkout"], []).append(
                row["ms_per_step"])
    rows = [(records.BACKEND_NAMES[backend],
             *("; ".join(f"{ms:.1f}" for ms in by_checkout.get(commit, [])) or "–"
               for commit in commits)) for backend, by_checkout in cells.items()]
    return "\n".join([*lines, "", run_all.table(
        ("backend", *(f"`{commit}`, ms per step" for commit in commits)), rows)])


def main():
    args = build_parser().parse_args()
    commits = {checkout: checkout_commit(checkout) for checkout in args.checkouts}
    rows = []
    for backend in args.backends.split(","):
        for checkout in args.checkouts:
            result = subprocess.run(
                [sys.executable, "-c", CHILD, os.path.abspath(checkout), str(args.steps)],
                capture_output=True, text=True, env=dict(os.environ, KERAS_BACKEND=backend))
            if result.returncode != 0:
                sys.exit(f"{backend} at {checkout} failed:\n{result.stderr[-3000:]}")
            rows.append({"backend": backend, "checkout": commits[checkout],
                         "ms_per_step": float(result.stdout.strip().splitlines()[-1])})
            common.progress(f"{backend} at {checkout}: {rows[-1]['ms_per_step']:.1f} ms")
    results = common.completed({"script": "step_by_checkout", "steps": args.steps,
                                "checkouts": commits, "rows": rows})
    print(table(results))
    common.write_results(results, args.output)


if __name__ == "__main__":
    common.run_script(main)
