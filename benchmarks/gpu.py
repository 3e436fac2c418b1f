"""Training on a GPU with `model.fit` in mixed precision (§5.2 Hardware and
Schedule): tokens/s, model FLOPs utilization (MFU), peak GPU memory, the loss
over the run, and which attention kernel ran.

Trains `TransformerConfig.base` (N=6, d_model 512, 8 heads, d_ff 2048, shared
vocabulary of 37000; `--config big` for the big model) with `model.fit`,
`paper_adam` and label smoothing 0.1, on batches of about 25,000 source and
25,000 target tokens as in the paper (`--tokens-per-batch`, `--length`). The
data is synthetic and learnable: a copy task whose ids follow a Zipf law over
the vocabulary, so the loss must fall from about ln(37000) = 10.5 within the
run. The last row of every batch is all padding, source and target, as a batch
filled up to a fixed size would be: the masks' fully padded rows are exercised
in every step (under mixed_float16 too).

`fit` runs `--steps` optimizer steps in windows of `--window` steps (Keras
epochs); the end of a window reads the loss back, which waits for the device.
Reported: the median window's target tokens/s (padding excluded) after the
first window (which compiles), the time of the first window, TFLOP/s with the
FLOP formula of `common.py` (matmuls only, 3 × forward, over the batch's whole
shape) and MFU against `--peak-tflops` (the chip's dense peak for the precision
you run: 989 for bf16/fp16 on an H100 or H200 SXM, from NVIDIA's datasheet),
the backend allocator's peak GPU memory, and each window's mean loss.

`--profile STEPS` profiles that many `train_on_batch` steps after the run and
reports the wall time and, per timeline of the profiler (JAX: each line of the
GPU's planes, such as "XLA Ops" and the streams; torch: the GPU kernels), the
number of events, their busy time and the costliest names.

`--check-attention` says which kernel eq. (1) ran on: under JAX it lowers the
gradient of the training loss and counts cuDNN fused-attention custom calls
(`__cudnn$fmha*`) in it; under torch it profiles one training step and lists
the attention kernels that ran on the GPU. Under TensorFlow it says that Keras
has no fused kernel for that backend.

Without a GPU visible to the backend it prints why and exits with status 0 and a
JSON line marked "skipped" (`--allow-cpu` runs it anyway, to check the script).

    KERAS_BACKEND=jax python benchmarks/gpu.py --peak-tflops 989 --check-attention
    KERAS_BACKEND=torch python benchmarks/gpu.py --precision mixed_float16 --peak-tflops 989
    KERAS_BACKEND=jax python benchmarks/gpu.py --config big --peak-tflops 989
    KERAS_BACKEND=jax python benchmarks/gpu.py --steps 50 --profile 5
"""

import argparse
import math
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

# cuDNN's fused attention in an XLA graph: a custom call named __cudnn$fmha...
JAX_FUSED_ATTENTION = re.compile(r"__cudnn\$fmha\w*")
# The names torch gives its fused attention kernels (flash, memory-efficient, cuDNN).
TORCH_ATTENTION_KERNEL = re.compile(r"flash|fmha|efficient_attention|cudnn.*attention|"
                                    r"attention.*cudnn|sdpa", re.IGNORECASE)


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


def copy_batches(num_batches, batch_size, length, vocab_size, seed=0):
    """`({"source", "target"}, labels)` int32 arrays of `num_batches` batches of a
    copy task: labels = source, target = BOS + labels[:-1]; ids above the special
    ones, Zipf-distributed (exponent 1.1) so that the loss falls quickly. The
    last row of each batch is all padding."""
    rng = np.random.default_rng(seed)
    rows, first = num_batches * batch_size, 4  # above pad, unknown, begin and end
    ids = first + (rng.zipf(1.1, size=(rows, length)) - 1) % (vocab_size - first)
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


def attention_kernels(backend, model, inputs, labels):
    """What ran eq. (1): a dict saying how it was checked and what was found."""
    if backend == "jax":
        import jax

        loss_fn = model.loss

        def training_loss(trainable, non_trainable, x, y):
            predictions, _ = model.stateless_call(trainable, non_trainable, x, training=True)
            return loss_fn(y, predictions)

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        lowered = jax.jit(jax.grad(training_loss)).lower(trainable, non_trainable, inputs, labels)
        calls = JAX_FUSED_ATTENTION.findall(lowered.as_text())
        counts = {name: calls.count(name) for name in sorted(set(calls))}
        return {"method": "custom calls in the lowered gradient of the training loss",
                "fused_calls": counts, "fused": bool(calls)}
    if backend == "torch":
        profiler, _ = _torch_profiled(model, inputs, labels, 1)
        names = {}
        for event in profiler.key_averages():
            if TORCH_ATTENTION_KERNEL.search(event.key):
                names[event.key[:120]] = event.count
        return {"method": "torch.profiler operators and kernels of one train_on_batch",
                "fused_calls": names, "fused": bool(names)}
    return {"method": "none", "fused": False,
            "fused_calls": {}, "note": "Keras's TensorFlow backend has no fused attention kernel"}


def _torch_profiled(model, inputs, labels, steps):
    """(torch.profiler, wall seconds) of `steps` calls of `train_on_batch`: the
    aten:: operators, and on a GPU the kernels they launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    start = time.perf_counter()
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            model.train_on_batch(inputs, labels)
        if gpu:
            torch.cuda.synchronize()
    return profiler, time.perf_counter() - start


def _timeline(events, most):
    """The summary of one timeline's (name, nanoseconds) events: their number,
    busy time, and [[name, calls, ms], ...] of the `most` names with the most time."""
    totals, counts = {}, {}
    for name, duration in events:
        totals[name] = totals.get(name, 0) + duration
        counts[name] = counts.get(name, 0) + 1
    ranked = sorted(totals, key=totals.get, reverse=True)[:most]
    return {"events": sum(counts.values()), "busy_ms": round(sum(totals.values()) / 1e6, 3),
            "top": [[name[:160], counts[name], round(totals[name] / 1e6, 3)]
                    for name in ranked]}


def profile_steps(backend, model, inputs, labels, steps, most=25):
    """Where `steps` calls of `train_on_batch` spend their time, from the backend's
    profiler: the wall time, and per timeline (JAX: each line of the device's
    planes, the host's where no device shows; torch: the GPU kernels, else the
    CPU operators) the events, their busy time and the `most` costliest names."""
    import tempfile

    model.train_on_batch(inputs, labels)  # compiled and warm before the trace
    if backend == "jax":
        import glob

        import jax
        from jax.profiler import ProfileData

        with tempfile.TemporaryDirectory(prefix="gpu-profile-") as directory:
            start = time.perf_counter()
            with jax.profiler.trace(directory):
                for _ in range(steps):
                    model.train_on_batch(inputs, labels)  # returns the loss on the host
            wall = time.perf_counter() - start
            path = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)[0]
            planes = list(ProfileData.from_file(path).planes)
        device = [p for p in planes if p.name.startswith("/device:")]
        timelines = {}
        for plane in device or [p for p in planes if p.name.startswith("/host:CPU")]:
            for line in plane.lines:
                timeline = _timeline(((e.name, e.duration_ns) for e in line.events), most)
                if timeline["events"]:
                    timelines[f"{plane.name} {line.name}"] = timeline
        return {"steps": steps, "wall_ms": round(wall * 1e3, 3), "tool": "jax.profiler",
                "device_planes": bool(device), "timelines": timelines}
    if backend == "torch":
        import torch

        gpu = torch.cuda.is_available()
        profiler, wall = _torch_profiled(model, inputs, labels, steps)
        events = ((event.name, (event.time_range.end - event.time_range.start) * 1000)  # ns
                  for event in profiler.events()
                  if str(event.device_type).endswith("CUDA") is gpu
                  and (gpu or event.cpu_parent is None))
        name = "GPU kernels" if gpu else "top-level CPU operators"
        return {"steps": steps, "wall_ms": round(wall * 1e3, 3), "tool": "torch.profiler",
                "device_planes": gpu, "timelines": {name: _timeline(events, most)}}
    return {"steps": steps, "tool": "none", "note": "profiling is implemented for JAX and torch"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=("base", "big"), default="base")
    parser.add_argument("--precision", choices=("mixed_bfloat16", "mixed_float16", "float32"),
                        default="mixed_bfloat16", help="Keras dtype policy")
    parser.add_argument("--tokens-per-batch", type=int, default=25000,
                        help="source (and target) positions per batch, as in §5.1")
    parser.add_argument("--length", type=int, default=64,
                        help="S = T, positions per sentence; the batch holds "
                             "tokens-per-batch // length sentences")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps in all")
    parser.add_argument("--window", type=int, default=25,
                        help="steps per timed window (a Keras epoch); the first compiles")
    parser.add_argument("--dropout", type=float, default=None,
                        help="override the config's dropout rate (0.1 base, 0.3 big)")
    parser.add_argument("--steps-per-execution", type=int, default=1,
                        help="Keras's compile(steps_per_execution=...): steps per device call")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense peak TFLOP/s for this precision; gives MFU")
    parser.add_argument("--flash-attention", choices=("auto", "on", "off"), default="auto",
                        help="keras.config.enable/disable_flash_attention (auto: Keras decides)")
    parser.add_argument("--check-attention", action="store_true",
                        help="also report which kernel ran the attention (see above)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after fit, profile STEPS train_on_batch steps (see profile_steps)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and a few steps, to check that the script runs")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU, only to check the script (figures meaningless)")
    args = parser.parse_args(argv)
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
    if args.profile < 0:
        parser.error("--profile must be >= 0")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        parser.error("--dropout must be in [0, 1)")
    if args.steps_per_execution < 1 or args.window % args.steps_per_execution:
        parser.error("--steps-per-execution must be positive and divide --window")

    import keras

    import keras_transformer as kt

    backend = keras.backend.backend()
    devices = gpu_devices(backend)
    if not devices and not args.allow_cpu:
        message = (f"No GPU visible to the {backend} backend: gpu.py measures GPU training and "
                   "has nothing to do here. Install the backend's CUDA build (see README) and "
                   "check that the GPU is visible (nvidia-smi).")
        print(message, file=sys.stderr)
        common.emit({"benchmark": "gpu", "backend": backend, "skipped": True,
                     "reason": message})
        return
    if args.flash_attention != "auto":
        (keras.config.enable_flash_attention if args.flash_attention == "on"
         else keras.config.disable_flash_attention)()
    keras.config.set_dtype_policy(args.precision)

    preset = kt.TransformerConfig.big if args.config == "big" else kt.TransformerConfig.base
    overrides = {} if args.dropout is None else {"dropout_rate": args.dropout}
    config = preset(args.vocab_size, max_length=max(256, args.length), **overrides)
    if args.quick:
        config = kt.TransformerConfig.tiny(args.vocab_size, **overrides)
        args.config = "tiny (quick)"
    batch_size = args.tokens_per_batch // args.length
    windows = args.steps // args.window
    inputs, labels = copy_batches(args.window, batch_size, args.length, config.vocab_size)
    target_tokens = int(np.count_nonzero(labels != config.pad_id)) // args.window  # per step
    common.progress(f"gpu: backend {backend}, devices {devices or ['CPU (--allow-cpu)']}, "
                    f"{args.config} config (N={config.num_layers}, d_model {config.d_model}, "
                    f"h={config.num_heads}, d_ff {config.d_ff}, dropout {config.dropout_rate}), "
                    f"{args.precision}, batches of {batch_size} x {args.length} positions "
                    f"({target_tokens} target tokens), {args.steps} steps of model.fit")
    model = kt.Transformer(config)
    model.compile(optimizer=kt.paper_adam(config.d_model, config.warmup_steps),
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id),
                  steps_per_execution=args.steps_per_execution)
    timer = window_timer(args.window, target_tokens, windows)
    start = time.perf_counter()
    model.fit(inputs, labels, batch_size=batch_size, epochs=windows, shuffle=False,
              verbose=0, callbacks=[timer])
    fit_seconds = time.perf_counter() - start

    step_time = common.median(timer.seconds[1:]) / args.window
    flops = common.training_flops(batch_size, args.length, args.length, config)
    achieved = flops / step_time / 1e12
    mfu = achieved / args.peak_tflops if args.peak_tflops else None
    finite = all(math.isfinite(loss) for loss in timer.losses)
    result = {
        "benchmark": "gpu", "backend": backend, "devices": devices, "config": args.config,
        "precision": args.precision, "batch_size": batch_size, "length": args.length,
        "target_tokens_per_step": target_tokens, "steps": args.steps, "window": args.window,
        "dropout_rate": config.dropout_rate, "vocab_size": config.vocab_size,
        "steps_per_execution": args.steps_per_execution, "params": model.count_params(),
        "median_step_s": step_time, "first_window_s": timer.seconds[0], "fit_s": fit_seconds,
        "tokens_per_s": target_tokens / step_time, "achieved_tflops": achieved,
        "peak_tflops": args.peak_tflops, "mfu": mfu, "flop_formula": common.FLOP_FORMULA,
        "peak_gpu_memory_mb": peak_memory_mb(backend), "jit_compile": model.jit_compile,
        "flash_attention": keras.config.is_flash_attention_enabled(),
        "window_losses": timer.losses, "loss_finite": finite,
        "loss_decreased": finite and timer.losses[-1] < timer.losses[0],
        "optimizer": type(model.optimizer).__name__,
        "quick": args.quick, "skipped": False,
    }
    common.progress(f"gpu: {result['tokens_per_s']:,.0f} target tokens/s, "
                    f"{step_time * 1e3:.1f} ms/step, {achieved:.1f} TFLOP/s "
                    f"({common.FLOP_FORMULA}); first window {timer.seconds[0]:.1f} s")
    common.progress("gpu: MFU " + (f"{mfu:.1%}" if mfu is not None else
                                   "not computed: pass --peak-tflops"))
    common.progress(f"gpu: loss {timer.losses[0]:.3f} -> {timer.losses[-1]:.3f}, "
                    f"peak GPU memory {result['peak_gpu_memory_mb'] or float('nan'):,.0f} MiB")
    sample = ({key: value[:batch_size] for key, value in inputs.items()}, labels[:batch_size])
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
    common.emit(result)
    if not finite:
        sys.exit("error: the loss became NaN or infinite")


if __name__ == "__main__":
    main()
