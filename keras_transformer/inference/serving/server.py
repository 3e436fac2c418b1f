"""The HTTP layer: TensorFlow Serving's REST API on uvicorn and starlette.

Routes (NAME is the model name, V a version):

    GET  /v1/models/NAME[/versions/V]            version states
    GET  /v1/models/NAME[/versions/V]/metadata   signatures and export settings
    POST /v1/models/NAME[/versions/V]:predict    {"instances": [...]} or {"inputs": [...]}
    GET  /monitoring/prometheus/metrics          Prometheus metrics

What a production server needs, from a maintained ASGI server (uvicorn):
a listen backlog, a bound on open connections, keep-alive, header and body
timeouts (a slow or idle client holds an idle coroutine, never a thread), a
bound on requests in flight and on the batch queue (503 when full), and a
clean shutdown on SIGTERM that answers the requests in flight. Every
client mistake, down to malformed HTTP, gets a 4xx JSON `{"error": ...}`; a
server fault gets a 500 whose body does not describe internals (the log
has the traceback).
"""

import asyncio
import dataclasses
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import traceback

from keras_transformer import validation
from keras_transformer.inference import saved_model
from keras_transformer.inference.serving.batching import (
    BatchingParameters,
    BatchScheduler,
    QueueFullError,
)
from keras_transformer.inference.serving.manager import ModelManager
from keras_transformer.inference.serving.metrics import ServingMetrics
from keras_transformer.inference.serving.servable import (
    RequestError,
    Servable,
    format_response,
    parse_predict_request,
)

DEFAULT_PORT = 8501

_REASONS = {400: "Bad Request", 408: "Request Timeout"}
# The most bytes of request line and headers (h11's default for headers
# still arriving, applied to complete ones too).
_MAX_HEADER_BYTES = 16 * 1024
_MODEL_PATH = re.compile(
    r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?(?P<rest>/metadata|:predict)?")


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Limits and timeouts of the server (defaults suit one CPU host).

    Attributes:
        host: Address to bind; 127.0.0.1 keeps the server on this machine.
        port: Port; 0 picks a free one.
        name: Model name in the URLs; None means the base path's folder name.
        max_instances: Most instances per request.
        max_chars: Most characters per sentence (ids per id list).
        max_body_bytes: Largest request body.
        max_connections: Open connections at once (more get 503).
        max_concurrent_requests: Predict requests in flight at once (more get 503).
        backlog: The listen backlog.
        header_timeout: Seconds for a client to send a request's headers.
        body_timeout: Seconds for a client to send a request's body.
        keep_alive_timeout: Seconds an idle keep-alive connection stays open.
        graceful_shutdown_seconds: Longest wait for requests in flight on SIGTERM.
        file_system_poll_wait_seconds: Seconds between polls for new versions
            (TensorFlow Serving's flag); 0 disables polling.
        warmup_threads: Warm-up requests replayed at once.
        batching: `BatchingParameters`.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    name: str = None
    max_instances: int = 64
    max_chars: int = 2000
    max_body_bytes: int = 1 << 20
    max_connections: int = 1000
    max_concurrent_requests: int = 256
    backlog: int = 2048
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 30.0
    graceful_shutdown_seconds: float = 30.0
    file_system_poll_wait_seconds: float = 1.0
    warmup_threads: int = 2
    batching: BatchingParameters = BatchingParameters()

    def __post_init__(self):
        for name in ("max_instances", "max_chars", "max_body_bytes", "max_connections",
                     "max_concurrent_requests", "backlog", "warmup_threads"):
            validation.check_positive_int(name, getattr(self, name))
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout",
                     "graceful_shutdown_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive number "
                                 "of seconds.")
        validation.check_non_negative_number("file_system_poll_wait_seconds",
                                             self.file_system_poll_wait_seconds)
        capacity = self.batching.max_enqueued_batches * self.batching.max_batch_size
        if self.max_instances > capacity:
            raise ValueError(
                f"max_instances={self.max_instances} exceeds the batch queue "
                f"(max_enqueued_batches × max_batch_size = {capacity}): no such request could "
                "ever be queued.")


def _json_bytes(status, message):
    body = json.dumps({"error": message}).encode("utf-8")
    reason = _REASONS.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode("ascii") + body


def _protocol_class(header_timeout):
    """uvicorn's h11 protocol with a header timeout and JSON protocol errors."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        _header_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm_header_timer()
            next_event = self.conn.next_event

            def checked_next_event():
                # h11 limits headers only while they arrive in pieces; one
                # read can bring a complete block of any size.
                event = next_event()
                if isinstance(event, h11.Request) and len(event.target) + sum(
                        len(name) + len(value) for name, value in event.headers
                ) > _MAX_HEADER_BYTES:
                    raise h11.RemoteProtocolError(
                        f"the request line and headers exceed {_MAX_HEADER_BYTES} bytes")
                return event

            self.conn.next_event = checked_next_event

        def data_received(self, data):
            super().data_received(data)
            if self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
                self._arm_header_timer()  # a request has begun; its headers are due
            else:
                self._disarm_header_timer()

        def connection_lost(self, exc):
            self._disarm_header_timer()
            super().connection_lost(exc)

        def send_400_response(self, msg):
            # Malformed HTTP (a bad request line, over-long headers, broken
            # chunked framing): answered in JSON like every other mistake.
            self._disarm_header_timer()
            self.transport.write(_json_bytes(400, f"Malformed HTTP request: {msg}"))
            self.transport.close()

        def _arm_header_timer(self):
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm_header_timer(self):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self):
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.our_state is h11.IDLE and not self.conn.trailing_data[0]:
                self.transport.close()  # connected, never sent anything: just close
                return
            if self.conn.our_state is h11.IDLE:
                self.transport.write(_json_bytes(
                    408, f"The request headers did not arrive within {header_timeout:g} s."))
            self.transport.close()

    return Protocol


class TranslationServer:
    """Serves the versions of one exported model over HTTP.

    Args:
        base_path: `saved_models/NAME` (its highest version is served, and
            new versions are picked up), or one version folder.
        options: `ServerOptions`.
        log: `log(message)` for the server's events.

    Example:

    >>> server = TranslationServer("saved_models/quickstart", ServerOptions(port=0))
    >>> server.start()           # binds, then loads and warms up in the background
    >>> server.wait_until_available()
    >>> server.url               # 'http://127.0.0.1:PORT/v1/models/quickstart'
    >>> server.shutdown()
    """

    def __init__(self, base_path, options=ServerOptions(), log=None):
        self.options = options
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        # Fail at once, before binding, when there is nothing to serve.
        saved_model.latest_version_path(base_path)
        base = os.path.normpath(base_path)
        if os.path.exists(os.path.join(base, "saved_model.pb")):
            base_name = os.path.dirname(os.path.abspath(base))
        else:
            base_name = os.path.abspath(base)
        self.name = options.name or os.path.basename(base_name)
        self.metrics = ServingMetrics(lambda: self.scheduler.queue_depth)
        self.scheduler = BatchScheduler(options.batching,
                                        on_batch=self.metrics.batch_size.observe)
        self.manager = ModelManager(base, self._load_servable,
                                    poll_seconds=options.file_system_poll_wait_seconds,
                                    log=self._log)
        self._in_flight = 0
        self._loaded = threading.Event()
        self._load_error = None
        self._socket = None
        self._server = None
        self._thread = None

    # Lifecycle.

    def _load_servable(self, version_path):
        servable = Servable(version_path, self.options.max_instances, self.options.max_chars)
        batching = self.options.batching
        start = time.perf_counter()
        self._log(f"Warming up version {servable.version} (XLA compiles each shape once)")

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

    def _load_first_version(self):
        try:
            self.manager.start()
        except Exception as error:  # noqa: BLE001  reported, and the server stops
            self._load_error = error
            self._log(f"Serving {self.name} failed: {type(error).__name__}: {error}")
            if self._server is not None:
                self._server.should_exit = True
        finally:
            self._loaded.set()

    def _bind_and_load(self):
        """Binds the port, then loads the first version on a thread."""
        self._bind()
        threading.Thread(target=self._load_first_version, name="load", daemon=True).start()

    def _bind(self):
        import uvicorn

        family = socket.AF_INET6 if ":" in self.options.host else socket.AF_INET
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that
        # say so. Without it, Nagle's algorithm holds a response's body until
        # the client acknowledges its headers: 40 ms of delayed ACK each.
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((self.options.host, self.options.port))
        config = uvicorn.Config(
            self.app, http=_protocol_class(self.options.header_timeout), lifespan="off",
            interface="asgi3", proxy_headers=False, server_header=False,
            access_log=False, log_level="warning", backlog=self.options.backlog,
            limit_concurrency=self.options.max_connections,
            timeout_keep_alive=self.options.keep_alive_timeout,
            timeout_graceful_shutdown=self.options.graceful_shutdown_seconds,
        )
        self._server = _graceful_server_class()(config)

    @property
    def port(self):
        return self._socket.getsockname()[1]

    @property
    def url(self):
        host = f"[{self.options.host}]" if ":" in self.options.host else self.options.host
        return f"http://{host}:{self.port}/v1/models/{self.name}"

    def serve_forever(self):
        """Binds, loads and serves until SIGTERM or Ctrl-C (in the main
        thread); then answers the requests in flight and returns."""
        self._bind_and_load()
        self._log(f"Serving {self.name} at {self.url} (POST :predict); loading and warming up "
                  "the latest version")
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._stop_backend()
        if self._load_error is not None:
            raise self._load_error

    def start(self):
        """Starts serving on a background thread (no signal handling); returns
        once the port is bound. Loading goes on in the background."""
        self._bind_and_load()
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]}, daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            time.sleep(0.01)
        return self

    def wait_until_available(self, timeout=None):
        """Blocks until the first version is AVAILABLE; raises what its load raised."""
        if not self._loaded.wait(timeout):
            raise TimeoutError(f"{self.name} was not AVAILABLE within {timeout} s.")
        if self._load_error is not None:
            raise self._load_error

    def shutdown(self):
        """Stops a server started with `start()`, answering requests in flight."""
        self._server.should_exit = True
        self._thread.join()
        self._stop_backend()

    def _stop_backend(self):
        self.manager.stop()
        self.scheduler.stop()

    # The ASGI application.

    async def app(self, scope, receive, send):
        if scope["type"] != "http":
            return
        from starlette.requests import Request

        request = Request(scope, receive)
        start = time.perf_counter()
        signature = None
        try:
            status, payload, headers = await self._route(request)
            if isinstance(payload, tuple):  # (signature, response) of a predict
                signature, payload = payload
        except RequestError as error:
            status, payload, headers = error.status, {"error": str(error)}, {}
            if isinstance(error, _Closing) or _unread_body(request):
                # A body left unread would hold the connection, with no
                # timeout running, for as long as the client trickles it.
                headers["connection"] = "close"
            if status == 503:
                headers["retry-after"] = "1"
        except Exception:  # noqa: BLE001  a server fault: log it, say nothing of internals
            self._log("Internal error:\n" + traceback.format_exc())
            status, payload, headers = 500, {"error": "Internal server error; the server's "
                                                      "log has the details."}, {}
        await self._send(send, status, payload, headers)
        self.metrics.requests.labels(self.name, str(status)).inc()
        if signature is not None:
            self.metrics.latency.labels(self.name, signature).observe(
                time.perf_counter() - start)

    async def _send(self, send, status, payload, headers):
        if isinstance(payload, bytes):
            body, content_type = payload, headers.pop("content-type")
        else:
            body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
            content_type = "application/json"
        raw = [(b"content-type", content_type.encode()),
               (b"content-length", str(len(body)).encode())]
        raw += [(k.encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})

    async def _route(self, request):
        path, method = request.url.path, request.method
        if path == "/monitoring/prometheus/metrics":
            _allow(method, "GET")
            return 200, self.metrics.exposition(), {"content-type": self.metrics.content_type}
        prefix = f"/v1/models/{self.name}"
        match = _MODEL_PATH.fullmatch(path)
        if match is None or match["name"] != self.name:
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
            return 200, self._status(version), {}
        if match["rest"] == "/metadata":
            _allow(method, "GET")
            servable = self._servable(version)
            return 200, {"model_spec": {"name": self.name, "version": str(servable.version)},
                         "metadata": servable.metadata}, {}
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
        if servable is None:
            raise RequestError(f"{self.name} is loading and warming up: no version is "
                               "AVAILABLE yet.", 503)
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
        return 200, (predict.signature, format_response(predict, results)), {}

    async def _read_body(self, request):
        limit = self.options.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise _Closing(f"Content-Length {length[:40]!r} is not a number.", 400)
            if int(length) > limit:
                raise _Closing(f"The request body has {length} bytes; this server takes at "
                               f"most {limit}.", 413)

        request.state.body_read = True

        async def read():
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _Closing(f"The request body exceeds {limit} bytes.", 413)
                chunks.append(chunk)
            return b"".join(chunks)

        from starlette.requests import ClientDisconnect

        try:
            return await asyncio.wait_for(read(), self.options.body_timeout)
        except ClientDisconnect:  # broken framing, or the client went away
            raise _Closing("The connection ended before the whole body arrived.", 400) from None
        except asyncio.TimeoutError:
            raise _Closing(f"The request body did not arrive within "
                           f"{self.options.body_timeout:g} s.", 408) from None


def _graceful_server_class():
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn's server, except that after a graceful shutdown on SIGTERM
        or SIGINT it returns (so the batch threads stop cleanly and the
        process exits with status 0) instead of raising the signal again."""

        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return GracefulServer


class _Closing(RequestError):
    """A mistake after which the connection closes (its body is not read)."""


def _unread_body(request):
    headers = request.headers
    has_body = "transfer-encoding" in headers or headers.get("content-length", "0") != "0"
    return has_body and not getattr(request.state, "body_read", False)


def _allow(method, allowed):
    if method != allowed:
        raise RequestError(f"Method {method} is not allowed here; use {allowed}.", 405)


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def serve(base_path, options=ServerOptions()):
    """Serves until SIGTERM or Ctrl-C (blocking)."""
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    TranslationServer(base_path, options).serve_forever()
