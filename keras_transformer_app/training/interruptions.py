"""§5.2 Training, interrupted (not in the paper): a Ctrl-C or SIGTERM during `model.fit`.

`SignalsBetweenSteps` is the first of `fit_steps`'s callbacks: it holds the program's
own SIGINT and SIGTERM handlers while a step runs, and calls them when it ends.
"""

import contextlib
import signal
import threading
import time

import keras


class SignalsBetweenSteps(keras.callbacks.Callback):
    """Runs the program's own SIGINT and SIGTERM handlers between steps.

    A handler that raises (Ctrl-C's `KeyboardInterrupt`, a command line's
    `Terminated`) runs wherever the main thread is when the signal comes, and
    under JAX that can be inside a `jax.Array`'s copy to the host (`np.array(x)`,
    which Keras makes of every step's logs): the exception left that wait blocked
    for good, and the interrupted training ran on, never ending. While `model.fit`
    runs (`installed`), a signal is only noted, and its handler is called at the
    next step's end (validation steps too): the exception unwinds from Python code,
    before the window's checkpoint and backup are written. A step that has not
    ended `longest_wait` seconds after the signal (the compilation of a new shape)
    gets the handler where it is, as before. Signals left at their default (or
    ignored) are not touched, and the handlers are restored when `fit` ends.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, longest_wait=10.0):
        super().__init__()
        self.longest_wait = longest_wait
        self._handlers = {}
        self._pending = None
        self._now = False
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def installed(self):
        """Defers the handlers while the block (`model.fit`) runs, in the main
        thread (where Python runs signal handlers); elsewhere it changes nothing."""
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                handler = signal.getsignal(number)
                if callable(handler):
                    self._handlers[number] = handler
                    signal.signal(number, self._note)
        try:
            yield self
        finally:
            for number, handler in self._handlers.items():
                signal.signal(number, handler)
            with self._lock:  # no late `_signal_now` once the handlers are back
                handlers, self._handlers = self._handlers, {}
                number, self._pending = self._pending, None
            if number is not None:  # came after the last step's end
                handlers[number](number, None)

    def _note(self, number, frame):
        if self._now:  # the step outlasted `longest_wait`: the handler runs here
            self._handlers[number](number, frame)
        elif self._pending is None:
            self._pending = number
            threading.Thread(target=self._signal_now, args=(number,), daemon=True,
                             name="signal-between-steps").start()

    def _signal_now(self, number):
        time.sleep(self.longest_wait)
        with self._lock:
            if self._pending is not None:
                self._now = True
                signal.pthread_kill(threading.main_thread().ident, number)

    def _handle(self, *args, **kwargs):
        with self._lock:
            number, self._pending = self._pending, None
        if number is not None:
            self._now = True  # a second signal, while this one unwinds, is not held
            self._handlers[number](number, None)

    on_train_batch_end = on_test_batch_end = on_epoch_end = _handle

