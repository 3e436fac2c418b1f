"""Where a pass's time goes, printed after pytest's `--durations` report: the time of its
tests (setup, call and teardown), the CPU time of the pytest processes that ran them, that
of the processes the tests started (and waited for), and the rest, which is waiting (on a
timeout, a peer, a lock, a sleeping child) or, under `-n`, time a process spent without a
core of its own. The files whose started processes took the most CPU follow.

Each test's share is measured around it in the process that runs it, and travels to the
pytest-xdist controller with its teardown report (`user_properties`). Threads count: a test
whose compiler runs on two cores can have more CPU time than time, so "the rest" is what is
left after subtraction, over a whole pass. A process that a test leaves running is counted
where it is waited for.

Loaded from the repository's conftest.py (`pytest_plugins`), for the tests and for the
docstring examples; .ci/run's passes give `--durations 25`, which prints it. Where the
environment names a file in `CI_TIMES` (.ci/run and `.ci/times.py --time` do), the report is
added to it as a line of JSON, with `--durations` or without, under
the stage that `CI_STAGE` names, with the seconds of its 25 slowest tests (setup, call and
teardown; the walk's tests are its pages, so its chains' times are in it): .ci/times.py
makes CI's record of them.
"""

import collections
import json
import os
import resource
import time

import pytest

_KEY = "cpu_time"  # (seconds, own CPU seconds, started processes' CPU seconds)
_START = pytest.StashKey[tuple]()
_FILES_SHOWN = 5
_SLOWEST_KEPT = 25  # as many as .ci/run's --durations prints


def _cpu():
    """(this process's CPU seconds, those of its children that ended and were waited for)"""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_START] = (time.monotonic(), *_cpu())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _START in item.stash:
        began, own, children = item.stash[_START]
        now_own, now_children = _cpu()
        report.user_properties.append(
            (_KEY, (time.monotonic() - began, now_own - own, now_children - children)))


class _Totals:
    """Sums the shares that tests' teardown reports carry, by file, and prints them after
    `--durations`' report: registered on the pytest-xdist controller, or in the only
    process, not on the workers."""

    def __init__(self):
        self.files = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        self.tests = {}  # nodeid -> seconds

    def pytest_runtest_logreport(self, report):
        for name, value in report.user_properties:
            if name == _KEY and report.when == "teardown":
                totals = self.files[report.nodeid.split("::")[0]]
                for index, seconds in enumerate(value):
                    totals[index] += seconds
                self.tests[report.nodeid] = value[0]

    @pytest.hookimpl(trylast=True)  # after the durations
    def pytest_terminal_summary(self, terminalreporter, config):
        if not self.files:
            return
        if config.option.durations is not None:
            terminalreporter.write_sep("=", "where the tests' time went")
            for line in summary(self.files):
                terminalreporter.write_line(line)
        if os.environ.get("CI_TIMES"):
            seconds, own, started = (round(total) for total in totals(self.files))
            with open(os.environ["CI_TIMES"], "a", encoding="utf-8") as file:
                file.write(json.dumps({"stage": os.environ.get("CI_STAGE"), "tests": {
                    "seconds": seconds, "own_cpu": own, "started_cpu": started},
                    "slowest": slowest(self.tests)}) + "\n")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # a pytest-xdist worker sends its reports on
        config.pluginmanager.register(_Totals(), "cpu_time_totals")


def totals(files):
    """(seconds, own CPU, started processes' CPU) summed over {file: those three}."""
    return tuple(sum(values[i] for values in files.values()) for i in range(3))


def slowest(tests, count=_SLOWEST_KEPT):
    """{nodeid: seconds, to 0.1 s} of the `count` slowest of {nodeid: seconds}, slowest
    first: what CI's record keeps of each pytest run's tests (the walk's are its pages)."""
    ranked = sorted(tests.items(), key=lambda item: -item[1])[:count]
    return {nodeid: round(seconds, 1) for nodeid, seconds in ranked}


def summary(files):
    """The report's lines for {file: [seconds, own CPU, started processes' CPU]}."""
    seconds, own, started = totals(files)
    lines = [f"the tests' time {seconds:.0f} s: their own CPU {own:.0f} s, the processes they "
             f"started {started:.0f} s, the rest (waiting) {seconds - own - started:.0f} s"]
    busiest = sorted(((values[2], name) for name, values in files.items() if values[2] >= 0.5),
                     reverse=True)[:_FILES_SHOWN]
    if busiest:
        lines.append("started processes' CPU by file: " + ", ".join(
            f"{name} {cpu:.0f} s" for cpu, name in busiest))
    return lines

