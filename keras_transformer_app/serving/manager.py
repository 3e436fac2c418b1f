"""The manager: a model's versions loaded, warmed up, served and unloaded as in TF Serving.

`ModelManager` watches a model's base path (`saved_models/NAME/`) for version
folders every `file_system_poll_wait_seconds`, like TensorFlow Serving's
file-system source with its default policy of serving the latest version, in
a simpler form: it only moves forward (a deleted folder is not unloaded, and
a version that failed to load is not retried). A new version is loaded and warmed up (its
`assets.extra/tf_serving_warmup_requests` replayed) before it replaces the
served one; only then is it AVAILABLE, and the old one is unloaded (requests
already queued for it still finish on it). Exports appear atomically (a
hidden folder renamed when complete, see
`keras_transformer.export.versions`), and a version folder that is not a
complete SavedModel or CTranslate2 export (`versions.is_version`) is never
loaded, so a half-written version is never served. A version that fails to load is reported with its
error and the served one stays.

Version states are TensorFlow Serving's: START, LOADING, AVAILABLE,
UNLOADING, END.
"""

import os
import threading
import time

from keras_transformer.export import versions


class ModelManager:
    """Loads, warms up, serves and unloads the versions of one model.

    Args:
        base_path: `saved_models/NAME` (polled for versions), or one version
            folder (served alone, never polled).
        load: `load(version_path) -> servable`, a warmed-up servable.
        poll_seconds: Seconds between polls; 0 disables polling.
        log: `log(message)` for load and unload events.
    """

    def __init__(self, base_path, load, poll_seconds=1.0, log=print):
        self.base_path = os.path.normpath(base_path)
        self._single = versions.is_version_folder(self.base_path)
        self._load = load
        self._log = log
        self._poll_seconds = 0 if self._single else poll_seconds
        self._lock = threading.Lock()
        self._states = {}  # version -> (state, error message)
        self._servable = None
        self._stop = threading.Event()
        self._thread = None

    @property
    def servable(self):
        """The servable of the version served now (None before the first load)."""
        return self._servable

    def start(self):
        """Loads the highest version (blocking), then polls on a thread.

        Raises:
            FileNotFoundError: when there is no complete version to serve.
            Exception: what loading the highest version raised.
        """
        path = versions.latest_version_path(self.base_path)
        self._load_version(int(os.path.basename(path)), path, raise_errors=True)
        if self._poll_seconds:
            self._thread = threading.Thread(target=self._poll_loop, name="version-poll",
                                            daemon=True)
            self._thread.start()

    def stop(self):
        """Stops polling. A load in progress (its warm-up can take minutes) is
        not waited for: the thread is a daemon and ends with the process."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def poll(self):
        """Loads the highest complete version if it is newer than the one served."""
        candidates = [v for v in versions.versions(self.base_path)
                      if self._complete(v) and v not in self._states]
        served = self._servable.version if self._servable is not None else 0
        newer = [v for v in candidates if v > served]
        if newer:
            version = newer[-1]
            self._load_version(version, os.path.join(self.base_path, str(version)))

    def version_status(self):
        """TensorFlow Serving's `GET /v1/models/NAME` answer."""
        with self._lock:
            states = sorted(self._states.items(), reverse=True)
        return {"model_version_status": [{
            "version": str(version), "state": state,
            "status": {"error_code": "OK" if not error else "UNKNOWN", "error_message": error},
        } for version, (state, error) in states]}

    def _complete(self, version):
        return versions.is_version(os.path.join(self.base_path, str(version)))

    def _set_state(self, version, state, error=""):
        with self._lock:
            self._states[version] = (state, error)

    def _load_version(self, version, path, raise_errors=False):
        self._set_state(version, "START")
        self._set_state(version, "LOADING")
        start = time.perf_counter()
        try:
            servable = self._load(path)
        except Exception as error:  # noqa: BLE001  reported in the version status
            self._set_state(version, "END", f"{type(error).__name__}: {error}")
            self._log(f"Version {version} failed to load: {type(error).__name__}: {error}")
            if raise_errors:
                raise
            return
        old, self._servable = self._servable, servable
        self._set_state(version, "AVAILABLE")
        self._log(f"Version {version} AVAILABLE after {time.perf_counter() - start:.1f} s "
                  f"(warm-up {servable.warmup_seconds or 0:.1f} s)")
        if old is not None:
            self._set_state(old.version, "UNLOADING")
            # Batches already queued for the old version hold it until they end.
            self._set_state(old.version, "END")
            self._log(f"Version {old.version} unloaded")

    def _poll_loop(self):
        while not self._stop.wait(self._poll_seconds):
            try:
                self.poll()
            except OSError as error:  # the base path vanished for a moment
                self._log(f"Polling {self.base_path} failed: {error}")
