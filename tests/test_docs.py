"""The manual's code runs as written: every ```python block of README.md and docs/*.md.

A page reads like a notebook: its blocks run in order in one fresh namespace, in a temporary
working directory, under the backend of the pass. README.md's run in every pass, since the
README says its snippet runs unchanged on the three backends; the other pages' in the torch
pass only (their subject is the library's API, which the backend tests cover per backend).
A failure names the page and the line where its block starts, and the traceback gives the
page's own line numbers. Shell commands sit in ```bash blocks, which are not run.
"""

import glob
import os
import re

import pytest
from figures_in_prose import anchor
from helpers import REPOSITORY

_FENCE = re.compile(r"^```\s*(\S*)\s*$")
# Fence labels that would hide Python code from this test.
_OTHER_PYTHON_LABELS = ("py", "python3", "pycon", "ipython", "Python")


def code_blocks(text):
    """(label, first line number, code) of each fenced block of Markdown text,
    counting lines from 1; the label is the word after the opening fence."""
    blocks, label, start, lines = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if label is None:
            if fence:
                label, start, lines = fence.group(1), number + 1, []
        elif fence and not fence.group(1):
            blocks.append((label, start, "\n".join(lines) + "\n"))
            label = None
        elif fence or line.startswith("```"):  # a closing fence with text after it
            raise ValueError(f"line {number}: a fence inside the ```{label} block opened at "
                             f"line {start - 1}: close each block with a line of ``` alone")
        else:
            lines.append(line)
    if label is not None:
        raise ValueError(f"a ```{label} block opened at line {start - 1} is never closed")
    return blocks


def _read(page):
    with open(os.path.join(REPOSITORY, page), encoding="utf-8") as file:
        return file.read()


def _pages():
    docs = sorted(os.path.relpath(path, REPOSITORY)
                  for path in glob.glob(os.path.join(REPOSITORY, "docs", "*.md")))
    return ["README.md", *docs]


PAGES = _pages()
# The pages whose links are checked: these, and the benchmarks' and the exports' folder's.
LINKED_PAGES = [*PAGES, "benchmarks/README.md", "benchmarks/RESULTS.md",
                "benchmarks/experiments/README.md", "saved_models/README.md"]
PAGES_WITH_CODE = [page for page in PAGES
                   if any(label == "python" for label, _, _ in code_blocks(_read(page)))]


@pytest.mark.once("jax")  # reads the pages, not the backend
def test_code_blocks_are_found_with_their_lines():
    text = "# Title\n\n```python\nx = 1\n\ny = 2\n```\n\ntext\n```bash\nls\n```\n```\ntree\n```\n"
    assert code_blocks(text) == [("python", 4, "x = 1\n\ny = 2\n"), ("bash", 11, "ls\n"),
                                 ("", 14, "tree\n")]
    with pytest.raises(ValueError, match="line 1 is never closed"):
        code_blocks("```python\nx = 1\n")
    # Text after a closing fence makes it no fence: the block would run on into the next.
    with pytest.raises(ValueError, match="line 3: a fence inside the ```bash block opened at "
                                         "line 1"):
        code_blocks("```bash\nls\n``` Then the prose.\n```bash\npwd\n```\n")


@pytest.mark.once("jax")  # reads the pages, not the backend
def test_the_readme_and_the_manual_hold_python_blocks():
    assert "README.md" in PAGES_WITH_CODE
    assert any(page.startswith("docs") for page in PAGES_WITH_CODE)


@pytest.mark.once("jax")  # reads the pages, not the backend
@pytest.mark.parametrize("page", PAGES)
def test_python_code_is_labelled_python(page):
    hidden = [(label, line) for label, line, _ in code_blocks(_read(page))
              if label in _OTHER_PYTHON_LABELS]
    assert not hidden, f"{page}: label these blocks ```python so that they run: {hidden}"


_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$")


def _anchors(path):
    with open(path, encoding="utf-8") as file:
        text = file.read()
    fenced = {line for _, start, code in code_blocks(text)
              for line in range(start, start + code.count("\n"))}
    return {anchor(match.group(1)) for number, line in enumerate(text.splitlines(), 1)
            if number not in fenced and (match := _HEADING.match(line))}


@pytest.mark.once("jax")  # reads the pages, not the backend
def test_anchors_follow_github():
    assert anchor("Training on a CPU") == "training-on-a-cpu"
    assert anchor("GPU: `model.fit` in mixed precision (gpu_all.sh)") == \
        "gpu-modelfit-in-mixed-precision-gpu_allsh"


@pytest.mark.once("jax")  # reads the pages, not the backend
@pytest.mark.parametrize("page", LINKED_PAGES)
def test_relative_links_lead_somewhere(page):
    """Every link to a file of the repository names a file that exists, and every
    #anchor in a Markdown file names one of its headings."""
    text = _read(page)
    fenced = {line for _, start, code in code_blocks(text)
              for line in range(start, start + code.count("\n"))}
    broken = []
    for number, line in enumerate(text.splitlines(), 1):
        if number in fenced:
            continue
        for target in _LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, fragment = target.partition("#")
            path = os.path.normpath(os.path.join(REPOSITORY, os.path.dirname(page), path)
                                    if path else os.path.join(REPOSITORY, page))
            if not os.path.exists(path):
                broken.append(f"line {number}: {target} (no such file)")
            elif fragment and path.endswith(".md") and fragment not in _anchors(path):
                broken.append(f"line {number}: {target} (no such heading)")
    assert not broken, f"{page}: " + "; ".join(broken)


# Pages whose blocks run under every backend: the README's snippet, and the library's page
# (its own model from the blocks, a loaded model trained on, `Translator`); the other
# pages' blocks run once.
ON_EVERY_BACKEND = ("README.md", "docs/library.md")


@pytest.mark.slow
@pytest.mark.parametrize("page", [page if page in ON_EVERY_BACKEND else
                                  pytest.param(page, marks=pytest.mark.once("torch"))
                                  for page in PAGES_WITH_CODE])
def test_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = os.path.join(REPOSITORY, page)
    namespace = {"__name__": "__main__"}
    for label, line, code in code_blocks(_read(page)):
        if label != "python":
            continue
        # Blank lines in front, so that the traceback's line numbers are the page's.
        program = compile("\n" * (line - 1) + code, path, "exec")
        try:
            exec(program, namespace)
        except Exception as error:
            raise AssertionError(
                f"{page}: the python block at line {line} failed: {error!r}") from error


@pytest.mark.once("jax")  # reads the pages, not the backend
def test_the_command_reference_is_the_parsers():
    """docs/commands.md is generated from the parsers
    (`python -m keras_transformer_app.reference > docs/commands.md`): every command, option,
    default and help text there is the parsers' own."""
    from keras_transformer_app import compat, reference

    with open(os.path.join(REPOSITORY, "docs", "commands.md"), encoding="utf-8") as file:
        page = file.read()
    generated = reference.reference()
    assert page == generated, (
        "docs/commands.md differs from the parsers: run `python -m keras_transformer_app."
        "reference > docs/commands.md`")
    for name, parser in reference.parsers():  # nothing left out
        assert f"## `{name}`" in page
        for action, _ in compat.parser_actions(parser):
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in page, (name, flag)


@pytest.mark.once("jax")  # reads the pages, not the backend
def test_the_statements_index_is_the_tests_markers():
    """docs/claims.md lists every `backs` marker of the tests, each quote still on its page
    (`python tests/claims.py > docs/claims.md` writes it)."""
    import claims

    found = claims.markers()
    assert found, "no test backs a statement"
    for page, quote, test_file, test in found:
        assert os.path.exists(os.path.join(REPOSITORY, page)), (test_file, test, page)
        claims.line_of(page, quote)  # raises, naming the page and the quote
    assert _read("docs/claims.md") == claims.index(), (
        "docs/claims.md differs from the tests' markers: run `python tests/claims.py > "
        "docs/claims.md`")


@pytest.mark.once("jax")  # reads the pages, not the backend
def test_the_paper_pages_modules_are_where_it_says():
    """docs/paper.md names each module by its path under keras_transformer/, or under
    keras_transformer_app/ where it starts with app/: each is there, and each module of
    both packages is named (its folder, at least)."""
    page = _read("docs/paper.md")
    cells = re.findall(r"(?<=\|) ((?:`[^`]+`(?:, )?)+) (?=\|)", page)  # cells of paths alone
    named = {name for cell in cells
             for name in re.findall(r"`((?:app/)?[a-z_0-9/]+(?:\.py|/))`", cell)}
    where = {name: os.path.join(REPOSITORY, "keras_transformer_app", name[len("app/"):])
             if name.startswith("app/") else os.path.join(REPOSITORY, "keras_transformer", name)
             for name in named}
    assert [name for name, path in where.items() if not os.path.exists(path)] == []
    modules = [os.path.relpath(path, REPOSITORY) for package in ("keras_transformer",
                                                                 "keras_transformer_app")
               for path in glob.glob(os.path.join(REPOSITORY, package, "**", "*.py"),
                                     recursive=True)]
    shown = {os.path.relpath(path, REPOSITORY) + ("/" if path.endswith("/") else "")
             for path in where.values()}
    unnamed = [module for module in modules
               if os.path.basename(module) not in ("__init__.py", "__main__.py")
               and module not in shown and os.path.dirname(module) + "/" not in shown]
    assert unnamed == []
