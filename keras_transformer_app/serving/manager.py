"""The manager: a model's versions loaded, warmed up, served and unloaded as in TF Serving.

`ModelManager` watches a model's base path (`saved_models/NAME/`) for version
folders every `file_system_poll_wait_seconds`, like TensorFlow Serving's
file-system source with its default version policy, "latest": the version it
aspires to serve is the highest complete one on disk. A folder that is not yet
a complete SavedModel or CTranslate2 export (`versions.is_version`) is not a
version at all: it is never loaded, and is picked up once complete. Exports
appear atomically (a hidden folder renamed when complete, see
`keras_transformer.export.versions`); a copy (`cp -r`, a bucket sync) may not.

Loading. The aspired version is loaded and warmed up (its
`assets.extra/tf_serving_warmup_requests` replayed) before it replaces the
served one; only then is it AVAILABLE, and the old one is unloaded (requests
already queued for it still finish on it). A load that fails is tried again,
as TensorFlow Serving's `--max_num_load_retries` and
`--load_retry_interval_micros` have it: up to `max_num_load_retries` more
times, `load_retry_interval` seconds apart, the served version answering
meanwhile. A version that used up its tries is left alone until its folder
changes (a file added, removed or rewritten): a copy that was still going on
when it was loaded is tried afresh once its files have stopped changing for one
poll.

Removal. A version whose folder is removed is no longer aspired: the highest
complete version left is loaded in its place, the removed one answering until
then. When no version is left, or the one left cannot be loaded (its tries used
up), the removed version is unloaded and no version is served: the server
answers predict with 503 until a version is copied or exported in.

Version states are TensorFlow Serving's: START, LOADING (also between the tries
of a failed load, with the last error), AVAILABLE, UNLOADING, END.
"""

import dataclasses
import os
import threading
import time

from keras_transformer.export import versions


@dataclasses.dataclass
class _Failure:
    """A version whose last load failed."""

    attempts: int  # failed tries since the folder last changed
    error: Exception
    retry_at: float | None  # time.monotonic() of the next try; None: no tries left
    tried: tuple  # the folder's `_fingerprint` when the last try began
    seen: tuple  # ... at the last poll (a copy still going on changes it every poll)


class ModelManager:
    """Loads, warms up, serves and unloads the versions of one model.

    Args:
        base_path: `saved_models/NAME` (polled for versions), or one version
            folder (served alone, never polled).
        load: `load(version_path) -> servable`, a warmed-up servable.
        poll_seconds: Seconds between polls; 0 disables polling.
        log: `log(message)` for load and unload events.
        max_num_load_retries: Tries after a failed load of a version (TF
            Serving's `--max_num_load_retries`); 0 tries each version once.
        load_retry_interval: Seconds between those tries (TF Serving's
            `--load_retry_interval_micros`, in seconds).
        on_load_attempt: `on_load_attempt(version, outcome, retry_in)` after
            each try: outcome "success" or "failure"; `retry_in` is the seconds
            until the next try, or None when there is none.
    """

    def __init__(self, base_path, load, poll_seconds=1.0, log=print, max_num_load_retries=5,
                 load_retry_interval=60.0, on_load_attempt=None):
        self.base_path = os.path.normpath(base_path)
        self._single = versions.is_version_folder(self.base_path)
        if self._single and not os.path.basename(self.base_path).isdigit():
            raise ValueError(f"{self.base_path!r} is a version folder, so its name must be "
                             "its version number, as in saved_models/NAME/1.")
        self._load = load
        self._log = log
        self._poll_seconds = 0 if self._single else poll_seconds
        self._max_num_load_retries = max_num_load_retries
        self._load_retry_interval = load_retry_interval
        self._on_load_attempt = on_load_attempt or (lambda version, outcome, retry_in: None)
        self._lock = threading.Lock()
        self._states = {}  # version -> (state, error message)
        self._failures = {}  # version -> _Failure, while its folder is a complete version
        self._servable = None
        self._unavailable = "no version has loaded yet"
        self._stop = threading.Event()
        self._thread = None

    @property
    def servable(self):
        """The servable of the version served now (None before the first load, and
        once no version is left to serve)."""
        return self._servable

    @property
    def unavailable(self):
        """Why no version is served, while `servable` is None."""
        return self._unavailable

    def start(self):
        """Loads the highest complete version (blocking, with its tries), then polls on
        a thread. Returns early, serving nothing, when `stop()` is called meanwhile.

        Raises:
            FileNotFoundError: when there is no complete version to serve.
            Exception: what the last try of loading the highest version raised.
        """
        while self._servable is None:
            self.poll()
            if self._servable is not None:
                break
            failure = self._failures.get(int(os.path.basename(self.latest_path())))
            if failure is None:  # the folders changed since the poll
                continue
            if failure.retry_at is None:
                raise failure.error
            wait = max(0.0, failure.retry_at - time.monotonic())
            if self._stop.wait(min(wait, self._poll_seconds or wait)):
                return
        if self._poll_seconds:
            # Started before it is shared: `stop()`, from a signal's handler in another
            # thread, joins only a started thread ("cannot join thread before it is
            # started" ended a SIGTERM right after AVAILABLE with status 1).
            thread = threading.Thread(target=self._poll_loop, name="version-poll", daemon=True)
            thread.start()
            self._thread = thread

    def latest_path(self):
        """The folder of the highest complete version: the one the policy serves.

        Raises:
            FileNotFoundError: naming what is missing, when there is none.
        """
        on_disk = self._on_disk()
        if on_disk:
            return on_disk[max(on_disk)]
        versions.latest_version_path(self.base_path)  # its errors name what is missing
        what = "is not a complete version" if self._single else "holds no complete version"
        raise FileNotFoundError(
            f"{self.base_path!r} {what}: a version folder needs saved_model.pb and "
            f"{versions.METADATA_PATH}, or a CTranslate2 export's files. Export one with "
            "`keras-transformer export`.")

    def stop(self):
        """Stops polling. A load in progress (its warm-up can take minutes) is
        not waited for: the thread is a daemon and ends with the process."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def poll(self):
        """Loads the highest complete version if it is not the one served and a try is
        due; unloads the served version if its folder is gone and nothing can replace it."""
        on_disk = self._on_disk()
        for version in [v for v in self._failures if v not in on_disk]:
            del self._failures[version]  # removed or being rewritten: it starts afresh
        aspired = max(on_disk, default=None)
        served = self._servable
        if (aspired is not None and (served is None or served.version != aspired)
                and self._due(aspired, on_disk[aspired])):
            self._try_load(aspired, on_disk[aspired])
            served = self._servable
        if served is not None and served.version not in on_disk:
            failure = self._failures.get(aspired)
            if aspired is None or (failure is not None and failure.retry_at is None):
                self._unload_removed(served, aspired)

    def version_status(self):
        """TensorFlow Serving's `GET /v1/models/NAME` answer."""
        with self._lock:
            states = sorted(self._states.items(), reverse=True)
        return {"model_version_status": [{
            "version": str(version), "state": state,
            "status": {"error_code": "OK" if not error else "UNKNOWN", "error_message": error},
        } for version, (state, error) in states]}

    def _on_disk(self):
        """{version: path} of the complete versions on disk."""
        if self._single:
            found = {int(os.path.basename(self.base_path)): self.base_path}
        else:
            found = {v: os.path.join(self.base_path, str(v))
                     for v in versions.versions(self.base_path)}
        return {v: path for v, path in found.items() if versions.is_version(path)}

    def _due(self, version, path):
        """Whether a try of `version` is due: its first, its next after the retry
        interval, or a fresh one once its folder has changed since the last and then
        stayed the same for one poll."""
        failure = self._failures.get(version)
        if failure is None:
            return True
        now = _fingerprint(path)
        settled = now == failure.seen
        failure.seen = now
        if settled and now != failure.tried:
            failure.attempts = 0
            self._log(f"Version {version} changed on disk since it failed to load: "
                      "loading it again")
            return True
        return failure.retry_at is not None and time.monotonic() >= failure.retry_at

    def _set_state(self, version, state, error=""):
        with self._lock:
            self._states[version] = (state, error)

    def _try_load(self, version, path):
        failure = self._failures.get(version)
        attempt = (failure.attempts if failure else 0) + 1
        tries = 1 + self._max_num_load_retries
        tried = _fingerprint(path)
        self._set_state(version, "START")
        self._set_state(version, "LOADING")
        start = time.perf_counter()
        try:
            servable = self._load(path)
        except Exception as error:  # noqa: BLE001  reported in the version status
            message = f"{type(error).__name__}: {error}"
            if attempt < tries:
                retry_in, state = self._load_retry_interval, "LOADING"
                then = f"trying again in {retry_in:g} s"
            else:
                retry_in, state = None, "END"
                then = "no tries left; it is tried again once its folder changes"
            self._failures[version] = _Failure(
                attempt, error, None if retry_in is None else time.monotonic() + retry_in,
                tried, tried)
            self._set_state(version, state, message)
            self._log(f"Version {version} failed to load (attempt {attempt} of {tries}): "
                      f"{message}; {then}")
            self._on_load_attempt(version, "failure", retry_in)
            return
        self._failures.pop(version, None)
        self._on_load_attempt(version, "success", None)
        old, self._servable = self._servable, servable
        self._set_state(version, "AVAILABLE")
        self._log(f"Version {version} AVAILABLE after {time.perf_counter() - start:.1f} s "
                  f"(warm-up {servable.warmup_seconds or 0:.1f} s"
                  + (f", attempt {attempt} of {tries})" if attempt > 1 else ")"))
        if old is not None:
            self._set_state(old.version, "UNLOADING")
            # Batches already queued for the old version hold it until they end.
            self._set_state(old.version, "END")
            self._log(f"Version {old.version} unloaded")

    def _unload_removed(self, served, aspired):
        """Unloads the served version, whose folder is gone, when nothing replaces it."""
        if aspired is None:
            self._unavailable = (f"every version was removed from {self.base_path}; one "
                                 "copied or exported there is served")
        else:
            self._unavailable = (f"version {served.version} was removed and version {aspired}, "
                                 "the highest left, failed to load (GET the model's status "
                                 "for its error)")
        self._servable = None
        self._set_state(served.version, "UNLOADING")
        self._set_state(served.version, "END")
        self._log(f"Version {served.version} unloaded: its folder is gone, and no version is "
                  f"served now: {self._unavailable}")

    def _poll_loop(self):
        while not self._stop.wait(self._poll_seconds):
            try:
                self.poll()
            except OSError as error:  # the base path vanished for a moment
                self._log(f"Polling {self.base_path} failed: {error}")


def _fingerprint(path):
    """What changes when a file under `path` is added, removed or rewritten."""
    entries = []
    for folder, _, files in os.walk(path):
        for name in files:
            file = os.path.join(folder, name)
            try:
                stat = os.stat(file)
            except FileNotFoundError:  # removed while walking: the next poll sees it gone
                continue
            entries.append((os.path.relpath(file, path), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))
