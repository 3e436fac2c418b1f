"""The HTTP/1.1 side of the built-in server, on asyncio and httptools' public parser API (no
paper section).

`HttpServer` listens on a bound socket and gives each client connection a
`Connection` (an `asyncio.Protocol`) that parses requests with `httptools.HttpRequestParser`
(llhttp, the parser of Node.js) and hands each complete request head to the application, an
`async handler(request)` that returns `(status, headers, body)`. Requests on one connection
are answered in order (pipelined ones wait, with reading paused). What a server facing the
network needs is here, each answered as TensorFlow Serving's REST API answers errors, with a
JSON `{"error": ...}` that closes the connection:

* malformed HTTP (a bad request line, broken chunked framing, a bad Content-Length, an
  HTTP/1.1 request without Host, a repeated or invalid Host): 400;
* a bound on the request line and headers (`MAX_HEADER_BYTES`), whether they arrive in one
  read or in many: 400;
* a header timeout, from when a client connects or from the first byte of a later request on
  a keep-alive connection: 408 (a plain close when nothing was sent);
* a body timeout and a bound on the body, applied when the application reads it
  (`Request.body`): 408, 413; a chunked body's raw bytes (chunk sizes and extensions
  included) count against the bound as they arrive;
* a bound on open connections: one more is answered 503 with `Retry-After` as soon as it
  is accepted, and closed; it never holds a slot;
* a write deadline: a connection whose answers have not drained within
  `write_timeout` (a client that does not read) is aborted, and queued requests are not
  answered while its writing is paused;
* a keep-alive timeout, after which an idle connection closes; an HTTP/1.0 request with
  Transfer-Encoding is answered, then the connection closes (RFC 9112 §6.1).

Requests are routed on the path as sent (`Request.path`, percent-encoding kept, so that
`%2F` is never a separator); an absolute-form target (`GET http://host/path`) is routed
on its path, with its authority as the Host (RFC 9112 §3.2.2).
* a graceful stop (`HttpServer.serve` returns once its `stop` future is done): the listening
  socket closes, idle connections close, and every request whose head has arrived is
  answered, for at most `graceful_seconds`.
"""

import asyncio
import json
import socket

import httptools

from keras_transformer_app.serving.request import (
    Request,
    check_host,
    joined_headers,
    response_bytes,
    target_path,
)

#: The most bytes of request line and headers.
MAX_HEADER_BYTES = 16 * 1024
_CONNECTION_ENDED = "The connection ended before the whole body arrived."
#: How long a connection over the bound stays, answered, for the client to read the 503.
_REFUSED_LINGER = 1.0


class _Refused(Exception):
    """Raised from a parser callback to stop the parser: the request is malformed
    (`Connection._refusal` says why)."""


class Connection(asyncio.Protocol):
    """One client connection: parses its requests, runs the handler on each in turn, and
    writes the answers (module docstring)."""

    def __init__(self, server):
        self.server = server
        self.loop = server.loop
        self.transport = None
        self._parser = httptools.HttpRequestParser(self)
        self._refused = False  # over the bound on connections: answered 503 and closed
        # The request being parsed: its URL pieces, headers and head size so far.
        self._url = []
        self._headers = []
        self._head_size = 0
        self._in_head = False
        self._received_in_head = 0  # bytes read while a head is incomplete
        self._completed = False  # a request's end was parsed in the current read
        self._refusal = None  # why a parser callback refused the request
        self._parsing = None  # the Request whose body is being parsed
        self._active = None  # the Request being answered
        self._waiting = []  # complete heads behind it (pipelined)
        self._closing_error = None  # a 400 to send once the active request is answered
        self._stopping = False
        self._header_timer = None
        self._idle_timer = None
        self._write_timer = None  # the write deadline, while answers wait to drain
        self._write_paused = False

    # asyncio.Protocol.

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it, Nagle's algorithm holds a response's body until the client
            # acknowledges its headers: a delayed ACK on every answer.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = self.server
        if len(server.connections) >= server.max_connections:
            self._refuse_connection()
            return
        server.connections.add(self)
        self._arm_header_timer()

    def _refuse_connection(self):
        """One connection over the bound: a 503 at once, then a half-close; what the
        client sends meanwhile is read and dropped, and the socket goes after
        `_REFUSED_LINGER` seconds. It holds no slot (`server.connections`)."""
        self._refused = True
        self.server.refused.add(self)
        status, headers, body = self.server.error_response(
            503, f"This server holds at most {self.server.max_connections} open "
                 "connections; retry later.")
        headers.append(("retry-after", "1"))
        self.transport.write(response_bytes(status, headers, body))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._write_timer = self.loop.call_later(_REFUSED_LINGER, self.transport.abort)

    def connection_lost(self, exc):
        self.server.connections.discard(self)
        self.server.refused.discard(self)
        self._cancel_timers()
        for request in (self._parsing, self._active):
            if request is not None and not request.complete:
                request._fail(_CONNECTION_ENDED, 400)

    def data_received(self, data):
        if self._refused:
            return  # answered already: the request is not read
        if self._idle_timer is not None:  # a new request begins on a kept-alive connection
            self._idle_timer.cancel()
            self._idle_timer = None
            self._arm_header_timer()
        self._completed = False
        in_body = self._parsing  # a request whose head came in an earlier read
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An upgrade or CONNECT request: answered as any other, then the connection
            # closes (this server speaks HTTP/1.1 only).
            self._closing_error = False
        except httptools.HttpParserCallbackError:
            if self._refusal is None:
                raise  # not ours: a fault of this module
            self._malformed(self._refusal)
            return
        except httptools.HttpParserError as error:
            self._malformed(str(error) or type(error).__name__)
            return
        # A body still incomplete: its raw bytes count against the bound, chunk sizes and
        # extensions included (a read that also ended it is not counted).
        if in_body is not None and in_body is self._parsing and not in_body.complete:
            in_body._count_raw(len(data))
        # A head still incomplete: the bytes read since it began (a read that also ended
        # a request is not counted, so the bound can be passed by at most one read).
        if self._in_head and not self._completed:
            self._received_in_head += len(data)
            if self._received_in_head > MAX_HEADER_BYTES:
                self._malformed(f"the request line and headers exceed {MAX_HEADER_BYTES} bytes")

    def pause_writing(self):
        self._write_paused = True
        self.transport.pause_reading()
        self._arm_write_timer()

    def resume_writing(self):
        self._write_paused = False
        self._disarm_write_timer()
        if self._waiting and self._active is None and not self.transport.is_closing():
            self._start(self._waiting.pop(0))  # held while the answers could not drain
        if not self._waiting:
            self.transport.resume_reading()

    # httptools' callbacks.

    def on_message_begin(self):
        self._url.clear()
        self._headers = []
        self._head_size = 0
        self._in_head = True
        self._received_in_head = 0

    def on_url(self, url):
        self._url.append(url)
        self._count_head(len(url))

    def on_header(self, name, value):
        self._headers.append((name, value))
        self._count_head(len(name) + len(value))

    def on_headers_complete(self):
        self._in_head = False
        self._disarm_header_timer()
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.0", "1.1"):
            self._refuse("no HTTP version" if version == "0.9"
                         else f"HTTP/{version} is not served")
        try:
            headers = joined_headers(self._headers)
            # The parser (httptools >= 0.6.3) has refused a target that is not ASCII.
            path = target_path(b"".join(self._url).decode("ascii"), headers)
            if version == "1.1" and "host" not in headers:
                raise ValueError("an HTTP/1.1 request without a Host header")
            check_host(headers)
        except ValueError as error:
            self._refuse(str(error))
        # RFC 9112 §6.1: HTTP/1.0 framing with Transfer-Encoding is faulty; close after.
        keep_alive = parser.should_keep_alive() and not (
            version == "1.0" and "transfer-encoding" in headers)
        request = Request(self, parser.get_method().decode("ascii"), path, headers,
                          keep_alive)
        self._parsing = request
        if self._active is None and not self._write_paused:
            self._start(request)
        else:
            self._waiting.append(request)
            self.transport.pause_reading()

    def on_body(self, body):
        self._parsing._append(body)

    def on_message_complete(self):
        self._parsing._finish()
        self._parsing = None
        self._completed = True

    # Requests and answers.

    def _count_head(self, size):
        self._head_size += size
        if self._head_size > MAX_HEADER_BYTES:
            self._refuse(f"the request line and headers exceed {MAX_HEADER_BYTES} bytes")

    def _refuse(self, message):
        self._refusal = message
        raise _Refused(message)

    def _start(self, request):
        self._active = request
        self.loop.create_task(self._answer(request))

    async def _answer(self, request):
        try:
            status, headers, body = await self.server.handler(request)
        except Exception:  # noqa: BLE001  the handler answers its own faults; a last guard
            status, headers, body = self.server.error_response(500, "Internal server error.")
        self._active = None
        if self.transport.is_closing():  # the client went away: nothing more to answer
            self._waiting.clear()
            return
        keep_alive = (request.keep_alive and request.complete and not self._stopping
                      and self._closing_error is None and not request._error)
        self._write_response(request, status, headers, body, keep_alive)
        if not keep_alive:
            self._close_after_answer()
        elif self._write_paused:
            pass  # the next queued request is answered once the answers drain
        elif self._waiting:
            self._start(self._waiting.pop(0))
            if not self._waiting:
                self.transport.resume_reading()
        else:
            self._idle_timer = self.loop.call_later(self.server.keep_alive_timeout,
                                                    self._close)

    def _write_response(self, request, status, headers, body, keep_alive):
        if not keep_alive:
            connection = "close"
        elif request.headers.get("connection", "").lower() == "keep-alive":
            connection = "keep-alive"  # HTTP/1.0's keep-alive
        else:
            connection = None
        self.transport.write(response_bytes(status, headers, body, connection,
                                             with_body=request.method != "HEAD"))

    def _close_after_answer(self):
        if self._closing_error:
            self.transport.write(self._closing_error)
        self._close()

    def _close(self):
        """Closes the transport once what it holds is written, within the write deadline:
        a client that does not read cannot keep it (and its slot) open."""
        self.transport.close()
        if self.transport.get_write_buffer_size():
            self._arm_write_timer()

    def _malformed(self, message):
        """Malformed HTTP: answered with a 400 JSON error, then the connection closes
        (after the answer to the request before it, when that one was complete)."""
        self._disarm_header_timer()
        status, headers, body = self.server.error_response(
            400, f"Malformed HTTP request: {message}")
        answer = response_bytes(status, headers, body)
        parsing, self._parsing = self._parsing, None
        if parsing is not None and not parsing.complete:
            parsing._fail(_CONNECTION_ENDED, 400)
        self._waiting.clear()
        if self._active is not None and self._active is not parsing:
            self._closing_error = answer  # the active request's answer comes first
            self.transport.pause_reading()
            return
        if not self.transport.is_closing():
            self.transport.write(answer)
            self._close()

    def write(self, data):
        if not self.transport.is_closing():
            self.transport.write(data)

    def stop(self):
        """The graceful stop: an idle connection closes now; a request whose head has
        arrived is answered first."""
        self._stopping = True
        if self._active is None:
            self._close()

    # Timers.

    def _arm_header_timer(self):
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.server.header_timeout,
                                                      self._headers_late)

    def _disarm_header_timer(self):
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _arm_write_timer(self):
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.server.write_timeout,
                                                     self.transport.abort)

    def _disarm_write_timer(self):
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _cancel_timers(self):
        self._disarm_header_timer()
        self._disarm_write_timer()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _headers_late(self):
        self._header_timer = None
        if self.transport.is_closing() or self._active is not None:
            return
        if self._in_head:
            status, headers, body = self.server.error_response(
                408, f"The request headers did not arrive within "
                     f"{self.server.header_timeout:g} s.")
            self.transport.write(response_bytes(status, headers, body))
        self._close()  # connected, never sent anything: just close


class HttpServer:
    """The connections of one listening socket.

    Args:
        handler: `async handler(request) -> (status, [(name, value)], body bytes)`; it
            answers every request, errors included (a `BodyError` from `request.body()`
            too).
        max_connections: Open connections at once; one more is answered 503 and closed.
        header_timeout: Seconds for a client to send a request's headers.
        body_timeout: Seconds for a client to send a request's body.
        keep_alive_timeout: Seconds an idle connection stays open.
        max_body_bytes: The largest request body (a chunked one's raw bytes).
        write_timeout: Seconds for a connection's answers to drain once its buffers
            are full (or once it closes); then it is aborted.
    """

    def __init__(self, handler, *, max_connections, header_timeout, body_timeout,
                 keep_alive_timeout, max_body_bytes, write_timeout=30.0):
        self.handler = handler
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.keep_alive_timeout = keep_alive_timeout
        self.max_body_bytes = max_body_bytes
        self.write_timeout = write_timeout
        self.connections = set()
        self.refused = set()  # connections over the bound, answered 503, not yet gone
        self.loop = None

    @staticmethod
    def error_response(status, message):
        """`(status, headers, body)` of a JSON `{"error": message}`."""
        body = json.dumps({"error": message}, ensure_ascii=False).encode("utf-8")
        return status, [("content-type", "application/json")], body

    async def serve(self, sock, backlog, stop, graceful_seconds, on_listening=None):
        """Serves on `sock` (bound) until the future `stop` is done; then stops
        gracefully and returns."""
        self.loop = asyncio.get_running_loop()
        listener = await self.loop.create_server(lambda: Connection(self), sock=sock,
                                                 backlog=backlog)
        if on_listening is not None:
            on_listening()
        try:
            await stop
        finally:
            listener.close()
            for connection in list(self.connections):
                connection.stop()
            deadline = self.loop.time() + graceful_seconds
            while (any(c._active is not None for c in self.connections)
                   and self.loop.time() < deadline):
                await asyncio.sleep(0.01)
            for connection in [*self.connections, *self.refused]:
                connection.transport.abort()
            await listener.wait_closed()
