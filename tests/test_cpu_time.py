"""tests/cpu_time.py: the report of where a pass's time went, from a run of pytest on a
file of three tests (one waits, one starts a busy process, one is busy itself), under
pytest-xdist as .ci/run runs the passes."""

import json
import os
import re
import subprocess
import sys
import types

import cpu_time
import pytest
from cpu_time import summary
from helpers import REPOSITORY

pytestmark = pytest.mark.once("jax")  # times pytest's own processes, not a backend

SAMPLE = '''
import subprocess, sys, time

def busy(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_waits():
    time.sleep(0.6)

def test_starts_a_busy_process():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\n"
                    "while time.process_time() < end: pass"], check=True)

def test_is_busy():
    busy(0.6)
'''


def run_pytest(folder, *arguments, **environment):
    (folder / "test_sample.py").write_text(SAMPLE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.cpu_time",
         "-n", "2", *arguments, "test_sample.py"], cwd=folder, capture_output=True, text=True,
        timeout=120, env=dict({k: v for k, v in os.environ.items() if k != "CI_TIMES"},
                              PYTHONPATH=REPOSITORY, **environment))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_the_report_splits_the_tests_time_into_own_cpu_started_processes_and_waiting(tmp_path):
    output = run_pytest(tmp_path, "--durations", "0")
    found = re.search(r"the tests' time (\d+) s: their own CPU (\d+) s, the processes they "
                      r"started (\d+) s, the rest \(waiting\) (-?\d+) s", output)
    assert found, output
    seconds, own, started, rest = map(int, found.groups())
    # 0.6 s each, in whole seconds (pytest's own work adds a little; on a loaded machine
    # the busy ones take longer, and the rest grows).
    assert seconds >= 2 and own == 1 and started == 1 and rest >= 1, output
    assert "started processes' CPU by file: test_sample.py 1 s" in output
    # After the durations, which come first.
    assert output.index("slowest durations") < output.index("where the tests' time went")


def test_ci_keeps_the_split_and_each_tests_seconds_in_its_record(tmp_path):
    """Under CI_TIMES (.ci/run's), the report is a line of JSON for .ci/times.py: the split
    under the stage CI_STAGE names, and the seconds of the slowest tests, slowest first."""
    lines = tmp_path / "times.jsonl"
    run_pytest(tmp_path, "--durations", "0", CI_TIMES=str(lines), CI_STAGE="a stage")
    [entry] = [json.loads(line) for line in lines.read_text().splitlines()]
    assert entry["stage"] == "a stage" and entry["tests"]["seconds"] >= 2
    assert sorted(entry["slowest"]) == [f"test_sample.py::test_{name}" for name in (
        "is_busy", "starts_a_busy_process", "waits")]
    assert all(seconds >= 0.6 for seconds in entry["slowest"].values())
    assert list(entry["slowest"].values()) == sorted(entry["slowest"].values(), reverse=True)
    assert cpu_time.slowest({"a": 1.04, "b": 3.0, "c": 2.0}, count=2) == {"b": 3.0, "c": 2.0}


def test_without_durations_there_is_no_report_but_ci_times_gets_its_line(monkeypatch, tmp_path):
    """The report is printed after `--durations`' only; a CI_TIMES file (.ci/times.py --time's
    quick loop, run without --durations) gets its line either way."""
    class Reporter:
        def __init__(self):
            self.lines = []

        def write_sep(self, separator, title):
            self.lines.append(title)

        def write_line(self, line):
            self.lines.append(line)

    monkeypatch.delenv("CI_TIMES", raising=False)  # CI's own record stays CI's
    totals, reporter = cpu_time._Totals(), Reporter()
    totals.files["test_sample.py"] = [1.0, 0.5, 0.2]
    config = types.SimpleNamespace(option=types.SimpleNamespace(durations=None))
    totals.pytest_terminal_summary(reporter, config)
    assert reporter.lines == []
    monkeypatch.setenv("CI_TIMES", str(tmp_path / "times.jsonl"))
    monkeypatch.setenv("CI_STAGE", "command")
    totals.pytest_terminal_summary(reporter, config)
    assert reporter.lines == []
    [entry] = [json.loads(line) for line in (tmp_path / "times.jsonl").read_text().splitlines()]
    assert entry["stage"] == "command" and entry["tests"]["seconds"] == 1
    monkeypatch.delenv("CI_TIMES")
    config.option.durations = 0
    totals.pytest_terminal_summary(reporter, config)
    assert reporter.lines == ["where the tests' time went", *summary(totals.files)]


def test_the_summary_names_the_files_whose_processes_took_most_cpu():
    files = {f"tests/test_{n}.py": [10.0 + n, 1.0, float(n)] for n in range(8)}
    lines = summary(files)
    assert lines[0] == ("the tests' time 108 s: their own CPU 8 s, the processes they started "
                        "28 s, the rest (waiting) 72 s")
    assert lines[1] == ("started processes' CPU by file: tests/test_7.py 7 s, tests/test_6.py "
                        "6 s, tests/test_5.py 5 s, tests/test_4.py 4 s, tests/test_3.py 3 s")
    # A compiler on two cores can give a test more CPU time than time.
    assert summary({"a.py": [1.0, 1.6, 0.0]}) == [
        "the tests' time 1 s: their own CPU 2 s, the processes they started 0 s, the rest "
        "(waiting) -1 s"]
