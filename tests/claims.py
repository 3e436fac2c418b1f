"""The index of the pages' statements of behaviour and the tests that back them.

A test that backs a statement of a page says so with a marker that quotes it:

    @pytest.mark.backs("docs/troubleshooting.md",
                       "A closed output pipe (`| head`) ends it with status 1")

The quote is a piece of one line of the page, as the page writes it. This script reads the
markers from the tests' source (it imports nothing of them) and writes docs/claims.md: per
page, each statement's line, the quote and its tests. tests/test_docs.py fails when a quote
is no longer in its page or when docs/claims.md is not what this script writes:

    python tests/claims.py > docs/claims.md
"""

import ast
import collections
import glob
import os
import sys
import textwrap

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "backs"


def _marker(decorator):
    """(page, quote) of a `pytest.mark.backs("page", "quote")` decorator, else None."""
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == MARKER):
        return None
    arguments = [ast.literal_eval(argument) for argument in decorator.args]
    if len(arguments) != 2 or not all(isinstance(a, str) for a in arguments):
        raise ValueError(f"line {decorator.lineno}: write @pytest.mark.backs(PAGE, QUOTE)")
    return tuple(arguments)


def markers():
    """[(page, quote, test file, test name)] of every backs marker of tests/, in file order."""
    found = []
    for path in sorted(glob.glob(os.path.join(REPOSITORY, "tests", "**", "test_*.py"),
                                 recursive=True)):
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
        name = os.path.relpath(path, REPOSITORY)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    claim = _marker(decorator)
                    if claim is not None and not node.name.startswith("test_"):
                        # pytest ignores a marker on a helper: the statement would be unbacked.
                        raise ValueError(f"{name}:{decorator.lineno}: a backs marker on "
                                         f"{node.name}, which is not a test")
                    if claim is not None:
                        found.append((*claim, name, node.name))
    return found


def line_of(page, quote):
    """The number of the page's line that holds the quote; ValueError if none does."""
    with open(os.path.join(REPOSITORY, page), encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if quote in line:
                return number
    raise ValueError(f"{page} no longer says {quote!r}: update the test's backs marker "
                     f"(or the page)")


def index():
    """docs/claims.md's text."""
    claims = collections.defaultdict(lambda: collections.defaultdict(list))
    for page, quote, test_file, test in markers():
        claims[page][quote].append((test_file, test))
    out = ["# Statements and their tests", "", textwrap.fill(
        "Each statement of behaviour below is quoted from its page, with the tests that check "
        "it. The list is generated from the tests' `@pytest.mark.backs(PAGE, QUOTE)` markers "
        "(`python tests/claims.py > docs/claims.md`), and the tests fail when a quote has left "
        "its page or this list differs from the markers.", 100), ""]
    for page in sorted(claims):
        # Line numbers and quoted statuses, not measurements (tests/test_figures.py).
        out += [f"## {page}", "", "<!-- not measured -->", "| line | statement | tests |",
                "| --- | --- | --- |"]
        rows = sorted((line_of(page, quote), quote, tests)
                      for quote, tests in claims[page].items())
        for number, quote, tests in rows:
            link = os.path.relpath(os.path.join(REPOSITORY, page),
                                   os.path.join(REPOSITORY, "docs"))
            cited = "; ".join(f"[{test_file}](../{test_file}) `{test}`"
                              for test_file, test in sorted(set(tests)))
            out.append(f"| [{number}]({link}) | {quote.replace('|', chr(92) + '|')} | {cited} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(index())
