"""The tables of figures that are written from a results file, and the check that each
still says what its file says.

A benchmark writes its results as JSON, with the commit, the machine (its CPU and
widest instruction set) and the command (`common.emit`). A page holds a table made from
such a file between two markers, which name the file and what is made from it:

    <!-- generated from benchmarks/RESULTS.json (run_all.training) by benchmarks/tables.py -->
    | backend | config | ... |
    <!-- end of generated -->

`run_all.py` writes its tables so, `serving.py --output FILE` gives the file that a
serving section is made from, and the `decoding.py --ctranslate2 --output FILE` runs of a
folder make the tables against CTranslate2. A new run replaces the file and the table; git keeps the
history. Text around the markers (the commit line, what the table means) is written by
hand.

    python benchmarks/tables.py           # status 1, and the blocks, where a table differs
    python benchmarks/tables.py --write   # write every block again from its file
    python benchmarks/tables.py --record runs/NAME docs/results/TRIALS/NN-NAME.json --trial NAME

A table of trials (`trials`) is made from a folder of such records, a row each, in the
order of their names, and so is distributed.md's table of one process against a cluster
(`clusters`); the quickstart's table (`quickstart`) from one, recorded with
`--wall-seconds`, the whole command's time as `/usr/bin/time` gave it; wmt14.md's from a
folder of `wmt14_scale.py --output` files; results.md's Table 3 (`table3`) from a copy of
`recipes.table3`'s results.json; results.md's table of one command on each backend
(`backends`) from a list of the runs' records: those kinds are in benchmarks/records.py.
The GPU's tables (`gpu` and the two after it in `KINDS`) are made from gpu_all.sh's
`results.jsonl` by benchmarks/gpu_tables.py.
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import figures  # noqa: E402  (beside this file)
import gpu_tables  # noqa: E402
import recipe_tables  # noqa: E402
import records  # noqa: E402
from records import BACKEND_NAMES, record  # noqa: E402  (`tables.record`: --record's)

# A block's markers (figures.py labels a stale table outside them).
BEGIN = re.compile("^" + re.escape(figures.GENERATED_BEGIN) + r"(?P<source>\S+) "
                   r"\((?P<kind>[\w.]+)\) by benchmarks/tables\.py -->$", re.MULTILINE)
END = figures.GENERATED_END


def begin(source, kind):
    """The opening marker of a block made from `source` (a path from the repository's
    root) by `kind`."""
    return f"{figures.GENERATED_BEGIN}{source} ({kind}) by benchmarks/tables.py -->"


def marked(source, kind, text):
    """`text` between the markers of a block made from `source` by `kind`."""
    return f"{begin(source, kind)}\n{text.strip(chr(10))}\n{END}"


def _run_all(kind, results):
    import run_all

    return run_all.render(kind, run_all.from_json(results))


def _serving(kind, results):
    import serving_report

    return serving_report.markdown(results, results["command"])


# CI's stages (.ci/run), in its order, and the name each is given in the table.
_CI_STAGES = {"install": "install", "ruff": "ruff", "lint-imports": "lint-imports",
              "suite (tensorflow)": "the suite, TensorFlow pass",
              "suite (jax)": "the suite, JAX pass", "suite (torch)": "the suite, PyTorch pass",
              "walk": "the walk", "walk's tables": "the walk's tables",
              "figures --check": "`run_all.py --check`"}
_README_COMMAND = ("install", "ruff", "lint-imports", "suite (tensorflow)", "suite (jax)",
                   "suite (torch)")


def _ci(kind, runs):
    """CI's records (.ci/times.py), a file each (a folder, in the order of their names), a
    column each: the seconds of each stage, of the README's test command and of all of CI;
    then where each pytest run's tests' time went (tests/cpu_time.py), a row per run and
    record; then the walk's chains, from the records that keep them (`_walk_chains`)."""
    import run_all

    labels = list(_CI_STAGES.values())
    readme_row, all_row = "**the README's test command** (the six above)", "**all of `.ci/run`**"
    order = [*labels[:len(_README_COMMAND)], readme_row, *labels[len(_README_COMMAND):], all_row]
    columns, cells, split = [], {label: [] for label in order}, []
    for run in runs:
        stages = {entry["stage"]: entry for entry in run["stages"]}
        missing = [name for name in (*_CI_STAGES, "all") if name not in stages]
        if missing:
            raise ValueError(f"CI's record at {run['commit']} lacks the stages "
                             f"{', '.join(missing)}")
        machine = records._machine(run, article=False)
        columns.append(f"{machine}, commit `{run['commit']}`")
        for name, label in _CI_STAGES.items():
            cells[label].append(f"{stages[name]['seconds']:,}")
        for label, total in ((readme_row, sum(stages[name]["seconds"] for name in _README_COMMAND)),
                             (all_row, stages["all"]["seconds"])):
            cells[label].append(f"**{total:,}** ({total / 60:.1f} min)")
        split += [(_CI_STAGES[name], machine, *(f"{value:,}" for value in (
            tests["seconds"], tests["own_cpu"], tests["started_cpu"],
            tests["seconds"] - tests["own_cpu"] - tests["started_cpu"])))
            for name, entry in stages.items() if (tests := entry.get("tests"))]
    split.sort(key=lambda row: labels.index(row[0]))  # each pytest run's rows together
    return "\n".join([
        *(f"- `{run['command']}` at commit `{run['commit']}`, on {run['cores']} cores of "
          f"{run['cpu']} ({run['isa']})" for run in runs), "",
        "Each run's stages, in seconds:", "",
        run_all.table(("stage", *columns), [(label, *cells[label]) for label in order]),
        "", "Where each pytest run's tests' time went (tests/cpu_time.py), in seconds:", "",
        run_all.table(("pytest run", "machine", "the tests' time", "their own CPU",
                       "the processes they started", "the rest (waiting)"), split),
        *_walk_chains(runs, columns)])


# A page of the walk in CI's record: tests/test_pages.py's test of the page, its chain
# after the "@" that pytest-xdist's --dist loadgroup adds.
_WALKED_PAGE = re.compile(r"::test_the_page_runs\[(?P<page>[^\]]+)\]@(?P<chain>[\w-]+)$")


def _walk_chains(runs, columns):
    """The walk's chains and their pages, in seconds, from the runs whose record keeps its
    tests' times (tests/cpu_time.py's `slowest`), a column each: a chain is its pages,
    walked one after the other on one worker, the chains side by side. [] if none does."""
    import run_all

    walks = []
    for run, column in zip(runs, columns):
        stage = next(entry for entry in run["stages"] if entry["stage"] == "walk")
        pages = {}
        for nodeid, seconds in stage.get("slowest", {}).items():
            if found := _WALKED_PAGE.search(nodeid):
                pages[found["chain"], found["page"]] = seconds
        if pages:
            walks.append((column, pages))
    if not walks:
        return []
    first = walks[0][1]
    chains = {}  # chain -> its pages, in the order the records list them, the first's first
    for _, pages in walks:
        for chain, page in pages:
            if page not in chains.setdefault(chain, []):
                chains[chain].append(page)

    def total(pages, chain):  # of the seconds as the rows show them
        return sum(round(seconds) for (name, _), seconds in pages.items() if name == chain)

    rows = []
    for chain in sorted(chains, key=lambda name: -total(first, name)):
        rows.append((f"**{chain}**", *(f"**{total(pages, chain):,.0f}**"
                                       if total(pages, chain) else "–" for _, pages in walks)))
        rows += [(page, *(f"{pages[chain, page]:,.0f}" if (chain, page) in pages else "–"
                          for _, pages in walks)) for page in chains[chain]]
    return ["", "The walk's chains, each a page after another on one worker, the chains side by "
            "side, in seconds, from the records that keep each test's seconds: a chain, then "
            "its pages, slowest first (a page's test; the chain's first page in its walk order, "
            "`CHAINS` in tests/page_walk.py, also makes the chain's clone):",
            "", run_all.table(("chain, then its pages", *(column for column, _ in walks)), rows)]


def _decoding_peers(kind, runs):
    """`decoding.py --ctranslate2 [--saved-model] --output FILE` runs, a file each
    (a folder, in the order of their names): the commands, commit and machine; ms per
    new token of our cached searches, of the SavedModel and of CTranslate2 in the same
    run; and ours / CTranslate2 fp32, the ratio that compares like with like."""
    import run_all

    if not runs or any("ctranslate2_settings" not in run["summary"] for run in runs):
        raise ValueError("a table against CTranslate2 needs decoding.py --ctranslate2 runs")
    if len({(tuple(run["lengths"]), run["beam_size"]) for run in runs}) > 1:
        raise ValueError("the runs of a table against CTranslate2 decode other lengths or "
                         "beams: run them with the same --lengths and --beam-size")
    lengths = [str(n) for n in runs[0]["lengths"]]
    searches = (("greedy", "greedy"), ("beam", f"beam {runs[0]['beam_size']}"))

    def figures(by_length, digits=2):
        return [f"{by_length[n]:.{digits}f}" for n in lengths]

    lines = []
    for run in runs:
        machine, settings = run["machine"], run["summary"]["ctranslate2_settings"]
        lines.append(f"- `{run['command']}` at commit `{run['commit']}`, on "
                     f"{machine['usable_cores']} cores of {machine['cpu']} "
                     f"({machine['isa']}); CTranslate2 kept fp32 ({settings['fp32']}) "
                     f"and int8 ({settings['int8']})")
    times, ratios = [], []
    for search, label in searches:
        for run in runs:
            name, ms = _run_name(run), run["ms_per_token"]
            ours = run["summary"]["ours_over_ctranslate2"]
            times.append((f"{name} {label}", *figures(ms[f"{search}_cached"])))
            ratios.append((f"{name} {label}", *figures(ours[f"{search}_fp32"])))
            if f"{search}_saved_model" in ms:
                times.append((f"SavedModel {label} ({name} run)",
                              *figures(ms[f"{search}_saved_model"])))
                ratios.append((f"SavedModel {label} ({name} run)",
                               *figures(ours[f"{search}_saved_model_fp32"])))
            for quantization in ("fp32", "int8"):
                times.append((f"CTranslate2 {quantization} {label} ({name} run)",
                              *figures(ms[f"{search}_ct2_{quantization}"])))
    same = []
    for run in runs:
        summary = run["summary"]
        same.append(f"{_run_name(run)} run "
                    f"{summary['greedy_ct2_fp32_matches_cached']:.0%}" + (
                        f" (SavedModel {summary['greedy_saved_model_matches_cached']:.0%})"
                        if "greedy_saved_model_matches_cached" in summary else ""))
    same = ", ".join(same)
    return "\n\n".join([
        "\n".join(lines),
        run_all.table(("ms per new token", *lengths), times),
        run_all.table(("ours / CTranslate2 fp32, same run", *lengths), ratios),
        f"Greedy tokens of CTranslate2 fp32 equal to ours: {same}.",
    ])


def _run_name(run):
    """"JAX", or "JAX capped at AVX2": a decoding.py run's backend and its --max-isa cap."""
    cap = run["machine"].get("isa_cap")
    return BACKEND_NAMES[run["backend"]] + (f" capped at {cap}" if cap else "")


def _streaming(kind, run):
    """A `streaming.py --output FILE` run (docs/translation.md): the command, commit and
    machine; the medians of the start-up, the file and the pipe, and the slow writer's
    latencies, the first line's and the range of the others'."""
    import run_all

    medians, (first, *later) = run["median_seconds"], run["writer_latencies"]
    if not later:
        raise ValueError("a streaming run's writer sent fewer than two lines")
    if run["start_wait"] < 1.5 * medians["start-up"]:
        raise ValueError(f"the writer waited {run['start_wait']:g} s for a command that "
                         f"starts in {medians['start-up']:.1f} s: its first line's time may "
                         "hold the start-up (run it with a longer --start-wait)")
    rows = [("the command with an empty input (its start-up: TensorFlow and the model)",
             f"{medians['start-up']:.2f}"),
            (f"{run['lines']:,} lines from a file, start-up included", f"{medians['file']:.2f}"),
            (f"{run['lines']:,} lines from a pipe that `cat` fills, start-up included",
             f"{medians['pipe']:.2f}"),
            ("a slow writer's first line, answered (its search compiles)", f"{first:.3f}"),
            (f"each of its {len(later)} later lines, answered (the {run['wait_ms']} ms wait for "
             "more lines, and the search)", f"{min(later):.3f} to {max(later):.3f}")]
    return "\n".join([
        f"- `{run['command']}` at commit `{run['commit']}`, on "
        f"{run['machine']['usable_cores']} cores of {records._machine(run['machine'], False)}, "
        f"under {BACKEND_NAMES[run['backend']]}; start-up, file and pipe: the median of "
        f"{run['repeats']} runs each", "",
        run_all.table(("what", "seconds"), rows)])


def _chunked_loss(kind, run):
    """A `chunked_loss.py --output FILE` run (benchmarks/RESULTS.md): the command, commit
    and machine; per backend and vocabulary, each chunk size's ms per step (the median of
    the rounds, and their range) and peak RSS, and its step over the whole logits'."""
    import run_all

    if "--quick" in run["command"].split():
        raise ValueError("a chunked_loss.py --quick run's figures are meaningless: run it "
                         "without --quick")
    rounds = {len(row["round_ms_per_step"]) for row in run["rows"]}
    whole = {(row["backend"], row["vocab_size"]): row["ms_per_step"] for row in run["rows"]
             if row["chunk_size"] is None}
    rows = []
    for row in run["rows"]:
        base = whole.get((row["backend"], row["vocab_size"]))
        spread = row["round_ms_per_step"]
        rows.append((BACKEND_NAMES[row["backend"]], f"{row['vocab_size']:,}",
                     f"chunks of {row['chunk_size']:,}" if row["chunk_size"] else "whole",
                     f"{row['ms_per_step']:,.0f}", f"{min(spread):,.0f}–{max(spread):,.0f}",
                     f"{row['ms_per_step'] / base:.2f}" if base else "–",
                     f"{row['peak_rss_mb'] / 1024:.2f} GiB"))
    batch, length = run["batch"]
    return "\n".join([
        f"- `{run['command']}` at commit `{run['commit']}`, on "
        f"{run['machine']['usable_cores']} cores of {records._machine(run['machine'], False)}; "
        f"one batch of {batch} × {length} tokens a side, one process per row and round, "
        f"the median of {'/'.join(str(n) for n in sorted(rounds))} interleaved rounds", "",
        run_all.table(("backend", "vocabulary", "logits", "ms per step", "rounds",
                       "× whole logits", "peak RSS"), rows)])


def _cpu_step(kind, runs):
    """A folder of `cpu_step.py --output FILE` runs, or one: `cpu_step.table`."""
    import cpu_step

    runs = runs if isinstance(runs, list) else [runs]  # a folder of runs, or one run
    if quick := [run["command"] for run in runs if run.get("quick")]:
        raise ValueError(f"a cpu_step.py --quick run's figures are meaningless: {quick[0]}")
    return cpu_step.table(runs)


def _script_table(kind, result):
    """A results file (`--output FILE`) of the script `benchmarks/KIND.py`, whose own
    `table` makes its Markdown (cluster_faults.py, isa_check.py, torch_overhead.py,
    torch_decoding.py, step_by_checkout.py, engines.py)."""
    import importlib

    return importlib.import_module(kind).table(result)


# The function that makes each kind of block from its results.
KINDS = {
    "run_all.header": _run_all, "run_all.targets": _run_all, "run_all.matmul": _run_all,
    "run_all.training": _run_all, "run_all.decoding": _run_all,
    "serving": _serving,
    "trials": records.trials,  # a folder of records, a row each, in the order of their names
    "ci": _ci,  # a folder of CI's records of its stages' time (.ci/times.py), a column each
    "decoding_peers": _decoding_peers,  # a folder of decoding.py --ctranslate2 runs
    "quickstart": records.quickstart,  # the quickstart's record (--record ... --wall-seconds)
    "recipe_run": records.recipe_run,  # one recipe run's record (--record): its test BLEU
    "table3": records.table3,  # recipes.table3's results.json: a row per variant
    "clusters": records.clusters,  # a folder of records: distributed.md's runs, a row each
    "wmt14_scale": records.wmt14_scale,  # a folder of wmt14_scale.py --output runs
    "headlines": records.headlines,  # README's results, a row each from its results file
    "backends": records.backends,  # one command on each backend: a row per run's record
    "streaming": _streaming,  # streaming.py --output: translate's start-up, file, pipe, writer
    "chunked_loss": _chunked_loss,  # chunked_loss.py --output: the step, whole against chunks
    "cpu_step": _cpu_step,  # a folder of cpu_step.py --output runs: a column pair each
    "lowest_versions": records.lowest_versions,  # .ci/lowest_versions.py --output: one line
    "cluster_faults": _script_table,  # cluster_faults.py --output: a cluster's process killed
    "isa_check": _script_table,  # isa_check.py --output: what each engine picked, and capped
    "torch_overhead": _script_table,  # a folder of torch_overhead.py --output runs: the steps
    "torch_decoding": _script_table,  # torch_decoding.py --output: traced loops against eager
    "step_by_checkout": _script_table,  # step_by_checkout.py --output runs: a step per checkout
    "engines": _script_table,  # engines.py --output runs: the SavedModel against CTranslate2
    "recipe_windows": recipe_tables.windows,  # a folder of one recipe command's records per backend
    "gpu": gpu_tables.gpu,  # gpu_all.sh's results.jsonl: a row per model and peer
    "gpu_before_after": gpu_tables.gpu_before_after,  # the same with BEFORE: the pairs of JAX base
    "gpu_paper_time": gpu_tables.gpu_paper_time,  # the same: the paper's training time per model
}


def render(source, kind, repository=REPOSITORY):
    """The block's text as the results file `source` gives it."""
    if kind not in KINDS:
        raise ValueError(f"{source}: no table is made by {kind!r}; known: {', '.join(KINDS)}")
    results = records.load(os.path.join(repository, source))
    if kind in ("headlines", "backends"):  # its rows name further files, read from the
        # same repository
        return KINDS[kind](kind, results, root=repository).strip("\n")
    return KINDS[kind](kind, results).strip("\n")


def _spans(text):
    """[(line, source, kind, start, end)]: each generated block's text is text[start:end]."""
    found = []
    for match in BEGIN.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        end = text.find("\n" + END, match.end())
        if end < 0:
            raise ValueError(f"line {line}: a generated block without its {END!r}")
        found.append((line, match["source"], match["kind"], match.end() + 1, end))
    return found


def blocks(text):
    """[(line, source, kind, the block's text)] of the generated blocks of a page."""
    return [(line, source, kind, text[start:end].strip("\n"))
            for line, source, kind, start, end in _spans(text)]


def pages(repository=REPOSITORY):
    """The pages that may hold generated blocks: the README, docs/ and the benchmarks'."""
    return figures.pages(repository)


def differences(repository=REPOSITORY):
    """["PAGE:LINE (source, kind)"] of the blocks that differ from their results file."""
    differ = []
    for page in pages(repository):
        with open(os.path.join(repository, page), encoding="utf-8") as file:
            text = file.read()
        for line, source, kind, block in blocks(text):
            if block != render(source, kind, repository):
                differ.append(f"{page}:{line} ({source}, {kind})")
    return differ


def write(repository=REPOSITORY):
    """Writes every generated block again from its results file; returns the pages
    changed."""
    changed = []
    for page in pages(repository):
        path = os.path.join(repository, page)
        with open(path, encoding="utf-8") as file:
            text = file.read()
        new = text
        for _, source, kind, start, end in reversed(_spans(text)):
            new = new[:start] + render(source, kind, repository) + new[end:]
        if new != text:
            with open(path, "w", encoding="utf-8") as file:
                file.write(new)
            changed.append(page)
    return changed


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true",
                        help="write every generated block again from its results file")
    parser.add_argument("--record", nargs=2, metavar=("RUN_DIR", "OUTPUT"),
                        help="write the record of a finished training run (a row of a table "
                             "of trials, the quickstart's table) to OUTPUT")
    parser.add_argument("--trial", help="with --record: the run's name (a trial's row)")
    parser.add_argument("--commit", help="with --record, for a run whose results.json "
                                         "names no provenance: the commit it ran")
    parser.add_argument("--command", help="with --record: the command it ran, likewise")
    parser.add_argument("--wall-seconds", type=float,
                        help="with --record: the whole command's seconds, start to end "
                             "(/usr/bin/time's elapsed time)")
    args = parser.parse_args(argv)
    if not args.record and (args.trial or args.commit or args.command
                            or args.wall_seconds is not None):
        parser.error("--trial, --commit, --command and --wall-seconds go with --record")
    if args.record:
        if not args.trial:
            parser.error("--record needs --trial")
        given = {"commit": args.commit, "command": args.command}
        record(*args.record, args.trial,
               {key: value for key, value in given.items() if value} or None,
               args.wall_seconds)
        return 0
    if args.write:
        for page in write():
            print(f"wrote {page}")
        return 0
    differ = differences()
    for entry in differ:
        print(f"{entry}: differs from its results file (python benchmarks/tables.py --write)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
