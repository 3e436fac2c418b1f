"""The tables of figures that are written from a results file, and the check that each
still says what its file says.

A benchmark writes its results as JSON, with the commit, the machine (its CPU and
widest instruction set) and the command (`common.emit`). A page holds a table made from
such a file between two markers, which name the file and what is made from it:

    <!-- generated from benchmarks/RESULTS.json (run_all.training) by benchmarks/tables.py -->
    | backend | config | ... |
    <!-- end of generated -->

`run_all.py` writes its tables so, and `serving.py --output FILE` gives the file that a
serving section is made from. A new run replaces the file and the table; git keeps the
history. Text around the markers (the commit line, what the table means) is written by
hand.

    python benchmarks/tables.py           # status 1, and the blocks, where a table differs
    python benchmarks/tables.py --write   # write every block again from its file
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

BEGIN = re.compile(r"^<!-- generated from (?P<source>\S+) \((?P<kind>[\w.]+)\) by "
                   r"benchmarks/tables\.py -->$", re.MULTILINE)
END = "<!-- end of generated -->"


def begin(source, kind):
    """The opening marker of a block made from `source` (a path from the repository's
    root) by `kind`."""
    return f"<!-- generated from {source} ({kind}) by benchmarks/tables.py -->"


def marked(source, kind, text):
    """`text` between the markers of a block made from `source` by `kind`."""
    return f"{begin(source, kind)}\n{text.strip(chr(10))}\n{END}"


def _run_all(kind, results):
    import run_all

    return run_all.render(kind, run_all.from_json(results))


def _serving(kind, results):
    import serving_report

    return serving_report.markdown(results, results["command"])


# What each kind is made by: (the script whose results it reads, the function).
KINDS = {
    "run_all.header": _run_all, "run_all.targets": _run_all, "run_all.matmul": _run_all,
    "run_all.training": _run_all, "run_all.decoding": _run_all,
    "serving": _serving,
}


def render(source, kind, repository=REPOSITORY):
    """The block's text as the results file `source` gives it."""
    if kind not in KINDS:
        raise ValueError(f"{source}: no table is made by {kind!r}; known: {', '.join(KINDS)}")
    with open(os.path.join(repository, source), encoding="utf-8") as file:
        results = json.load(file)
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
    import figures

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
    args = parser.parse_args(argv)
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
