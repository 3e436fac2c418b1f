"""The Keras torch trainer's host overhead (§5, one training step of the §3 model) against
plain PyTorch: at d_model 64, two blocks a stack and batches of 8 × 16 tokens on one CPU
thread the arithmetic is small, so a step's time is mostly Python dispatching the ops.

Each model trains in its own process under `KERAS_BACKEND=torch` with
`torch.set_num_threads(1)`, in `--rounds` interleaved rounds (every model, then again), and
the table gives the median over the rounds of each process's median step:

- `peer`: `torch.nn.Transformer` with our configuration (`peers.torch_transformer`: tied
  embedding, sinusoidal positions, the same masks), `torch.optim.Adam` on eq. (3) and
  `F.cross_entropy(label_smoothing=0.1)`, an eager loop;
- `ours`: our `Transformer`, compiled as the recipes compile it (`compile_model`: the paper's
  Adam and schedule, the label-smoothed loss in chunks of `--loss-chunk-size` positions, the
  masked token accuracy), trained by `model.fit`;
- `keras`: the same shapes from Keras's own layers (`keras.layers.MultiHeadAttention`,
  `Dense`, `LayerNormalization`, `Dropout`, an `Embedding` with `mask_zero` whose mask
  Keras carries to the attention and the loss), Adam, `SparseCategoricalCrossentropy` and
  `SparseCategoricalAccuracy`, trained by the same `model.fit`: what Keras's trainer and
  layers cost with none of our code;
- with `--compiled`, also `ours_compiled` (`jit_compile=True`: `torch.compile`, minutes to
  compile here) and `peer_compiled` (the peer's model under `torch.compile`).

A Keras model's step is the time between two batches' ends in one `fit` over
`--warmup` + `--steps` batches of the same ids (the data adapter's work included, as a user's
`fit` pays it); the peer's is one call of its step. With `--profile`, one more `fit` of
`ours` and of `keras` runs under cProfile, and its time is split by where it is spent: the
torch kernels and autograd (C++), Keras's layer `__call__` machinery, Keras's op wrappers
and tensor conversion, variables and autocasting, masks, the loss, the metrics, the
optimizer, the trainer and data adapter, our library's own Python, and the rest. cProfile
slows Python more than C++, so the shares overstate the host side; the ratios between
areas hold.

    python benchmarks/torch_overhead.py
    python benchmarks/torch_overhead.py --profile
    python benchmarks/torch_overhead.py --compiled        # + torch.compile (minutes)
    TORCH_LOGS=graph_breaks python benchmarks/torch_overhead.py --models ours_compiled --rounds 1
    python benchmarks/torch_overhead.py --quick           # a smoke run, figures meaningless
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import peers
from serving import git_commit

MODELS = ("peer", "ours", "keras")
COMPILED = ("peer_compiled", "ours_compiled")
SIZES = dict(num_layers=2, d_model=64, num_heads=4, d_ff=256, vocab_size=1000,
             dropout_rate=0.1)

# Where a profiled step's Python time goes, by the file of the function that spends it
# (the first matching fragment wins). C++ work shows as built-in methods, sorted apart.
AREAS = (
    ("loss", ("keras/src/losses/", "keras_transformer/losses", "keras_transformer/chunked_loss")),
    ("metrics", ("keras/src/metrics/", "keras_transformer/training/metrics")),
    ("optimizer", ("keras/src/optimizers/", "keras/src/backend/torch/optimizers/")),
    ("trainer and data adapter", ("keras/src/trainers/", "keras/src/backend/torch/trainer",
                                  "keras/src/callbacks/", "torch/utils/data/")),
    ("masks", ("keras/src/backend/common/masking", "keras/src/utils/masking")),
    ("variables and autocast", ("keras/src/backend/common/variables",
                                "keras/src/backend/torch/core.py(value",
                                "keras/src/dtype_policies/",
                                "keras/src/backend/common/dtypes")),
    ("layer __call__ machinery", ("keras/src/layers/layer.py", "keras/src/ops/operation.py",
                                  "keras/src/utils/traceback_utils",
                                  "keras/src/backend/torch/layer",
                                  "keras/src/backend/common/global_state",
                                  "keras/src/backend/common/name_scope",
                                  "keras/src/backend/common/stateless_scope",
                                  "keras/src/backend/common/symbolic_scope",
                                  "keras/src/backend/common/keras_tensor",
                                  "keras/src/utils/tracking", "keras/src/utils/naming",
                                  "torch/nn/modules/module", "/inspect.py")),
    ("op wrappers and conversion", ("keras/src/ops/", "keras/src/backend/torch/",
                                    "keras/src/tree/", "torch/utils/_pytree", "keras/src/")),
    ("our library's Python", ("keras_transformer/",)),
)


def build_parser():
    parser = common.argument_parser(__doc__)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, of {','.join(MODELS + COMPILED)} "
                             "(default: %(default)s)")
    parser.add_argument("--compiled", action="store_true",
                        help=f"also {' and '.join(COMPILED)} (torch.compile: minutes)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed steps first (at least 2: the first builds and compiles)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over every model, one process each; the table gives "
                             "the median of the rounds (default: %(default)s)")
    parser.add_argument("--loss-chunk-size", type=int, default=1024,
                        help="ours: the loss in chunks of this many positions, as the recipes "
                             "(0: the whole logits)")
    parser.add_argument("--profile", action="store_true",
                        help="also split ours' and the Keras model's step by where its time "
                             "goes (cProfile)")
    parser.add_argument("--quick", action="store_true",
                        help="few steps, one round (figures meaningless)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    parser.add_argument("--child", choices=MODELS + COMPILED, help=argparse.SUPPRESS)
    parser.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    return parser


def config():
    from keras_transformer import TransformerConfig

    return TransformerConfig(**SIZES)


def batch(vocab_size):
    return common.random_batch(8, 16, 16, vocab_size)


def keras_model(c):
    """Our configuration from Keras's own layers, as a functional `keras.Model`: post-norm
    blocks of `keras.layers.MultiHeadAttention`, `Dense`, `LayerNormalization` and
    `Dropout`, one `Embedding` for both sides with `mask_zero` (Keras carries the padding
    mask to the attention and to the loss), sinusoidal positions, an untied output `Dense`."""
    import keras
    import numpy as np
    from keras import layers

    d = c.d_model
    position = np.arange(c.max_length)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
    table = np.zeros((c.max_length, d), "float32")
    table[:, 0::2], table[:, 1::2] = np.sin(position), np.cos(position)
    embedding = layers.Embedding(c.vocab_size, d, mask_zero=True, name="embedding")

    def embed(ids, name):
        x = embedding(ids) * d**0.5
        x = x + table[None, :ids.shape[1]]
        return layers.Dropout(c.dropout_rate, name=f"{name}_dropout")(x)

    def sublayer(x, y, name):
        y = layers.Dropout(c.dropout_rate, name=f"{name}_dropout")(y)
        return layers.LayerNormalization(epsilon=c.layer_norm_epsilon, name=f"{name}_norm")(
            x + y)

    def attention(name):
        return layers.MultiHeadAttention(c.num_heads, d // c.num_heads, name=name)

    def feed_forward(x, name):
        hidden = layers.Dense(c.d_ff, activation="relu", name=f"{name}_inner")(x)
        return layers.Dense(d, name=f"{name}_output")(hidden)

    source = keras.Input((16,), dtype="int32", name="source")
    target = keras.Input((16,), dtype="int32", name="target")
    x = embed(source, "source")
    for i in range(c.num_layers):
        x = sublayer(x, attention(f"encoder_{i}_attention")(x, x), f"encoder_{i}_attention")
        x = sublayer(x, feed_forward(x, f"encoder_{i}_ffn"), f"encoder_{i}_ffn")
    y = embed(target, "target")
    for i in range(c.num_layers):
        y = sublayer(y, attention(f"decoder_{i}_self")(y, y, use_causal_mask=True),
                     f"decoder_{i}_self")
        y = sublayer(y, attention(f"decoder_{i}_cross")(y, x), f"decoder_{i}_cross")
        y = sublayer(y, feed_forward(y, f"decoder_{i}_ffn"), f"decoder_{i}_ffn")
    logits = layers.Dense(c.vocab_size, name="logits")(y)
    model = keras.Model({"source": source, "target": target}, logits, name="plain_keras")
    model.compile(optimizer=keras.optimizers.Adam(1e-4, beta_2=0.98, epsilon=1e-9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()], jit_compile=False)
    return model


def our_model(c, loss_chunk_size, jit_compile):
    import keras_transformer as kt
    from keras_transformer.training.compile import compile_model

    model = kt.Transformer(c)
    compile_model(model, c, loss_chunk_size=loss_chunk_size or None)
    model.jit_compile = jit_compile
    return model


def fit_step_times(model, ids, warmup, steps):
    """Seconds between consecutive batch ends of one `fit` over `warmup + steps` batches of
    the same ids; the last `steps` of them."""
    import keras
    import numpy as np

    source, target, labels = ids
    count = warmup + steps + 1
    x = {"source": np.tile(source, (count, 1)), "target": np.tile(target, (count, 1))}
    ends = []

    class BatchEnds(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())

    model.fit(x, np.tile(labels, (count, 1)), batch_size=len(source), epochs=1,
              shuffle=False, verbose=0, callbacks=[BatchEnds()])
    return [later - earlier for earlier, later in zip(ends, ends[1:])][-steps:]


def peer_step_times(compiled, ids, warmup, steps):
    """Seconds of the peer's last `steps` steps on `ids`, after `warmup` of them."""
    model, step = peers.torch_model_and_step(config(), ids)
    if compiled:
        model.compile()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def child(args):
    """One model's steps in this process (the torch backend, one thread)."""
    import keras
    import torch

    torch.set_num_threads(1)
    keras.utils.set_random_seed(0)
    c = config()
    ids = batch(c.vocab_size)
    first = time.perf_counter()
    if args.child.startswith("peer"):
        times = peer_step_times(args.child == "peer_compiled", ids, args.warmup, args.steps)
        profile = None
    else:
        model = (keras_model(c) if args.child == "keras" else
                 our_model(c, args.loss_chunk_size, args.child == "ours_compiled"))
        times = fit_step_times(model, ids, args.warmup, args.steps)
        profile = where_time_goes(model, ids, args.steps) if args.profile_child else None
    common.emit({"model": args.child, "ms_per_step": common.median(times) * 1e3,
                 "step_ms": [t * 1e3 for t in times], "threads": torch.get_num_threads(),
                 "seconds": time.perf_counter() - first, "profile": profile})


def where_time_goes(model, ids, steps):
    """One more `fit` of `steps` batches under cProfile: its seconds per step by area
    (`AREAS`), C++ kernels apart, each built-in Python call counted where its caller is."""
    profiler = cProfile.Profile()
    profiler.enable()
    fit_step_times(model, ids, 0, steps)
    profiler.disable()
    areas = {}
    for (filename, _, name), (_, _, own, _, callers) in pstats.Stats(profiler).stats.items():
        if filename == "~" and ("torch" in name or name.startswith("<method")):
            area = "autograd (C++)" if "run_backward" in name else "torch kernels (C++)"
            areas[area] = areas.get(area, 0.0) + own
        elif filename == "~":  # a Python built-in: its caller's area
            for (caller_file, _, caller_name), (_, _, caller_own, _) in callers.items():
                area = area_of(caller_file, caller_name)
                areas[area] = areas.get(area, 0.0) + caller_own
        else:
            area = area_of(filename, name)
            areas[area] = areas.get(area, 0.0) + own
    return {area: seconds / steps * 1e3 for area, seconds in
            sorted(areas.items(), key=lambda item: -item[1])}


def area_of(filename, name):
    place = f"{filename.replace(os.sep, '/')}({name}"
    for area, fragments in AREAS:
        if any(fragment in place for fragment in fragments):
            return area
    return "other Python"


def run_child(args, model, profile=False):
    command = [sys.executable, os.path.abspath(__file__), "--child", model,
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--loss-chunk-size", str(args.loss_chunk_size),
               *(["--profile-child"] if profile else [])]
    # The child's standard error is this process's: its warnings, and what
    # `TORCH_LOGS=graph_breaks` prints of a compiled step.
    done = subprocess.run(command, env=dict(os.environ, KERAS_BACKEND="torch"),
                          stdout=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"error: {model} failed with exit status {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.quick:
        args.steps, args.warmup, args.rounds = 3, 2, 1
    if args.steps < 1 or args.warmup < 2 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1, --warmup at least 2")
    models = args.models.split(",") + (list(COMPILED) if args.compiled else [])
    unknown = sorted(set(models) - set(MODELS + COMPILED))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {','.join(MODELS + COMPILED)}")
    commit = git_commit()
    runs = {model: [] for model in models}
    for round_ in range(args.rounds):
        for model in models:
            common.progress(f"round {round_ + 1}/{args.rounds}: {model}")
            runs[model].append(run_child(args, model))
            common.progress(f"  {runs[model][-1]['ms_per_step']:.1f} ms per step")
    rows = {model: {"ms_per_step": common.median([r["ms_per_step"] for r in results]),
                    "round_ms_per_step": [r["ms_per_step"] for r in results]}
            for model, results in runs.items()}
    profiles = {}
    if args.profile:
        for model in ("ours", "keras"):
            common.progress(f"profiling {model}")
            profiles[model] = run_child(args, model, profile=True)["profile"]
    results = common.completed({
        "script": "torch_overhead", "commit": commit,
        "command": common.command_line("torch_overhead.py", argv), "sizes": SIZES,
        "batch": [8, 16], "threads": 1, "steps": args.steps, "rounds": args.rounds,
        "loss_chunk_size": args.loss_chunk_size, "rows": rows, "profiles": profiles})
    print(markdown([results]))
    common.write_results(results, args.output)


LABELS = {"peer": "`torch.nn.Transformer`, eager (the peer)", "ours": "ours",
          "keras": "the same shapes from Keras's layers",
          "peer_compiled": "the peer, `torch.compile`", "ours_compiled": "ours, `jit_compile=True`"}


def table(runs):
    """The Markdown of one run's results (`--output`), or of a folder of them
    (benchmarks/tables.py's kind `torch_overhead`): a line per run (its command, commit and
    machine), a row per run and model: the median step, the rounds' steps, and the ratios
    to that run's eager peer and Keras layers' model; then, for a run with `--profile`, the
    split of its profiled steps by area, the largest first."""
    runs = runs if isinstance(runs, list) else [runs]
    if quick := [run["command"] for run in runs if "--quick" in run["command"]]:
        raise ValueError(f"a torch_overhead.py --quick run's figures are meaningless: {quick[0]}")
    return markdown(runs)


def markdown(runs):
    """`table`'s Markdown of a list of runs, a --quick one's too (the script prints it)."""
    import records
    import run_all

    lines, rows = [], []
    for run in runs:
        made = run["machine"]
        lines.append(f"- `{run['command']}` at commit `{run['commit']}`, on "
                     f"{made['usable_cores']} cores of {records._machine(made)}: "
                     + (f"the median of {run['rounds']} rounds' medians" if run["rounds"] > 1
                        else "one round's median") + f" of {run['steps']} steps")
        peer, plain = (run["rows"].get(name, {}).get("ms_per_step") for name in ("peer", "keras"))
        order = MODELS + COMPILED  # a results file's keys are sorted
        for model, row in sorted(run["rows"].items(), key=lambda item: order.index(item[0])):
            ms = row["ms_per_step"]
            label = LABELS.get(model, model)
            if model.startswith("ours") and run["loss_chunk_size"] == 0:
                label += ", the loss on the whole logits (`--loss-chunk-size 0`)"
            rounds = ", ".join(f"{r:.1f}" for r in row["round_ms_per_step"])
            rows.append((label, f"{ms:.1f}", rounds, f"{ms / peer:.2f}" if peer else "—",
                         f"{ms / plain:.2f}" if plain else "—"))
    lines += ["", run_all.table(("model", "ms per step", "each round", "× its run's eager peer",
                                 "× its run's Keras layers' model"), rows)]
    for run in runs:
        profiles = run.get("profiles") or {}
        if not profiles:
            continue
        names = sorted(profiles, key=(MODELS + COMPILED).index)
        areas = sorted({area for profile in profiles.values() for area in profile},
                       key=lambda area: -max(p.get(area, 0.0) for p in profiles.values()))
        profile_rows = [(area.replace("__call__", "`__call__`"),
                         *(f"{profiles[n].get(area, 0.0):.1f}" for n in names))
                        for area in areas]
        profile_rows.append(("total", *(f"{sum(profiles[n].values()):.1f}" for n in names)))
        lines += ["", f"Where a profiled step goes, ms (`{run['command']}`: one more `fit` under "
                  "cProfile, which slows Python more than C++):", "",
                  run_all.table(("where", *(LABELS.get(n, n) for n in names)), profile_rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    common.run_script(main)
