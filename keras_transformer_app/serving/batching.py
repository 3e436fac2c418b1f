"""Dynamic batching: requests that arrive together run as one signature call.

A stand-in for TensorFlow Serving's batching scheduler, with its parameters'
names. Each request is a *task* of one or more instances for one servable
and signature (a task larger than `max_batch_size` is split, as TF Serving's
large-batch splitting does). One batch is open at a time: it starts with the
oldest task and takes later tasks of the same servable and signature while it
holds at most `max_batch_size` instances, waiting at most
`batch_timeout_micros` after its first task arrived; then it closes and the
thread that filled it runs it, while the next idle one of the
`num_batch_threads` threads opens the next batch. The queue
holds at most `max_enqueued_batches × max_batch_size` instances; a task that
does not fit is refused at once (`QueueFullError`), so memory stays bounded
under any load.

With batching off (`BatchingParameters(enabled=False)`) every task runs
alone, on the same bounded queue and worker threads.
"""

import collections
import concurrent.futures
import dataclasses
import os
import threading
import time


class QueueFullError(RuntimeError):
    """The batch queue cannot take a task; the client should retry later."""


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """TensorFlow Serving's batching parameters (`batching_parameters_file`).

    The defaults follow TensorFlow Serving's advice for CPUs: no batch
    timeout (a lone client never waits for others to join it), one batch
    thread per core, and small batches (on a CPU, a larger batch holds
    every request in it for longer than it saves). Raise `max_batch_size`
    on a GPU.

    Attributes:
        enabled: Merge concurrent requests (`--enable_batching`).
        max_batch_size: Most instances per signature call.
        batch_timeout_micros: Longest wait for more requests after a batch
            opens, in microseconds; 0 takes what is queued and runs at once.
        max_enqueued_batches: Queue bound, in batches of `max_batch_size`.
        num_batch_threads: Batches run at once (default: the CPU cores).
    """

    enabled: bool = True
    max_batch_size: int = 4
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 64
    num_batch_threads: int = os.cpu_count() or 1

    def __post_init__(self):
        # Imported here, when parameters are made: the command line's parser reads the
        # defaults above without loading the library (and Keras with it).
        from keras_transformer import validation

        validation.check_positive_int("max_batch_size", self.max_batch_size)
        validation.check_non_negative_int("batch_timeout_micros", self.batch_timeout_micros)
        validation.check_positive_int("max_enqueued_batches", self.max_enqueued_batches)
        validation.check_positive_int("num_batch_threads", self.num_batch_threads)


class _Task:
    __slots__ = ("key", "instances", "future", "enqueued")

    def __init__(self, key, instances):
        self.key = key
        self.instances = instances
        self.future = concurrent.futures.Future()
        self.enqueued = time.monotonic()


class BatchScheduler:
    """Queues tasks and runs them in batches on worker threads.

    Args:
        parameters: `BatchingParameters`.
        on_batch: Optional callback `on_batch(size)` after each batch runs
            (for the batch-size histogram).
    """

    def __init__(self, parameters, on_batch=None):
        self.parameters = parameters
        self._on_batch = on_batch
        self._queue = collections.deque()
        self._queued_instances = 0
        self._capacity = parameters.max_enqueued_batches * parameters.max_batch_size
        self._condition = threading.Condition()
        self._stopping = False
        self._forming = False
        self._threads = [threading.Thread(target=self._work, name=f"batch-{i}", daemon=True)
                         for i in range(parameters.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    @property
    def queue_depth(self):
        """Instances waiting in the queue."""
        return self._queued_instances

    def submit(self, servable, signature, instances):
        """Queues `instances` for `servable.run(signature, ...)`.

        Returns:
            A `concurrent.futures.Future` of the list of results, one per
            instance, in order.

        Raises:
            QueueFullError: when the queue cannot hold them (nothing is queued).
        """
        if not instances:
            raise ValueError("A task needs at least one instance.")
        size = self.parameters.max_batch_size if self.parameters.enabled else len(instances)
        pieces = [instances[i : i + size] for i in range(0, len(instances), size)]
        tasks = [_Task((servable, signature), piece) for piece in pieces]
        with self._condition:
            if self._stopping:
                raise QueueFullError("The server is shutting down.")
            if self._queued_instances + len(instances) > self._capacity:
                raise QueueFullError(
                    f"The batch queue is full ({self._queued_instances} instances waiting, "
                    f"max_enqueued_batches={self.parameters.max_enqueued_batches}); retry later.")
            self._queue.extend(tasks)
            self._queued_instances += len(instances)
            self._condition.notify_all()
        if len(tasks) == 1:
            return tasks[0].future
        return _joined([task.future for task in tasks])

    def stop(self):
        """Runs what is queued, then stops the workers."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        for thread in self._threads:
            thread.join()

    def _take_batch(self):
        """The next batch of tasks (called with the condition held), or None
        once stopping with an empty queue.

        One batch is open at a time: an idle thread waits while another fills
        one, so that the requests arriving meanwhile join one batch instead of
        being split between two half-empty ones.
        """
        while self._forming or not self._queue:
            if self._stopping and not self._queue:
                return None
            self._condition.wait()
        self._forming = True
        first = self._queue.popleft()
        batch, size = [first], len(first.instances)
        if self.parameters.enabled:
            deadline = first.enqueued + self.parameters.batch_timeout_micros / 1e6
            while size < self.parameters.max_batch_size:
                fits = next((task for task in self._queue if task.key == first.key
                             and size + len(task.instances) <= self.parameters.max_batch_size),
                            None)
                if fits is not None:
                    self._queue.remove(fits)
                    batch.append(fits)
                    size += len(fits.instances)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    break
                self._condition.wait(remaining)
        self._queued_instances -= size
        self._forming = False
        self._condition.notify_all()
        return batch

    def _work(self):
        while True:
            with self._condition:
                batch = self._take_batch()
            if batch is None:
                return
            # A request cancelled while queued (its client gone at shutdown)
            # is dropped; the others can no longer be cancelled.
            batch = [task for task in batch if task.future.set_running_or_notify_cancel()]
            if not batch:
                continue
            servable, signature = batch[0].key
            instances = [instance for task in batch for instance in task.instances]
            try:
                results = servable.run(signature, instances)
            except BaseException as error:  # noqa: BLE001  each waiting request gets the error
                for task in batch:
                    task.future.set_exception(error)
                continue
            if self._on_batch is not None:
                self._on_batch(len(instances))
            start = 0
            for task in batch:
                task.future.set_result(results[start : start + len(task.instances)])
                start += len(task.instances)


def _joined(futures):
    """One future of the concatenated results of `futures`."""
    joined = concurrent.futures.Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def done(_):
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        if not joined.set_running_or_notify_cancel():
            return  # cancelled by its waiter
        errors = [f.exception() for f in futures if not f.cancelled() and f.exception()]
        if errors:
            joined.set_exception(errors[0])
        elif any(f.cancelled() for f in futures):
            joined.set_exception(concurrent.futures.CancelledError())
        else:
            joined.set_result([result for f in futures for result in f.result()])

    for future in futures:
        future.add_done_callback(done)
    return joined
