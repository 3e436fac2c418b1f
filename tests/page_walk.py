"""The pages, run as a new user runs them: every ```bash block of README.md, then of the
docs/ pages and the benchmarks' pages, in page order, in fresh clones of the repository.

A new user follows README.md and then docs/: the pages build on each other (docs/serving.md
serves the model README.md's quickstart trained), so the walk runs the pages of a chain
(`CHAINS`) one after the other in one directory, each page's blocks joined into one bash
script (`set -e`: a command that fails ends its page, with the page and the line of its
block). The chains do not depend on each other: each runs in a clone of its own, and the
suite's walk (`python -m pytest -n 2 --dist loadgroup --walk tests/test_pages.py`: each chain
an xdist group, all its pages on one worker) runs them side by side. What a page takes from
another chain it makes first (`BEFORE`, printed with the page's table).

What the walk changes is declared in `SUBSTITUTIONS`, one table per page, printed with each
run: step counts and sizes (minutes of training become seconds), ports (a free one for
8501) and installs (`.ci/run` has installed the project already). Each entry must match
the page's text, so a table cannot outlive its page. Downloads go to a loopback mirror of
../shared/data (`KERAS_TRANSFORMER_DATA_MIRROR`): the recipes run their own download code.
The walk's HOME is a fresh folder (no keras.json: Keras's default backend, TensorFlow; an
empty ~/.keras/datasets), and KERAS_BACKEND is unset unless a command sets it; XLA compiles
faster, as in the suite, but for the benchmarks' chain (`WALK_XLA_FLAGS`); inside the
suite the walk keeps the worker's share of the cores (OMP_NUM_THREADS, see `environment`);
a crash in native code prints Python's stacks (PYTHONFAULTHANDLER=1).

A block that cannot run here (a GPU, docker, TensorFlow Serving, several hosts, the real
WMT14, hours of measurement) is marked in the page itself, on the line above its fence:

    <!-- not run by the tests: REASON -->

and only parsed (tests/test_doc_commands.py checks every command's options).

    python tests/page_walk.py [--pages README.md docs/serving.md] [--directory DIR]
    python tests/page_walk.py --chain benchmarks   # the benchmarks' pages, walked by hand
    python tests/page_walk.py --tables   # what the walk changes, page by page
    python tests/page_walk.py --list     # the tables and the scripts the walk would run
"""

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import REPOSITORY  # noqa: E402
from test_docs import code_blocks  # noqa: E402

# The chains of pages that build on each other, in the order a new user reads them, each
# walked in a clone of its own. The suite's walk runs the first four side by side, the longest
# first (pytest-xdist gives each worker a chain and the next one when its chain nears its
# end); the benchmarks' pages are walked by hand (`python tests/page_walk.py --chain
# benchmarks`): even with every script at --quick they take about an hour on 2 cores.
CHAINS = {
    "multi30k": ("docs/results.md", "docs/training.md", "docs/translation.md"),
    "quickstart": ("README.md", "docs/installation.md", "docs/serving.md", "docs/library.md"),
    "wmt14": ("docs/wmt14.md",),
    "distributed": ("docs/distributed.md",),
    "benchmarks": ("docs/performance.md", "benchmarks/README.md",
                   "benchmarks/experiments/README.md"),
}
WALKED_IN_THE_SUITE = ("multi30k", "quickstart", "wmt14", "distributed")
PAGES = tuple(page for pages in CHAINS.values() for page in pages)
NOT_RUN = re.compile(r"^<!-- not run by the tests: (?P<reason>\S.*\S) -->$")


@dataclasses.dataclass(frozen=True)
class Substitution:
    old: str
    new: str
    why: str


# A recipe run of seconds (Multi30k's, and Anki's) on the first 1,000 training pairs (of
# Multi30k's, the 161 of at most 16 subwords a side), scored on 10 sentences, with a model of
# one layer 32 wide. One bucket 16 wide gives one batch shape: each shape is a compilation of
# the train step (TensorFlow's XLA: 136 s for a Multi30k run of these sizes with 3 shapes and
# the recipe's 4 layers 128 wide, 93 s with 1 shape; 31 s with 1 shape and this model, on a
# 2-core AMD EPYC).
_ONE_LAYER = "--num-layers 1 --d-model 32 --num-heads 2 --d-ff 64"
# Sizes for the quickstart that keep its products real (a model, a tokenizer, exports)
# while it trains for seconds, with the same model of one layer 32 wide: its run with its
# SavedModel took 65 s of CPU with the quickstart's model (2 layers 128 wide) and 37 s with
# this one, under JAX on a 2-core AMD EPYC (AVX2), and every later command that loads it
# (translating, exporting, serving's warm-up) compiles less.
_QUICKSTART = ("--steps 40 --checkpoint-every 20 --train-pairs 2000 --test-pairs 20 "
               f"{_ONE_LAYER}")
_MULTI30K = ("--steps 20 --checkpoint-every 10 --train-limit 1000 --max-sentence-length 16 "
             f"--bucket-width 16 --vocab-size 600 --eval-limit 10 {_ONE_LAYER}")
# The quickstart's SavedModel with 2 × 2 compiled shapes instead of 7 × 4: the server's
# warm-up compiles the search once per shape (13 shapes: a minute on a 2-core AMD EPYC).
_EXPORT = "keras-transformer export runs/quickstart saved_models/quickstart"
_FEW_SHAPES = "--batch-sizes 1,2 --lengths 16,32"
_FEW_SHAPES_WHY = "sizes: 4 compiled shapes, not 28 (the server's warm-up compiles each)"

SUBSTITUTIONS = {
    "README.md": (
        Substitution('pip install torch==2.13.0 -e ".[all]" && ', "",
                     "installed already: `.ci/run` runs this install first"),
        Substitution("python -m recipes.quickstart", f"python -m recipes.quickstart {_QUICKSTART}",
                     "steps and sizes"),
        Substitution(_EXPORT, f"{_EXPORT} {_FEW_SHAPES}", _FEW_SHAPES_WHY),
        Substitution("8501", "$PORT", "a free port"),
    ),
    "docs/installation.md": (
        Substitution("python -m recipes.quickstart", f"python -m recipes.quickstart {_QUICKSTART}",
                     "steps and sizes (the README's run is finished: nothing is left to do)"),
    ),
    "docs/results.md": (
        Substitution("python -m recipes.multi30k",
                     f"python -m recipes.multi30k {_MULTI30K} --tune-alpha 1.0",
                     "steps and sizes: one α tried on validation, not four"),
        Substitution("--steps 1100 --checkpoint-every 220", _MULTI30K, "steps and sizes"),
        Substitution("--minutes 5 --eval-limit 400",
                     "--minutes 5 --max-steps 4 --eval-limit 4 --variants base,heads1 "
                     f"--train-limit 1000 --max-sentence-length 16 --vocab-size 600 {_ONE_LAYER}",
                     "steps and sizes: two variants of a model of one layer 32 wide"),
        Substitution("python -m recipes.quickstart", f"python -m recipes.quickstart {_QUICKSTART}",
                     "steps and sizes (the README's run is finished: nothing is left to do)"),
    ),
    "docs/training.md": (
        Substitution("python -m recipes.multi30k",
                     f"python -m recipes.multi30k {_MULTI30K} --tune-alpha 1.0",
                     "steps and sizes, as results.md's run, which the command scores"),
        Substitution("--steps-per-window 200", "--steps-per-window 10", "steps"),
    ),
    "docs/translation.md": (
        Substitution("--reference $M30K/test_2016_flickr.en.gz",
                     "--reference $M30K/test_2016_flickr.en.gz --limit 10", "sizes: 10 sentences"),
        Substitution("zcat $M30K/test_2016_flickr.de.gz >", "zcat $M30K/test_2016_flickr.de.gz | "
                     "head -n 10 >", "sizes: 10 sentences"),
        Substitution("zcat $M30K/test_2016_flickr.en.gz >", "zcat $M30K/test_2016_flickr.en.gz | "
                     "head -n 10 >", "sizes: 10 sentences"),
        Substitution("benchmarks/streaming.py runs/quickstart",
                     "benchmarks/streaming.py runs/quickstart --quick",
                     "sizes: 30 lines, one run of each, the writer's first wait 8 s: the walk "
                     "checks the status, not the times"),
    ),
    "docs/serving.md": (
        Substitution(_EXPORT, f"{_EXPORT} {_FEW_SHAPES}", _FEW_SHAPES_WHY),
        Substitution("8501", "$PORT", "a free port"),
    ),
    "docs/wmt14.md": (
        Substitution("--work-dir /tmp/wmt14_scale", "--quick --pairs 10000 --work-dir wmt14_scale",
                     "sizes: 10,000 pairs, test sets of 16, a folder of the walk's"),
    ),
    "docs/distributed.md": (
        Substitution("--train-limit 2000",
                     f"--train-limit 1000 --max-sentence-length 16 --bucket-width 16 {_ONE_LAYER}",
                     "sizes: 1 batch shape instead of 15, a model of one layer 32 wide"),
        Substitution("127.0.0.1:1234", "127.0.0.1:$PORT", "a free port"),
        Substitution("cluster_faults.py --output docs/results/cluster-faults.json",
                     "cluster_faults.py --backends jax --killed 0 --repeats 1 --output "
                     "cluster-faults.json", "one cluster: JAX's, its coordinator killed (the "
                     "other ends at once); a file of the walk's"),
        Substitution("""WORKERS='["127.0.0.1:2222", "127.0.0.1:2223"]'""",
                     'WORKERS="[\\"127.0.0.1:$PORT_2\\", \\"127.0.0.1:$PORT_3\\"]"',
                     "free ports"),
    ),
    "docs/performance.md": (
        *(Substitution(f"benchmarks/{name}.py", f"benchmarks/{name}.py --quick", "sizes")
          for name in ("training", "matmul", "cpu_step", "chunked_loss", "torch_overhead",
                       "decoding", "serving", "engines")),
        Substitution("--steps 400 --checkpoint-every 200", f"{_MULTI30K}", "steps and sizes"),
        Substitution("--steps 2400 --checkpoint-every 400", f"{_MULTI30K}", "steps and sizes"),
        Substitution("/tmp/before", "../before", "a folder of the walk's"),
        Substitution("/tmp/after", "../after", "a folder of the walk's"),
        Substitution("/tmp/base", "../base", "a folder of the walk's"),
        Substitution("step_by_checkout.py ../before ../after --output",
                     "step_by_checkout.py ../before ../after --steps 2 --output", "steps"),
        Substitution("--steps 30", "--steps 2", "steps"),
        Substitution("benchmarks/torch_decoding.py", "benchmarks/torch_decoding.py --length 4",
                     "sizes"),
        Substitution("python -m recipes.quickstart", f"python -m recipes.quickstart {_QUICKSTART}",
                     "steps and sizes"),
    ),
    "benchmarks/README.md": (
        *(Substitution(f"benchmarks/{name}.py", f"benchmarks/{name}.py --quick", "sizes")
          for name in ("matmul", "training", "decoding", "serving")),
    ),
    "benchmarks/experiments/README.md": (
        Substitution("--steps 200 --rounds 4", "--steps 2 --rounds 1", "steps"),
        *(Substitution(f"experiments/{name}.py", f"experiments/{name}.py --quick", "sizes")
          for name in ("profile_step", "profile_decoding", "beam_reorder")),
        Substitution("quantize_layers.py", "quantize_layers.py --repeats 2", "repeats"),
    ),
}


# What a page takes from a page of another chain, made first in the chain's clone:
# (command, the path it makes, why), printed with the page's table. The page names each path
# where it says what it needs from other pages (test_pages.py checks that it does).
BEFORE = {
    "docs/translation.md": (
        ("python -c \"from keras_transformer.data.corpora import synthetic_translation as s\n"
         "open('test.src', 'w').write('\\\\n'.join(s(20, seed=3).sources) + '\\\\n')\"",
         "test.src",
         "README.md's test.src (docs/results.md has trained the quickstart in this chain)"),
        ("keras-transformer export runs/quickstart ct2_models/quickstart --format ctranslate2",
         "ct2_models/quickstart", "README.md's CTranslate2 export of the quickstart"),
    ),
}


def substitutions(page):
    return SUBSTITUTIONS.get(page, ())


def read(page):
    with open(os.path.join(REPOSITORY, page), encoding="utf-8") as file:
        return file.read()


def blocks(text):
    """[(first line, code, reason not run or None)] of the ```bash blocks of a page's text.
    A comment that starts like the marker and is not one (no reason, a typo) is an error."""
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("<!-- not run") and not NOT_RUN.match(line.strip()):
            raise ValueError(f"line {number}: write the marker as "
                             f"'<!-- not run by the tests: REASON -->', got {line!r}")
    found = []
    for label, line, code in code_blocks(text):
        if label != "bash":
            continue
        above = lines[line - 3].strip() if line >= 3 else ""  # the line above the fence
        marker = NOT_RUN.match(above)
        found.append((line, code, marker.group("reason") if marker else None))
    return found


def script(page, text=None):
    """The page's runnable blocks as one bash script, its substitutions applied in the
    table's order. A substitution that matches none of them (as the entries before it
    left them) is an error: its table is out of date."""
    parts = [(line, code) for line, code, reason in blocks(read(page) if text is None else text)
             if reason is None]
    for entry in substitutions(page):
        if not any(entry.old in code for _, code in parts):
            raise ValueError(f"{page}: the substitution of {entry.old!r} matches no block it runs")
        parts = [(line, code.replace(entry.old, entry.new)) for line, code in parts]
    before = [f"echo {shlex.quote(f'## before {page}: {command}')} >&2\n{command}\n"
              for command, _, _ in BEFORE.get(page, ())]
    return "\n".join(before + [f"echo \"## {page}:{line} (at $SECONDS s)\" >&2\n{code}"
                               for line, code in parts])


def table(page):
    """The page's substitutions and the blocks it leaves out, as printed with each run."""
    rows = [f"### {page}"]
    entries = substitutions(page)
    rows.append("| as the page writes it | as the walk runs it | why |")
    rows.append("| --- | --- | --- |")
    def cell(text):
        return text.replace("|", "\\|").replace("\n", "\\n")

    rows.extend(f"| `{cell(e.old)}` | `{cell(e.new)}` | {e.why} |" for e in entries)
    if not entries:
        rows.append("| (no substitution) | | |")
    if chain_of(page) != "benchmarks":
        rows.append(f"environment: `XLA_FLAGS={WALK_XLA_FLAGS}` ({WALK_XLA_FLAGS_WHY})")
    rows.append(f"environment: `PYTHONFAULTHANDLER=1` ({FAULT_HANDLER_WHY})")
    for command, _, why in BEFORE.get(page, ()):
        rows.append(f"before the page: `{command}` ({why})")
    for line, _, reason in blocks(read(page)):
        if reason is not None:
            rows.append(f"not run: the block at line {line}: {reason}")
    return "\n".join(rows)


def fresh_checkout(directory):
    """A clone of the repository (its history too: pages compare with older commits)
    with the working tree's files on top (tracked, and new ones git does not ignore):
    what the pages run is the code under test, committed or not."""
    subprocess.run(["git", "clone", "--quiet", "--local", "--no-hardlinks", REPOSITORY,
                    directory], check=True, capture_output=True)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"],
                            cwd=REPOSITORY, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, target = os.path.join(REPOSITORY, name), os.path.join(directory, name)
        if not os.path.isfile(source):  # deleted from the working tree
            if os.path.lexists(target):
                os.remove(target)
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# XLA's flags in the chains that do not measure (all but the benchmarks'): the walk's commands
# train tens of steps of a model one layer 32 wide, where compiling is most of their time, and
# XLA compiles faster without LLVM's optimizations and with its older fusion emitters (as the
# suite's tests do: tests/conftest.py). A walk-sized Multi30k run took 10.4 s instead of
# 12.9 s under JAX and 13.7 s instead of 16.6 s under TensorFlow (2-core Intel Xeon). What
# runs is unchanged; the compiled code runs slower, and the walk checks no speed.
WALK_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
WALK_XLA_FLAGS_WHY = ("compiles faster: the walk's runs are mostly compiling (not in the "
                      "benchmarks' chain)")

# A command that crashes in native code (a segmentation fault, an abort) prints every
# thread's Python stack first, as `python -X faulthandler` traced the crash of
# docs/distributed.md's one-process TensorFlow block.
FAULT_HANDLER_WHY = "a crash in native code prints each thread's Python stack"


def environment(home, mirror=None, chain=None):
    """The walk's environment for `chain`: a fresh HOME, no KERAS_BACKEND, the mirror, free
    ports, PYTHONFAULTHANDLER, and XLA_FLAGS set to WALK_XLA_FLAGS (none in the benchmarks'
    chain, whose commands measure; the suite's own XLA_FLAGS stay out everywhere).
    OMP_NUM_THREADS stays, when set: inside the suite it is the pytest worker's share of
    the cores, and the walk shares the machine with the other worker. Without it, torch's
    two threads wait for a taken core: a Multi30k run of the walk's earlier sizes (the
    recipe's 4 layers 128 wide) under torch took 1209 s beside a busy process, 320 s under
    JAX."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("KERAS_", "PYTEST_")) and name != "XLA_FLAGS"}
    env.update(HOME=home, PORT=str(free_port()), PORT_2=str(free_port()),
               PORT_3=str(free_port()), PYTHONFAULTHANDLER="1")
    if mirror is not None:
        env["KERAS_TRANSFORMER_DATA_MIRROR"] = mirror
    if chain != "benchmarks":
        env["XLA_FLAGS"] = WALK_XLA_FLAGS
    return env


@dataclasses.dataclass
class PageRun:
    page: str
    status: int
    seconds: float
    output: str


def run_page(page, directory, env, timeout=1800):
    """Runs the page's script in `directory`; the background jobs it leaves are ended."""
    program = ("set -e\ntrap 'jobs -p | xargs -r kill 2>/dev/null; wait' EXIT\n"
               + script(page) + "\n")
    start = time.monotonic()
    process = subprocess.Popen(["bash", "-c", program], cwd=directory, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += f"\n(the page ran past {timeout} s and was stopped)"
    return PageRun(page, process.returncode, time.monotonic() - start, output)


def failure(run):
    """Where a page stopped: its last block's line, and the output's last lines."""
    started = re.findall(r"^## (\S+:\d+) ", run.output, re.M)
    tail = "\n".join(run.output.splitlines()[-40:])
    where = started[-1] if started else run.page
    return f"{where}: the block ended with status {run.status} after {run.seconds:.0f} s\n{tail}"


def chain_of(page):
    return next(name for name, pages in CHAINS.items() if page in pages)


def walk_chain(pages, directory, env, timeout):
    """Runs the pages in order in `directory` (a fresh clone is made there unless one is),
    printing each page's table, output and time; False at the first page that fails."""
    if not os.path.isdir(os.path.join(directory, ".git")):  # else a walk's, reused
        os.makedirs(directory, exist_ok=True)
        fresh_checkout(directory)
    for page in pages:
        print(table(page), flush=True)
        run = run_page(page, directory, env, timeout=timeout)
        print(run.output if run.status == 0 else failure(run), flush=True)
        print(f"{page}: status {run.status} in {run.seconds:.0f} s\n", flush=True)
        if run.status != 0:
            return False
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", nargs="+", default=PAGES, choices=PAGES, metavar="PAGE",
                        help="the pages, in the order of their chains (default: all)")
    parser.add_argument("--chain", choices=CHAINS, help="the pages of one chain")
    parser.add_argument("--directory", help="where the fresh checkouts go, one folder per "
                        "chain (default: a temporary folder, removed afterwards)")
    parser.add_argument("--list", action="store_true", help="print the tables and the "
                        "scripts, run nothing")
    parser.add_argument("--tables", action="store_true", help="print the tables only")
    parser.add_argument("--timeout", type=int, default=3600, metavar="SECONDS",
                        help="a page's limit (default: %(default)s; docs/performance.md "
                        "alone ran past 1,800 s on the 2-core AMD EPYC)")
    args = parser.parse_args(argv)
    if args.chain:
        args.pages = CHAINS[args.chain]
    if args.list or args.tables:
        for page in args.pages:
            print(table(page), *([] if args.tables else [script(page)]), sep="\n\n",
                  end="\n\n")
        return 0
    chains = {name: [page for page in pages if page in args.pages]
              for name, pages in CHAINS.items()}
    with tempfile.TemporaryDirectory() as scratch:
        base = args.directory or scratch
        from helpers import data_mirror, loopback_http

        # The mirror serves until the last page could end.
        with loopback_http(data_mirror(), lifetime=args.timeout * len(args.pages)) as mirror:
            for name, pages in chains.items():
                if not pages:
                    continue
                home = os.path.join(base, f"{name}-home")
                os.makedirs(home, exist_ok=True)
                if not walk_chain(pages, os.path.join(base, name),
                                  environment(home, mirror, name), args.timeout):
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
