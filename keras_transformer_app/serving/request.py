"""One HTTP request of the built-in server, and its body as it arrives (no paper section).

`protocol.Connection` makes a `Request` when a request's head has arrived and feeds it the
body; the application reads the body with `await request.body()`, under the server's body
timeout and bound.
"""

import asyncio

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class BodyError(Exception):
    """The request body could not be read: `status` 400 (the connection ended or its
    framing broke), 408 (too slow) or 413 (too large). The connection closes after the
    answer."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class Request:
    """One request: `method` (str), `path` (percent-decoded, without the query) and
    `headers` (lower-case names; repeated headers joined with ", "); `await body()`
    reads the body."""

    __slots__ = ("method", "path", "headers", "keep_alive", "_connection", "_chunks", "_size",
                 "_complete", "_error", "_waiter", "_read")

    def __init__(self, connection, method, path, headers, keep_alive):
        self.method, self.path, self.headers = method, path, headers
        self.keep_alive = keep_alive
        self._connection = connection
        self._chunks, self._size = [], 0
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
