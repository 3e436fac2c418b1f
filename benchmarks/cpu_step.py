"""The Multi30k recipe's training step under each backend on this CPU, side by side, with
the label-smoothed loss fused or not, and where each backend's step goes.

One process per (backend, loss), in interleaved rounds (TensorFlow, JAX, torch, then
again), so that a slow spell of the machine does not fall on one backend only. Each
trains the recipe's sizes (d_model 128, N 4, h 4, d_ff 512; post-norm, dropout 0.2, separate
vocabularies of 8000) with `model.fit` on the recipe's batches (2048 tokens a side,
buckets 4 wide) of Multi30k's training split from `--data-dir` (the synthetic task when
it is absent), the paper's optimizer and schedule, and reports the median
milliseconds per step (from the time between consecutive steps, so that a step that
compiles a new bucket shape does not weigh on it) over `--windows` windows of `--steps`
steps, after a first window that compiles. The ratio column is each backend's step
over TensorFlow's with the same loss.

`--profile` adds, per backend, where one step's time goes, from the backend's own
profiler: JAX's XLA operations (`jax.profiler`) and torch's ATen operators
(`torch.profiler`), grouped into matrix products, element-wise and reduction work,
layout changes, and the optimizer; TensorFlow's XLA program has no profiler that runs
without TensorBoard's plugin here, so its step is the reference the others are
compared with.

    TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/cpu_step.py
    TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/cpu_step.py --losses fused --profile
    python benchmarks/cpu_step.py --quick    # a smoke run, figures meaningless
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import collections
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from serving import git_commit

BACKENDS = ("tensorflow", "jax", "torch")
DATA_DIR = common.multi30k_dir()
RECIPE_MODEL = dict(d_model=128, num_layers=4, num_heads=4, d_ff=512, dropout_rate=0.2)
BATCHING = dict(max_sentence_length=64, tokens_per_batch=2048, bucket_width=4)
CHUNK = 1024  # positions per chunk of the chunked loss


def build_parser():
    """The script's command-line options (and a child process's own)."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated (default: all three)")
    parser.add_argument("--losses", default="fused,reference",
                        help="comma-separated of fused, reference (the log-softmax form) "
                             f"and chunked (the projection and loss {CHUNK} positions at a "
                             "time)")
    parser.add_argument("--steps", type=int, default=50, help="steps per timed window")
    parser.add_argument("--windows", type=int, default=3, help="timed windows per process")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--data-dir", default=DATA_DIR,
                        help="Multi30k's files (default: %(default)s; without them, the "
                             "synthetic task)")
    parser.add_argument("--feed", default="pipeline", choices=("pipeline", "memory"),
                        help="pipeline: the recipe's tf.data pipeline, as model.fit gets it; "
                             "memory: the same batches drawn beforehand into NumPy arrays and "
                             "fed from a Python generator, which takes the input pipeline "
                             "out of the step")
    parser.add_argument("--profile", action="store_true",
                        help="also show where a JAX and a torch step go, op by op")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model and few steps (figures meaningless)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    parser.add_argument("--child", help=argparse_suppress())
    return parser


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


def prepare(args, folder):
    """The de→en training pairs and their two tokenizers, saved in `folder` for the
    children (learned once, in this process)."""
    from keras_transformer import saving
    from keras_transformer.data.corpora import load_multi30k, synthetic_translation
    from keras_transformer.tokenizers import SubwordTokenizer

    if os.path.isdir(args.data_dir):
        train = load_multi30k(args.data_dir, "de-en")["train"]
    else:
        common.progress(f"cpu_step: no Multi30k at {args.data_dir} (run the Multi30k recipe "
                        "once, or give --data-dir): measuring the synthetic task instead")
        train = synthetic_translation(30000, seed=0)
    if args.quick:
        train = train._replace(sources=train.sources[:3000], targets=train.targets[:3000])
    size = 1000 if args.quick else 8000
    tokenizers = [SubwordTokenizer.train(texts, size) for texts in (train.sources,
                                                                     train.targets)]
    saving.save_tokenizers(folder, *tokenizers)
    with open(os.path.join(folder, "pairs.json"), "w", encoding="utf-8") as file:
        json.dump([train.sources, train.targets], file)


def child(args):
    """One (backend, loss): the recipe's model trained on the recipe's batches."""
    import keras

    import keras_transformer as kt
    from keras_transformer import saving
    from keras_transformer.data.pipeline import make_dataset
    from keras_transformer.training.compile import compile_model

    folder, loss = args.child.split(",")
    with open(os.path.join(folder, "pairs.json"), encoding="utf-8") as file:
        sources, targets = json.load(file)
    source_tokenizer, target_tokenizer = saving.load_tokenizers(folder)
    keras.utils.set_random_seed(0)
    dataset, _ = make_dataset(sources, targets, source_tokenizer, target_tokenizer,
                              repeat=True, verbose=False, **BATCHING)
    if args.feed == "memory":
        dataset = _in_memory(dataset, args.steps * (args.windows + 1))
    sizes = dict(d_model=32, num_layers=1, num_heads=2, d_ff=64) if args.quick else {}
    config = kt.TransformerConfig.small(
        vocab_size=source_tokenizer.vocab_size, target_vocab_size=target_tokenizer.vocab_size,
        share_embeddings=False, **dict(RECIPE_MODEL, **sizes))
    model = kt.Transformer(config)
    compile_model(model, config, fused_loss=loss == "fused",
                  loss_chunk_size=CHUNK if loss == "chunked" else None)
    windows = _timed_windows(model, dataset, args.steps, args.windows)
    result = {"backend": keras.backend.backend(), "loss": loss, "feed": args.feed,
              "jit_compile": model.jit_compile,
              "window_ms_per_step": windows, "ms_per_step": statistics.median(windows)}
    if args.profile:
        result["profile"] = _profile(model, dataset, max(2, args.steps // 5))
    common.emit(result)


def _in_memory(dataset, count):
    """An endless generator over the first `count` batches of `dataset`, drawn now as
    NumPy arrays."""
    import itertools

    batches = list(itertools.islice(dataset.as_numpy_iterator(), count))

    def cycle():
        while True:
            yield from batches

    return cycle()


def _timed_windows(model, dataset, steps, windows):
    """The median ms per step of each window of `steps` after the first, from the
    time between consecutive steps (so that a step that compiles a new bucket shape
    counts once, not in a window's mean)."""
    import keras

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            stamps.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            if epoch:
                window = stamps[-steps - 1:]
                medians.append(statistics.median(
                    (b - a) * 1e3 for a, b in zip(window, window[1:])))
                common.progress(f"  window {epoch}/{windows}: {medians[-1]:.0f} ms/step")

    stamps, medians = [], []
    model.fit(dataset, steps_per_epoch=steps, epochs=windows + 1, verbose=0, shuffle=False,
              callbacks=[Clock()])
    return medians


def _profile(model, dataset, steps):
    """{group: ms per step} of the backend's profiler over `steps` fit steps."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "experiments"))
        from profile_step import xla_operations

        with tempfile.TemporaryDirectory() as trace_dir:
            jax.profiler.start_trace(trace_dir)
            model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
            jax.profiler.stop_trace()
            totals, _ = xla_operations(trace_dir)
        return _grouped({name: us / 1e3 / steps for name, us in totals.items()})
    if backend == "torch":
        import torch

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
        return _grouped({event.key: event.self_cpu_time_total / 1e3 / steps
                         for event in prof.key_averages()})
    return None


# Operation names, XLA's and ATen's, by group.
GROUPS = (("matmul", ("dot", "ynn_fusion", "xnn_fusion", "onednn", "aten::mm", "aten::addmm",
                      "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")),
          ("attention", ("aten::_scaled_dot_product", "aten::scaled_dot_product")),
          ("optimizer", ("aten::_foreach", "adam", "Adam")),
          ("layout", ("copy", "transpose", "aten::copy_", "aten::contiguous", "aten::clone",
                      "aten::t", "aten::permute", "aten::transpose", "aten::reshape",
                      "aten::view")))


def _grouped(per_op):
    groups = collections.Counter()
    for name, ms in per_op.items():
        group = next((label for label, prefixes in GROUPS
                      if name.startswith(prefixes) or any(p in name for p in prefixes[:1])),
                     "element-wise and other")
        groups[group] += ms
    top = sorted(per_op.items(), key=lambda item: -item[1])[:12]
    return {"groups_ms": dict(groups), "top_ms": dict(top)}


def run_child(args, folder, backend, loss):
    command = [sys.executable, os.path.abspath(__file__), "--child", f"{folder},{loss}",
               "--steps", str(args.steps), "--windows", str(args.windows)]
    command += ["--profile"] * args.profile + ["--quick"] * args.quick + ["--feed", args.feed]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    common.progress(f"{backend}, {loss} loss:")
    process = subprocess.run(command, env=env, cwd=common.REPOSITORY, text=True,
                             stdout=subprocess.PIPE)
    lines = process.stdout.strip().splitlines()
    for line in lines[:-1]:
        common.progress(line)
    if process.returncode or not lines or not lines[-1].startswith("{"):
        raise SystemExit(f"error: the {backend} process failed (status {process.returncode})")
    return json.loads(lines[-1])


def rounds_of_windows(rounds, windows, steps):
    """"the median of 3 windows of 40 steps", of each round's medians when more than one."""
    of_windows = f"the median of {windows} windows of {steps} steps"
    return of_windows if rounds == 1 else f"the median of {rounds} rounds, each {of_windows}"


def _run_label(run):
    """A run as a profile's row names it: its machine, its cap, the XLA_FLAGS it set."""
    import records

    cap, flags = run["machine"].get("isa_cap"), run["command"].startswith("XLA_FLAGS=")
    return (records._machine(run["machine"], False) + (f", capped at {cap}" if cap else "")
            + (f", `{run['command'].split()[0]}`" if flags else ""))


def table(runs):
    """The Markdown of runs' results (`--output`; benchmarks/tables.py's kind `cpu_step`),
    two columns each: the command, commit and machine (its `--max-isa` cap too) of each;
    per backend and loss, the ms per step (the median of the rounds, each the median of
    its windows) and the step over TensorFlow's with the same loss in the same run."""
    import records
    import run_all

    described, columns = [], []
    figures = {}  # (backend, loss) -> {run's index: (ms, × TensorFlow)}
    for index, run in enumerate(runs):
        made, first = run["machine"], run["rows"][0]
        machine, cap = records._machine(made, False), made.get("isa_cap")
        described.append(
            f"- `{run['command']}` at commit `{run['commit']}`, on {made['usable_cores']} "
            f"cores of {machine}" + (f", every engine capped at {cap}" if cap else "") + "; "
            + rounds_of_windows(len(first["rounds"]), len(first["windows"][0]), run["steps"]))
        columns += [f"{_run_label(run)}, ms per step", "× TensorFlow"]
        reference = {row["loss"]: row["ms_per_step"] for row in run["rows"]
                     if row["backend"] == "tensorflow"}
        for row in run["rows"]:
            base = reference.get(row["loss"])
            figures.setdefault((row["backend"], row["loss"]), {})[index] = (
                f"{row['ms_per_step']:,.0f}", f"{row['ms_per_step'] / base:.2f}" if base else "–")
    rows = [(records.BACKEND_NAMES[backend], loss,
             *(value for index in range(len(runs)) for value in by_run.get(index, ("–", "–"))))
            for (backend, loss), by_run in figures.items()]
    lines = [*described, "", run_all.table(("backend", "loss", *columns), rows)]
    profiled = [(run, name, profile) for run in runs
                for name, profile in (run.get("profiles") or {}).items()]
    if profiled:
        groups = ("matmul", "attention", "layout", "optimizer", "element-wise and other")
        lines += ["", "Where a step goes, from each backend's profiler (its overhead included), "
                  "ms per step:", "",
                  run_all.table(("run", "backend, loss", "matrix products", "attention",
                                 "layout copies", "optimizer", "element-wise and other",
                                 "largest single entries"),
                                [(_run_label(run),
                                  "{}, {}".format(records.BACKEND_NAMES[name.split()[0]],
                                                  name.split(maxsplit=1)[1]),
                                  *(f"{profile['groups_ms'].get(group, 0.0):,.0f}"
                                    for group in groups),
                                  ", ".join(f"`{op[:40]}` {ms:,.0f}" for op, ms in sorted(
                                      profile["top_ms"].items(), key=lambda item: -item[1])[:3]))
                                 for run, name, profile in profiled])]
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.quick:
        args.steps, args.windows, args.rounds = 3, 1, 1
    if args.child:
        return child(args)
    backends = [b for b in args.backends.split(",") if b]
    losses = [loss for loss in args.losses.split(",") if loss]
    runs, windows = collections.defaultdict(list), collections.defaultdict(list)
    profiles = {}
    with tempfile.TemporaryDirectory(prefix="cpu-step-") as folder:
        prepare(args, folder)
        for _ in range(args.rounds):
            for backend in backends:
                for loss in losses:
                    result = run_child(args, folder, backend, loss)
                    runs[backend, loss].append(result["ms_per_step"])
                    windows[backend, loss].append(result["window_ms_per_step"])
                    if result.get("profile"):
                        profiles[f"{backend} {loss}"] = result["profile"]
    rows = [{"backend": backend, "loss": loss, "rounds": times, "windows": windows[backend, loss],
             "ms_per_step": statistics.median(times)} for (backend, loss), times in runs.items()]
    command = common.command_line("cpu_step.py", argv)
    if os.environ.get("XLA_FLAGS"):  # what the processes' XLA ran with (YNNPACK off, say)
        command = f"XLA_FLAGS={shlex.quote(os.environ['XLA_FLAGS'])} {command}"
    results = {"commit": git_commit(), "command": command,
               "machine": common.machine(), "steps": args.steps, "quick": args.quick,
               "rows": rows, "profiles": profiles}
    print()
    print(table([results]))
    for name, profile in profiles.items():
        print(f"\n{name}: " + ", ".join(f"{group} {ms:.0f} ms" for group, ms in sorted(
            profile["groups_ms"].items(), key=lambda item: -item[1])))
        for op, ms in profile["top_ms"].items():
            print(f"    {ms:8.1f} ms  {op}")
    common.write_results(results, args.output)


if __name__ == "__main__":
    common.run_script(main)
