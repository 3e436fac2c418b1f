"""The load generator of the serving benchmark (`serving.py`): the server in
a subprocess, and the clients that drive it on loopback.

`ServerProcess` starts `keras-transformer serve` on 127.0.0.1 (port 0, read
from its log) and waits for the model to be AVAILABLE. `Client` is one
keep-alive `http.client` connection, for requests sent one at a time.
`run_load` sends many one-sentence requests from concurrent clients, each
holding one keep-alive connection: coroutines of one asyncio loop that write
prepared request bytes, the lightest load generator Python offers, since it
shares the CPU with the server. `SlowConnections` holds connections open
that send nothing, or a request's headers one byte at a time.
"""

import asyncio
import contextlib
import http.client
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

HOST = "127.0.0.1"
SERVING_LINE = re.compile(r"Serving (?P<name>\S+) at http://(?P<host>[^:/\s]+):(?P<port>\d+)/")
WARMUP_LINE = re.compile(r"Replayed (?P<count>\d+) warm-up requests of version (?P<version>\d+) "
                         r"in (?P<seconds>[0-9.]+) s")


def percentile(values, q):
    """The q-th percentile (0-100) of `values`, linear between ranks; NaN if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def rss_mb(pid):
    """VmRSS of process `pid` in MiB (/proc/PID/status); NaN where unavailable."""
    try:
        with open(f"/proc/{pid}/status") as file:
            for line in file:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return float("nan")


class ServerProcess:
    """`keras-transformer serve` in a subprocess, bound to 127.0.0.1 on a free port."""

    def __init__(self, base_path, flags, startup_timeout, checkout=None):
        """`checkout`: the root of another checkout (a git worktree) whose code serves,
        instead of this repository's."""
        self.command = [sys.executable, "-m", "keras_transformer_app", "serve", base_path,
                        "--host", HOST, "--port", "0", *flags]
        self.startup_timeout = startup_timeout
        self.checkout = checkout
        self.lines = []
        self.port = None
        self.name = None
        self.warmup = None
        self.process = None
        self._bound = threading.Event()

    def __enter__(self):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
        if self.checkout is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [self.checkout,
                                                              env.get("PYTHONPATH")]))
        self.started = time.perf_counter()
        self.process = subprocess.Popen(self.command, cwd=self.checkout or common.REPOSITORY,
                                        env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, errors="replace")
        threading.Thread(target=self._read_log, daemon=True).start()
        return self

    def __exit__(self, *exc_info):
        self.stop()

    @property
    def pid(self):
        return self.process.pid

    def _read_log(self):
        for line in self.process.stderr:  # drained to the end, so the pipe never fills
            line = line.rstrip("\n")
            self.lines.append(line)
            match = SERVING_LINE.search(line)
            if match and self.port is None:
                self.port, self.name = int(match["port"]), match["name"]
                self._bound.set()
            match = WARMUP_LINE.search(line)
            if match and self.warmup is None:
                self.warmup = {"requests": int(match["count"]),
                               "version": int(match["version"]),
                               "seconds": float(match["seconds"])}
        self._bound.set()  # the process ended

    def log_tail(self, count=20):
        return "\n".join(f"    server: {line}" for line in self.lines[-count:])

    def wait_until_available(self):
        """Waits for the state AVAILABLE; returns seconds from process start."""
        deadline = self.started + self.startup_timeout
        if not self._bound.wait(max(deadline - time.perf_counter(), 0)) or self.port is None:
            if self._bound.is_set():  # its standard error closed: it ended before binding
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=10)
                raise RuntimeError(f"The server exited (status {self.process.returncode}) "
                                   f"before it reported its port:\n{self.log_tail()}")
            raise RuntimeError(f"The server did not report its port within "
                               f"{self.startup_timeout:g} s:\n{self.log_tail()}")
        client = Client(self.port)
        try:
            while time.perf_counter() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"The server exited with status {self.process.returncode}"
                                       f":\n{self.log_tail()}")
                status, payload = client.request("GET", f"/v1/models/{self.name}")
                states = [s.get("state") for s in (payload or {}).get("model_version_status", [])]
                if status == 200 and "AVAILABLE" in states:
                    return time.perf_counter() - self.started
                time.sleep(0.1)
        finally:
            client.close()
        raise RuntimeError(f"The model was not AVAILABLE within {self.startup_timeout:g} s:\n"
                           f"{self.log_tail()}")

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # SIGTERM: the server answers what is in flight, then exits
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Client:
    """One keep-alive HTTP connection to the server; reconnects after an error."""

    def __init__(self, port, timeout=120):
        self.port, self.timeout = port, timeout
        self.connection = None

    def connect(self):
        if self.connection is None:
            self.connection = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
            self.connection.connect()

    def request(self, method, path, body=None):
        """(status, parsed JSON or None); status is None after a connection error."""
        try:
            self.connect()
            headers = {"content-type": "application/json"} if body is not None else {}
            self.connection.request(method, path, body=body, headers=headers)
            response = self.connection.getresponse()
            data = response.read()
            if response.getheader("connection", "").lower() == "close":
                self.close()
        except (OSError, http.client.HTTPException):
            self.close()
            return None, None
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, None

    def predict(self, name, body, instances):
        """(seconds, ok, failure) of one predict request of `instances` instances."""
        start = time.perf_counter()
        status, payload = self.request("POST", f"/v1/models/{name}:predict", body)
        seconds = time.perf_counter() - start
        if status is None:
            return seconds, False, "connection error"
        if status != 200:
            return seconds, False, f"HTTP {status}"
        if not isinstance(payload, dict) or len(payload.get("predictions", ())) != instances:
            return seconds, False, "bad answer"
        return seconds, True, None

    def close(self):
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def run_load(port, name, bodies, concurrency, total, deadline, on_complete=None):
    """`total` one-sentence requests from `concurrency` clients, each with one
    keep-alive connection, stopping early at `deadline`. Returns the figures.

    The clients are coroutines of one asyncio loop that write each request's
    prepared bytes and read the answer by its Content-Length: a load
    generator as light as Python allows, since every CPU cycle it takes is
    one the server on the same machine does not get (32 threads of
    `http.client` took measurably more). Every answer is still parsed and
    checked for its one prediction."""

    return asyncio.run(_run_load(port, name, bodies, concurrency, total, deadline,
                                 on_complete))


def _request_bytes(name, body):
    return (f"POST /v1/models/{name}:predict HTTP/1.1\r\nHost: {HOST}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


async def _read_answer(reader):
    """(status, body, close) of one HTTP/1.1 answer with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
    headers = {key.strip().lower(): value.strip() for key, value in headers.items()}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, body, headers.get("connection", "").lower() == "close"


async def _connect(port):
    return await asyncio.wait_for(asyncio.open_connection(HOST, port), 30)


async def _send(connection, port, request):
    """Sends `request` on `connection` (a new one if it is None) and checks the
    answer for its one prediction. Returns (the connection to send the next
    request on, None if it closed; the failure, None if the answer is good)."""
    failure = None
    try:
        if connection is None:
            connection = await _connect(port)
        reader, writer = connection
        writer.write(request)
        status, body, close = await asyncio.wait_for(_read_answer(reader), 120)
        if close:
            writer.close()
            connection = None
        if status != 200:
            failure = f"HTTP {status}"
        else:
            payload = json.loads(body)
            if not isinstance(payload, dict) or len(payload.get("predictions", ())) != 1:
                failure = "bad answer"
    except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            asyncio.TimeoutError, ValueError):
        failure = "connection error"
        if connection is not None:
            connection[1].close()
        connection = None
    return connection, failure


async def _run_load(port, name, bodies, concurrency, total, deadline, on_complete):

    requests = [_request_bytes(name, body if isinstance(body, bytes) else body.encode())
                for body in bodies]
    state = {"next": 0, "done": 0}
    latencies, failures = [], {}
    ready, go = [0], asyncio.Event()

    async def client():
        connection = None
        try:
            connection = await _connect(port)
        except (OSError, asyncio.TimeoutError):
            pass  # the first request reconnects and counts the error
        ready[0] += 1
        await go.wait()
        while state["next"] < total and time.perf_counter() <= deadline:
            index = state["next"]
            state["next"] += 1
            start = time.perf_counter()
            connection, failure = await _send(connection, port, requests[index % len(requests)])
            seconds = time.perf_counter() - start
            state["done"] += 1
            if failure is None:
                latencies.append(seconds)
            else:
                failures[failure] = failures.get(failure, 0) + 1
            if on_complete is not None:
                on_complete(state["done"])
        if connection is not None:
            connection[1].close()

    tasks = [asyncio.ensure_future(client()) for _ in range(concurrency)]
    while ready[0] < concurrency:
        await asyncio.sleep(0.001)
    start = time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    seconds = time.perf_counter() - start
    return {
        "clients": concurrency, "requests": state["done"], "ok": len(latencies),
        "failed": sum(failures.values()), "failures": failures, "seconds": seconds,
        "stopped_by_time_limit": state["done"] < total,
        "sentences_per_s": len(latencies) / seconds if seconds > 0 else float("nan"),
        "p50_ms": percentile(latencies, 50) * 1e3, "p95_ms": percentile(latencies, 95) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
    }


class SlowConnections:
    """`count` connections held open: half never send a byte, half send a
    request's headers one byte every `interval` s. A connection the server
    closes (its header timeout) is opened again at once."""

    def __init__(self, port, name, count, interval=0.1):
        self.port, self.interval = port, interval
        self.count = count
        self.header = (f"POST /v1/models/{name}:predict HTTP/1.1\r\nHost: {HOST}\r\n"
                       + "X-Slow: " + "s" * 4000).encode("ascii")
        self.sockets = []  # [socket, drips?, bytes sent]
        self.reopened = 0
        self.failed_connects = 0
        self.answers = {}
        self._stop = threading.Event()
        self._thread = None

    def _open(self, drips):
        sock = socket.create_connection((HOST, self.port), timeout=10)
        sock.setblocking(False)
        return [sock, drips, 0]

    def __enter__(self):
        self.sockets = [self._open(i % 2 == 1) for i in range(self.count)]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()
        for entry in self.sockets:
            if entry is not None:
                entry[0].close()

    def _run(self):
        while not self._stop.wait(self.interval):
            for index, entry in enumerate(self.sockets):
                if entry is None:  # could not reconnect last time: try again
                    entry = self.sockets[index] = self._reopen(index, None)
                if entry is None:
                    continue
                sock, drips, sent = entry
                if drips and sent < len(self.header):
                    try:
                        entry[2] += sock.send(self.header[sent:sent + 1])
                    except OSError:
                        pass  # seen as closed below
            open_sockets = [e[0] for e in self.sockets if e is not None]
            readable, _, _ = select.select(open_sockets, [], [], 0)
            for index, entry in enumerate(self.sockets):
                if entry is None or entry[0] not in readable:
                    continue
                try:
                    data = entry[0].recv(4096)
                except OSError:
                    data = b""
                first = data.split(b"\r\n", 1)[0].decode("ascii", "replace") or "closed"
                self.answers[first] = self.answers.get(first, 0) + 1
                entry[0].close()
                self.reopened += 1
                self.sockets[index] = self._reopen(index, entry[1])

    def _reopen(self, index, drips):
        drips = index % 2 == 1 if drips is None else drips
        try:
            return self._open(drips)
        except OSError:
            self.failed_connects += 1
            return None
