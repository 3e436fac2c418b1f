"""Shared pieces of the benchmark scripts: model sizes, the FLOP formula, timing,
memory, machine description and the one-JSON-line output.

The FLOP count (§3.1-§3.4, Figure 1) counts the matrix multiplications of one
training step, 2 FLOPs per multiply-add, with B sentences, S source and T
target positions, N blocks per stack, d = d_model, f = d_ff, V = target vocab:

    encoder forward = B·N·[S·(8d² + 4df) + 4S²d]
        (Q, K, V, O projections 8d², feed-forward 4df per token; QKᵀ and AV 4S²d)
    decoder forward = B·N·[T·(12d² + 4df) + 4Sd² + 4T²d + 4TSd]
        (self-attention 8d² and cross-attention Q, O 4d² per target token; cross
         K, V 4d² per source token; self QKᵀ, AV 4T²d, full square, masked
         positions are computed; cross QKᵀ, AV 4TSd)
    output projection = 2·B·T·d·V
    training step = 3 × forward (the backward pass costs about twice the forward)

This is the usual "6 × non-embedding parameters × tokens" plus the attention
and pre-softmax terms, written out. Embedding look-ups, LayerNorm, softmax and
the optimizer update are not counted. The same count is used for every
implementation, so GFLOP/s compares model work per second, not kernels.
"""

import argparse
import json
import math
import os
import platform
import resource
import shlex
import statistics
import sys
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # `python benchmarks/x.py` reads this checkout's library

from keras_transformer.data.toy_tasks import ToyVocabulary  # noqa: E402
from keras_transformer_app import provenance  # noqa: E402
from keras_transformer_app.provenance import (  # noqa: E402, F401 (commit: the scripts')
    commit,
    cpu,
    instruction_set,
)

FLOP_FORMULA = (
    "train FLOPs/step = 3 x forward; forward = B*N*[S*(8d^2+4df) + 4S^2d] (encoder)"
    " + B*N*[T*(12d^2+4df) + 4Sd^2 + 4T^2d + 4TSd] (decoder) + 2BTdV (output);"
    " matmuls only, 2 FLOPs per multiply-add"
)

# The sizes of issue 6, and the paper's base and big models (issue 21's GPU
# runs). "quick" is only for checking that the scripts run.
SIZES = {
    "default": {"num_layers": 3, "d_model": 256, "num_heads": 4, "d_ff": 1024, "vocab_size": 8000},
    "large": {"num_layers": 3, "d_model": 512, "num_heads": 8, "d_ff": 2048, "vocab_size": 8000},
    "quick": {"num_layers": 1, "d_model": 32, "num_heads": 4, "d_ff": 64, "vocab_size": 200},
    "base": {"num_layers": 6, "d_model": 512, "num_heads": 8, "d_ff": 2048, "vocab_size": 37000},
    "big": {"num_layers": 6, "d_model": 1024, "num_heads": 16, "d_ff": 4096, "vocab_size": 37000},
}

# The special ids of the benchmarks' random data: those of the project's tokenizers.
VOCABULARY = ToyVocabulary(SIZES["quick"]["vocab_size"])
PAD_ID, BOS_ID, EOS_ID = VOCABULARY.pad_id, VOCABULARY.bos_id, VOCABULARY.eos_id


def run_script(main):
    """Runs a script's `main` as the process it owns, as the project's command lines
    run: native log lines hidden (`--native-logs` shows them), Ctrl-C and SIGTERM
    ending it quietly, a mistake one `error:` line (`keras_transformer_app.cli.errors`).
    With `--max-isa`, the process first runs itself again under the cap, from its start,
    so that each engine reads it before it loads (the servers and peers it starts
    inherit it)."""
    from keras_transformer_app.cli import errors

    isa = max_isa_of(sys.argv[1:])
    if isa in ISA_CAPS and os.environ.get(ISA_CAP_VARIABLE) != isa:
        run_again_capped(isa)

    with errors.command_line():
        return main()


#: What caps each engine at an instruction set, read by each when it starts: XLA's CPU
#: code generator (JAX's, and TensorFlow's XLA), oneDNN (TensorFlow's and PyTorch's
#: kernels), PyTorch's ATen dispatch and CTranslate2.
ISA_CAPS = {
    "AVX2": {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "ATEN_CPU_CAPABILITY": "avx2", "CT2_FORCE_CPU_ISA": "AVX2"},
}
#: The environment variable that says which cap this process runs under.
ISA_CAP_VARIABLE = "KT_BENCHMARK_MAX_ISA"


def capped_environment(isa, environment=os.environ):
    """`environment` with the variables that cap every engine at `isa` (`ISA_CAPS`); an
    XLA_FLAGS already set keeps its other flags."""
    capped = dict(environment, **{ISA_CAP_VARIABLE: isa})
    for name, value in ISA_CAPS[isa].items():
        if name == "XLA_FLAGS" and environment.get(name):
            value = f"{environment[name]} {value}"
        capped[name] = value
    return capped


def max_isa_of(argv):
    """The `--max-isa` value among a command line's arguments, or None."""
    for index, argument in enumerate(argv):
        if argument == "--max-isa" and index + 1 < len(argv):
            return argv[index + 1]
        if argument.startswith("--max-isa="):
            return argument.partition("=")[2]
    return None


def run_again_capped(isa):
    """Replaces this process by the same command under the cap (`os.execve`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], capped_environment(isa))


def argument_parser(doc):
    """The command-line parser of a benchmark script: the first paragraph of its
    docstring `doc` is the description, the last (its example commands) the epilog.
    Every script takes `--max-isa AVX2` (`ISA_CAPS`)."""
    paragraphs = doc.split("\n\n")
    parser = argparse.ArgumentParser(description=paragraphs[0], epilog=paragraphs[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-isa", choices=tuple(ISA_CAPS),
                        help="cap every engine at this instruction set (XLA, oneDNN, ATen, "
                             "CTranslate2): one machine measures what a CPU without AVX-512 "
                             "runs; recorded in the results' machine.isa_cap")
    return parser


def multi30k_dir():
    """Where Multi30k's files are: the project machines' shared folder
    (`../shared/data/multi30k`) if there is one, else where the Multi30k recipe keeps
    them once it has run (`~/.keras/datasets/keras_transformer/multi30k`)."""
    from keras_transformer.data.downloads import MULTI30K, cache_dir

    shared = os.path.join(REPOSITORY, "..", "shared", "data", "multi30k")
    return shared if os.path.isdir(shared) else cache_dir(MULTI30K)


def fetched_if_cache(data_dir):
    """`data_dir`; when it is the Multi30k recipe's folder in the Keras cache, whatever of
    Multi30k it lacks is downloaded there first, as the recipe would (a user without
    ../shared/data has not necessarily run the recipe)."""
    from keras_transformer.data.downloads import MULTI30K, cache_dir, fetch

    if os.path.realpath(data_dir) == os.path.realpath(cache_dir(MULTI30K)):
        fetch(MULTI30K, print_fn=progress)
    return data_dir


def transformer_config(size, dropout_rate=0.1, **overrides):
    """The `TransformerConfig` of a named size (dropout as in the paper's base)."""
    from keras_transformer import TransformerConfig

    if size not in SIZES:
        raise ValueError(f"Unknown size {size!r}: choose one of {sorted(SIZES)}.")
    values = dict(SIZES[size], dropout_rate=dropout_rate)
    values.update(overrides)
    return TransformerConfig(**values)


def forward_flops(batch, source_length, target_length, num_layers, d_model, d_ff, vocab):
    """Matmul FLOPs of one forward pass (see the module docstring)."""
    B, S, T, N, d, f, V = batch, source_length, target_length, num_layers, d_model, d_ff, vocab
    encoder = B * N * (S * (8 * d * d + 4 * d * f) + 4 * S * S * d)
    decoder = B * N * (T * (12 * d * d + 4 * d * f) + 4 * S * d * d + 4 * T * T * d
                       + 4 * T * S * d)
    return encoder + decoder + 2 * B * T * d * V


def training_flops(batch, source_length, target_length, config):
    """FLOPs of one training step: 3 × the forward pass."""
    return 3 * forward_flops(batch, source_length, target_length, config.num_layers,
                             config.d_model, config.d_ff, config.resolved_target_vocab_size)


def random_batch(batch, source_length, target_length, vocab, seed=0):
    """Random (source, target input, labels) int32 ids, no padding, no special ids."""
    import numpy as np

    rng = np.random.default_rng(seed)
    low = 4  # above pad, unknown, begin and end
    source = rng.integers(low, vocab, (batch, source_length), dtype="int32")
    labels = rng.integers(low, vocab, (batch, target_length), dtype="int32")
    target = np.concatenate([np.full((batch, 1), BOS_ID, "int32"), labels[:, :-1]], axis=1)
    return source, target, labels


def test_set(sources_path=None, references_path=None, limit=None):
    """(sources, references): the files' lines, or the quickstart's test split
    (`synthetic_translation(500, seed=3)`) without them; the first `limit`."""
    if sources_path:
        with open(sources_path, encoding="utf-8") as f:
            sources = f.read().splitlines()
        with open(references_path, encoding="utf-8") as f:
            references = f.read().splitlines()
    else:
        from keras_transformer.data.corpora import synthetic_translation

        test = synthetic_translation(500, seed=3)
        sources, references = list(test.sources), list(test.targets)
    if limit:
        sources, references = sources[:limit], references[:limit]
    return sources, references


def timed(function, *args):
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def time_steps(step, warmup, steps, label=""):
    """Runs `step()` (returning the loss) `warmup` times, then `steps` timed
    times. Returns (first call's seconds, median step seconds)."""
    first, _ = timed(step)
    for _ in range(warmup - 1):
        step()
    times = []
    for i in range(steps):
        seconds, loss = timed(step)
        times.append(seconds)
        progress(f"  {label}step {i + 1}/{steps}: {seconds * 1e3:.1f} ms, loss {loss:.3f}")
    return first, median(times)


def median(values):
    return statistics.median(values) if values else float("nan")


def peak_rss_mb():
    """Peak resident set size of this process (resource.getrusage ru_maxrss), MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


def current_rss_mb():
    """Current resident set size (/proc/self/statm), MiB; NaN where unavailable."""
    try:
        with open("/proc/self/statm") as file:
            pages = int(file.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def machine():
    """CPU model, its widest vector instructions, logical cores, OS and Python version."""
    return {
        "cpu": cpu(),
        "isa": instruction_set(),
        # The cap every engine ran under (`--max-isa`), with the variables that set it.
        "isa_cap": os.environ.get(ISA_CAP_VARIABLE),
        "isa_cap_variables": {name: os.environ.get(name) for name in ISA_CAPS["AVX2"]
                              if os.environ.get(ISA_CAP_VARIABLE)},
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def backend_name():
    import keras

    return keras.backend.backend()


def command_line(script, argv=None):
    """The shell command that reruns `script` (benchmarks/NAME.py) with the given
    arguments (this process's own when `argv` is None), as the tables print it."""
    arguments = sys.argv[1:] if argv is None else argv
    return "TF_CPP_MIN_LOG_LEVEL=3 python " + " ".join(
        shlex.quote(a) for a in [f"benchmarks/{script}", *arguments])


def recorded_command(argv=None):
    """The command that ran this process's script, with the backend it chose: what a
    results file records to measure the same again."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPOSITORY)
    return provenance.command([script, *(sys.argv[1:] if argv is None else argv)])


def write_results(results, output=None):
    """Writes `results` to the `--output` JSON file, when one is given, with the
    machine, commit and command that `emit` adds, then emits them as the final
    stdout line."""
    results = completed(results)
    if output:
        with open(output, "w") as file:
            json.dump(_clean(results), file, indent=1, default=str)
    emit(results)


def completed(result):
    """`result` with the machine it ran on (`machine()`: the CPU, its widest ISA, the
    `--max-isa` cap), the commit measured and the command, where it has none of its
    own."""
    if not isinstance(result, dict):
        return result
    made = {"machine": machine, "commit": commit, "command": recorded_command}
    return {**{key: make() for key, make in made.items() if key not in result}, **result}


def emit(result):
    """Prints the script's result as its final stdout line: one JSON object, with the
    machine it ran on (`machine()`: the CPU, its widest ISA, the `--max-isa` cap), the
    commit measured and the command, where the script gave none of its own."""
    sys.stdout.flush()
    print(json.dumps(_clean(completed(result)), sort_keys=True), flush=True)


def _clean(value):
    """`value` with None for NaN and infinities, which JSON has not."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(item) for item in value]
    return value


def progress(message):
    print(message, flush=True)
