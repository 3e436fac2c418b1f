"""Where and how the tests run: the backends' passes of the suite, the walk through the
pages, and CI. Plain Python and pytest only: tests/conftest.py reads it in pytest's own
process, which under pytest-xdist only starts the workers and need not import Keras (a
pass of no tests on 2 workers took 19.0 and 19.8 s when that process imported Keras, 12.6
and 12.7 s when it did not; AMD EPYC with AVX2)."""

import os

import pytest

BACKENDS = ("tensorflow", "jax", "torch")
# {node id: its markers} of every collected test, before any is left out by tier or by
# backend (tests/conftest.py); tests/test_tiers.py reads it.
COLLECTED = pytest.StashKey[dict]()


def runs_in(markers, backend, walk):
    """Whether a test with these marker names and `once` backend ({name: args}) runs in
    the suite's pass of `backend` (walk False) or in the walk (walk True, any backend)."""
    if "walk" in markers:
        return walk
    once = markers.get("once")
    return not walk and (once is None or once[0] == backend)


def in_ci():
    """Whether the tests run in CI (the CI environment variable is set, and not
    to "0" or "false")."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
