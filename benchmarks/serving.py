"""The built-in server (`keras-transformer serve`) under load, on loopback.

Starts the server twice as a subprocess on 127.0.0.1 (port 0, read from its
log), each time on a fresh process, and drives it with clients that each hold
one keep-alive connection (coroutines of one asyncio loop: the lightest load
generator Python offers, since it shares the CPU with the server):

    batching off  first request of every compiled shape against warm ones of
                  the same shape (fresh server), then 1, 8, 32, 64 concurrent
                  clients sending one-sentence requests, `--rounds` times over
    batching on   the same load rounds, then good requests with and
                  without 100 idle or byte-by-byte slow connections open, then
                  a long run (8 clients) reading the server's RSS at requests
                  1,000 and 5,000

One-sentence requests use the quickstart's test sentences
(`synthetic_translation(n, seed=3)`). The shape check sends, for every
(batch size, width) of `GET /v1/models/NAME/metadata`, a request of that many
sentences whose token count + EOS falls in the width's bucket, with the text
signature (`serving_default`) and with `translate_ids` (the run's tokenizer,
`--run-dir`, turns the same sentences into ids); then `--warm-repeats` more of
the same request, and reports first / p99(warm). Batching is off for it, so
that a request of 64 sentences runs at batch 64 (with batching on, requests
are split at `--max-batch-size`, 32 by default).

Each figure is reported with its target (met / not met); nothing is asserted.
The client runs on the same machine as the server and takes CPU from it. A full
run takes about 10 minutes on a 2-core CPU, half of it the two servers' warm-ups.

    TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/serving.py
    python benchmarks/serving.py --quick                      # a smoke run, figures meaningless
    python benchmarks/serving.py --output /tmp/serving.json   # the figures as JSON too
"""

import argparse
import datetime
import http.client
import json
import os
import re
import select
import shlex
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

HOST = "127.0.0.1"
CONCURRENCY = (1, 8, 32, 64)
REQUESTS_PER_CLIENT = 20  # at least, so that many clients run for more than a moment
SERVING_LINE = re.compile(r"Serving (?P<name>\S+) at http://(?P<host>[^:/\s]+):(?P<port>\d+)/")
WARMUP_LINE = re.compile(r"Replayed (?P<count>\d+) warm-up requests of version (?P<version>\d+) "
                         r"in (?P<seconds>[0-9.]+) s")

# The targets of the serving issue.
MAX_FAILED_AT_64 = 0
MIN_BATCHING_SPEEDUP = 3.0
MAX_FIRST_OVER_WARM = 2.0
MAX_SLOW_CLIENT_DELAY_MS = 100.0
MAX_RSS_CHANGE = 0.10


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

    def __init__(self, base_path, flags, startup_timeout):
        self.command = [sys.executable, "-m", "keras_transformer.cli", "serve", base_path,
                        "--host", HOST, "--port", "0", *flags]
        self.startup_timeout = startup_timeout
        self.lines = []
        self.port = None
        self.name = None
        self.warmup = None
        self.process = None
        self._bound = threading.Event()

    def __enter__(self):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
        self.started = time.perf_counter()
        self.process = subprocess.Popen(self.command, cwd=common.REPOSITORY, env=env,
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
    import asyncio

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


async def _run_load(port, name, bodies, concurrency, total, deadline, on_complete):
    import asyncio

    requests = [_request_bytes(name, body if isinstance(body, bytes) else body.encode())
                for body in bodies]
    state = {"next": 0, "done": 0}
    latencies, failures = [], {}
    ready, go = [0], asyncio.Event()

    def fail(kind):
        failures[kind] = failures.get(kind, 0) + 1

    async def connect():
        return await asyncio.wait_for(asyncio.open_connection(HOST, port), 30)

    async def client():
        connection = None
        try:
            connection = await connect()
        except (OSError, asyncio.TimeoutError):
            pass  # the first request reconnects and counts the error
        ready[0] += 1
        await go.wait()
        while state["next"] < total and time.perf_counter() <= deadline:
            index = state["next"]
            state["next"] += 1
            start = time.perf_counter()
            failure = None
            try:
                if connection is None:
                    connection = await connect()
                reader, writer = connection
                writer.write(requests[index % len(requests)])
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
            seconds = time.perf_counter() - start
            state["done"] += 1
            if failure is None:
                latencies.append(seconds)
            else:
                fail(failure)
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


def load_table(server, bodies, args, deadline, label):
    """Every concurrency of `args.concurrency`, `args.rounds` times over in
    interleaved rounds (1, 8, 32, 64, 1, 8, ...), so that a slow spell of the
    machine does not fall on one concurrency only. Each row is the round with
    the median sentences/s, with every round's figure in `rounds`."""
    runs = {clients: [] for clients in args.concurrency}
    for round_index in range(args.rounds):
        for clients in args.concurrency:
            if time.perf_counter() > deadline:
                common.progress(f"  {label}: {clients} clients, round {round_index + 1} "
                                "skipped (time limit)")
                continue
            total = max(args.requests, REQUESTS_PER_CLIENT * clients)
            result = run_load(server.port, server.name, bodies, clients, total,
                              min(deadline, time.perf_counter() + args.phase_limit))
            runs[clients].append(result)
            common.progress(
                f"  {label}, {clients:2d} clients, round {round_index + 1}: "
                f"{result['requests']} requests in {result['seconds']:.1f} s, "
                f"{result['sentences_per_s']:.1f} sentences/s, p50 {result['p50_ms']:.0f} ms, "
                f"p95 {result['p95_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms, failed "
                f"{result['failed']} {result['failures'] or ''}")
    results = []
    for clients, measured in runs.items():
        if not measured:
            continue
        ranked = sorted(measured, key=lambda r: r["sentences_per_s"])
        median = ranked[(len(ranked) - 1) // 2]
        results.append(dict(median, batching=label,
                            rounds=[r["sentences_per_s"] for r in measured],
                            failed_all_rounds=sum(r["failed"] for r in measured),
                            stopped_all_rounds=any(r["stopped_by_time_limit"] for r in measured)))
    return results


class SentenceBank:
    """One-sentence request bodies and, per width bucket, sentences whose token
    count + EOS falls in the bucket (with their ids)."""

    def __init__(self, run_dir, count):
        from keras_transformer.training.data import synthetic_translation

        self.sources = list(synthetic_translation(count, seed=3).sources)
        self.tokenizer = None
        if run_dir and os.path.isdir(run_dir):
            from keras_transformer.run_files import load_tokenizers

            self.tokenizer = load_tokenizers(run_dir)[0]
        self.bodies = [json.dumps({"instances": [s]}) for s in self.sources]

    def bucket_sentences(self, low, high, count):
        """`count` (sentence, ids + EOS) with low < len(ids) + 1 <= high, as long
        as fits: consecutive test sentences joined, starting at different ones."""
        words = " ".join(self.sources).split()
        distinct = sorted(set(words))
        pieces = dict(zip(distinct, map(len, self.tokenizer.tokenize(distinct))))
        chosen = []
        for start in range(len(words)):
            total, end = 0, start
            while end < len(words) and total + pieces[words[end]] + 1 <= high:
                total += pieces[words[end]]
                end += 1
            if total + 1 > low:
                chosen.append(" ".join(words[start:end]))
            if len(chosen) == count:
                break
        ids = self.tokenizer.tokenize(chosen)
        eos = self.tokenizer.eos_id
        rows = [row + [eos] for row in ids]
        bad = [len(row) for row in rows if not low < len(row) <= high]
        if bad or len(rows) < count:
            raise RuntimeError(f"Could not build {count} sentences of width ({low}, {high}]: "
                               f"got lengths {bad[:5]} ({len(rows)} sentences).")
        return list(zip(chosen, rows))


def shape_check(server, bank, metadata, args, deadline):
    """First request of every compiled shape vs `args.warm_repeats` warm ones."""
    shapes = metadata["shapes"]
    batch_sizes, lengths = shapes["batch_sizes"], shapes["lengths"]
    if args.quick:
        batch_sizes, lengths = batch_sizes[:2], lengths[:2]
    signatures = ["serving_default", "translate_ids"] if bank.tokenizer else ["translate_ids"]
    if bank.tokenizer is None:
        common.progress(f"  no tokenizer in {args.run_dir!r}: translate_ids only, random ids")
    client = Client(server.port)
    results = []
    try:
        for signature in signatures:
            low = 0
            for width in lengths:
                if bank.tokenizer is not None:
                    sentences = bank.bucket_sentences(low, width, max(batch_sizes))
                else:
                    import numpy as np

                    rng = np.random.default_rng(width)
                    vocab = metadata["config"]["vocab_size"]
                    sentences = [(None, [int(i) for i in rng.integers(4, vocab, width - 1)] + [3])
                                 for _ in range(max(batch_sizes))]
                low = width
                for batch in batch_sizes:
                    if time.perf_counter() > deadline:
                        common.progress("  shape check stopped (time limit)")
                        return results
                    chosen = sentences[:batch]
                    if signature == "serving_default":
                        body = json.dumps({"instances": [text for text, _ in chosen]})
                    else:
                        body = json.dumps({"signature_name": "translate_ids",
                                           "instances": [ids for _, ids in chosen]})
                    first, ok, _ = client.predict(server.name, body, batch)
                    warm, failed = [], 0 if ok else 1
                    for _ in range(args.warm_repeats):
                        seconds, ok, _ = client.predict(server.name, body, batch)
                        if ok:
                            warm.append(seconds)
                        else:
                            failed += 1
                    p99 = percentile(warm, 99)
                    row = {"signature": signature, "batch": batch, "width": width,
                           "first_ms": first * 1e3, "warm_p50_ms": percentile(warm, 50) * 1e3,
                           "warm_p99_ms": p99 * 1e3, "ratio": first / p99, "failed": failed}
                    results.append(row)
                    common.progress(
                        f"  {signature} batch {batch:2d} width {width:3d}: first "
                        f"{row['first_ms']:.0f} ms, warm p50 {row['warm_p50_ms']:.0f} ms, p99 "
                        f"{row['warm_p99_ms']:.0f} ms, first/p99 {row['ratio']:.2f}"
                        + (f", {failed} failed" if failed else ""))
    finally:
        client.close()
    return results


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


def serial_latencies(server, bodies, count, offset=0):
    client = Client(server.port)
    latencies, failed = [], 0
    try:
        for i in range(count):
            seconds, ok, _ = client.predict(server.name, bodies[(offset + i) % len(bodies)], 1)
            if ok:
                latencies.append(seconds)
            else:
                failed += 1
    finally:
        client.close()
    return latencies, failed


def slow_client_check(server, bodies, args):
    count = args.slow_requests
    serial_latencies(server, bodies, 5)  # the connection path warm
    before, failed_before = serial_latencies(server, bodies, count)
    with SlowConnections(server.port, server.name, args.slow_connections) as slow:
        time.sleep(1.0)
        during, failed_during = serial_latencies(server, bodies, count)
        reopened, answers = slow.reopened, dict(slow.answers)
        failed_connects = slow.failed_connects
    result = {
        "connections": args.slow_connections, "requests": count,
        "p50_without_ms": percentile(before, 50) * 1e3,
        "p95_without_ms": percentile(before, 95) * 1e3,
        "p50_with_ms": percentile(during, 50) * 1e3,
        "p95_with_ms": percentile(during, 95) * 1e3,
        "failed": failed_before + failed_during,
        "slow_connections_closed_by_server": reopened, "their_answers": answers,
        "slow_connects_refused": failed_connects,
    }
    result["delay_p50_ms"] = result["p50_with_ms"] - result["p50_without_ms"]
    result["delay_p95_ms"] = result["p95_with_ms"] - result["p95_without_ms"]
    common.progress(
        f"  good requests p50 {result['p50_without_ms']:.1f} -> {result['p50_with_ms']:.1f} ms, "
        f"p95 {result['p95_without_ms']:.1f} -> {result['p95_with_ms']:.1f} ms with "
        f"{args.slow_connections} slow connections open ({reopened} closed by the server: "
        f"{answers or 'none'}), failed {result['failed']}")
    return result


def rss_check(server, bodies, args, deadline):
    marks = {args.rss_marks[0]: None, args.rss_marks[1]: None}

    def on_complete(done):
        if done in marks:
            marks[done] = rss_mb(server.pid)

    before = rss_mb(server.pid)
    load = run_load(server.port, server.name, bodies, args.rss_clients, args.rss_marks[1],
                    deadline, on_complete)
    first, last = marks[args.rss_marks[0]], marks[args.rss_marks[1]]
    change = (last - first) / first if first and last else float("nan")
    common.progress(f"  RSS before {before:.0f} MiB, at request {args.rss_marks[0]} "
                    f"{first or float('nan'):.0f} MiB, at {args.rss_marks[1]} "
                    f"{last or float('nan'):.0f} MiB ({change * 100:+.1f} %); "
                    f"{load['sentences_per_s']:.1f} sentences/s, failed {load['failed']}")
    return {"before_mb": before, "marks": args.rss_marks, "at_first_mark_mb": first,
            "at_last_mark_mb": last, "change": change, "load": load}


def start_server(args, flags, label):
    server = ServerProcess(args.saved_model, flags, args.startup_timeout)
    server.__enter__()
    try:
        available = server.wait_until_available()
    except BaseException:
        server.stop()
        raise
    info = {"flags": flags, "start_to_available_s": available,
            "warmup": server.warmup, "rss_available_mb": rss_mb(server.pid)}
    warmup = server.warmup or {}
    common.progress(f"{label}: port {server.port}, AVAILABLE {available:.1f} s after process "
                    f"start, warm-up {warmup.get('requests')} requests in "
                    f"{warmup.get('seconds')} s, RSS {info['rss_available_mb']:.0f} MiB")
    return server, info


def evaluate(results):
    """[(target, measured, required, met)] of the issue's targets."""
    rows = []
    load = {(r["batching"], r["clients"]): r for r in results["load"]}
    at_64 = [load[key] for key in (("off", 64), ("on", 64)) if key in load]
    if at_64:
        failed = sum(r["failed_all_rounds"] for r in at_64)
        complete = not any(r["stopped_all_rounds"] for r in at_64)
        rows.append(("failed requests, 64 concurrent one-sentence clients (batching off + on)",
                     f"{failed}" + ("" if complete else " (stopped by the time limit)"),
                     "0", failed == MAX_FAILED_AT_64 and complete))
    if ("on", 1) in load and ("on", 32) in load:
        one, many = load[("on", 1)], load[("on", 32)]
        ratio = many["sentences_per_s"] / one["sentences_per_s"]
        paired = [b / a for a, b in zip(one["rounds"], many["rounds"])]
        rows.append(("batching on: sentences/s at 32 clients / 1 serial client (medians of "
                     f"{len(one['rounds'])} rounds)",
                     f"{ratio:.2f} (round by round: {', '.join(f'{r:.2f}' for r in paired)})",
                     f"≥ {MIN_BATCHING_SPEEDUP:g}",
                     ratio >= MIN_BATCHING_SPEEDUP))
    if results["shapes"]:
        worst = max(results["shapes"], key=lambda r: r["ratio"])
        rows.append((("first request / warm p99, worst shape "
                      f"({worst['signature']}, batch {worst['batch']}, width {worst['width']})"),
                     f"{worst['ratio']:.2f}", f"≤ {MAX_FIRST_OVER_WARM:g}",
                     worst["ratio"] <= MAX_FIRST_OVER_WARM))
    slow = results.get("slow_clients")
    if slow:
        rows.append((f"delay of a good request (p50) with {slow['connections']} slow connections",
                     f"{slow['delay_p50_ms']:.1f} ms", f"≤ {MAX_SLOW_CLIENT_DELAY_MS:g} ms",
                     slow["delay_p50_ms"] <= MAX_SLOW_CLIENT_DELAY_MS and not slow["failed"]))
    rss = results.get("rss")
    if rss and rss["at_last_mark_mb"]:
        marks = rss["marks"]
        rows.append((f"RSS change between request {marks[0]:,} and {marks[1]:,}",
                     f"{rss['change'] * 100:+.1f} %", f"within ±{MAX_RSS_CHANGE * 100:g} %",
                     abs(rss["change"]) <= MAX_RSS_CHANGE))
    return rows


def markdown(results, command):
    machine = results["machine"]
    compiled = results["shapes_compiled"]
    lines = [f"- Command: `{command}`",
             (f"- Date: {results['date']}; machine: {machine['cpu']}, "
              f"{machine['logical_cores']} logical cores; Python {machine['python']}; "
              f"keras-transformer {results['commit']}"),
             (f"- Model: `{results['saved_model']}` (version {results['version']}), batch sizes "
              f"{compiled['batch_sizes']} × widths {compiled['lengths']}"), ""]
    lines += ["| server | process start → AVAILABLE | warm-up (server log) | RSS at AVAILABLE |",
              "| --- | --- | --- | --- |"]
    for label, info in results["servers"].items():
        warmup = info["warmup"] or {}
        lines.append(f"| batching {label} | {info['start_to_available_s']:.1f} s | "
                     f"{warmup.get('requests')} requests, {warmup.get('seconds')} s | "
                     f"{info['rss_available_mb']:.0f} MiB |")
    lines += ["", ("Load: each row is the median of its rounds (by sentences/s); the rounds "
                   "ran interleaved, 1, 8, 32, 64 clients, then again."), "",
              ("| batching | clients | requests per round | failed (all rounds) | sentences/s "
               "| every round | p50 ms | p95 ms | p99 ms |"),
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["load"]:
        stopped = " (time limit)" if r["stopped_all_rounds"] else ""
        lines.append(f"| {r['batching']} | {r['clients']} | {r['requests']}{stopped} | "
                     f"{r['failed_all_rounds']} | {r['sentences_per_s']:.1f} | "
                     f"{', '.join(f'{x:.1f}' for x in r['rounds'])} | {r['p50_ms']:.0f} | "
                     f"{r['p95_ms']:.0f} | {r['p99_ms']:.0f} |")
    if results["shapes"]:
        by_signature = {}
        for r in results["shapes"]:
            by_signature.setdefault(r["signature"], []).append(r)
        lines += ["", (f"First request of each shape vs {results['warm_repeats']} warm ones "
                       "(fresh server, batching off):"), "",
                  ("| signature | shapes | worst first / warm p99 (shape) | median ratio | "
                   "largest first request |"), "| --- | --- | --- | --- | --- |"]
        for signature, rows in by_signature.items():
            worst = max(rows, key=lambda r: r["ratio"])
            slowest = max(rows, key=lambda r: r["first_ms"])
            lines.append(
                f"| {signature} | {len(rows)} | {worst['ratio']:.2f} (batch {worst['batch']}, "
                f"width {worst['width']}: {worst['first_ms']:.0f} vs {worst['warm_p99_ms']:.0f} "
                f"ms) | {percentile([r['ratio'] for r in rows], 50):.2f} | "
                f"{slowest['first_ms']:.0f} ms (batch {slowest['batch']}, width "
                f"{slowest['width']}; warm p99 {slowest['warm_p99_ms']:.0f} ms) |")
    slow = results.get("slow_clients")
    if slow:
        lines += ["", (f"Slow clients (batching on): {slow['requests']} serial one-sentence "
                       f"requests without, then with {slow['connections']} connections open "
                       "(half idle, half sending headers one byte per 0.1 s): p50 "
                       f"{slow['p50_without_ms']:.1f} → {slow['p50_with_ms']:.1f} ms, p95 "
                       f"{slow['p95_without_ms']:.1f} → {slow['p95_with_ms']:.1f} ms; the "
                       f"server closed {slow['slow_connections_closed_by_server']} of them "
                       f"meanwhile ({slow['their_answers'] or 'none'}).")]
    rss = results.get("rss")
    if rss:
        load = rss["load"]
        lines += ["", (f"RSS (VmRSS, batching on, {load['clients']} clients, "
                       f"{load['requests']} requests at {load['sentences_per_s']:.1f} "
                       f"sentences/s, {load['failed']} failed): {rss['before_mb']:.0f} MiB "
                       f"before, {_mb(rss['at_first_mark_mb'])} at request {rss['marks'][0]:,}, "
                       f"{_mb(rss['at_last_mark_mb'])} at request {rss['marks'][1]:,}.")]
    lines += ["", "| target | measured | required | result |", "| --- | --- | --- | --- |"]
    for target, measured, required, met in results["targets"]:
        lines.append(f"| {target} | {measured} | {required} | {'met' if met else 'not met'} |")
    return "\n".join(lines)


def git_commit():
    """The repository's short commit, marked when the server's code has changes."""
    def git(*arguments):
        return subprocess.run(["git", *arguments], cwd=common.REPOSITORY, capture_output=True,
                              text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "keras_transformer"):
        commit += " (uncommitted changes in keras_transformer/)"
    return commit


def _mb(value):
    return f"{value:.0f} MiB" if value else "n/a"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saved-model", default="saved_models/quickstart",
                        help="base path served (default: saved_models/quickstart)")
    parser.add_argument("--run-dir", default="runs/quickstart",
                        help="the run whose tokenizer sizes the shape check's sentences")
    parser.add_argument("--requests", type=int, default=600,
                        help=f"requests per load configuration (at least {REQUESTS_PER_CLIENT} "
                             "per client)")
    parser.add_argument("--time-limit", type=float, default=1200,
                        help="seconds for the whole benchmark; later phases are skipped")
    parser.add_argument("--phase-limit", type=float, default=90,
                        help="seconds for one load configuration")
    parser.add_argument("--startup-timeout", type=float, default=400,
                        help="seconds for a server to become AVAILABLE")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of the load table; each row reports the median")
    parser.add_argument("--warm-repeats", type=int, default=5,
                        help="warm requests per shape after the first")
    parser.add_argument("--slow-connections", type=int, default=100)
    parser.add_argument("--slow-requests", type=int, default=200,
                        help="good requests timed without and with the slow connections (200 "
                             "last past the server's 10 s header timeout)")
    parser.add_argument("--rss-clients", type=int, default=8)
    parser.add_argument("--quick", action="store_true",
                        help="small counts, two batch sizes and widths (figures meaningless)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    args.concurrency = CONCURRENCY
    args.rss_marks = (1000, 5000)
    if args.quick:
        args.requests, args.warm_repeats, args.slow_requests, args.rounds = 16, 2, 5, 1
        args.slow_connections, args.rss_marks = 10, (20, 100)
    if min(args.requests, args.rounds, args.warm_repeats, args.slow_connections,
           args.slow_requests, args.rss_clients) < 1 or min(args.time_limit, args.phase_limit) <= 0:
        parser.error("counts and limits must be positive")
    shown_path = args.saved_model
    args.saved_model = os.path.abspath(args.saved_model)  # the server runs in the repository

    start = time.perf_counter()
    deadline = start + args.time_limit
    common.progress("serving: preparing sentences")
    bank = SentenceBank(args.run_dir, 500)
    results = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
               "machine": common.machine(), "saved_model": shown_path,
               "commit": git_commit(),
               "quick": args.quick, "requests_per_configuration": args.requests,
               "rounds": args.rounds,
               "warm_repeats": args.warm_repeats, "servers": {}, "load": [], "shapes": []}

    server, info = start_server(args, ["--no-enable-batching"], "batching off")
    try:
        results["servers"]["off"] = info
        client = Client(server.port)
        _, metadata = client.request("GET", f"/v1/models/{server.name}/metadata")
        client.close()
        version, metadata = int(metadata["model_spec"]["version"]), metadata["metadata"]
        results["version"], results["shapes_compiled"] = version, metadata["shapes"]
        common.progress("First request of each shape (batching off, fresh server)")
        results["shapes"] = shape_check(server, bank, metadata, args, deadline)
        common.progress("Load, batching off")
        results["load"] += load_table(server, bank.bodies, args, deadline, "off")
    finally:
        server.stop()

    if time.perf_counter() < deadline:
        server, info = start_server(args, ["--enable-batching"], "batching on")
        try:
            results["servers"]["on"] = info
            common.progress("Load, batching on")
            results["load"] += load_table(server, bank.bodies, args, deadline, "on")
            if time.perf_counter() < deadline:
                common.progress("Slow clients (batching on)")
                results["slow_clients"] = slow_client_check(server, bank.bodies, args)
            if time.perf_counter() < deadline:
                common.progress(f"RSS over a long run ({args.rss_clients} clients, batching on)")
                results["rss"] = rss_check(server, bank.bodies, args, deadline)
        finally:
            server.stop()

    results["seconds"] = time.perf_counter() - start
    results["targets"] = evaluate(results)
    command = "TF_CPP_MIN_LOG_LEVEL=3 python " + " ".join(
        shlex.quote(a) for a in ["benchmarks/serving.py", *(sys.argv[1:] if argv is None
                                                            else argv)])
    print()
    print(markdown(results, command))
    print(f"\n(took {results['seconds'] / 60:.1f} min)")
    if args.output:
        with open(args.output, "w") as file:
            json.dump(results, file, indent=1, default=str)
    common.emit(results)


if __name__ == "__main__":
    main()
