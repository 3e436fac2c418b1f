"""Training on a GPU with `model.fit` in mixed precision (§5.2 Hardware and
Schedule): tokens/s, model FLOPs utilization (MFU), peak GPU memory, the loss
over the run, and which attention kernel ran; against torch.nn.Transformer in
plain PyTorch on the same batches.

Trains `TransformerConfig.base` (N=6, d_model 512, 8 heads, d_ff 2048, shared
vocabulary of 37000; `--config big` for the big model) with `model.fit`,
`paper_adam` and label smoothing 0.1, on batches of about 25,000 source and
25,000 target tokens as in the paper (`--tokens-per-batch`, `--length`). The
data is synthetic and learnable: a copy task whose ids follow a Zipf law over
the vocabulary, as subword ids do, so the loss must fall from about
ln(37000) = 10.5 within the run; `--id-frequencies` draws them from the unigram
counts of a real tokenized corpus instead (`id_frequencies.py`). The last row
of every batch is all padding, source and target, as a batch filled up to a
fixed size would be: the masks' fully padded rows are exercised in every step.

`fit` runs `--steps` optimizer steps in windows of `--window` steps (Keras
epochs); the end of a window reads the loss back, which waits for the device.
Reported: the median window's target tokens/s (padding excluded) after the
first window (which compiles), the time of the first window, TFLOP/s with the
FLOP formula of `common.py` (matmuls only, 3 × forward, over the batch's whole
shape) and MFU against `--peak-tflops` (the chip's dense peak for the precision
you run: 989 for bf16/fp16 on an H100 or H200 SXM, from NVIDIA's datasheet),
the backend allocator's peak GPU memory, each window's mean loss, and the steps
that loss scaling skipped (mixed_float16).

`--peers eager,compile` then trains `torch.nn.Transformer` on the same batches
with the same ids, loss and optimizer (`gpu_peer.py`), each mode in its own
process, and gives ours / peer from the one invocation. `--check-attention`
and `--profile STEPS` say which kernel ran eq. (1) and where the time of a few
steps goes (`gpu_profile.py`).

Without a GPU visible to the backend it prints why and exits with status 0 and a
JSON line marked "skipped" (`--allow-cpu` runs it anyway, to check the script).

    KERAS_BACKEND=jax python benchmarks/gpu.py --peak-tflops 989 --peers eager,compile
    KERAS_BACKEND=torch python benchmarks/gpu.py --precision mixed_float16 --peak-tflops 989
    KERAS_BACKEND=jax python benchmarks/gpu.py --config big --peak-tflops 989 --peers compile
    KERAS_BACKEND=jax python benchmarks/gpu.py --steps 40 --window 20 --profile 5
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from gpu_profile import attention_kernels, profile_steps


def gpu_devices(backend):
    """Names of the GPUs the backend sees (empty when none)."""
    if backend == "jax":
        import jax

        return [str(d) for d in jax.devices() if d.platform in ("gpu", "cuda", "rocm")]
    if backend == "tensorflow":
        import tensorflow as tf

        return [d.name for d in tf.config.list_physical_devices("GPU")]
    import torch

    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def peak_memory_mb(backend):
    """Peak GPU memory of this process from the backend's allocator, MiB (or None)."""
    try:
        if backend == "jax":
            import jax

            return jax.devices()[0].memory_stats()["peak_bytes_in_use"] / 2**20
        if backend == "tensorflow":
            import tensorflow as tf

            return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
        import torch

        return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    except (AttributeError, KeyError, RuntimeError, ValueError, TypeError):
        # CPU runs (--allow-cpu) and allocators without statistics
        return None


def copy_batches(num_batches, batch_size, length, vocab_size, seed=0, frequencies=None):
    """`({"source", "target"}, labels)` int32 arrays of `num_batches` batches of a
    copy task: labels = source, target = BOS + labels[:-1]. The ids lie above
    the special ones and follow a Zipf law (exponent 1.1), as subword ids do,
    or with `frequencies` (a count per id, `vocab_size` of them) the unigram
    distribution of a real tokenized corpus. The last row of each batch is all
    padding."""
    rng = np.random.default_rng(seed)
    rows, first = num_batches * batch_size, 4  # above pad, unknown, begin and end
    if frequencies is None:
        ids = first + (rng.zipf(1.1, size=(rows, length)) - 1) % (vocab_size - first)
    else:
        weights = np.asarray(frequencies, "float64")[first:]
        ids = first + rng.choice(len(weights), size=(rows, length), p=weights / weights.sum())
    source = ids.astype("int32")
    source[batch_size - 1::batch_size] = common.PAD_ID
    labels = source.copy()
    target = np.concatenate([np.full((rows, 1), common.BOS_ID, "int32"), labels[:, :-1]], axis=1)
    target[batch_size - 1::batch_size] = common.PAD_ID
    return {"source": source, "target": target}, labels


def window_timer(steps_per_window, tokens_per_step, total_windows):
    """A Keras callback that times each window (epoch) and keeps its mean loss;
    reading the loss at the window's end waits for the device."""
    import keras

    class _WindowTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self.losses, self._start = [], [], None

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            loss = float(logs["loss"])  # waits for the window's last step
            seconds = time.perf_counter() - self._start
            self.seconds.append(seconds)
            self.losses.append(loss)
            common.progress(f"  window {epoch + 1}/{total_windows}: "
                            f"steps {epoch * steps_per_window + 1}-"
                            f"{(epoch + 1) * steps_per_window}, {seconds:.2f} s, "
                            f"{tokens_per_step * steps_per_window / seconds:,.0f} target tokens/s, "
                            f"loss {loss:.4f}")

    return _WindowTimer()


def add_run_options(parser, steps=300, window=25):
    """The options of the model and its batches, which gpu_peer.py shares."""
    parser.add_argument("--config", choices=("base", "big"), default="base")
    parser.add_argument("--precision", choices=("mixed_bfloat16", "mixed_float16", "float32"),
                        default="mixed_bfloat16", help="Keras dtype policy")
    parser.add_argument("--tokens-per-batch", type=int, default=25000,
                        help="source (and target) positions per batch, as in §5.1")
    parser.add_argument("--length", type=int, default=64,
                        help="S = T, positions per sentence; the batch holds "
                             "tokens-per-batch // length sentences")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--id-frequencies", metavar="NPY",
                        help="draw the ids from these counts per id (a .npy that "
                             "benchmarks/id_frequencies.py writes from a real corpus) instead "
                             "of a Zipf law; the vocabulary is then their length")
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps in all")
    parser.add_argument("--window", type=int, default=window,
                        help="steps per timed window; the first compiles")
    parser.add_argument("--dropout", type=float, default=None,
                        help="override the config's dropout rate (0.1 base, 0.3 big)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense peak TFLOP/s for this precision; gives MFU")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and a few steps, to check that the script runs")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU, only to check the script (figures meaningless)")


def check_run_options(parser, args):
    """Checks the options of `add_run_options` (tiny sizes with --quick) and
    returns the id counts of --id-frequencies, or None."""
    if args.quick:
        args.tokens_per_batch, args.length, args.vocab_size = 64, 8, 200
        args.steps, args.window = 6, 2
    if args.length < 2 or args.tokens_per_batch < 2 * args.length:
        parser.error("--length must be >= 2 and --tokens-per-batch at least two sentences")
    if min(args.steps, args.window) < 1 or args.steps % args.window:
        parser.error("--steps and --window must be positive, --steps a multiple of --window")
    if args.steps // args.window < 2:
        parser.error("--steps must give at least two windows: the first one compiles")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        parser.error("--peak-tflops must be positive")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        parser.error("--dropout must be in [0, 1)")
    if not args.id_frequencies:
        return None
    frequencies = np.load(args.id_frequencies)
    args.vocab_size = len(frequencies)
    return frequencies


def run_config(args):
    """The `TransformerConfig` that the options name (`tiny` with --quick)."""
    from keras_transformer.config import TransformerConfig

    overrides = {} if args.dropout is None else {"dropout_rate": args.dropout}
    if args.quick:
        return TransformerConfig.tiny(args.vocab_size, **overrides)
    preset = TransformerConfig.big if args.config == "big" else TransformerConfig.base
    return preset(args.vocab_size, max_length=max(256, args.length), **overrides)


def training_batches(args, config, frequencies):
    """(batch size, inputs, labels, target tokens per step) of the copy-task
    batches that the options name: `--window` batches, which every window
    goes through in turn."""
    batch_size = args.tokens_per_batch // args.length
    inputs, labels = copy_batches(args.window, batch_size, args.length, config.vocab_size,
                                  frequencies=frequencies)
    target_tokens = int(np.count_nonzero(labels != config.pad_id)) // args.window  # per step
    return batch_size, inputs, labels, target_tokens


def window_figures(args, config, batch_size, target_tokens, seconds, losses):
    """The figures of the timed windows (`seconds` and mean `losses` of each)
    that gpu.py and gpu_peer.py both report: the median step after the first
    window, which compiles; tokens/s, TFLOP/s and MFU; the loss of each window."""
    step_time = common.median(seconds[1:]) / args.window
    flops = common.training_flops(batch_size, args.length, args.length, config)
    achieved = flops / step_time / 1e12
    finite = all(math.isfinite(loss) for loss in losses)
    return {
        "median_step_s": step_time, "first_window_s": seconds[0],
        "tokens_per_s": target_tokens / step_time, "achieved_tflops": achieved,
        "peak_tflops": args.peak_tflops,
        "mfu": achieved / args.peak_tflops if args.peak_tflops else None,
        "window_losses": losses, "loss_finite": finite,
        "loss_decreased": finite and losses[-1] < losses[0],
    }


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    add_run_options(parser)
    parser.add_argument("--peers", default="", metavar="MODES",
                        help="after our run, train torch.nn.Transformer on the same batches in "
                             "plain PyTorch (benchmarks/gpu_peer.py), each of these comma-"
                             "separated modes in its own process: eager, compile")
    parser.add_argument("--steps-per-execution", type=int, default=1,
                        help="Keras's compile(steps_per_execution=...): steps per device call")
    parser.add_argument("--flash-attention", choices=("auto", "on", "off"), default="auto",
                        help="keras.config.enable/disable_flash_attention (auto: Keras decides)")
    parser.add_argument("--check-attention", action="store_true",
                        help="also report which kernel ran the attention (see above)")
    parser.add_argument("--loss", choices=("fused", "reference"), default="reference",
                        help="the label-smoothed loss fused (one pass over the logits, a "
                             "hand-written gradient) or in its log-softmax form")
    parser.add_argument("--jit-compile", choices=("auto", "on", "off"), default="auto",
                        help="Keras's compile(jit_compile=...): under torch, on compiles the "
                             "train step with torch.compile (auto: Keras's choice, eager)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after fit, profile STEPS train_on_batch steps (see profile_steps)")
    return parser


def parse_args(argv=None):
    """The options, checked (tiny sizes with --quick): (args, the id counts of
    --id-frequencies or None, the peer modes)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    frequencies = check_run_options(parser, args)
    if args.profile < 0:
        parser.error("--profile must be >= 0")
    if args.steps_per_execution < 1 or args.window % args.steps_per_execution:
        parser.error("--steps-per-execution must be positive and divide --window")
    peers = [mode for mode in args.peers.split(",") if mode]
    if set(peers) - set(PEER_MODES):
        parser.error(f"--peers takes {', '.join(PEER_MODES)}, got {args.peers!r}")
    return args, frequencies, peers


def skip_without_gpu(backend):
    """Says why there is nothing to measure, on stderr and in the JSON line."""
    message = (f"No GPU visible to the {backend} backend: gpu.py measures GPU training and "
               "has nothing to do here. Install the backend's CUDA build (see README) and "
               "check that the GPU is visible (nvidia-smi).")
    print(message, file=sys.stderr)
    common.emit({"benchmark": "gpu", "backend": backend, "skipped": True, "reason": message})


def fit(args, config, inputs, labels, batch_size, target_tokens):
    """Trains our model with `model.fit`, timing each window; returns
    (model, the window timer, seconds of the whole fit)."""
    import keras_transformer as kt

    model = kt.Transformer(config)
    jit_compile = {"auto": "auto", "on": True, "off": False}[args.jit_compile]
    model.compile(optimizer=kt.paper_adam(config.d_model, config.warmup_steps),
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id,
                                                    fused=args.loss == "fused"),
                  steps_per_execution=args.steps_per_execution, jit_compile=jit_compile)
    windows = args.steps // args.window
    timer = window_timer(args.window, target_tokens, windows)
    start = time.perf_counter()
    model.fit(inputs, labels, batch_size=batch_size, epochs=windows, shuffle=False,
              verbose=0, callbacks=[timer])
    return model, timer, time.perf_counter() - start


def report_fit(result):
    """Prints the figures of our run."""
    common.progress(f"gpu: {result['tokens_per_s']:,.0f} target tokens/s, "
                    f"{result['median_step_s'] * 1e3:.1f} ms/step, "
                    f"{result['achieved_tflops']:.1f} TFLOP/s "
                    f"({common.FLOP_FORMULA}); first window {result['first_window_s']:.1f} s")
    mfu = result["mfu"]
    common.progress("gpu: MFU " + (f"{mfu:.1%}" if mfu is not None else
                                   "not computed: pass --peak-tflops"))
    losses = result["window_losses"]
    common.progress(f"gpu: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
                    f"peak GPU memory {result['peak_gpu_memory_mb'] or float('nan'):,.0f} MiB")


def inspect_steps(args, backend, model, sample, result):
    """With --check-attention and --profile, adds which kernel ran the
    attention and where the time of a few steps goes to `result`, printed."""
    if args.check_attention:
        result["attention"] = attention_kernels(backend, model, *sample)
        common.progress(f"gpu: attention kernels ({result['attention']['method']}): "
                        f"{result['attention']['fused_calls'] or 'no fused kernel'}")
    if args.profile:
        result["profile"] = profile_steps(backend, model, *sample, args.profile)
        for name, timeline in result["profile"].get("timelines", {}).items():
            common.progress(f"gpu: profile of {args.profile} steps "
                            f"({result['profile']['wall_ms']:.1f} ms wall), {name}: "
                            f"{timeline['events']} events, {timeline['busy_ms']:.1f} ms busy; "
                            + ", ".join(f"{n} x{c} {ms:.2f} ms"
                                        for n, c, ms in timeline["top"][:5]))


def compare_with_peers(args, peers, backend, result):
    """Runs the peers (once our model is deleted) and adds their results and
    ours / theirs to `result`, printed."""
    if backend == "torch":
        import torch

        torch.cuda.empty_cache()
    result["peers"] = run_peers(args, peers)
    for mode, peer in result["peers"].items():
        if peer.get("tokens_per_s"):
            peer["ours_over_peer"] = result["tokens_per_s"] / peer["tokens_per_s"]
            common.progress(f"gpu: ours / torch.nn.Transformer ({mode}) = "
                            f"{peer['ours_over_peer']:.3f}")


def main(argv=None):
    args, frequencies, peers = parse_args(argv)
    if peers:
        # Our process keeps only the GPU memory it uses, so that the peers'
        # processes, which run after it, have the rest.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    import keras

    backend = keras.backend.backend()
    devices = gpu_devices(backend)
    if not devices and not args.allow_cpu:
        skip_without_gpu(backend)
        return
    if args.flash_attention != "auto":
        (keras.config.enable_flash_attention if args.flash_attention == "on"
         else keras.config.disable_flash_attention)()
    keras.config.set_dtype_policy(args.precision)

    config = run_config(args)
    if args.quick:
        args.config = "tiny (quick)"
    batch_size, inputs, labels, target_tokens = training_batches(args, config, frequencies)
    common.progress(f"gpu: backend {backend}, devices {devices or ['CPU (--allow-cpu)']}, "
                    f"{args.config} config (N={config.num_layers}, d_model {config.d_model}, "
                    f"h={config.num_heads}, d_ff {config.d_ff}, dropout {config.dropout_rate}), "
                    f"{args.precision}, batches of {batch_size} x {args.length} positions "
                    f"({target_tokens} target tokens), {args.steps} steps of model.fit")
    model, timer, fit_seconds = fit(args, config, inputs, labels, batch_size, target_tokens)
    # Under mixed_float16 a step whose gradient overflowed is skipped by the
    # loss scaling; the inner optimizer counts only the steps it applied.
    applied = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    result = {
        "benchmark": "gpu", "backend": backend, "devices": devices, "config": args.config,
        "precision": args.precision, "batch_size": batch_size, "length": args.length,
        "target_tokens_per_step": target_tokens, "steps": args.steps, "window": args.window,
        "dropout_rate": config.dropout_rate, "vocab_size": config.vocab_size,
        "steps_per_execution": args.steps_per_execution, "params": model.count_params(),
        "fit_s": fit_seconds, "flop_formula": common.FLOP_FORMULA,
        "peak_gpu_memory_mb": peak_memory_mb(backend), "jit_compile": model.jit_compile,
        "flash_attention": keras.config.is_flash_attention_enabled(),
        "optimizer": type(model.optimizer).__name__,
        "skipped_steps": args.steps - applied, "ids": args.id_frequencies or "zipf 1.1",
        "quick": args.quick, "skipped": False,
        **window_figures(args, config, batch_size, target_tokens, timer.seconds, timer.losses),
    }
    report_fit(result)
    sample = ({key: value[:batch_size] for key, value in inputs.items()}, labels[:batch_size])
    inspect_steps(args, backend, model, sample, result)
    if peers:
        del model
        compare_with_peers(args, peers, backend, result)
    common.emit(result)
    if not result["loss_finite"]:
        sys.exit("error: the loss became NaN or infinite")


PEER_MODES = ("eager", "compile")


def run_peers(args, modes):
    """Runs benchmarks/gpu_peer.py once per mode, in its own process, with our
    batch shape, ids, steps and precision; returns {mode: its JSON result}."""
    import json
    import subprocess

    shared = ["--config", args.config if args.config in ("base", "big") else "base",
              "--precision", args.precision, "--tokens-per-batch", str(args.tokens_per_batch),
              "--length", str(args.length), "--vocab-size", str(args.vocab_size),
              "--steps", str(args.steps), "--window", str(args.window)]
    for flag, value in (("--dropout", args.dropout), ("--id-frequencies", args.id_frequencies),
                        ("--peak-tflops", args.peak_tflops)):
        if value is not None:
            shared += [flag, str(value)]
    shared += ["--quick"] * args.quick + ["--allow-cpu"] * args.allow_cpu
    results = {}
    for mode in modes:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_peer.py")
        common.progress(f"gpu: peer torch.nn.Transformer, {mode}")
        finished = subprocess.run([sys.executable, script, "--mode", mode, *shared],
                                  stdout=subprocess.PIPE, text=True)
        lines = finished.stdout.strip().splitlines()
        try:
            results[mode] = json.loads(lines[-1])
        except (IndexError, ValueError):
            results[mode] = {"error": f"exit status {finished.returncode}, no result line"}
    return results


if __name__ == "__main__":
    common.run_script(main)
