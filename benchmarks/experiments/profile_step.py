"""Where the time of one training step goes (§5: one optimizer step of the §3
model), under JAX on a CPU: the XLA operations of the compiled step, from a
`jax.profiler` trace, grouped into matrix multiplications, layout changes
(copies and transposes) and everything else (element-wise fusions: bias adds,
LayerNorm, softmax, dropout, Adam).

It explains the training figures of `training.py`: how much of a step is
matmul work at all, and so how far above the matmul share any implementation
could get. Our `Transformer` or the keras-hub-layer model of `peers.py`, the
same sizes and batch as `training.py`.

    KERAS_BACKEND=jax python benchmarks/experiments/profile_step.py     # ours, default size
    KERAS_BACKEND=jax python benchmarks/experiments/profile_step.py --model keras_hub --config large

Operation names are XLA's CPU names: matmuls are `dot` or YNNPACK fusions
(`ynn_fusion`, XLA's CPU matmul library in jaxlib 0.10), layout changes are
`copy`, `transpose` and their fusions. Times are summed over both CPU threads,
so their total can exceed the step's wall-clock time.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common
import peers


def category(name):
    if name.startswith(("ynn_fusion", "dot", "onednn", "xnn_fusion")):
        return "matmul"
    if name.startswith(("copy", "transpose")) or "transpose" in name:
        return "layout"
    return "other"


def xla_operations(trace_dir):
    """{operation name without its number: (total µs, count)} of a trace."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
        raise RuntimeError(f"jax.profiler wrote no trace under {trace_dir}")
    with gzip.open(sorted(paths)[-1]) as file:
        events = json.load(file)["traceEvents"]
    totals, counts = collections.Counter(), collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or name.startswith("$") or name.startswith("end:"):
            continue
        if any(word in name for word in ("Thunk", "Pjit", "Slinky", "PjRt")):
            continue  # runtime wrappers around the operations, not operations
        key = re.sub(r"\.\d+$", "", name)
        totals[key] += event["dur"]
        counts[key] += 1
    return totals, counts


def build_parser():
    """The script's command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("ours", "keras_hub"), default="ours")
    parser.add_argument("--config", choices=tuple(common.SIZES), default="default")
    parser.add_argument("--steps", type=int, default=5, help="traced steps")
    parser.add_argument("--top", type=int, default=12, help="operations listed")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 steps")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.config, args.steps = "quick", 2
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    backend = common.backend_name()
    if backend != "jax":
        parser.error(f"profile_step.py reads XLA CPU traces: run it with KERAS_BACKEND=jax "
                     f"(got {backend})")
    import jax
    import training

    config = common.transformer_config(args.config)
    size = (4, 8) if args.quick else (32, 32)
    batch = common.random_batch(size[0], size[1], size[1], config.vocab_size)
    model = training.build_ours(config) if args.model == "ours" else peers.build_keras_hub(config)
    step = training.keras_step(model, config, "auto", batch)
    common.progress(f"profile: {args.model}, config {args.config}, batch {size[0]} x {size[1]}: "
                    "compiling and warming up")
    for _ in range(3):
        step()
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for index in range(args.steps):
            step()
            common.progress(f"profile: traced step {index + 1}/{args.steps}")
        jax.profiler.stop_trace()
        totals, counts = xla_operations(trace_dir)

    per_step = {name: total / args.steps / 1e3 for name, total in totals.items()}
    total = sum(per_step.values())
    groups = collections.Counter()
    for name, ms in per_step.items():
        groups[category(name)] += ms
    common.progress(f"profile: XLA operation time per step {total:.1f} ms (summed over threads)")
    for group in ("matmul", "layout", "other"):
        common.progress(f"  {group:<7} {groups[group]:8.1f} ms  {groups[group] / total:6.1%}")
    common.progress(f"profile: the {args.top} most expensive operations")
    for name, ms in sorted(per_step.items(), key=lambda item: -item[1])[:args.top]:
        common.progress(f"  {ms:8.2f} ms  {counts[name] / args.steps:6.0f} calls  "
                        f"{category(name):<7} {name}")
    common.emit({
        "benchmark": "profile_step", "backend": backend, "model": args.model,
        "config": args.config, "batch_size": size[0], "length": size[1],
        "steps": args.steps, "op_ms_per_step": total,
        "groups_ms": dict(groups), "groups_share": {k: v / total for k, v in groups.items()},
        "top": {name: ms for name, ms in sorted(per_step.items(),
                                                key=lambda item: -item[1])[:args.top]},
        "quick": args.quick,
    })


if __name__ == "__main__":
    common.run_script(main)
