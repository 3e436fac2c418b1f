"""The HTTP/1.1 side of the server alone (`keras_transformer_app.serving.protocol`), over a
handler that echoes what it was asked, with no model: pipelined requests answered in
order, `Expect: 100-continue`, HTTP/1.0, the keep-alive timeout, the bound on open
connections, a handler's fault, and the graceful stop. What the server answers through it
(malformed HTTP, timeouts, bounds on bodies and headers) is tested in `test_server.py`.

Every socket is on 127.0.0.1 with a timeout.
"""

import asyncio
import concurrent.futures
import json
import os
import re
import socket
import threading
import time
import tomllib

import httptools
import pytest
from helpers import REPOSITORY

from keras_transformer_app.serving.protocol import HttpServer
from keras_transformer_app.serving.request import BodyError

pytestmark = pytest.mark.once("tensorflow")  # backend-independent

HOST = "127.0.0.1"
TIMEOUT = 30.0


async def echo(request):
    """Answers `{"method", "path", "host", "body"}`; `/slow` waits for `release` first,
    `/fault` raises and `/big` answers a megabyte."""
    if request.path == "/fault":
        raise RuntimeError("a fault of the handler")
    if request.path == "/big":
        return 200, [("content-type", "text/plain")], b"x" * 1_000_000
    try:
        body = (await request.body()).decode()
    except BodyError as error:
        return error.status, [("content-type", "application/json")], json.dumps(
            {"error": str(error)}).encode()
    if request.path == "/slow":
        await asyncio.wrap_future(RELEASE[0])
    payload = json.dumps({"method": request.method, "path": request.path,
                          "host": request.headers.get("host"), "body": body})
    return 200, [("content-type", "application/json")], payload.encode()


RELEASE = [None]


class Running:
    """An `HttpServer` serving `echo` on a thread: `port`, `stop()` (graceful)."""

    def __init__(self, **options):
        settings = dict(max_connections=100, header_timeout=5.0, body_timeout=5.0,
                        keep_alive_timeout=5.0, max_body_bytes=1000)
        settings.update(options)
        self.http = HttpServer(echo, **settings)
        self.sock = socket.socket()
        self.sock.bind((HOST, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        listening = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.stop_future = self.loop.create_future()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(
            self.http.serve(self.sock, 16, self.stop_future, 10.0, listening.set),), daemon=True)
        self.thread.start()
        assert listening.wait(TIMEOUT)

    def stop(self):
        self.loop.call_soon_threadsafe(self.stop_future.set_result, None)
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive()
        self.loop.close()


@pytest.fixture
def running():
    RELEASE[0] = concurrent.futures.Future()
    servers = []

    def start(**options):
        servers.append(Running(**options))
        return servers[-1]

    yield start
    if not RELEASE[0].done():
        RELEASE[0].set_result(None)
    for server in servers:
        if server.thread.is_alive():
            server.stop()


def connect(port):
    return socket.create_connection((HOST, port), timeout=TIMEOUT)


def get(path, version="1.1", headers=()):
    lines = [f"GET {path} HTTP/{version}", f"Host: {HOST}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def post(path, body, headers=()):
    lines = [f"POST {path} HTTP/1.1", f"Host: {HOST}", f"Content-Length: {len(body)}",
             *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


_BUFFERS = {}  # bytes read past an answer, per socket (pipelined answers)


def read_response(sock):
    """(status, headers, body) of the next answer; None when the server closed first."""
    data = _BUFFERS.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            assert not data, data
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((name.strip().lower(), value.strip()) for name, _, value in
                   (line.partition(":") for line in lines[1:]))
    length = int(headers["content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    _BUFFERS[sock] = body[length:]
    return int(lines[0].split()[1]), headers, body[:length]


def closed(sock):
    """Whether the server has closed `sock` (reads until the end)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_pipelined_requests_are_answered_in_order(running):
    server = running()
    with connect(server.port) as sock:
        sock.sendall(post("/a", b"first") + get("/b") + post("/c", b"third"))
        answers = [json.loads(read_response(sock)[2]) for _ in range(3)]
    assert [(a["method"], a["path"], a["body"]) for a in answers] == [
        ("POST", "/a", "first"), ("GET", "/b", ""), ("POST", "/c", "third")]


def test_expect_100_continue_gets_100_before_the_body_is_sent(running):
    server = running()
    with connect(server.port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        assert sock.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"body")
        status, _, body = read_response(sock)
    assert status == 200 and json.loads(body)["body"] == "body"


def test_http_1_0_is_answered_and_closed_unless_kept_alive(running):
    server = running()
    with connect(server.port) as sock:
        sock.sendall(get("/old", version="1.0"))
        status, headers, _ = read_response(sock)
        assert (status, headers["connection"]) == (200, "close")
        assert closed(sock)
    with connect(server.port) as sock:
        sock.sendall(get("/old", version="1.0", headers=("Connection: keep-alive",)))
        status, headers, _ = read_response(sock)
        assert (status, headers["connection"]) == (200, "keep-alive")
        sock.sendall(get("/again", version="1.0"))
        assert read_response(sock)[0] == 200


def test_an_idle_connection_closes_after_the_keep_alive_timeout(running):
    server = running(keep_alive_timeout=0.5)
    with connect(server.port) as sock:
        sock.sendall(get("/a"))
        assert read_response(sock)[0] == 200
        start = time.monotonic()
        assert closed(sock)
        assert 0.4 <= time.monotonic() - start < TIMEOUT


@pytest.mark.backs("docs/serving.md",
                   "one more gets 503 with `Retry-After` at once and closes within a second")
def test_connections_over_the_bound_get_503_with_retry_after(running):
    server = running(max_connections=2)
    with connect(server.port) as first, connect(server.port) as second:
        first.sendall(get("/a"))
        assert read_response(first)[0] == 200
        second.sendall(get("/b"))
        assert read_response(second)[0] == 200
        with connect(server.port) as third:
            third.sendall(get("/c"))
            status, headers, body = read_response(third)
            assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
            assert "at most 2 open connections" in json.loads(body)["error"]
            assert closed(third)
        first.sendall(get("/a"))  # the two below the bound go on
        assert read_response(first)[0] == 200
    deadline = time.monotonic() + TIMEOUT
    while server.http.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    with connect(server.port) as again:  # room again once they have closed
        again.sendall(get("/d"))
        assert read_response(again)[0] == 200


@pytest.mark.backs("docs/serving.md", "a server fault gets a 500 whose body says")
def test_a_fault_of_the_handler_is_a_500_that_says_nothing_of_it(running):
    server = running()
    with connect(server.port) as sock:
        sock.sendall(get("/fault"))
        status, _, body = read_response(sock)
    assert status == 500 and "fault of the handler" not in body.decode()


def test_the_graceful_stop_answers_requests_in_flight_and_closes_idle_ones(running):
    server = running()
    idle, busy = connect(server.port), connect(server.port)
    with idle, busy:
        idle.sendall(get("/a"))
        assert read_response(idle)[0] == 200
        busy.sendall(get("/slow"))
        deadline = time.monotonic() + TIMEOUT
        while not any(c._active for c in list(server.http.connections)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stopping = threading.Thread(target=server.stop)
        stopping.start()
        assert closed(idle)
        RELEASE[0].set_result(None)
        status, headers, _ = read_response(busy)
        assert (status, headers["connection"]) == (200, "close")
        stopping.join(TIMEOUT)
    with pytest.raises(OSError):
        connect(server.port).close()


# The hostile cases of a probe from outside (each sends raw bytes): what the server
# answers, whether it closes the connection, and what the echo saw.
def _chunked(head, chunks):
    return head + b"".join(b"%x%s\r\n%s\r\n" % (len(data), extension, data)
                           for extension, data in chunks) + b"0\r\n\r\n"


HOSTILE = [
    # (id, request bytes, status, the connection closes, what the echo saw or None)
    ("Host twice", b"GET /a HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, True, None),
    ("Host with a space, @ and /", b"GET /a HTTP/1.1\r\nHost: a b@c/d\r\n\r\n", 400, True,
     None),
    ("HTTP/1.0 with Transfer-Encoding, asking to keep alive",
     _chunked(b"POST /a HTTP/1.0\r\nConnection: keep-alive\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n", [(b"", b"body")]), 200, True,
     {"path": "/a", "body": "body"}),
    ("1 MB of chunk extensions on a 20-byte body",
     _chunked(b"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
              [(b";x=" + b"e" * 100_000, b"ab")] * 10), 413, True, None),
    ("%2F kept in the path", b"GET /a%2Fb HTTP/1.1\r\nHost: h\r\n\r\n", 200, False,
     {"path": "/a%2Fb"}),
    ("absolute-form target", b"GET http://example.org:8501/abs/path?q=1 HTTP/1.1\r\n"
     b"Host: other\r\n\r\n", 200, False, {"path": "/abs/path", "host": "example.org:8501"}),
    ("absolute-form target without a path", b"GET http://example.org HTTP/1.1\r\n"
     b"Host: other\r\n\r\n", 200, False, {"path": "/", "host": "example.org"}),
    ("IPv6 Host with a port", b"GET /a HTTP/1.1\r\nHost: [::1]:8501\r\n\r\n", 200, False,
     {"host": "[::1]:8501"}),
]


@pytest.mark.parametrize("raw, status, closes, seen", [case[1:] for case in HOSTILE],
                         ids=[case[0] for case in HOSTILE])
@pytest.mark.backs("docs/serving.md", "`%2F` is never a separator")
def test_hostile_requests(running, raw, status, closes, seen):
    server = running()
    with connect(server.port) as sock:
        sock.sendall(raw)
        answer, headers, body = read_response(sock)
        assert answer == status, body
        assert headers["content-type"] == "application/json"
        assert (headers.get("connection") == "close") == closes
        if seen is not None:
            echoed = json.loads(body)
            assert {name: echoed[name] for name in seen} == seen
        if closes:
            assert closed(sock)
        else:
            sock.sendall(get("/again"))
            assert read_response(sock)[0] == 200


@pytest.mark.backs("docs/serving.md", "the connection goes if they have not drained in time")
def test_a_client_that_does_not_read_is_cut_off_at_the_write_deadline(running):
    """3,000 pipelined requests for a megabyte each, and not one byte read: the server
    stops answering once its buffers are full and aborts the connection after
    write_timeout; the slot is free again, and the client gets what the kernel held,
    then the end."""
    server = running(write_timeout=0.5, max_connections=1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TIMEOUT)
    sock.connect((HOST, server.port))
    with sock:
        sock.sendall(get("/big") * 3000)
        deadline = time.monotonic() + TIMEOUT
        while not any(c._write_paused for c in list(server.http.connections)):
            assert time.monotonic() < deadline, "the answers never filled the buffers"
            time.sleep(0.01)
        while server.http.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.http.connections
        received = 0  # what the kernel still held for it, then the end
        try:
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < 100 * 1_000_000  # not the 3,000 answers
    with connect(server.port) as again:  # the one slot serves again
        again.sendall(get("/a"))
        assert read_response(again)[0] == 200


@pytest.mark.backs("docs/serving.md", "it never holds a slot")
def test_sockets_over_the_bound_are_answered_at_once_and_hold_no_slot(running):
    server = running(max_connections=2)
    held = [connect(server.port), connect(server.port)]
    for sock in held:
        sock.sendall(get("/a"))
        assert read_response(sock)[0] == 200
    extra = [connect(server.port) for _ in range(50)]  # they send nothing
    try:
        for sock in extra:
            status, headers, body = read_response(sock)  # without asking
            assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
            assert "at most 2 open connections" in json.loads(body)["error"]
            assert closed(sock)
        assert len(server.http.connections) == 2
        held.pop().close()
        deadline = time.monotonic() + TIMEOUT
        while len(server.http.connections) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with connect(server.port) as legitimate:  # the extra sockets are still open here
            legitimate.sendall(get("/b"))
            assert read_response(legitimate)[0] == 200
    finally:
        for sock in held + extra:
            sock.close()
    deadline = time.monotonic() + TIMEOUT
    while server.http.refused and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.http.refused  # gone within a second of their answer


def test_the_serving_extra_asks_for_an_httptools_with_llhttps_fix():
    """httptools 0.6.0-0.6.2 bundle llhttp 8.1.1 (CVE-2024-27982: a Content-Length hidden
    behind obs-fold); 0.6.3 has the fix, and the installed one is at least that."""
    with open(os.path.join(REPOSITORY, "pyproject.toml"), "rb") as file:
        serving = tomllib.load(file)["project"]["optional-dependencies"]["serving"]
    [floor] = [re.fullmatch(r"httptools>=([\d.]+)", r).group(1) for r in serving
               if r.startswith("httptools")]
    assert tuple(map(int, floor.split("."))) >= (0, 6, 3)
    assert tuple(map(int, httptools.__version__.split(".")[:3])) >= (0, 6, 3)
