"""Runs every benchmark, one subprocess per script and backend, checks the
targets of issue 6 and writes `benchmarks/RESULTS.md`.

    matmul.py            once (NumPy, TensorFlow, JAX and PyTorch in one process)
    training.py          per backend, --config default and --config large
    decoding.py          per backend
    gpu.py               per backend (skipped without a GPU)

Each script prints one JSON line last; this script collects them and writes a
Markdown report (machine, versions, command, tables, and PASS/FAIL for each
target) plus the raw results beside it (`.json`). The sections of the report
that it does not write (written by hand from the other scripts' printed
tables) are kept, in their order, after the ones it writes. Targets:

* training tokens/s ≥ 1.2 × the keras-hub-layer model, on every backend;
* training tokens/s ≥ 1.0 × native torch.nn.Transformer, on the torch backend;
* at d_model 512 (--config large) the training step reaches ≥ 60% of the best
  measured square float32 matmul rate;
* cached decoding of 256 new tokens takes ≤ 9 × the time of 32;
* at 128 new tokens cached decoding is ≥ 5 × faster than uncached.

    python benchmarks/run_all.py                       # all backends, writes RESULTS.md
    python benchmarks/run_all.py --quick --output /tmp/bench_quick.md   # check the scripts
    python benchmarks/run_all.py --check [--write]   # the tables measured on changed code
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import datetime
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

HERE = os.path.dirname(os.path.abspath(__file__))
INTRODUCTION = """\
The current figures of the maintained benchmarks: for each, the command, the machine, the table
and what it means. How each figure is made: [README.md](README.md). The experiments behind past
decisions, each with what it showed: [experiments/README.md](experiments/README.md). Earlier runs
are in the history of this file in git.

The sections down to "Analysis of the targets" are written by `python benchmarks/run_all.py`,
the analysis by hand after its run. A rerun writes its sections again, drops the analysis, which
was about the run before, and keeps the sections after them: each written from another script's
run, with its command, by hand or as a table generated from that script's results file. What
the tables show is read in [docs/performance.md](../docs/performance.md)."""
DEFAULT_OUTPUT = os.path.join(HERE, "RESULTS.md")
BACKENDS = ("tensorflow", "jax", "torch")
PACKAGES = ("keras", "keras-hub", "tensorflow", "jax", "jaxlib", "torch", "numpy")
NOISE = ("I0000", "W0000", "E0000", "WARNING: All log messages", "oneDNN custom operations")


def run_script(script, arguments, backend, timeout):
    """Runs benchmarks/`script`, streaming its output; returns its JSON result."""
    command = [sys.executable, os.path.join(HERE, script), *arguments]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if backend:
        env["KERAS_BACKEND"] = backend
    tag = f"[{backend or 'all'} {script} {' '.join(arguments)}]".replace(" ]", "]")
    print(f"{tag} starting", flush=True)
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    timer = threading.Timer(timeout, process.kill)  # a hung script does not hang us
    timer.start()
    lines = []
    try:
        for line in process.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            if not line.startswith("{") and not line.startswith(NOISE):
                print(f"{tag} {line}", flush=True)
        process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            process.kill()
    if time.perf_counter() - start >= timeout:
        print(f"{tag} killed after the --timeout of {timeout} s", flush=True)
        return {"error": f"killed after the --timeout of {timeout} s"}
    results = [json.loads(line) for line in lines if line.startswith("{")]
    if process.returncode or not results:
        tail = "\n".join(lines[-15:])
        print(f"{tag} FAILED with exit status {process.returncode}:\n{tail}", flush=True)
        return {"error": f"exit status {process.returncode}: {lines[-1] if lines else ''}"}
    print(f"{tag} done in {time.perf_counter() - start:.0f} s", flush=True)
    return results[-1]


def versions():
    found = {}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    found["keras-transformer"] = common.commit()
    return found


def check(rows, name, backend, value, required, at_least=True):
    if value is None:
        rows.append((name, backend, "not measured", required, "n/a"))
        return
    passed = value >= required if at_least else value <= required
    bound = "≥" if at_least else "≤"
    rows.append((name, backend, f"{value:.2f}", f"{bound} {required}",
                 "PASS" if passed else "FAIL"))


def targets(results, backends):
    rows = []
    best = results.get("matmul", {}).get("best_gflops")
    for backend in backends:
        if ("training", backend, "default") not in results:
            continue  # skipped: no rows
        for config in ("default", "large"):
            training = results.get(("training", backend, config), {})
            ratios = training.get("ratios", {})
            check(rows, f"training tokens/s ours / keras-hub ({config})", backend,
                  ratios.get("ours/keras_hub"), 1.2)
            if backend == "torch":
                check(rows, f"training tokens/s ours / torch.nn.Transformer ({config})",
                      backend, ratios.get("ours/torch"), 1.0)
        large = results.get(("training", backend, "large"), {}).get("results", {})
        ours = large.get("ours", {}).get("gflops")
        check(rows, "training GFLOP/s at d_model 512 / best matmul GFLOP/s", backend,
              ours / best if ours and best else None, 0.6)
    for backend in backends:
        if ("decoding", backend) not in results:
            continue
        summary = results[("decoding", backend)].get("summary", {})
        for search in ("greedy", "beam"):
            figures = summary.get(search, {})
            long, short = figures.get("cached_ratio_lengths", (256, 32))
            check(rows, f"{search} cached time({long}) / time({short})", backend,
                  figures.get("cached_ratio"), 9, at_least=False)
            check(rows, f"{search} uncached / cached time at {figures.get('speedup_length', 128)}",
                  backend, figures.get("speedup"), 5)
    return rows


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def number(value, digits=1):
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _header(results):
    """The report's title, introduction and the lines on the machine, the versions, the
    command and the methods, from the run's `meta`."""
    meta = results.get("meta", {})
    parts = ["# Benchmark results", "", INTRODUCTION, ""]
    if meta.get("quick"):
        parts += [("**QUICK MODE: tiny sizes and 2 steps, only to check that the scripts "
                   "run. These figures mean nothing.**"), ""]
    return parts + [_marked(results, "run_all.header", render("run_all.header", results))]


def _header_lines(results):
    """The machine, versions, command and methods of the run."""
    meta = results["meta"]
    info = meta["machine"]
    lines = [
        (f"- Machine: {info['cpu']} ({info.get('isa', 'instruction set not recorded')}), "
         f"{info['logical_cores']} logical cores ({info['usable_cores']} usable), {info['os']}, "
         f"Python {info['python']}"),
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"- Command: `{meta['command']}` (took {meta['minutes']} min)",
        f"- FLOPs: {common.FLOP_FORMULA}",
        ("- Training: `model.train_on_batch` loop for both Keras models with "
         "`compile(jit_compile=\"auto\")`, each model's own default (column XLA), eager "
         "loop for torch.nn.Transformer; random ids, no padding; memory is the peak RSS of "
         "each model's own process (`ru_maxrss`, framework included)."),
    ]
    gpus = [value for key, value in results.items() if isinstance(key, tuple) and key[0] == "gpu"]
    if gpus and all(gpu.get("skipped") for gpu in gpus):
        lines.append("- GPU: none visible here (`gpu.py` skipped).")
    return "\n".join(lines)


def _matmul_table(results):
    """The matmul rates per library, if matmul.py ran."""
    matmul = results.get("matmul", {})
    if "gflops" not in matmul:
        return None
    shapes = matmul["shapes"]
    return table(("library", f"square {'×'.join(map(str, shapes['square']))} GFLOP/s",
                  f"FFN-shaped {'×'.join(map(str, shapes['ffn']))} GFLOP/s", "threads"),
                 [(name, number(r["square"]), number(r["ffn"]), r["threads"] or "default")
                  for name, r in matmul["gflops"].items()])


def _training_table(results):
    """Each model's training figures per backend and config, if training.py ran."""
    best = results.get("matmul", {}).get("best_gflops")
    rows = []
    for backend in results["meta"]["backends"]:
        for config in ("default", "large"):
            training = results.get(("training", backend, config), {})
            for model, r in training.get("results", {}).items():
                if "error" in r:
                    rows.append((backend, config, model, r["error"], *[""] * 7))
                    continue
                xla = {True: "yes", False: "no", None: "eager torch"}[r.get("jit_compile")]
                rows.append((backend, config, model, xla, f"{r['params']:,}",
                             number(r["tokens_per_s"], 0), number(r["median_step_s"] * 1e3),
                             number(r["first_step_s"]), number(r["peak_rss_mb"], 0),
                             number(r["gflops"]),
                             f"{r['gflops'] / best:.0%}" if best else "n/a"))
    if not rows:
        return None
    return table(("backend", "config", "model", "XLA", "params", "target tokens/s",
                  "median ms/step", "first step s", "peak RSS MiB", "GFLOP/s",
                  "of best matmul"), rows)


def _decoding_table(results):
    """The cached and uncached searches' times per backend, if decoding.py ran."""
    backends, rows = results["meta"]["backends"], []
    for backend in backends:
        decoding = results.get(("decoding", backend), {})
        for method in ("greedy_cached", "greedy_uncached", "beam_cached", "beam_uncached"):
            if method in decoding.get("seconds", {}):
                per_token, seconds = decoding["ms_per_token"][method], decoding["seconds"][method]
                rows.append((backend, method, *[f"{per_token[str(n)]:.3g} ({seconds[str(n)]:.3g} s)"
                                                for n in decoding["lengths"]]))
    lengths = next((results[("decoding", b)]["lengths"] for b in backends
                    if "lengths" in results.get(("decoding", b), {})), [])
    if not rows:
        return None
    return table(("backend", "method", *[f"{n} tokens" for n in lengths]), rows)


def _gpu_table(results):
    """gpu.py's figures per backend, if it ran on a GPU for at least one."""
    gpus = {backend: results[("gpu", backend)] for backend in results["meta"]["backends"]
            if ("gpu", backend) in results}
    if not gpus or all(gpu.get("skipped") for gpu in gpus.values()):
        return None
    rows = []
    for backend, gpu in gpus.items():
        if gpu.get("skipped") or "error" in gpu:
            rows.append((backend, "skipped: " + gpu.get("reason", gpu.get("error", ""))
                         .split(":")[0], *[""] * 4))
        else:
            rows.append((backend, f"{gpu['config']} {gpu['precision']}",
                         number(gpu["tokens_per_s"], 0), number(gpu["achieved_tflops"], 2),
                         "n/a" if gpu["mfu"] is None else f"{gpu['mfu']:.1%}",
                         number(gpu["peak_gpu_memory_mb"], 0)))
    return table(("backend", "run", "tokens/s", "TFLOP/s", "MFU", "peak GPU MiB"), rows)


# The tables this script writes, each between the markers of benchmarks/tables.py, which
# makes them again from RESULTS.json to check the page.
RENDERERS = {
    "run_all.header": _header_lines,
    "run_all.targets": lambda results: table(
        ("target", "backend", "measured", "required", "result"),
        targets(results, results["meta"]["backends"])),
    "run_all.matmul": _matmul_table,
    "run_all.training": _training_table,
    "run_all.decoding": _decoding_table,
    "run_all.gpu": _gpu_table,
}
SECTIONS = (("## Targets", "run_all.targets"), ("## Matmul rate (float32)", "run_all.matmul"),
            ("## Training throughput", "run_all.training"),
            ("## Decoding: ms per new token (seconds per batch)", "run_all.decoding"),
            ("## GPU", "run_all.gpu"))


def render(kind, results):
    """The table (or the header's lines) of `kind`, made from `results`; None when the
    scripts it reads did not run."""
    return RENDERERS[kind](results)


def from_json(raw):
    """The results as `main` holds them, from RESULTS.json (whose keys are joined)."""
    return {tuple(key.split(" ")) if " " in key else key: value for key, value in raw.items()}


def _marked(results, kind, text):
    import tables

    return tables.marked(results["meta"]["results_file"], kind, text)


def report(results):
    """The Markdown report of the runs: the machine and versions, the targets, a table
    per benchmark that ran, and the runs that failed."""
    parts = _header(results)
    for title, kind in SECTIONS:
        text = render(kind, results)
        if text is not None:
            parts += ([""] if title == "## Targets" else []) + [
                title, "", _marked(results, kind, text), ""]
    errors = [f"- {key}: {value['error']}" for key, value in results.items()
              if isinstance(value, dict) and "error" in value]
    if errors:
        parts += ["## Runs that failed", "", *errors, ""]
    return "\n".join(_with_commit_lines(parts, results["meta"]["commit"]))


def _with_commit_lines(parts, commit):
    """`parts` with a line naming the commit measured under each section's title,
    so that each table names its commit in its own section (tests/test_figures.py)."""
    hash_, _, rest = commit.partition(" ")
    line = (f"Measured at commit `{hash_}`{', ' + rest.strip('()') if rest else ''}."
            if hash_ != "unknown" else "Measured at an unknown commit.")
    with_lines = []
    for part in parts:
        with_lines.append(part)
        if part.startswith("## ") and part != "## Runs that failed":
            with_lines += ["", line]
    return with_lines


# The sections this script writes, and the analysis written by hand for its
# previous run (stale once it runs again). Every other `## ` section of
# RESULTS.md was written from another script's run (by hand, from its printed
# tables) and a run of this script keeps it, in its place in the order.
WRITTEN_SECTIONS = ("## Targets", "## Matmul rate (float32)", "## Training throughput",
                    "## Decoding: ms per new token (seconds per batch)", "## GPU",
                    "## Runs that failed",
                    "## Analysis of the targets (written by hand for the run above)")


def _kept_sections(path):
    """The sections of the report at `path` that this script does not write,
    each from its `## ` title up to the next."""
    if not os.path.exists(path):
        return ""
    with open(path) as file:
        text = file.read()
    sections = text.split("\n## ")[1:]  # the text before the first is the header
    kept = ["## " + section for section in sections
            if section.split("\n", 1)[0] not in {t[3:] for t in WRITTEN_SECTIONS}]
    return "".join("\n" + section.rstrip("\n") + "\n" for section in kept)


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated subset of tensorflow,jax,torch")
    parser.add_argument("--skip", default="", help="comma-separated scripts to skip "
                        "(matmul,training,decoding,gpu)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="the Markdown report")
    parser.add_argument("--peak-tflops", type=float, help="passed to gpu.py for MFU")
    parser.add_argument("--timeout", type=int, default=7200, help="seconds per script run")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and 2 steps, only to check the scripts; needs an "
                             "--output other than benchmarks/RESULTS.md")
    parser.add_argument("--check", action="store_true",
                        help="run nothing: list the tables of figures of README.md, docs/ and "
                             "RESULTS.md whose code has changed since their commit "
                             "(figures.py); status 1 if one does not say so")
    parser.add_argument("--write", action="store_true",
                        help="with --check: write \"(the code has changed since)\" after the "
                             "commit of each such table that does not say so")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.write and not args.check:
        parser.error("--write goes with --check")
    if args.check:
        import figures

        return figures.check(write=args.write)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if sorted(set(backends) - set(BACKENDS)):
        parser.error(f"--backends must be a subset of {','.join(BACKENDS)}")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - {"matmul", "training", "decoding", "gpu"}:
        parser.error("--skip takes matmul, training, decoding, gpu")
    if args.quick and os.path.realpath(args.output) == os.path.realpath(DEFAULT_OUTPUT):
        parser.error("--quick figures must never go to benchmarks/RESULTS.md: pass "
                     "--output /tmp/bench_quick.md (or another path)")

    started = datetime.datetime.now()
    quick = ["--quick"] if args.quick else []
    results = {}
    if "matmul" not in skip:
        results["matmul"] = run_script("matmul.py", quick, None, args.timeout)
    for backend in backends:
        if "training" not in skip:
            for config in ("default", "large"):
                arguments = quick or ["--config", config]
                results["training", backend, config] = run_script(
                    "training.py", arguments, backend, args.timeout)
        if "decoding" not in skip:
            results["decoding", backend] = run_script("decoding.py", quick, backend, args.timeout)
        if "gpu" not in skip:
            peak = ["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else []
            results["gpu", backend] = run_script("gpu.py", quick + peak, backend, args.timeout)

    raw = os.path.splitext(args.output)[0] + ".json"
    found = versions()
    results["meta"] = {
        "machine": common.machine(), "versions": found, "backends": backends,
        "commit": found["keras-transformer"],
        "command": f"python {' '.join(shlex.quote(a) for a in sys.argv)}",
        "minutes": (datetime.datetime.now() - started).seconds // 60, "quick": args.quick,
        # The file the tables are made from, as the page's markers name it.
        "results_file": os.path.relpath(os.path.abspath(raw), common.REPOSITORY)}
    text = report(results) + _kept_sections(args.output)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as file:
        file.write(text)
    with open(raw, "w") as file:
        json.dump({" ".join(k) if isinstance(k, tuple) else k: v for k, v in results.items()},
                  file, indent=1, sort_keys=True)
    print(text)
    print(f"\nWrote {args.output} and {raw}")


if __name__ == "__main__":
    sys.exit(common.run_script(main))
