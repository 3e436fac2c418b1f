"""Training throughput on a GPU (§5.2 Hardware and Schedule): the paper's base
model in mixed_bfloat16 with fused attention, as tokens/s and model FLOPs
utilization (MFU).

Trains `TransformerConfig.base` (N=6, d_model 512, 8 heads, d_ff 2048, vocab
37000; `--config big` for the big model) on a random batch with
`model.train_on_batch`, `paper_adam` and label smoothing, `jit_compile` left at
Keras's default. Attention goes through `keras.ops.dot_product_attention`
(cuDNN / flash kernels) because the base config has no attention dropout;
`--flash-attention on|off` forces Keras's flash-attention switch. Reported:
target tokens/s after warm-up, the median step time, peak GPU memory (the
backend's own allocator statistics) and, with `--peak-tflops`, MFU = achieved
model FLOP/s / peak, with the FLOP formula of `common.py` (matmuls only, 3 ×
forward). Give the accelerator's dense peak for the precision you run (bf16 for
mixed_bfloat16), from its datasheet.

Without a GPU visible to the current backend it prints why and exits with
status 0 and a JSON line marked "skipped".

    KERAS_BACKEND=jax python benchmarks/gpu.py --peak-tflops PEAK
    KERAS_BACKEND=torch python benchmarks/gpu.py --precision float32 --peak-tflops PEAK
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common


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

        return torch.cuda.max_memory_allocated() / 2**20
    except (AttributeError, KeyError, RuntimeError, ValueError, TypeError):
        # CPU runs (--allow-cpu) and allocators without statistics
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=("base", "big"), default="base")
    parser.add_argument("--precision", choices=("mixed_bfloat16", "mixed_float16", "float32"),
                        default="mixed_bfloat16", help="Keras dtype policy")
    parser.add_argument("--batch-size", type=int, default=64, help="B, sentences per batch")
    parser.add_argument("--length", type=int, default=128, help="S = T, tokens per sentence")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--steps", type=int, default=30, help="timed steps (median)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (>= 1)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense peak TFLOP/s for this precision; gives MFU")
    parser.add_argument("--flash-attention", choices=("auto", "on", "off"), default="auto",
                        help="keras.config.enable/disable_flash_attention (auto: Keras decides)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and 2 steps, to check that the script runs")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a GPU, only to check the script (figures meaningless)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.length, args.vocab_size, args.steps, args.warmup = 2, 8, 200, 2, 1
    if min(args.batch_size, args.steps, args.warmup) < 1 or args.length < 2:
        parser.error("--batch-size, --steps and --warmup must be >= 1, --length >= 2")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        parser.error("--peak-tflops must be positive")

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
    config = preset(args.vocab_size)
    if args.quick:
        config, args.config = kt.TransformerConfig.tiny(args.vocab_size), "tiny (quick)"
    common.progress(f"gpu: backend {backend}, devices {devices or ['CPU (--allow-cpu)']}, "
                    f"{args.config} config (N={config.num_layers}, d_model {config.d_model}), "
                    f"{args.precision}, batch {args.batch_size} x {args.length} tokens")
    model = kt.Transformer(config)
    model.compile(optimizer=kt.paper_adam(config.d_model, config.warmup_steps),
                  loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, config.pad_id))
    source, target, labels = common.random_batch(args.batch_size, args.length, args.length,
                                                 config.vocab_size)
    inputs = {"source": source, "target": target}

    def step():
        return float(model.train_on_batch(inputs, labels))

    first, step_time = common.time_steps(step, args.warmup, args.steps)
    flops = common.training_flops(args.batch_size, args.length, args.length, config)
    achieved = flops / step_time / 1e12
    mfu = achieved / args.peak_tflops if args.peak_tflops else None
    result = {
        "benchmark": "gpu", "backend": backend, "devices": devices, "config": args.config,
        "precision": args.precision, "batch_size": args.batch_size, "length": args.length,
        "params": model.count_params(), "median_step_s": step_time, "first_step_s": first,
        "tokens_per_s": args.batch_size * args.length / step_time, "achieved_tflops": achieved,
        "peak_tflops": args.peak_tflops, "mfu": mfu, "flop_formula": common.FLOP_FORMULA,
        "peak_gpu_memory_mb": peak_memory_mb(backend), "jit_compile": model.jit_compile,
        "flash_attention": keras.config.is_flash_attention_enabled(),
        "quick": args.quick, "skipped": False,
    }
    common.progress(f"gpu: {result['tokens_per_s']:.0f} tokens/s, {step_time * 1e3:.1f} ms/step, "
                    f"{achieved:.2f} TFLOP/s ({common.FLOP_FORMULA})")
    common.progress("gpu: MFU " + (f"{mfu:.1%}" if mfu is not None else
                                   "not computed: pass --peak-tflops"))
    common.emit(result)


if __name__ == "__main__":
    main()
