"""The two tiers of tests (tests/conftest.py): every collected test runs in exactly one place
(the suite's pass of each backend, the pass of the one backend a `once` test names, or the
walk through the pages), and .ci/run runs the README's commands for both tiers as written."""

import re

import pytest
from helpers import REPOSITORY
from tiers import BACKENDS, COLLECTED, runs_in

pytestmark = pytest.mark.once("jax")  # reads markers and files, not the backend


def places(markers):
    """Where a test with these markers runs: backend names and/or "walk"."""
    return ([backend for backend in BACKENDS if runs_in(markers, backend, walk=False)]
            + (["walk"] if any(runs_in(markers, backend, walk=True) for backend in BACKENDS)
               else []))


def test_a_test_runs_in_every_pass_its_once_pass_or_the_walk():
    assert places({}) == list(BACKENDS)
    assert places({"parametrize": ()}) == list(BACKENDS)
    for backend in BACKENDS:
        assert places({"once": (backend,)}) == [backend]
    assert places({"walk": ()}) == ["walk"]


def test_every_collected_test_runs_in_exactly_one_place(request):
    collected = request.config.stash[COLLECTED]
    assert request.node.nodeid in collected  # the collection before any test was left out
    wrong = {}
    for nodeid, markers in collected.items():
        if "walk" in markers and "once" in markers:
            wrong[nodeid] = "marked both walk and once"
        elif "once" in markers and places(markers) != [markers["once"][0]]:
            wrong[nodeid] = f"runs in {places(markers)}, not in the {markers['once'][0]} pass"
        elif "once" not in markers and "walk" not in markers and places(markers) != list(BACKENDS):
            wrong[nodeid] = f"backend-sensitive, yet runs in {places(markers)} only"
    assert not wrong, wrong


def _readme_commands():
    """The README's two test commands: the suite's line and the walk's."""
    text = open(f"{REPOSITORY}/README.md", encoding="utf-8").read()
    suite = re.search(r"^pip install .*&& ruff check \. && lint-imports && \(.*\)$", text, re.M)
    walk = re.search(r"^python -m pytest .*--walk.*$", text, re.M)
    assert suite and walk, "README.md lost its test commands"
    return suite.group(0), walk.group(0)


def test_the_readme_runs_the_whole_suite_on_each_backend_and_then_the_walk():
    suite, walk = _readme_commands()
    loop = re.search(r"for backend in (.*?); do KERAS_BACKEND=\$backend (python -m pytest [^|]*)",
                     suite)
    assert loop and loop.group(1).split() == list(BACKENDS)
    pytest_arguments = loop.group(2).split()[3:]  # after python -m pytest
    # Nothing deselects, skips or narrows the suite beyond the tiers.
    for narrowing in ("-m", "-k", "--deselect", "--ignore", "--walk", "-x", "--lf"):
        assert narrowing not in pytest_arguments, loop.group(2)
    assert "--walk" in walk.split() and "tests/test_pages.py" in walk.split()


def test_ci_runs_the_readmes_commands():
    suite, walk = _readme_commands()
    ci = open(f"{REPOSITORY}/.ci/run", encoding="utf-8").read()
    install, ruff, lint, loop = suite.split(" && ", 3)
    pytest_command = re.search(r"(python -m pytest [^|]*?) \|\|", loop).group(1)
    for part in (install, ruff, lint, pytest_command, walk):
        assert part in ci, part
    assert ci.index(pytest_command) < ci.index(walk)
