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
import socket
import threading
import time

import pytest

from keras_transformer_app.serving.protocol import HttpServer
from keras_transformer_app.serving.request import BodyError

pytestmark = pytest.mark.once("tensorflow")  # backend-independent

HOST = "127.0.0.1"
TIMEOUT = 30.0


async def echo(request):
    """Answers `{"method", "path", "body"}`; `/slow` waits for `release` first and
    `/fault` raises."""
    if request.path == "/fault":
        raise RuntimeError("a fault of the handler")
    try:
        body = (await request.body()).decode()
    except BodyError as error:
        return error.status, [("content-type", "application/json")], json.dumps(
            {"error": str(error)}).encode()
    if request.path == "/slow":
        await asyncio.wrap_future(RELEASE[0])
    payload = json.dumps({"method": request.method, "path": request.path, "body": body})
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
                   "Beyond `--max-connections`, each request gets a 503 JSON error with")
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
