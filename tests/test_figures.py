"""Every table of figures names the commit it was measured on.

A Markdown table of README.md, docs/ or benchmarks/RESULTS.md is a table of figures when
a cell holds a measurement: a decimal number, a number with thousands separators, or one
with a unit (%, ×, ms, s, min, tok/s, MiB). Such a table names its commit, `commit
abcdef1` (seven hexadecimal digits or more), in its own section of the page (from the
heading above it to the next), or in a cell of its own; and every commit named must be
one of the repository's. A table of numbers that are not measurements (the paper's
hyperparameters, say) says so with `<!-- not measured -->` on the line before it.

The figures of the prose come from results files too (tests/figures_in_prose.py), or are
declared in tests/figures_declared.txt.
"""

import os
import subprocess

import figures_in_prose as prose
import pytest
from helpers import REPOSITORY, benchmark_module

pytestmark = pytest.mark.once("torch")


# The tables, their commits, and which were measured on code that has changed since.
figures = benchmark_module("figures")
PAGES = figures.pages(REPOSITORY)
COMMIT = figures.COMMIT
tables, is_table_of_figures = figures.tables, figures.is_table_of_figures


def test_tables_of_figures_are_recognised():
    measured = ["| run | ms/step |", "| --- | --- |", "| base | 39.6 |"]
    words = ["| field | base |", "| --- | --- |", "| §3.2 | `d_model` |"]
    assert is_table_of_figures(measured) and not is_table_of_figures(words)
    text = "# A\ntext\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n\n# B\n"
    [(line, section, table, marked)] = tables(text)
    assert line == 4 and section.startswith("# A") and "# B" not in section and not marked
    # A shell comment in a code block is no heading: the section still starts at "# A".
    text = "# A\nAt commit `abc1234`:\n\n```bash\n# run it\n```\n\n| a | b |\n| --- | --- |\n"
    [(line, section, table, marked)] = tables(text)
    assert section.startswith("# A\nAt commit `abc1234`")


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
    if figures.is_shallow(REPOSITORY):
        pytest.skip("not a full git clone: its history cannot be checked")
    with open(os.path.join(REPOSITORY, page), encoding="utf-8") as file:
        commits = set(COMMIT.findall(file.read()))
    assert [commit for commit in sorted(commits) if not known_commit(commit)] == []


def git(folder, *arguments):
    return subprocess.run(["git", *arguments], cwd=folder, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_table_is_stale_when_the_code_its_command_imports_changes(tmp_path):
    """In a repository of its own: a page's table measured by benchmarks/speed.py, which
    imports keras_transformer.fast; a docstring edit leaves it current, a code edit makes
    it stale, and --write labels it."""
    files = {"keras_transformer/__init__.py": "",
             "keras_transformer/fast.py": '"""Fast."""\n\ndef f():\n    return 1\n',
             "keras_transformer/other.py": "def g():\n    return 2\n",
             "benchmarks/speed.py": "from keras_transformer import fast\n"}
    for name, text in files.items():
        os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
        (tmp_path / name).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code",
        "--allow-empty")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    commit = git(tmp_path, "rev-parse", "--short=7", "HEAD")
    os.makedirs(tmp_path / "docs")
    page = tmp_path / "docs" / "speed.md"
    page.write_text(f"# Speed\n\nAt commit `{commit}`, `python benchmarks/speed.py`:\n\n"
                    "| run | ms |\n| --- | --- |\n| one | 12.5 |\n")
    lines = []
    assert figures.check(root=str(tmp_path), out=lines.append) == 0
    assert lines == ["0 stale tables of figures, 0 of them unlabelled"]

    (tmp_path / "keras_transformer/fast.py").write_text(
        '"""Faster, says the docstring."""\n\n# a comment\ndef f():\n    return 1\n')
    (tmp_path / "keras_transformer/other.py").write_text("def g():\n    return 3\n")
    assert figures.stale_tables(str(tmp_path)) == []  # other.py is not imported

    (tmp_path / "keras_transformer/fast.py").write_text("def f():\n    return 2\n")
    [table] = figures.stale_tables(str(tmp_path))
    assert (table.page, table.line, table.changed, table.labelled) == (
        "docs/speed.md", 5, ("keras_transformer/fast.py",), False)
    lines.clear()
    assert figures.check(root=str(tmp_path), out=lines.append) == 1
    assert "docs/speed.md:5" in lines[0] and "UNLABELLED" in lines[0]
    assert figures.check(write=True, root=str(tmp_path), out=lines.append) == 0
    assert f"commit `{commit}` (the code has changed since)," in page.read_text()
    [table] = figures.stale_tables(str(tmp_path))
    assert table.labelled

    # Tables whose sections name their commit only inside a block that tables.py writes
    # (which --write there would undo): the label goes in a line of its own before the
    # block, in each section (the lines added above do not move the label of the next).
    block = ["<!-- generated from results.json (speed) by benchmarks/tables.py -->",
             f"`python benchmarks/speed.py` at commit `{commit}`:",
             "| run | ms |", "| --- | --- |", "| one | 12.5 |", "<!-- end of generated -->"]
    sections = [["# Speed", "", "```bash", "# measures", "```", "", *block], ["## Again", *block],
                ["## Once more", *block], ["## Next", "", f"At commit `{commit}`."]]
    page.write_text("\n".join(line for section in sections for line in section) + "\n")
    assert [table.labelled for table in figures.stale_tables(str(tmp_path))] == [False] * 3
    assert figures.check(write=True, root=str(tmp_path), out=lines.append) == 0
    label = [f"Measured at commit `{commit}` (the code has changed since):", ""]
    sections = [section[:-len(block)] + label + block for section in sections[:3]] + sections[3:]
    assert page.read_text() == "\n".join(line for section in sections for line in section) + "\n"
    assert [table.labelled for table in figures.stale_tables(str(tmp_path))] == [True] * 3


def test_the_script_that_writes_tables_is_not_what_a_section_measured():
    """`benchmarks/tables.py` (in the text, or in a generated block's marker) writes a table
    from its results file and measures nothing: the section's other commands are what it
    measured, and with none, the whole program."""
    section = ("<!-- generated from x.json (trials) by benchmarks/tables.py -->\n"
               "Recorded by `python benchmarks/tables.py --record RUN OUT` after "
               "`python -m recipes.multi30k`.\n")
    assert figures.entry_files(section) == {"recipes/multi30k.py"}
    assert figures.entry_files("Written by `python benchmarks/tables.py --write`.") is None
    # Nor when a benchmark imports it to print its table as the page has it.
    scale = figures.imported_files({"benchmarks/wmt14_scale.py"}, REPOSITORY)
    assert "benchmarks/common.py" in scale
    assert not scale & {"benchmarks/records.py", "benchmarks/tables.py"}


def test_every_stale_table_of_figures_says_so():
    """`python benchmarks/run_all.py --check`: no table measured on code that has changed
    since its commit without "the code has changed since" (--write adds it)."""
    if figures.is_shallow(REPOSITORY):
        pytest.skip("not a full git clone: its history cannot be checked")
    unlabelled = [f"{t.page}:{t.line} (commit {', '.join(t.commits)}; changed: "
                  f"{', '.join(t.changed[:3])}...)"
                  for t in figures.stale_tables(REPOSITORY) if not t.labelled]
    assert unlabelled == [], "run python benchmarks/run_all.py --check --write"


def test_a_generated_blocks_marker_is_not_a_command_of_its_section():
    # The marker names the script that writes the table (benchmarks/tables.py), which
    # measured nothing: a change to it leaves the figures current.
    block = ("<!-- generated from docs/results/x.json (quickstart) by benchmarks/tables.py -->\n"
             "| a |\n| --- |\n| 1 |\n<!-- end of generated -->\n")
    assert figures.entry_files(block, REPOSITORY) is None
    assert figures.entry_files("`python benchmarks/decoding.py`:\n\n" + block,
                               REPOSITORY) == {"benchmarks/decoding.py"}


def test_the_prose_scan_finds_figures_and_their_sources():
    text = ("- **A trial** scores 42.10 at α 1.4, 0.61 above the defaults' 41.49, in 197.2 ms\n"
            "  (1.36× the peer's; `--steps 8000` and 3.14.1 are not figures; §6.1 neither).\n\n"
            "```bash\npython x.py 2.5\n```\n"
            "<!-- generated from docs/results/x.json (kind) by benchmarks/tables.py -->\n"
            "| 9.99 |\n<!-- end of generated -->\n| hand | 7.5 s |\n")
    [(first, item), (row, cells)] = prose.paragraphs(text.splitlines())
    assert (first, row) == (1, 10) and cells == "| hand | 7.5 s |"
    written = prose.figures(item)
    assert written == ["42.10", "1.4", "0.61", "41.49", "197.2 ms", "1.36×"]
    sourced = [f for f in written if prose._matches(f, {"41.49"}, [42.0951, 0.1972, 1.4])]
    assert sourced == ["42.10", "1.4", "41.49", "197.2 ms"]  # rounded as written; s as ms
    assert prose._derived("0.61", sourced) and not prose._derived("1.36×", sourced)
    # A whole number below 1,000 comes from a number written in a block, not from any of
    # a results file's: "241 ms" from a cell's 241.3.
    assert prose._matches("241 ms", {"241.3"}, []) and not prose._matches("3×", {"2.5"}, [3.0])


def test_every_figure_in_the_prose_comes_from_a_results_file_or_is_declared():
    """Issue 83: a measured figure is written from its results file; one that is not a
    measurement, or follows from others, says so in tests/figures_declared.txt."""
    missing = prose.unsourced(REPOSITORY)
    declared = prose.declared()
    undeclared = sorted({f"{page}:{line}: {figure}" for page, line, figure in missing
                         if (page, figure) not in declared})
    assert not undeclared, (
        "figures that no results file of their section holds: write them in a generated "
        "table (benchmarks/tables.py), link their section to it, or declare what they are "
        "in tests/figures_declared.txt:\n" + "\n".join(undeclared))


def test_every_declared_figure_is_still_written_and_still_unsourced():
    unsourced = {(page, figure) for page, _, figure in prose.unsourced(REPOSITORY)}
    stale = [f"{page} | {figure}" for page, figure in prose.declared()
             if (page, figure) not in unsourced]
    assert not stale, ("declared in tests/figures_declared.txt but no page's prose writes "
                       "them any more, or a results file now holds them:\n" + "\n".join(stale))
