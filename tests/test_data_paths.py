"""Where the shared corpora live, for the tests that read real data."""

import os

import pytest

SHARED_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def shared_data(*parts):
    """A path under ../shared/data; skipped when absent, except under CI=true,
    where the real data must be tested."""
    path = os.path.normpath(os.path.join(SHARED_DATA, *parts))
    if not os.path.exists(path):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{path} is missing, and CI must test on the real data")
        pytest.skip(f"{path} is not here")
    return path
