"""One HTTP request of the built-in server: its head, its body as it arrives, and the bytes
of its answer (no paper section).

`protocol.Connection` reads a request's head with `joined_headers`, `target_path` and
`check_host`, makes a `Request` once the head has arrived and feeds it the body; the
application reads the body with `await request.body()`, under the server's body timeout
and bound; `response_bytes` writes the answer.
"""

import asyncio
import email.utils
import http
import re
import time

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode("ascii")
                 for status in http.HTTPStatus}
# RFC 9112 §3.2 and RFC 3986 §3.2.2: uri-host [":" port], a name or an IP literal.
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(?::[0-9]*)?")
# An absolute-form request target: scheme "://" authority, then the path and query.
_ABSOLUTE_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/?#]*)(.*)", re.DOTALL)


def joined_headers(raw_headers):
    """{lower-case name: value} of a head's `[(name bytes, value bytes)]`, a repeated
    header's values joined with ", ".

    Raises:
        ValueError: a repeated Host (RFC 9112 §3.2).
    """
    headers = {}
    for name, value in raw_headers:
        name = name.decode("latin-1").lower()
        value = value.decode("latin-1")
        if name == "host" and name in headers:
            raise ValueError("more than one Host header")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def target_path(target, headers):
    """The path of the request `target` as sent (percent-encoding kept), without the
    query; an absolute-form target's authority becomes the Host in `headers`, whatever
    Host was sent (RFC 9112 §3.2.2)."""
    absolute = _ABSOLUTE_FORM.fullmatch(target)
    if absolute is not None:
        headers["host"] = absolute.group(1)
        target = absolute.group(2) or "/"
    return target.partition("?")[0]


def check_host(headers):
    """Raises a ValueError for a Host that is not uri-host [":" port] (RFC 9112 §3.2)."""
    if "host" in headers and not _HOST.fullmatch(headers["host"]):
        raise ValueError(f"an invalid Host header {headers['host'][:100]!r}")


class BodyError(Exception):
    """The request body could not be read: `status` 400 (the connection ended or its
    framing broke), 408 (too slow) or 413 (too large). The connection closes after the
    answer."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class Request:
    """One request: `method` (str), `path` (as sent, percent-encoding kept, without the
    query) and `headers` (lower-case names; repeated headers joined with ", "); `await
    body()` reads the body."""

    __slots__ = ("method", "path", "headers", "keep_alive", "_connection", "_chunks", "_size",
                 "_raw", "_complete", "_error", "_waiter", "_read")

    def __init__(self, connection, method, path, headers, keep_alive):
        self.method, self.path, self.headers = method, path, headers
        self.keep_alive = keep_alive
        self._connection = connection
        self._chunks, self._size = [], 0
        self._raw = 0  # the body's bytes as they came, a chunked body's framing included
        self._complete = False
        self._error = None  # a BodyError, once the body cannot be read
        self._waiter = None
        self._read = False

    @property
    def complete(self):
        """Whether the whole request, body included, has arrived."""
        return self._complete

    async def body(self):
        """The whole body (bytes), once it has arrived.

        Raises:
            BodyError: the body exceeds the server's `max_body_bytes` (413), did not
                arrive within its `body_timeout` (408), or the connection ended or broke
                its framing before the body's end (400).
        """
        self._read = True
        connection = self._connection
        if not self._complete and self._error is None:
            if self.headers.get("expect", "").lower() == "100-continue" and not self._size:
                connection.write(_CONTINUE)
            self._waiter = connection.loop.create_future()
            timeout = connection.server.body_timeout
            try:
                await asyncio.wait_for(self._waiter, timeout)
            except asyncio.TimeoutError:
                self._fail(f"The request body did not arrive within {timeout:g} s.", 408)
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        return b"".join(self._chunks)

    def _append(self, data):
        if self._error is not None:
            return
        self._size += len(data)
        limit = self._connection.server.max_body_bytes
        if self._size > limit:
            self._chunks.clear()
            self._fail(f"The request body exceeds {limit} bytes.", 413)
        else:
            self._chunks.append(data)

    def _count_raw(self, size):
        """Counts `size` more bytes of the body as they came over the connection: a
        chunked body's sizes and extensions count against the bound too."""
        self._raw += size
        limit = self._connection.server.max_body_bytes
        if self._raw > limit and self._error is None:
            self._chunks.clear()
            self._fail(f"The request body exceeds {limit} bytes (chunked framing "
                       "included).", 413)

    def _finish(self):
        self._complete = True
        self._wake()

    def _fail(self, message, status):
        if self._error is None:
            self._error = BodyError(message, status)
        self._wake()

    def _wake(self):
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def response_bytes(status, headers, body, connection="close", with_body=True):
    """A complete response: its status line, Date, Content-Length, `headers`, then
    `Connection: connection` unless None, and `body` unless not `with_body` (HEAD)."""
    lines = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Error\r\n".encode("ascii"),
             b"date: ", _date(), b"\r\ncontent-length: ", str(len(body)).encode("ascii"),
             b"\r\n"]
    for name, value in headers:
        lines += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
    if connection is not None:
        lines += (b"connection: ", connection.encode("ascii"), b"\r\n")
    lines.append(b"\r\n")
    if with_body:
        lines.append(body)
    return b"".join(lines)


_DATE = [0, b""]  # the second of the Date header last computed, and its value


def _date():
    """The Date header's value, computed once a second."""
    now = int(time.time())
    if now != _DATE[0]:
        _DATE[:] = [now, email.utils.formatdate(now, usegmt=True).encode("ascii")]
    return _DATE[1]
