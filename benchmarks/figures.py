"""Which tables of figures were measured on code that has changed since their commit.

A table of figures is a Markdown table of README.md, docs/ or benchmarks/RESULTS.md with a
measurement in a cell (a decimal number, thousands separators, or a unit: %, ×, ms, s, min,
tok/s, MiB); it names the commit it was measured at in its section (from the heading above
it to the next), `tests/test_figures.py` checks that it does. The code it measured is what
the section's commands run: benchmark scripts (`benchmarks/NAME.py`), recipes
(`python -m recipes.NAME`) and `keras-transformer` commands, with every file of this
repository they import, followed through each import statement (those inside functions
too) and each sibling script a benchmark names (`"decoding_peers.py"`, which it starts); a
section that names no command measured the whole program. The table is stale when one of
those files' code differs between a commit its section names and the working tree,
docstrings and comments left out (a reworded docstring changes no figure). A stale table is
labelled when its section says "the code has changed since".

    python benchmarks/run_all.py --check           # list them; status 1 if one is unlabelled
    python benchmarks/run_all.py --check --write   # label the unlabelled ones in their pages
"""

import ast
import functools
import glob
import os
import re
import subprocess
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURE = re.compile(r"(?<![§\w.])\d+\.\d+(?![\w.])|\b\d{1,3}(?:,\d{3})+\b"
                    r"|\b\d+(?:\.\d+)?\s?(?:%|×|ms\b|s\b|min\b|tok/s|MiB\b)")
COMMIT = re.compile(r"\bcommits? `([0-9a-f]{7,40})`")
NOT_MEASURED = "<!-- not measured -->"
LABEL = "the code has changed since"
# The markers of the blocks that benchmarks/tables.py writes from results files (its BEGIN
# and END are made of them).
GENERATED_BEGIN, GENERATED_END = "<!-- generated from ", "<!-- end of generated -->"
COMMAND = re.compile(r"benchmarks/(\w+)\.py|recipes\.(\w+)|keras-transformer (\w+)")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
# The scripts that write tables from results files: named in a section, or imported by a
# benchmark that prints its table as a page has it, they measured nothing.
WRITERS = {"tables", "records", "gpu_tables"}
WRITER_FILES = {f"benchmarks/{name}.py" for name in WRITERS}
# The program's folders: what a section with no command measured.
PROGRAM = ("keras_transformer", "keras_transformer_app", "recipes", "benchmarks")


class Table(NamedTuple):
    page: str
    line: int  # of its first row, counted from 1
    commits: tuple
    changed: tuple  # the files whose code changed since one of the commits
    labelled: bool


def pages(root=ROOT):
    """The pages whose tables are checked, relative to `root`."""
    docs = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    return [p for p in ["README.md", *docs, "benchmarks/RESULTS.md"]
            if os.path.exists(os.path.join(root, p))]


def tables(text):
    """(first line number, section text, table lines, marked not measured) of each
    table of a Markdown page, outside code blocks."""
    lines = text.splitlines()
    found, fenced, index = [], False, 0
    headings = sorted(_headings(lines))
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


def entry_files(section, root=ROOT):
    """The repository's files that the section's commands start, or None when it
    names none."""
    files = set()
    # Comments are not the section's commands: a generated block's marker names the
    # script that writes the table (benchmarks/tables.py), which measured nothing; nor is
    # that script where the text names it (`tables.py --record`), and its tables are
    # checked against their results files instead (`python benchmarks/tables.py`).
    section = HTML_COMMENT.sub("", section)
    for script, recipe, command in COMMAND.findall(section):
        if script in WRITERS:
            continue
        path = (f"benchmarks/{script}.py" if script else f"recipes/{recipe}.py" if recipe
                else "keras_transformer_app/__main__.py")
        if os.path.exists(os.path.join(root, path)):
            files.add(path)
    return files or None


def program_files(root=ROOT):
    return {os.path.relpath(path, root) for folder in PROGRAM
            for path in glob.glob(os.path.join(root, folder, "**", "*.py"), recursive=True)}


def imported_files(files, root=ROOT, known=None):
    """`files` with every file of the repository they import, transitively, except the
    scripts that write tables (WRITERS); `known` ({path: the files it imports}) keeps each
    file's imports across calls."""
    known = {} if known is None else known
    seen, todo = set(), list(files)
    while todo:
        path = todo.pop()
        if (path in seen or path in WRITER_FILES
                or not os.path.exists(os.path.join(root, path))):
            continue
        seen.add(path)
        if path not in known:
            with open(os.path.join(root, path), encoding="utf-8") as file:
                source = file.read()
            try:
                known[path] = tuple(_imports(ast.parse(source), path, root))
            except SyntaxError:
                known[path] = ()
        todo.extend(known[path])
    return seen


def _imports(tree, path, root):
    """The repository files that `path`'s import statements (and, in benchmarks/, the
    sibling scripts it names in strings) may load."""
    folder = os.path.dirname(path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package
                package = folder.split("/")[:len(folder.split("/")) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and folder == "benchmarks" and re.fullmatch(r"\w+\.py", node.value)):
            yield f"benchmarks/{node.value}"
    for name in filter(None, names):
        parts = name.split(".")
        if folder == "benchmarks" and len(parts) == 1:  # a sibling: `import common`
            yield f"benchmarks/{parts[0]}.py"
        for end in range(1, len(parts) + 1):  # a.b.c runs a/__init__.py, a/b/__init__.py
            stem = "/".join(parts[:end])
            yield f"{stem}.py"
            yield f"{stem}/__init__.py"


@functools.lru_cache(maxsize=None)
def code_of(source):
    """The source's syntax tree without docstrings, as text (comments and layout are not
    in it); the source itself when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def changed_since(commit, files, root=ROOT, known=None):
    """The files among `files` whose code differs between `commit` and the working tree;
    `known` ({(commit, path): differs}) keeps the answers across calls."""
    known = {} if known is None else known
    asked = sorted(path for path in files if (commit, path) not in known)
    for path, old in zip(asked, _at_commit(commit, asked, root)):
        new_path = os.path.join(root, path)
        new = (open(new_path, encoding="utf-8").read() if os.path.exists(new_path)
               else None)
        known[commit, path] = (old is None or new is None
                               or (old != new and code_of(old) != code_of(new)))
    return sorted(path for path in files if known[commit, path])


def _at_commit(commit, paths, root):
    """Each path's text at `commit` (None where it was not there), read by one
    `git cat-file --batch` rather than a `git show` each."""
    if not paths:
        return []
    output = subprocess.run(["git", "cat-file", "--batch"], cwd=root, check=True,
                            input="".join(f"{commit}:{path}\n" for path in paths).encode(),
                            capture_output=True).stdout
    texts, at = [], 0
    for _ in paths:
        end = output.index(b"\n", at)
        header = output[at:end].rsplit(maxsplit=2)  # OBJECT TYPE SIZE, or NAME missing
        if len(header) < 3 or not header[2].isdigit():  # no object: no contents follow
            texts.append(None)
            at = end + 1
            continue
        size = int(header[2])
        contents = output[end + 1:end + 1 + size]
        texts.append(contents.decode("utf-8", errors="replace") if header[1] == b"blob"
                     else None)  # a folder's tree object is not a file
        at = end + 1 + size + 1
    return texts


def stale_tables(root=ROOT):
    """Every stale table of figures (`Table`), page by page."""
    stale, known, imports = [], {}, {}
    for page in pages(root):
        with open(os.path.join(root, page), encoding="utf-8") as file:
            text = file.read()
        for line, section, table, marked in tables(text):
            commits = tuple(dict.fromkeys(COMMIT.findall(section)))
            if marked or not commits or not is_table_of_figures(table):
                continue
            files = imported_files(entry_files(section, root) or program_files(root), root,
                                   imports)
            changed = {path for commit in commits
                       for path in changed_since(commit, files, root, known)}
            if changed:
                stale.append(Table(page, line, commits, tuple(sorted(changed)),
                                   LABEL in " ".join(section.lower().split())))
    return stale


def label(page, line, root=ROOT):
    """Writes "(the code has changed since)" after the first commit its section names,
    for the table at `line` ("(the code has changed since; ..." into a parenthesis there),
    outside the blocks that tables.py writes (`python benchmarks/tables.py --write` writes
    them again from their results files, without it): where its section names a commit only
    inside such a block, a line saying so goes before the block."""
    path = os.path.join(root, page)
    with open(path, encoding="utf-8") as file:
        lines = file.read().split("\n")
    headings = _headings(lines)
    start = max([i for i in headings if i < line - 1], default=0)
    generated, block = None, None  # the first line of the block we are in; (that, commit)
    written = False
    for index in range(start, len(lines)):
        text = lines[index]
        if index > start and index in headings:  # the next section
            break
        if text.startswith(GENERATED_BEGIN):
            generated = index
        elif text.startswith(GENERATED_END):
            generated = None
        match = COMMIT.search(text)
        if match and generated is not None:
            block = block or (generated, match.group(1))
        elif match:
            before, after = text[:match.end()], text[match.end():]
            # A parenthesis that follows the commit takes the label first.
            lines[index] = (f"{before} ({LABEL}; {after[2:]}" if after.startswith(" (")
                            else f"{before} ({LABEL}){after}")
            written = True
            break
    if not written and block:
        begin, commit = block
        lines[begin:begin] = [f"Measured at commit `{commit}` ({LABEL}):", ""]
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n".join(lines))


def check(write=False, root=ROOT, out=print):
    """Lists the stale tables; with `write`, labels the unlabelled ones. Returns the exit
    status: 1 when an unlabelled one is left."""
    if is_shallow(root):
        out("not a full git clone: the commits' code cannot be compared (git fetch --unshallow)")
        return 0
    stale = stale_tables(root)
    unlabelled = [table for table in stale if not table.labelled]
    for table in stale:
        files = ", ".join(table.changed[:4]) + (
            f" and {len(table.changed) - 4} more" if len(table.changed) > 4 else "")
        state = "labelled" if table.labelled else ("LABELLED NOW" if write else "UNLABELLED")
        out(f"{table.page}:{table.line}  commit {', '.join(table.commits)}  {state}: "
            f"changed since: {files}")
    if write:
        done = set()
        # From the end of each page up, so that the lines a label adds (`label`) do not
        # move the tables still to label.
        for table in sorted(unlabelled, key=lambda table: (table.page, -table.line)):
            # One label a section: its other tables share it.
            if not any(t.page == table.page and _same_section(t, table, root) for t in done):
                label(table.page, table.line, root)
                done.add(table)
    out(f"{len(stale)} stale tables of figures, {len(unlabelled)} of them unlabelled"
        + (" (labelled now)" if write and unlabelled else ""))
    return 1 if unlabelled and not write else 0


def is_shallow(root=ROOT):
    """Whether `root` is a shallow clone (or not a git checkout at all)."""
    result = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=root,
                            capture_output=True, text=True)
    return result.returncode != 0 or result.stdout.strip() != "false"


def _same_section(a, b, root):
    with open(os.path.join(root, a.page), encoding="utf-8") as file:
        headings = _headings(file.read().split("\n"))
    return not any(min(a.line, b.line) - 1 <= i < max(a.line, b.line) for i in headings)


def _headings(lines):
    """The indices of a page's heading lines (a shell comment in a code block is none)."""
    headings, fenced = set(), False
    for index, text in enumerate(lines):
        fenced ^= text.startswith("```")
        if text.startswith("#") and not fenced:
            headings.add(index)
    return headings
