"""The manager (`keras_transformer_app.serving.manager`) over version folders of
placeholder files and a fake `load`, with no model: a version copied in two steps
served once complete, a failed load tried again after the retry interval and given up
after its tries, and a removed version replaced by the highest one left, or unloaded
when none is left. What the server answers then is tested in `test_server.py`.

Like the server's tests, these run once, in the TensorFlow-backend pass of the
suite; each test calls `poll()` itself instead of waiting for the polling thread.
"""

import os
import shutil
import threading
import types

import pytest

from keras_transformer.export import versions
from keras_transformer_app.serving.manager import ModelManager

pytestmark = pytest.mark.once("tensorflow")  # backend-independent


def write_graph(version_path):
    """What `versions.is_version` looks for: the graph and the export settings."""
    os.makedirs(os.path.join(version_path, "assets.extra"), exist_ok=True)
    for name in ("saved_model.pb", versions.METADATA_PATH):
        with open(os.path.join(version_path, name), "w") as file:
            file.write("{}")


def write_variables(version_path):
    os.makedirs(os.path.join(version_path, "variables"), exist_ok=True)
    with open(os.path.join(version_path, "variables", "variables.index"), "w") as file:
        file.write("weights")


def write_version(base, version):
    path = os.path.join(base, str(version))
    write_graph(path)
    write_variables(path)
    return path


class FakeLoad:
    """`load(version_path)`: fails while the version lacks its variables, and the
    first `failures[version]` times it is called for a version."""

    def __init__(self, failures=None):
        self.failures = dict(failures or {})
        self.calls = []

    def __call__(self, path):
        version = int(os.path.basename(path))
        self.calls.append(version)
        if not os.path.exists(os.path.join(path, "variables", "variables.index")):
            raise OSError(f"{path}/variables/variables.index: no such file")
        if self.failures.get(version, 0):
            self.failures[version] -= 1
            raise RuntimeError(f"version {version} is broken")
        return types.SimpleNamespace(version=version, warmup_seconds=0.0)


def manager(base, load, **retries):
    """A manager that never polls by itself; its log and load attempts are recorded."""
    log, attempts = [], []
    made = ModelManager(str(base), load, poll_seconds=0, log=log.append,
                        on_load_attempt=lambda *attempt: attempts.append(attempt), **retries)
    made.log, made.attempts = log, attempts
    return made


def states(made):
    return {int(s["version"]): (s["state"], s["status"]["error_message"])
            for s in made.version_status()["model_version_status"]}


@pytest.mark.backs("docs/serving.md", "it is never loaded, and is picked up")
def test_an_incomplete_version_is_not_loaded_and_is_served_once_complete(tmp_path):
    write_version(tmp_path, 1)
    load = FakeLoad()
    served = manager(tmp_path, load)
    served.start()
    # A copy that has written the variables, not yet the graph and its settings.
    write_variables(tmp_path / "2")
    served.poll()
    assert served.servable.version == 1 and load.calls == [1]
    assert 2 not in states(served)
    write_graph(tmp_path / "2")
    served.poll()
    assert served.servable.version == 2 and load.calls == [1, 2]
    assert states(served) == {2: ("AVAILABLE", ""), 1: ("END", "")}


@pytest.mark.backs("docs/serving.md",
                   "loaded before its copy ended is loaded again once its files have stayed")
def test_a_version_loaded_before_its_copy_ended_is_loaded_again_once_the_copy_ends(tmp_path):
    write_version(tmp_path, 1)
    load = FakeLoad()
    served = manager(tmp_path, load)  # the default retries: the next one is a minute away
    served.start()
    # The graph and the settings came first: a complete version to `is_version`.
    write_graph(tmp_path / "2")
    served.poll()
    assert load.calls == [1, 2] and served.servable.version == 1
    assert states(served)[2][0] == "LOADING" and "no such file" in states(served)[2][1]
    assert "Version 2 failed to load (attempt 1 of 6)" in served.log[-1]
    write_variables(tmp_path / "2")
    served.poll()  # the folder changed: tried again once it stays the same for a poll
    assert load.calls == [1, 2]
    served.poll()
    assert load.calls == [1, 2, 2] and served.servable.version == 2
    assert "Version 2 changed on disk since it failed to load" in "\n".join(served.log)
    assert states(served) == {2: ("AVAILABLE", ""), 1: ("END", "")}


@pytest.mark.backs("docs/serving.md", "a load that fails is tried again up to")
def test_a_failed_load_is_tried_again_after_the_interval_and_served(tmp_path):
    write_version(tmp_path, 3)
    load = FakeLoad(failures={3: 2})
    served = manager(tmp_path, load, load_retry_interval=0.0)
    for _ in range(2):
        served.poll()
        assert served.servable is None and states(served)[3] == (
            "LOADING", "RuntimeError: version 3 is broken")
    served.poll()
    assert served.servable.version == 3 and states(served) == {3: ("AVAILABLE", "")}
    assert load.calls == [3, 3, 3]
    assert served.attempts == [(3, "failure", 0.0), (3, "failure", 0.0), (3, "success", None)]
    assert [line for line in served.log if "attempt" in line] == [
        "Version 3 failed to load (attempt 1 of 6): RuntimeError: version 3 is broken; trying "
        "again in 0 s",
        "Version 3 failed to load (attempt 2 of 6): RuntimeError: version 3 is broken; trying "
        "again in 0 s",
        "Version 3 AVAILABLE after 0.0 s (warm-up 0.0 s, attempt 3 of 6)"]


def test_a_retry_waits_for_the_interval(tmp_path):
    write_version(tmp_path, 1)
    load = FakeLoad(failures={1: 1})
    served = manager(tmp_path, load, load_retry_interval=3600.0)
    for _ in range(3):
        served.poll()
    assert load.calls == [1] and served.servable is None
    assert served.attempts == [(1, "failure", 3600.0)]
    assert "trying again in 3600 s" in served.log[-1]


def test_a_load_that_always_fails_is_given_up_after_its_retries(tmp_path):
    write_version(tmp_path, 1)
    write_version(tmp_path, 2)
    load = FakeLoad(failures={2: 100})
    served = manager(tmp_path, load, max_num_load_retries=2, load_retry_interval=0.0)
    # Version 2, the highest, is the one to serve: version 1 is never loaded.
    for _ in range(10):
        served.poll()
    assert load.calls == [2, 2, 2]
    assert states(served) == {2: ("END", "RuntimeError: version 2 is broken")}
    assert served.log[-1].endswith("(attempt 3 of 3): RuntimeError: version 2 is broken; "
                                   "no tries left; it is tried again once its folder changes")
    assert [outcome for _, outcome, _ in served.attempts] == ["failure"] * 3


def test_a_failed_version_leaves_the_served_one_serving(tmp_path):
    write_version(tmp_path, 1)
    load = FakeLoad(failures={2: 100})
    served = manager(tmp_path, load, max_num_load_retries=1, load_retry_interval=0.0)
    served.start()
    write_version(tmp_path, 2)
    for _ in range(5):
        served.poll()
    assert load.calls == [1, 2, 2] and served.servable.version == 1
    assert states(served) == {2: ("END", "RuntimeError: version 2 is broken"),
                              1: ("AVAILABLE", "")}


def test_start_tries_the_first_version_again_then_raises_its_error(tmp_path):
    write_version(tmp_path, 1)
    load = FakeLoad(failures={1: 2})
    served = manager(tmp_path, load, max_num_load_retries=2, load_retry_interval=0.0)
    served.start()
    assert served.servable.version == 1 and load.calls == [1, 1, 1]

    load = FakeLoad(failures={1: 100})
    single = manager(tmp_path / "1", load, max_num_load_retries=1, load_retry_interval=0.0)
    with pytest.raises(RuntimeError, match="version 1 is broken"):
        single.start()
    assert load.calls == [1, 1] and single.servable is None


@pytest.mark.backs("docs/serving.md", "a version whose folder is removed is replaced by")
def test_removing_the_served_version_falls_back_to_the_highest_left(tmp_path):
    for version in (3, 7, 9):
        write_version(tmp_path, version)
    load = FakeLoad()
    served = manager(tmp_path, load)
    served.start()
    nine = served.servable
    shutil.rmtree(tmp_path / "9")
    served.poll()
    assert served.servable.version == 7 and load.calls == [9, 7]
    assert states(served) == {9: ("END", ""), 7: ("AVAILABLE", "")}
    assert nine.version == 9, "what is queued for version 9 keeps its servable"
    # A version the policy once replaced is loaded again when it is the highest left.
    shutil.rmtree(tmp_path / "7")
    served.poll()
    assert served.servable.version == 3 and load.calls == [9, 7, 3]


def test_a_removed_version_serves_until_the_version_left_fails_for_good(tmp_path):
    write_version(tmp_path, 7)
    write_version(tmp_path, 9)
    load = FakeLoad(failures={7: 100})
    served = manager(tmp_path, load, max_num_load_retries=1, load_retry_interval=0.0)
    served.start()
    shutil.rmtree(tmp_path / "9")
    served.poll()  # version 7's first try fails: version 9 answers while 7 has tries left
    assert served.servable.version == 9
    served.poll()
    assert served.servable is None and load.calls == [9, 7, 7]
    assert states(served) == {9: ("END", ""), 7: ("END", "RuntimeError: version 7 is broken")}
    assert "version 9 was removed and version 7, the highest left, failed to load" in (
        served.unavailable)


def test_removing_every_version_unloads_the_served_one(tmp_path):
    write_version(tmp_path, 1)
    write_version(tmp_path, 2)
    served = manager(tmp_path, FakeLoad())
    served.start()
    shutil.rmtree(tmp_path / "2")
    shutil.rmtree(tmp_path / "1")
    served.poll()
    assert served.servable is None
    assert states(served) == {2: ("END", "")}  # version 1 was never loaded
    assert served.unavailable == (f"every version was removed from {tmp_path}; one copied "
                                  "or exported there is served")
    assert served.log[-1].startswith("Version 2 unloaded: its folder is gone")
    write_version(tmp_path, 5)
    served.poll()
    assert served.servable.version == 5


def test_a_stop_between_the_polling_threads_creation_and_its_start_ends_it(tmp_path,
                                                                         monkeypatch):
    """SIGTERM right after AVAILABLE: the server's handler calls `stop()` while the
    loading thread is about to start the polling one. `stop()` joined the thread it
    had not started yet ("cannot join thread before it is started", exit status 1 in
    tests/test_signals.py::test_serving[SIGTERM])."""
    write_version(tmp_path, 1)
    made = ModelManager(str(tmp_path), FakeLoad(), poll_seconds=0.01, log=lambda line: None)
    start = threading.Thread.start

    def stopped_first(thread):
        if thread.name == "version-poll":
            made.stop()
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", stopped_first)
    made.start()
    assert made.servable.version == 1
    made._thread.join(timeout=5)
    assert not made._thread.is_alive()  # it saw the stop and ended
