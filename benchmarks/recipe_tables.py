"""Tables of recipe runs' windows, from their records (`benchmarks/tables.py --record`):
what a recipe's first windows cost under each backend, compilation apart (docs/performance.md's
Multi30k windows, made by tables.py's kind `recipe_windows`)."""

import records
import run_all


def windows(kind, runs):
    """A folder of records of one recipe command run under each backend, a row each: the
    backend, the CPU and the commit, the first two windows' seconds with the compilation in
    each (`compile_seconds`: the stalls of steps that compiled a new batch shape), and a step of
    the second window with its compilation and validation pass left out."""
    rows, sizes = [], set()
    for run in runs:
        made, seconds = run["provenance"], run["window_seconds"]
        first, second = sorted(seconds, key=int)[:2]
        sizes.add((int(first), int(second) - int(first)))
        step = (seconds[second] - run["compile_seconds"][second]
                - run["validation_seconds"][second]) / (int(second) - int(first))
        rows.append((records.BACKEND_NAMES[run["backend"]], records._machine(made, False),
                     f"commit `{made['commit']}`",
                     *(f"{seconds[end]:.1f} s ({run['compile_seconds'][end]:.1f} s)"
                       for end in (first, second)), f"{step:.2f} s"))
    if len(sizes) != 1:
        raise ValueError(f"the runs' first windows differ in size: {sorted(sizes)}")
    (first, size), = sizes
    return run_all.table(("backend", "CPU", "code", f"first window of {first} steps "
                          "(its compilation)", f"second window of {size} (its compilation)",
                          "a step of the second window, compilation and validation left out"),
                         rows)
