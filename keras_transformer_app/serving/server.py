"""The model server: TensorFlow Serving's REST API for one model, on asyncio and httptools.

`TranslationServer` plays `tensorflow_model_server`: it binds the port, has
the manager (`manager.py`) load, warm up and replace the versions, hands
predict requests to the batching scheduler (`batching.py`), counts them in
the metrics (`metrics.py`), and answers TensorFlow Serving's REST routes
(NAME is the model name, V a version):

    GET  /v1/models/NAME[/versions/V]            version states
    GET  /v1/models/NAME[/versions/V]/metadata   signatures and export settings
    POST /v1/models/NAME[/versions/V]:predict    {"instances": [...]} or {"inputs": [...]}
    GET  /monitoring/prometheus/metrics          Prometheus metrics

The HTTP/1.1 side (`protocol.py`) gives what a server facing the network
needs: a listen backlog, a bound on open connections, keep-alive, header and
body timeouts (a slow or idle client holds an idle connection object, never
a thread), and a graceful stop on SIGTERM that answers the requests in
flight. Requests in flight and the batch queue are bounded too (503 when
full). Every client mistake, down to malformed HTTP, gets a 4xx JSON
`{"error": ...}`; a server fault gets a 500 whose body does not describe
internals (the log has the traceback).
"""

import asyncio
import errno
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.parse

from keras_transformer.export import versions
from keras_transformer_app.serving.batching import BatchScheduler, QueueFullError
from keras_transformer_app.serving.manager import ModelManager
from keras_transformer_app.serving.metrics import ServingMetrics
from keras_transformer_app.serving.options import ServerOptions
from keras_transformer_app.serving.protocol import HttpServer
from keras_transformer_app.serving.request import BodyError
from keras_transformer_app.serving.servable import (
    RequestError,
    Servable,
    format_response,
    parse_predict_request,
)

_MODEL_PATH = re.compile(
    r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?(?P<rest>/metadata|:predict)?")


class TranslationServer:
    """Serves the versions of one exported model over HTTP.

    Args:
        base_path: `saved_models/NAME` (its highest version is served, and
            new versions are picked up), or one version folder.
        options: `ServerOptions`.
        log: `log(message)` for the server's events.

    `TranslationServer("saved_models/NAME", ServerOptions(port=0)).start()`
    binds a free port and loads and warms up the latest version in the
    background; `wait_until_available()` blocks until it is AVAILABLE, `url`
    is the model's URL, and `shutdown()` stops the server after the requests
    in flight (docs/serving.md, "The built-in server").
    """

    def __init__(self, base_path, options=ServerOptions(), log=None):
        self.options = options
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        base = os.path.normpath(base_path)
        folder = os.path.dirname(base) if versions.is_version_folder(base) else base
        self.name = options.name or os.path.basename(os.path.abspath(folder))
        self.manager = ModelManager(
            base, self._load_servable, poll_seconds=options.file_system_poll_wait_seconds,
            log=self._log, max_num_load_retries=options.max_num_load_retries,
            load_retry_interval=options.load_retry_interval_micros / 1e6,
            on_load_attempt=self._count_load_attempt)
        # Fail at once, before binding, when there is nothing to serve or the options do
        # not fit what there is (a mistake that no retry of the load would mend).
        self._check_engine_options(self.manager.latest_path())
        self.metrics = ServingMetrics(lambda: self.scheduler.queue_depth)
        self.scheduler = BatchScheduler(options.batching,
                                        on_batch=self.metrics.batch_size.observe)
        self._in_flight = 0
        self._loaded = threading.Event()
        self._load_error = None
        self._socket = None
        self._http = HttpServer(self.handle, max_connections=options.max_connections,
                                header_timeout=options.header_timeout,
                                body_timeout=options.body_timeout,
                                keep_alive_timeout=options.keep_alive_timeout,
                                max_body_bytes=options.max_body_bytes,
                                write_timeout=options.write_timeout)
        self._loop = None
        self._previous_handlers = {}
        self._stop = None  # the future whose result ends serving: the signal, or None
        self._listening = threading.Event()
        self._thread = None

    # Lifecycle.

    def _check_engine_options(self, version_path):
        """Raises a ValueError for CTranslate2's options given for a SavedModel version."""
        given = [flag for flag, value in (("compute_type", self.options.compute_type != "default"),
                                          ("intra_threads", self.options.intra_threads)) if value]
        if given and versions.engine(version_path) == "saved_model":
            raise ValueError(f"{' and '.join(given)} appl{'ies' if len(given) == 1 else 'y'} only "
                             f"to CTranslate2 exports, and {version_path!r} is a SavedModel.")

    def _open(self, version_path):
        """The servable of a version: a SavedModel's, or a CTranslate2 export's run
        with the options' compute type, one CTranslate2 call per batch thread."""
        options = self.options
        self._check_engine_options(version_path)
        if versions.engine(version_path) == "saved_model":
            return Servable(version_path, options.max_instances, options.max_chars)
        from keras_transformer_app.serving.ctranslate2 import CTranslate2Servable

        threads = options.batching.num_batch_threads
        return CTranslate2Servable(
            version_path, options.max_instances, options.max_chars, options.compute_type,
            intra_threads=options.intra_threads or max(1, (os.cpu_count() or 1) // threads),
            inter_threads=threads)

    def _load_servable(self, version_path):
        servable = self._open(version_path)
        batching = self.options.batching
        start = time.perf_counter()
        self._log(f"Warming up version {servable.version} ("
                  + ("XLA compiles each shape once)" if servable.engine == "saved_model"
                     else f"CTranslate2, {self.options.compute_type} compute type)"))

        def progress(done, total):  # about every quarter, so a slow warm-up shows life
            if done == total or done % max(1, total // 4) == 0:
                self._log(f"  warm-up of version {servable.version}: {done}/{total} requests, "
                          f"{time.perf_counter() - start:.0f} s")

        count = servable.warm_up(
            self.options.warmup_threads,
            # With batching on, no call holds more than max_batch_size instances.
            max_batch_size=batching.max_batch_size if batching.enabled else None,
            on_progress=progress)
        self._log(f"Replayed {count} warm-up requests of version {servable.version} in "
                  f"{servable.warmup_seconds:.1f} s")
        self.metrics.warmup_seconds.labels(self.name, str(servable.version)).set(
            servable.warmup_seconds)
        return servable

    def _count_load_attempt(self, version, outcome, retry_in):
        self.metrics.load_attempts.labels(self.name, str(version), outcome).inc()
        self.metrics.load_retry_delay.labels(self.name, str(version)).set(retry_in or 0)

    def _load_first_version(self):
        try:
            self.manager.start()
        except Exception as error:  # noqa: BLE001  reported, and the server stops
            self._load_error = error
            self._log(f"Serving {self.name} failed: {type(error).__name__}: {error}")
            self._request_stop(None)
        finally:
            self._loaded.set()

    def _bind_and_load(self, announce=False):
        """Binds the port, then loads the first version on a thread. `announce` logs
        the server's URL first: before the loading thread imports TensorFlow, which a
        command line does with stderr set aside (`logs.quiet_native_logs`)."""
        self._bind()
        if announce:
            self._log(f"Serving {self.name} at {self.url} (POST :predict); loading and "
                      "warming up the latest version")
        threading.Thread(target=self._load_first_version, name="load", daemon=True).start()

    def _bind(self):
        family = socket.AF_INET6 if ":" in self.options.host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((self.options.host, self.options.port))
        except OSError as error:
            self._socket.close()
            address = f"{self.options.host}:{self.options.port}"
            hint = ("; another server holds it: pick another --port, or 0 for a free one"
                    if error.errno == errno.EADDRINUSE else "")
            raise OSError(f"Cannot listen on {address}: {error.strerror}{hint}.") from None
        # Connections queue from now on, while the event loop starts.
        self._socket.listen(self.options.backlog)

    @property
    def port(self):
        return self._socket.getsockname()[1]

    @property
    def url(self):
        host = f"[{self.options.host}]" if ":" in self.options.host else self.options.host
        return f"http://{host}:{self.port}/v1/models/{self.name}"

    def serve_forever(self):
        """Binds, loads and serves until SIGTERM or Ctrl-C (in the main
        thread); then answers the requests in flight and returns the signal
        that stopped it (`signal.SIGTERM` or `signal.SIGINT`).

        The event loop takes the two signals before the port is bound: one that
        comes while the loop is not yet running waits in the loop's wake-up pipe
        and stops the server on the loop's first turn. (A handler that raises,
        as a command line's does, can run inside the loop's own machinery, where
        the exception is not the server's to see.)"""
        self._previous_handlers = {number: signal.getsignal(number)
                                   for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            with asyncio.Runner() as runner:
                loop = runner.get_loop()
                self._attach(loop)
                for number in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(number, self._stop_on_signal, number)
                self._bind_and_load(announce=True)
                return runner.run(self._serve())
        finally:  # after the loop's close, which puts the default handlers back
            self._restore_signal_handlers()
            self._stop_backend()
            if self._load_error is not None:
                raise self._load_error

    def start(self):
        """Starts serving on a background thread (no signal handling); returns
        once the port is bound. Loading goes on in the background."""
        self._bind_and_load()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),),
                                        name="serve", daemon=True)
        self._thread.start()
        while not self._listening.wait(0.01) and self._thread.is_alive():
            pass
        return self

    def _attach(self, loop):
        """Serving runs on `loop` and ends with the result of `_stop`, a future of it."""
        self._stop = loop.create_future()
        self._loop = loop  # after _stop: `_request_stop` reads them in this order

    async def _serve(self):
        """Serves until `_request_stop`; returns the signal that stopped it, if any."""
        if self._loop is None:
            self._attach(asyncio.get_running_loop())
        if self._load_error is not None and not self._stop.done():  # failed before the loop ran
            self._stop.set_result(None)
        await self._http.serve(self._socket, self.options.backlog, self._stop,
                               self.options.graceful_shutdown_seconds,
                               on_listening=self._listening.set)
        return self._stop.result()

    def _stop_on_signal(self, number):
        """The first SIGTERM or SIGINT stops gracefully; a second one meets the handlers
        that were there before `serve_forever` (the default ones end the process)."""
        for each in (signal.SIGINT, signal.SIGTERM):
            self._loop.remove_signal_handler(each)
        self._restore_signal_handlers()
        self._request_stop(signal.Signals(number))

    def _restore_signal_handlers(self):
        for number, handler in self._previous_handlers.items():
            signal.signal(number, handler)

    def _request_stop(self, result):
        """Ends serving (from any thread): `result` is what `_serve` returns."""
        loop, stop = self._loop, self._stop
        if loop is None or loop.is_closed():
            return

        def set_result():
            if not stop.done():
                stop.set_result(result)

        try:
            loop.call_soon_threadsafe(set_result)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def wait_until_available(self, timeout=None):
        """Blocks until the first version is AVAILABLE; raises what its load raised."""
        if not self._loaded.wait(timeout):
            raise TimeoutError(f"{self.name} was not AVAILABLE within {timeout} s.")
        if self._load_error is not None:
            raise self._load_error

    def shutdown(self):
        """Stops a server started with `start()`, answering requests in flight."""
        self._request_stop(None)
        self._thread.join()
        self._stop_backend()

    def _stop_backend(self):
        self.manager.stop()
        self.scheduler.stop()

    # The REST API.

    async def handle(self, request):
        """Answers one request (a `request.Request`): `(status, headers, body)`."""
        start = time.perf_counter()
        signature = None
        headers = []
        try:
            status, payload, content_type = await self._route(request)
            if isinstance(payload, tuple):  # (signature, response) of a predict
                signature, payload = payload
        except RequestError as error:
            status, payload, content_type = error.status, {"error": str(error)}, None
            if status == 503:
                headers.append(("retry-after", "1"))
            if status == 405:  # RFC 9110 §15.5.6: the methods the resource takes
                headers.append(("allow", error.allow))
        except Exception:  # noqa: BLE001  a server fault: log it, say nothing of internals
            self._log("Internal error:\n" + traceback.format_exc())
            status, payload, content_type = 500, {"error": "Internal server error; the "
                                                           "server's log has the details."}, None
        if content_type is None:
            body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
            content_type = "application/json"
        else:
            body = payload
        headers.insert(0, ("content-type", content_type))
        self.metrics.requests.labels(self.name, str(status)).inc()
        if signature is not None:
            self.metrics.latency.labels(self.name, signature).observe(
                time.perf_counter() - start)
        return status, headers, body

    async def _route(self, request):
        """`(status, payload, content type)`: a payload of JSON, content type None, or
        bytes of the content type."""
        # The path as sent: a %2F is not a separator (only the name's segment is decoded).
        path, method = request.path, request.method
        if path == "/monitoring/prometheus/metrics":
            _allow(method, "GET")
            return 200, self.metrics.exposition(), self.metrics.content_type
        prefix = f"/v1/models/{self.name}"
        match = _MODEL_PATH.fullmatch(path)
        if match is None or urllib.parse.unquote(match["name"]) != self.name:
            raise RequestError(f"No such endpoint {path[:200]!r}: this server serves {prefix}, "
                               f"{prefix}/metadata, {prefix}:predict (each also under "
                               "/versions/V) and /monitoring/prometheus/metrics.", 404)
        version = match["version"]
        if version is not None:
            if not version.isdigit() or len(version) > 18:
                raise RequestError(f"{version[:40]!r} is not a version number.", 404)
            version = int(version)
        if match["rest"] is None:
            _allow(method, "GET")
            return 200, self._status(version), None
        if match["rest"] == "/metadata":
            _allow(method, "GET")
            servable = self._servable(version)
            return 200, {"model_spec": {"name": self.name, "version": str(servable.version)},
                         "metadata": servable.metadata}, None
        _allow(method, "POST")
        return await self._predict(request, version)

    def _status(self, version):
        status = self.manager.version_status()
        if version is None:
            if not status["model_version_status"]:
                return {"model_version_status": [{
                    "version": "", "state": "LOADING",
                    "status": {"error_code": "OK", "error_message": ""}}]}
            return status
        found = [s for s in status["model_version_status"] if s["version"] == str(version)]
        if not found:
            raise RequestError(f"Version {version} of {self.name} is not known.", 404)
        return {"model_version_status": found}

    def _servable(self, version):
        servable = self.manager.servable
        if servable is None and not self._loaded.is_set():
            raise RequestError(f"{self.name} is loading and warming up: no version is "
                               "AVAILABLE yet.", 503)
        if servable is None:
            raise RequestError(f"No version of {self.name} is AVAILABLE: "
                               f"{self.manager.unavailable}.", 503)
        if version is not None and version != servable.version:
            raise RequestError(f"Version {version} of {self.name} is not AVAILABLE; version "
                               f"{servable.version} is.", 404)
        return servable

    async def _predict(self, request, version):
        servable = self._servable(version)
        body = await self._read_body(request)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError("The request body is not UTF-8 text.") from None
        try:
            parsed = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise RequestError("The request body is nested too deeply.") from None
        except ValueError as error:
            raise RequestError(f"The request body is not valid JSON: {error}.") from None
        predict = parse_predict_request(parsed, servable)
        if self._in_flight >= self.options.max_concurrent_requests:
            raise RequestError("Too many requests in flight; retry later.", 503)
        self._in_flight += 1
        try:
            future = self.scheduler.submit(servable, predict.signature, predict.instances)
            results = await asyncio.wrap_future(future)
        except QueueFullError as error:
            raise RequestError(str(error), 503) from None
        finally:
            self._in_flight -= 1
        return 200, (predict.signature, format_response(predict, results)), None

    async def _read_body(self, request):
        limit = self.options.max_body_bytes
        length = request.headers.get("content-length")  # the parser has checked it
        if length is not None and int(length) > limit:
            raise RequestError(f"The request body has {length} bytes; this server takes at "
                               f"most {limit}.", 413)
        try:
            return await request.body()
        except BodyError as error:
            raise RequestError(str(error), error.status) from None


class MethodNotAllowed(RequestError):
    """A method the resource does not take: 405, with an Allow header of those it does."""

    def __init__(self, method, allow):
        super().__init__(f"Method {method} is not allowed here; use {allow}.", 405)
        self.allow = allow


def _allow(method, allowed):
    """Refuses a method other than `allowed`; where GET is allowed, so is HEAD (RFC 9110
    §9.1), answered as GET without the body."""
    methods = (allowed, "HEAD") if allowed == "GET" else (allowed,)
    if method not in methods:
        raise MethodNotAllowed(method, ", ".join(methods))


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def serve(base_path, options=ServerOptions()):
    """Serves until SIGTERM or Ctrl-C (blocking); returns the signal that
    stopped the server."""
    return TranslationServer(base_path, options).serve_forever()
