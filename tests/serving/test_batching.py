"""The batching scheduler (`keras_transformer_app.serving.batching`),
with a servable that runs when the test lets it: a bounded queue that refuses
what does not fit, tasks of one signature merged, large tasks split and
reassembled in order, cancelled tasks dropped, and a failed batch's error
given to each of its tasks.

Like the server's tests, these run once, in the TensorFlow-backend pass of
the suite; every wait is on an event, with a timeout.
"""

import threading

import pytest

from keras_transformer_app.serving.batching import (
    BatchingParameters,
    BatchScheduler,
    QueueFullError,
)

pytestmark = pytest.mark.once("tensorflow")  # backend-independent

TIMEOUT = 60.0  # any one wait, generous for a shared, loaded machine


class FakeServable:
    """Records each batch it runs; `run` waits for `release` (set at first)."""

    def __init__(self):
        self.batches = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def run(self, signature, instances):
        self.batches.append((signature, list(instances)))
        self.started.set()
        assert self.release.wait(TIMEOUT), "never released"
        if "fail" in instances:
            raise RuntimeError("the model failed")
        return [f"{signature}:{instance}" for instance in instances]


def held_scheduler(servable, **parameters):
    """A one-thread scheduler whose worker runs a first task ("first") and
    holds it there until `servable.release` is set."""
    scheduler = BatchScheduler(BatchingParameters(num_batch_threads=1, **parameters))
    servable.release.clear()
    first = scheduler.submit(servable, "sig", ["first"])
    assert servable.started.wait(TIMEOUT)
    assert scheduler.queue_depth == 0, "the worker takes a batch off the queue before it runs it"
    return scheduler, first


def results(futures):
    return [future.result(timeout=TIMEOUT) for future in futures]


def test_scheduler_refuses_a_task_that_does_not_fit_the_queue():
    servable = FakeServable()
    scheduler, first = held_scheduler(servable, max_batch_size=2, max_enqueued_batches=2,
                                      batch_timeout_micros=0)
    try:
        queued = [scheduler.submit(servable, "sig", [f"a{i}", f"b{i}"]) for i in range(2)]
        assert scheduler.queue_depth == 4
        with pytest.raises(QueueFullError, match="queue is full"):
            scheduler.submit(servable, "sig", ["one more"])
        assert scheduler.queue_depth == 4, "a refused task queues nothing"
        servable.release.set()
        assert results([first] + queued) == [
            ["sig:first"], ["sig:a0", "sig:b0"], ["sig:a1", "sig:b1"]]
        assert scheduler.queue_depth == 0
        assert scheduler.submit(servable, "sig", ["later"]).result(TIMEOUT) == ["sig:later"]
    finally:
        servable.release.set()
        scheduler.stop()
    with pytest.raises(QueueFullError, match="shutting down"):
        scheduler.submit(servable, "sig", ["after stop"])


def test_scheduler_merges_tasks_of_one_signature():
    servable = FakeServable()
    scheduler, first = held_scheduler(servable, max_batch_size=8, batch_timeout_micros=0)
    try:
        futures = [scheduler.submit(servable, "sig", [f"x{i}", f"y{i}"]) for i in range(3)]
        other = scheduler.submit(servable, "other", ["z"])
        servable.release.set()
        assert results([first] + futures + [other]) == [
            ["sig:first"], ["sig:x0", "sig:y0"], ["sig:x1", "sig:y1"], ["sig:x2", "sig:y2"],
            ["other:z"]]
    finally:
        servable.release.set()
        scheduler.stop()
    assert servable.batches == [("sig", ["first"]),
                                ("sig", ["x0", "y0", "x1", "y1", "x2", "y2"]),
                                ("other", ["z"])]


def test_scheduler_without_batching_runs_each_task_alone():
    servable = FakeServable()
    scheduler, first = held_scheduler(servable, enabled=False, max_batch_size=4)
    try:
        futures = [scheduler.submit(servable, "sig", [f"x{i}", f"y{i}"]) for i in range(3)]
        big = scheduler.submit(servable, "sig", [f"b{i}" for i in range(6)])
        servable.release.set()
        assert results([first] + futures + [big])[-1] == [f"sig:b{i}" for i in range(6)]
    finally:
        servable.release.set()
        scheduler.stop()
    assert [len(instances) for _, instances in servable.batches] == [1, 2, 2, 2, 6]


def test_scheduler_splits_a_large_task_and_reassembles_it_in_order():
    servable = FakeServable()
    scheduler = BatchScheduler(BatchingParameters(max_batch_size=3, num_batch_threads=2,
                                                  batch_timeout_micros=0))
    try:
        instances = [f"s{i}" for i in range(8)]
        assert scheduler.submit(servable, "sig", instances).result(TIMEOUT) == [
            f"sig:{s}" for s in instances]
    finally:
        scheduler.stop()
    assert sorted(len(batch) for _, batch in servable.batches) == [2, 3, 3]
    assert sorted(s for _, batch in servable.batches for s in batch) == sorted(instances)


def test_scheduler_drops_a_cancelled_task_and_keeps_serving():
    # At shutdown, the event loop cancels the requests still waiting: their
    # futures are cancelled while queued, and the worker must live on.
    servable = FakeServable()
    scheduler, first = held_scheduler(servable, max_batch_size=8, batch_timeout_micros=0)
    try:
        cancelled = scheduler.submit(servable, "sig", ["gone"])
        kept = scheduler.submit(servable, "sig", ["kept"])
        assert cancelled.cancel()
        servable.release.set()
        assert results([first, kept]) == [["sig:first"], ["sig:kept"]]
        assert scheduler.submit(servable, "sig", ["ok"]).result(TIMEOUT) == ["sig:ok"]
    finally:
        servable.release.set()
        scheduler.stop()
    assert all("gone" not in batch for _, batch in servable.batches)
    with pytest.raises(ValueError, match="at least one instance"):
        scheduler.submit(servable, "sig", [])


def test_scheduler_gives_a_failed_batch_error_to_each_of_its_tasks():
    servable = FakeServable()
    scheduler, first = held_scheduler(servable, max_batch_size=8, batch_timeout_micros=0)
    try:
        failing = [scheduler.submit(servable, "sig", ["ok"]),
                   scheduler.submit(servable, "sig", ["fail"])]
        servable.release.set()
        assert first.result(TIMEOUT) == ["sig:first"]
        for future in failing:
            with pytest.raises(RuntimeError, match="the model failed"):
                future.result(TIMEOUT)
        assert scheduler.submit(servable, "sig", ["ok"]).result(TIMEOUT) == ["sig:ok"]
    finally:
        servable.release.set()
        scheduler.stop()
