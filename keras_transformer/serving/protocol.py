"""The HTTP/1.1 connection of the built-in server: uvicorn's h11 protocol, hardened.

TensorFlow Serving's REST API answers errors with a JSON `{"error": ...}`;
this server does so for every client mistake, down to malformed HTTP, which
uvicorn's own protocol answers in plain text. `protocol_class` returns
uvicorn's h11 protocol with three changes:

* a header timeout: a client has `header_timeout` seconds to send a
  request's headers, from when it connects or from the first bytes of a
  later request on a keep-alive connection (408, or a plain close when it
  never sent anything), so a slow client cannot hold a connection forever;
* a bound on the request line and headers that also holds when they arrive
  in one read (h11 bounds them only while they arrive in pieces);
* malformed HTTP (a bad request line, over-long headers, broken chunked
  framing) answered with a 400 JSON error.
"""

import json

from keras_transformer import compat

#: The most bytes of request line and headers (h11's bound on headers still
#: arriving, applied to complete ones too).
MAX_HEADER_BYTES = 16 * 1024
_REASONS = {400: "Bad Request", 408: "Request Timeout"}


def json_error_bytes(status, message):
    """A complete HTTP/1.1 response `{"error": message}` that closes the connection."""
    body = json.dumps({"error": message}).encode("utf-8")
    reason = _REASONS.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode("ascii") + body


def protocol_class(header_timeout):
    """uvicorn's h11 protocol with a header timeout and JSON protocol errors.

    Args:
        header_timeout: Seconds for a client to send a request's headers.

    Returns:
        A subclass of uvicorn's h11 protocol (`keras_transformer.compat.h11_protocol`,
        which names the uvicorn versions tested), for `uvicorn.Config(http=...)`.
    """
    return type("Protocol", (_Hardened, compat.h11_protocol()),
                {"header_timeout": header_timeout})


class _Hardened:
    """What `protocol_class` adds to uvicorn's h11 protocol (its subclass's
    `header_timeout` gives the timeout)."""

    header_timeout = None
    _header_timer = None

    def connection_made(self, transport):
        super().connection_made(transport)
        self._arm_header_timer()
        self.conn.next_event = _bounded(self.conn.next_event)

    def data_received(self, data):
        import h11

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
        # Malformed HTTP: answered in JSON like every other mistake.
        self._disarm_header_timer()
        self.transport.write(json_error_bytes(400, f"Malformed HTTP request: {msg}"))
        self.transport.close()

    def _arm_header_timer(self):
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm_header_timer(self):
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self):
        import h11

        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.our_state is h11.IDLE and not self.conn.trailing_data[0]:
            self.transport.close()  # connected, never sent anything: just close
            return
        if self.conn.our_state is h11.IDLE:
            self.transport.write(json_error_bytes(
                408, f"The request headers did not arrive within {self.header_timeout:g} s."))
        self.transport.close()


def _bounded(next_event):
    """h11's `next_event`, refusing a request whose request line and headers
    exceed `MAX_HEADER_BYTES`: h11 limits headers only while they arrive in
    pieces, and one read can bring a complete block of any size."""
    import h11

    def checked_next_event():
        event = next_event()
        if isinstance(event, h11.Request) and len(event.target) + sum(
                len(name) + len(value) for name, value in event.headers) > MAX_HEADER_BYTES:
            raise h11.RemoteProtocolError(
                f"the request line and headers exceed {MAX_HEADER_BYTES} bytes")
        return event

    return checked_next_event
