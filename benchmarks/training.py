"""Training throughput (§5: one optimizer step of the §3 model) of our
`Transformer` against the same model built from keras-hub layers and, on the
torch backend, against native `torch.nn.Transformer`.

Every model has the same sizes (N encoder + N decoder blocks, post-norm, shared
embedding tied to the output projection, sinusoidal positions, P_drop = 0.1)
and trains on the same random batch (B × S source and B × T target ids, no
padding) with Adam(0.9, 0.98, 1e-9), the §5.3 schedule and label smoothing
ε_ls = 0.1. The Keras models (ours and keras-hub's) both run a
`model.train_on_batch` loop with `compile(jit_compile="auto")` and no metrics.
For keras-hub's model that is Keras's default: XLA under JAX, a tf.function
graph without XLA on a TensorFlow CPU, eager on torch. Our `Transformer.compile`
resolves "auto" the same way except that it also picks XLA for TensorFlow on a
CPU, where it measured faster; `--jit-compile true|false` forces one choice on
both. The table reports each model's resolved `jit_compile`; `train_on_batch`
returns the loss as a NumPy value, so each timed step includes waiting for the
device. The torch model runs eagerly with `torch.optim.Adam` and
`F.cross_entropy(..., label_smoothing=0.1)`, with the same
`torch.set_num_threads` as the Keras torch backend.

Each model trains in its own subprocess, so that its peak memory (peak RSS of
the process, `resource.getrusage(...).ru_maxrss`, framework included) is its
own. Reported: target tokens/s (B·T / median step time after the warm-up
steps), the median step time, the first step (compilation included), peak RSS,
and achieved GFLOP/s with the formula of `common.py`:

    train FLOPs/step = 3 × forward
    forward = B·N·[S·(8d² + 4df) + 4S²d]                         (encoder)
            + B·N·[T·(12d² + 4df) + 4Sd² + 4T²d + 4TSd]          (decoder)
            + 2·B·T·d·V                                         (output projection)

    KERAS_BACKEND=jax python benchmarks/training.py                  # default size
    KERAS_BACKEND=torch python benchmarks/training.py --config large # + torch.nn.Transformer
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
import peers

MODELS = ("ours", "keras_hub", "torch")


def build_ours(config):
    import keras_transformer as kt

    return kt.Transformer(config)


def keras_step(model, config, jit_compile, batch):
    import keras

    import keras_transformer as kt

    model.compile(optimizer=kt.paper_adam(config.d_model, config.warmup_steps),
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id),
                  jit_compile=jit_compile)
    # Backend tensors made once, as the torch model's are: no conversion inside the step.
    source, target, labels = (keras.ops.convert_to_tensor(array) for array in batch)
    inputs = {"source": source, "target": target}
    return lambda: float(model.train_on_batch(inputs, labels))


def measure(args):
    """Trains one model in this process and returns its figures."""
    config = common.transformer_config(args.config)
    uses_torch = args.model == "torch" or common.backend_name() == "torch"
    if uses_torch:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
    batch = common.random_batch(args.batch_size, args.length, args.length, config.vocab_size)
    if args.model == "torch":
        model, step = peers.torch_model_and_step(config, batch)
        params = sum(p.numel() for p in model.parameters())
    else:
        model = build_ours(config) if args.model == "ours" else peers.build_keras_hub(config)
        params = model.count_params()
        jit_compile = {"auto": "auto", "true": True, "false": False}[args.jit_compile]
        step = keras_step(model, config, jit_compile, batch)
    rss_before = common.current_rss_mb()
    first, step_time = common.time_steps(step, args.warmup, args.steps, f"{args.model} ")
    flops = common.training_flops(args.batch_size, args.length, args.length, config)
    return {
        "params": int(params), "median_step_s": step_time, "first_step_s": first,
        "tokens_per_s": args.batch_size * args.length / step_time,
        "gflops": flops / step_time / 1e9, "flops_per_step": flops,
        "peak_rss_mb": common.peak_rss_mb(), "rss_before_training_mb": rss_before,
        "jit_compile": None if args.model == "torch" else model.jit_compile,
        "torch_threads": torch.get_num_threads() if uses_torch else None,
    }


def run_in_subprocess(args, model):
    command = [sys.executable, os.path.abspath(__file__), "--in-process", "--model", model,
               "--config", args.config, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch-size", str(args.batch_size), "--length", str(args.length),
               "--jit-compile", args.jit_compile, "--threads", str(args.threads)]
    # Stream the child's progress; its last stdout line is its JSON result.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if not line.startswith("{"):
            sys.stdout.write(line)
            sys.stdout.flush()
    process.wait()
    if process.returncode or not lines or not lines[-1].startswith("{"):
        return {"error": f"{model} failed with exit status {process.returncode} (see above)"}
    return json.loads(lines[-1])


def build_parser():
    """The command-line options, with the hidden ones of a model's own subprocess."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--config", choices=tuple(common.SIZES), default="default",
                        help="default: d_model 256, 4 heads, d_ff 1024; large: 512, 8, 2048 "
                             "(both N=3, vocab 8000); quick: tiny, for checks only")
    parser.add_argument("--models", default=None,
                        help="comma-separated subset of ours,keras_hub,torch (default: ours,"
                             "keras_hub, plus torch on the torch backend)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (median)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps first, compilation included (at least 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="B, sentences per batch")
    parser.add_argument("--length", type=int, default=32, help="S = T, tokens per sentence")
    parser.add_argument("--jit-compile", choices=("auto", "true", "false"), default="auto",
                        help="compile(jit_compile=...) of both Keras models (auto: each "
                             "model's own default, see above)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads for torch and the Keras torch backend "
                             "(0: torch's default)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and 2 steps, to check that the script runs")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    return parser


def report(results):
    """Prints each model's figures and returns the ratios of our tokens/s to
    the other models'."""
    common.progress(f"training: FLOPs: {common.FLOP_FORMULA}")
    common.progress("training: memory = peak RSS of each model's own process (ru_maxrss)")
    for model, r in results.items():
        if "error" in r:
            common.progress(f"  {model:<10} {r['error']}")
            continue
        common.progress(f"  {model:<10} {r['params']:>11,} params  {r['tokens_per_s']:9.0f} "
                        f"tokens/s  {r['median_step_s'] * 1e3:8.1f} ms/step  "
                        f"{r['gflops']:7.1f} GFLOP/s  peak RSS {r['peak_rss_mb']:6.0f} MiB "
                        f"(+{r['peak_rss_mb'] - r['rss_before_training_mb']:.0f} in training)")
    ratios = {}
    for peer in ("keras_hub", "torch"):
        if "tokens_per_s" in results.get("ours", {}) and "tokens_per_s" in results.get(peer, {}):
            ratios[f"ours/{peer}"] = (results["ours"]["tokens_per_s"]
                                      / results[peer]["tokens_per_s"])
            common.progress(f"  tokens/s ours / {peer}: {ratios[f'ours/{peer}']:.2f}x")
    return ratios


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.config, args.steps, args.warmup, args.batch_size, args.length = "quick", 2, 1, 4, 8
    if args.steps < 1 or args.warmup < 1 or args.batch_size < 1 or args.length < 2:
        parser.error("--steps, --warmup, --batch-size must be >= 1 and --length >= 2")

    if args.in_process:
        common.emit(measure(args))
        return
    backend = common.backend_name()
    models = (args.models.split(",") if args.models else
              ["ours", "keras_hub"] + (["torch"] if backend == "torch" else []))
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {','.join(MODELS)}")
    config = common.transformer_config(args.config)
    common.progress(f"training: backend {backend}, config {args.config} ({config.num_layers}+"
                    f"{config.num_layers} blocks, d_model {config.d_model}, "
                    f"{config.num_heads} heads, d_ff {config.d_ff}, vocab {config.vocab_size}), "
                    f"batch {args.batch_size} x {args.length} tokens")
    results = {}
    for model in models:
        common.progress(f"training: {model} ({args.warmup} warm-up + {args.steps} timed steps)")
        results[model] = run_in_subprocess(args, model)
    ratios = report(results)
    common.emit({
        "benchmark": "training", "backend": backend, "config": args.config,
        "sizes": common.SIZES[args.config], "batch_size": args.batch_size,
        "length": args.length, "steps": args.steps, "warmup": args.warmup,
        "loop": "model.train_on_batch (Keras models); eager torch loop (torch)",
        "jit_compile_argument": args.jit_compile, "flop_formula": common.FLOP_FORMULA,
        "memory": "peak RSS of each model's own process (resource.getrusage ru_maxrss)",
        "results": results, "ratios": ratios, "quick": args.quick,
    })


if __name__ == "__main__":
    common.run_script(main)
