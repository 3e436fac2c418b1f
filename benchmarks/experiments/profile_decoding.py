"""Where the time of one cached decoding step goes (§6.1: greedy or beam search with
the key/value cache), under JAX on a CPU: the XLA operations of the compiled search
loop, from a `jax.profiler` trace, grouped into matrix products, layout changes and
everything else, with how many products a step runs, their mean time, and whether
they run side by side on the CPU's threads or one after another.

It explains the decoding figures of `decoding.py` against CTranslate2: the same
model (random weights, the end-of-sentence id never chosen, so every search runs
its full length), batch and source length. XLA_FLAGS is read as usual, so one
setting of XLA's CPU backend can be profiled against another.

    KERAS_BACKEND=jax python benchmarks/experiments/profile_decoding.py
    KERAS_BACKEND=jax python benchmarks/experiments/profile_decoding.py --method beam
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= KERAS_BACKEND=jax \
        python benchmarks/experiments/profile_decoding.py

Operation names are XLA's CPU names (see `profile_step.py`); times are summed over
the CPU threads, so their total can exceed the wall-clock time of a step.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common
from profile_step import category, xla_operations


def product_instances(trace_dir):
    """{instance name, e.g. `ynn_fusion.80`: (total µs, calls)} of the products in a trace."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(sorted(paths)[-1]) as file:
        events = json.load(file)["traceEvents"]
    totals = collections.defaultdict(lambda: [0.0, 0])
    for event in events:
        if event.get("ph") == "X" and category(event.get("name", "")) == "matmul":
            totals[event["name"]][0] += event["dur"]
            totals[event["name"]][1] += 1
    return {name: tuple(value) for name, value in totals.items()}


def described_instances(dump_dir):
    """{instance name: "shape, the model's op"} from XLA's optimized HLO of the search
    loop (the dumped module with the most products)."""
    best, text = -1, ""
    for path in glob.glob(os.path.join(dump_dir, "*after_optimizations.txt")):
        with open(path, encoding="utf-8") as file:
            content = file.read()
        count = len(re.findall(r"= \S+ (?:fusion|dot)\(", content))
        if count > best:
            best, text = count, content
    described = {}
    for match in re.finditer(r"^\s*%?(\S+) = (\S+) (?:fusion|dot)\(.*?op_name=\"([^\"]*)\"",
                             text, re.MULTILINE):
        name, shape, op_name = match.groups()
        op_name = re.sub(r"^jit\(\w+\)/(while/body/)?", "", op_name)
        described[name] = f"{shape.split('{')[0]}, {op_name}"
    return described


def product_spans(trace_dir):
    """(sum of the products' durations, the time from the first product's start to the
    last one's end, the number of threads they ran on), in µs, from a trace."""
    paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(sorted(paths)[-1]) as file:
        events = json.load(file)["traceEvents"]
    products = [event for event in events if event.get("ph") == "X"
                and category(event.get("name", "")) == "matmul"]
    if not products:
        return 0.0, 0.0, 0
    busy = sum(event["dur"] for event in products)
    span = (max(event["ts"] + event["dur"] for event in products)
            - min(event["ts"] for event in products))
    return busy, span, len({(event["pid"], event["tid"]) for event in products})


def build_parser():
    """The script's command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=("greedy", "beam"), default="greedy")
    parser.add_argument("--config", choices=tuple(common.SIZES), default="default")
    parser.add_argument("--length", type=int, default=128, help="new tokens per sentence")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--source-length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="timed searches (median)")
    parser.add_argument("--top", type=int, default=10, help="operations listed")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few tokens")
    return parser


def parse_args(argv=None):
    """The options, checked; the backend must be JAX."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.config, args.length, args.repeats = "quick", 8, 1
    for name in ("length", "batch_size", "source_length", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if common.backend_name() != "jax":
        parser.error(f"profile_decoding.py reads XLA CPU traces: run it with KERAS_BACKEND=jax "
                     f"(got {common.backend_name()})")
    return args


def search_function(args):
    """The search to profile, on decoding.py's forced-length model: a function of no
    arguments."""
    import decoding
    import numpy as np

    from keras_transformer.inference import beam_search, greedy_search

    model = decoding.forced_length_model(args.config, [args.length])
    source = np.random.default_rng(0).integers(
        4, model.config.vocab_size, size=(args.batch_size, args.source_length)).astype("int32")
    if args.method == "greedy":
        return lambda: greedy_search(model, source, common.BOS_ID, common.EOS_ID,
                                     max_output_length=args.length)
    return lambda: beam_search(model, source, common.BOS_ID, common.EOS_ID, beam_size=4,
                               alpha=0.6, max_output_length=args.length)


def timed_and_traced(search, repeats, dump_dir):
    """The median seconds of `repeats` searches, then one traced search: (seconds,
    {operation: total µs}, {operation: calls}, (busy, span, threads) of the products,
    {product instance: (total µs, calls)}, {product instance: description})."""
    import jax

    search()
    search()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        search()
        seconds.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        search()
        jax.profiler.stop_trace()
        totals, counts = xla_operations(trace_dir)
        spans = product_spans(trace_dir)
        instances = product_instances(trace_dir)
    return (statistics.median(seconds), totals, counts, spans, instances,
            described_instances(dump_dir))


def report(args, xla_flags, seconds, totals, counts, spans, instances, described):
    """Prints the profile per new token and emits its JSON."""
    per_token = {name: total / args.length / 1e3 for name, total in totals.items()}
    total = sum(per_token.values())
    groups = collections.Counter()
    for name, ms in per_token.items():
        groups[category(name)] += ms
    products_per_token = sum(count for name, count in counts.items()
                             if category(name) == "matmul") / args.length
    busy, span, threads = spans
    ms_per_token = 1e3 * seconds / args.length
    common.progress(f"profile: {ms_per_token:.2f} ms per new token (median of {args.repeats}); "
                    f"XLA operation time {total:.2f} ms per token (summed over threads)")
    for group in ("matmul", "layout", "other"):
        common.progress(f"  {group:<7} {groups[group]:8.2f} ms  {groups[group] / total:6.1%}")
    common.progress(f"profile: {products_per_token:.1f} products per token, "
                    f"{1e3 * groups['matmul'] / max(products_per_token, 1e-9):.0f} µs each on "
                    f"average, on {threads} thread(s); their summed time is "
                    f"{busy / max(span, 1e-9):.0%} of the span from the first to the last "
                    "(100%: one after another, 200%: two at once throughout)")
    common.progress(f"profile: the {args.top} most expensive products (ms a token, µs a call, "
                    "calls a token, output shape, the model's operation)")
    ranked = sorted(instances.items(), key=lambda item: -item[1][0])[:args.top]
    for name, (total_us, calls) in ranked:
        common.progress(f"  {total_us / args.length / 1e3:7.3f} ms  {total_us / calls:7.0f} µs  "
                        f"{calls / args.length:4.1f}  {name}: {described.get(name, '?')}")
    common.progress(f"profile: the {args.top} most expensive operations")
    top = sorted(per_token.items(), key=lambda item: -item[1])[:args.top]
    for name, ms in top:
        common.progress(f"  {ms:8.3f} ms  {counts[name] / args.length:6.1f} calls  "
                        f"{category(name):<7} {name}")
    common.emit({
        "benchmark": "profile_decoding", "backend": "jax", "method": args.method,
        "config": args.config, "batch_size": args.batch_size,
        "source_length": args.source_length, "length": args.length, "xla_flags": xla_flags,
        "ms_per_token": ms_per_token, "op_ms_per_token": total,
        "groups_ms_per_token": dict(groups), "products_per_token": products_per_token,
        "products_busy_over_span": busy / span if span else None, "product_threads": threads,
        "top_products": {name: {"ms_per_token": total_us / args.length / 1e3,
                                "us_per_call": total_us / calls, "what": described.get(name)}
                         for name, (total_us, calls) in ranked},
        "top": dict(top), "quick": args.quick,
    })


def main(argv=None):
    args = parse_args(argv)
    # XLA's optimized HLO names each product's shape and operation; asked for before
    # JAX loads, as given XLA_FLAGS are kept (and recorded as given).
    xla_flags = os.environ.get("XLA_FLAGS", "")
    dump_dir = tempfile.mkdtemp(prefix="profile-decoding-hlo-")
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [
        xla_flags, f"--xla_dump_to={dump_dir}", "--xla_dump_hlo_as_text"]))
    try:
        search = search_function(args)
        common.progress(f"profile: {args.method}, config {args.config}, batch "
                        f"{args.batch_size} x {args.source_length}, {args.length} tokens: "
                        "compiling and warming up")
        report(args, xla_flags, *timed_and_traced(search, args.repeats, dump_dir))
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)


if __name__ == "__main__":
    common.run_script(main)
