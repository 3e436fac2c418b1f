"""The GPU benchmark's peer: `torch.nn.Transformer` trained in plain PyTorch on
gpu.py's batches (§5.2 Hardware and Schedule).

The same configuration as ours (`peers.torch_transformer`: N post-norm blocks,
one embedding matrix shared by source, target and the output projection,
sinusoidal positions, padding and causal masks), the same batches
(`gpu.copy_batches`: a copy task of Zipf-distributed or real-corpus ids, the
last row of each batch all padding), Adam(0.9, 0.98, 1e-9) with eq. (3), and
cross-entropy with label smoothing on float32 logits. It trains as a careful
PyTorch user would: `torch.autocast` in bfloat16 (float16 with a GradScaler),
fused Adam on a GPU, the batch copied to the device at each step, and with
`--mode compile` the loss function under `torch.compile`.

It reports what gpu.py reports, in the same JSON fields: the median window's
target tokens/s after the first window (which compiles), TFLOP/s with the same
FLOP count, MFU, peak memory, each window's loss, and under float16 the steps
the GradScaler skipped. `gpu.py --peers eager,compile` runs it after our model
in the same invocation, so that one report gives the ratio.

    python benchmarks/gpu_peer.py --mode compile --config big --peak-tflops 989
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import gpu
import peers

MODES = ("eager", "compile")


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--mode", choices=MODES, default="eager",
                        help="eager PyTorch, or the loss function under torch.compile")
    gpu.add_run_options(parser)
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    return args, gpu.check_run_options(parser, args)


def training_step(model, config, args, device):
    """One optimizer step of `model` on a (source, target, labels) batch of host
    tensors, as a careful PyTorch user writes it: Adam with eq. (3), autocast in
    the run's precision (float16 with a GradScaler), the loss function under
    torch.compile with `--mode compile`. The step returns (its loss, whether
    the GradScaler skipped it)."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 fused=device == "cuda")
    d, warmup = config.d_model, config.warmup_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(  # eq. (3), steps counted from 1
        optimizer, lambda i: d**-0.5 * min((i + 1) ** -0.5, (i + 1) * warmup**-1.5))
    dtype = {"mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}.get(
        args.precision)
    scaler = torch.amp.GradScaler(device, enabled=dtype is torch.float16)

    def training_loss(source, target, labels):
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(source, target)
        return F.cross_entropy(logits.float().reshape(-1, config.vocab_size),
                               labels.reshape(-1), ignore_index=config.pad_id,
                               label_smoothing=config.label_smoothing)

    loss_function = torch.compile(training_loss) if args.mode == "compile" else training_loss

    def step(batch):
        source, target, step_labels = (t.to(device, non_blocking=True) for t in batch)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_function(source, target, step_labels)
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        schedule.step()
        return loss, scaler.is_enabled() and scaler.get_scale() < scale

    return step


def train_windows(step, batches, args, target_tokens):
    """Runs `--steps` steps in windows of `--window`, each going through the
    batches once; returns (seconds of each window, its mean loss, steps skipped)."""
    windows, seconds, losses, skipped = args.steps // args.window, [], [], 0
    for window in range(windows):
        start = time.perf_counter()
        total = 0.0
        for index in range(args.window):
            loss, step_skipped = step(batches[index])
            total += loss.detach()
            skipped += step_skipped
        loss = float(total) / args.window  # waits for the window's last step
        seconds.append(time.perf_counter() - start)
        losses.append(loss)
        common.progress(f"  window {window + 1}/{windows}: {seconds[-1]:.2f} s, "
                        f"{target_tokens * args.window / seconds[-1]:,.0f} target tokens/s, "
                        f"loss {loss:.4f}")
    return seconds, losses, skipped


def main(argv=None):
    args, frequencies = parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.allow_cpu:
        common.emit({"benchmark": "gpu_peer", "mode": args.mode, "skipped": True,
                     "reason": "no GPU visible to torch"})
        return
    config = gpu.run_config(args)
    batch_size, inputs, labels, target_tokens = gpu.training_batches(args, config, frequencies)
    # Host tensors, copied to the device at each step as a data loader's are.
    batches = [tuple(torch.from_numpy(np.ascontiguousarray(array[i::args.window])).long()
                     for array in (inputs["source"], inputs["target"], labels))
               for i in range(args.window)]

    torch.manual_seed(0)
    model = peers.torch_transformer(config).to(device)
    model.train()
    step = training_step(model, config, args, device)
    common.progress(f"gpu_peer: torch.nn.Transformer ({args.mode}) on {device}, "
                    f"{args.config if not args.quick else 'tiny (quick)'} config, "
                    f"{args.precision}, batches of {batch_size} x {args.length}")
    seconds, losses, skipped = train_windows(step, batches, args, target_tokens)
    figures = gpu.window_figures(args, config, batch_size, target_tokens, seconds, losses)
    common.emit({
        "benchmark": "gpu_peer", "model": "torch.nn.Transformer", "mode": args.mode,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "config": "tiny (quick)" if args.quick else args.config,
        "precision": args.precision,
        "batch_size": batch_size, "length": args.length, "vocab_size": config.vocab_size,
        "target_tokens_per_step": target_tokens, "steps": args.steps, "window": args.window,
        "params": sum(p.numel() for p in model.parameters()),
        "peak_gpu_memory_mb": (torch.cuda.max_memory_allocated() / 2**20
                               if device == "cuda" else None),
        "skipped_steps": int(skipped),
        "ids": args.id_frequencies or "zipf 1.1", "quick": args.quick, "skipped": False,
        **figures,
    })
    if not figures["loss_finite"]:
        sys.exit("error: the loss became NaN or infinite")


if __name__ == "__main__":
    common.run_script(main)
