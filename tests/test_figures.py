"""Every table of figures names the commit it was measured on.

A Markdown table of README.md, docs/ or benchmarks/RESULTS.md is a table of figures when
a cell holds a measurement: a decimal number, a number with thousands separators, or one
with a unit (%, ×, ms, s, min, tok/s, MiB). Such a table names its commit, `commit
abcdef1` (seven hexadecimal digits or more), in its own section of the page (from the
heading above it to the next), or in a cell of its own; and every commit named must be
one of the repository's. A table of numbers that are not measurements (the paper's
hyperparameters, say) says so with `<!-- not measured -->` on the line before it.
"""

import glob
import os
import re
import subprocess

import pytest
from helpers import REPOSITORY

pytestmark = pytest.mark.once("torch")

PAGES = ["README.md", *sorted(os.path.relpath(path, REPOSITORY) for path in
                              glob.glob(os.path.join(REPOSITORY, "docs", "*.md"))),
         "benchmarks/RESULTS.md"]
FIGURE = re.compile(r"(?<![§\w.])\d+\.\d+(?![\w.])|\b\d{1,3}(?:,\d{3})+\b"
                    r"|\b\d+(?:\.\d+)?\s?(?:%|×|ms\b|s\b|min\b|tok/s|MiB\b)")
COMMIT = re.compile(r"\bcommits? `([0-9a-f]{7,40})`")
NOT_MEASURED = "<!-- not measured -->"


def tables(text):
    """(first line number, section text, table lines, marked not measured) of each
    table of a Markdown page, outside code blocks."""
    lines = text.splitlines()
    found, fenced, index = [], False, 0
    headings = [i for i, line in enumerate(lines) if line.startswith("#")]
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("|"):
            index += 1
            continue
        end = index
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        above = max([h for h in headings if h < index], default=0)
        below = min([h for h in headings if h > index], default=len(lines))
        marked = index > 0 and lines[index - 1].strip() == NOT_MEASURED
        found.append((index + 1, "\n".join(lines[above:below]), lines[index:end], marked))
        index = end
    return found


def is_table_of_figures(table_lines):
    cells = [cell for row in table_lines[2:] for cell in row.split("|")]
    return any(FIGURE.search(cell) for cell in cells)


def test_tables_of_figures_are_recognised():
    measured = ["| run | ms/step |", "| --- | --- |", "| base | 39.6 |"]
    words = ["| field | base |", "| --- | --- |", "| §3.2 | `d_model` |"]
    assert is_table_of_figures(measured) and not is_table_of_figures(words)
    text = "# A\ntext\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n\n# B\n"
    [(line, section, table, marked)] = tables(text)
    assert line == 4 and section.startswith("# A") and "# B" not in section and not marked


@pytest.mark.parametrize("page", PAGES)
def test_every_table_of_figures_names_its_commit(page):
    with open(os.path.join(REPOSITORY, page), encoding="utf-8") as file:
        text = file.read()
    missing = [f"{page}:{line}" for line, section, table, marked in tables(text)
               if not marked and is_table_of_figures(table) and not COMMIT.search(section)]
    assert missing == [], "tables of figures that name no commit"


def known_commit(commit):
    result = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPOSITORY,
                            capture_output=True)
    return result.returncode == 0


@pytest.mark.parametrize("page", PAGES)
def test_the_commits_named_are_the_repositorys(page):
    if subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPOSITORY,
                      capture_output=True, text=True).stdout.strip() != "false":
        pytest.skip("not a full git clone: its history cannot be checked")
    with open(os.path.join(REPOSITORY, page), encoding="utf-8") as file:
        commits = set(COMMIT.findall(file.read()))
    assert [commit for commit in sorted(commits) if not known_commit(commit)] == []
