"""What `pytest --doctest-modules keras_transformer` needs: each docstring example runs in
a temporary working directory of its own (the files it writes land there), with Keras seeded,
as a reader would run it in a fresh session. The tests' own settings are tests/conftest.py.
Every item, test or example, is timed by tests/cpu_time.py (the report after `--durations`)."""

import pytest
from _pytest.doctest import DoctestItem

pytest_plugins = ("tests.cpu_time",)


@pytest.fixture(autouse=True)
def _examples_run_in_a_temporary_directory(request, tmp_path, monkeypatch):
    if isinstance(request.node, DoctestItem):
        import keras

        monkeypatch.chdir(tmp_path)
        keras.utils.set_random_seed(0)
        keras.config.set_dtype_policy("float32")
    yield
