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
are split at the server's `--max-batch-size`).

Each figure is reported with its target (met / not met); nothing is asserted.
`serving_load.py` holds the server process and the clients, `serving_report.py`
the targets and the Markdown tables.
The client runs on the same machine as the server and takes CPU from it. A full
run takes about 10 minutes on a 2-core CPU, half of it the two servers' warm-ups.

    TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/serving.py
    python benchmarks/serving.py --quick                      # a smoke run, figures meaningless
    python benchmarks/serving.py --output /tmp/serving.json   # the figures as JSON too
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import datetime
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from serving_load import Client, ServerProcess, SlowConnections, percentile, rss_mb, run_load
from serving_report import evaluate, markdown

CONCURRENCY = (1, 8, 32, 64)
REQUESTS_PER_CLIENT = 20  # at least, so that many clients run for more than a moment


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
        from keras_transformer.data.corpora import synthetic_translation

        self.sources = list(synthetic_translation(count, seed=3).sources)
        self.tokenizer = None
        if run_dir and os.path.isdir(run_dir):
            from keras_transformer.saving import load_tokenizers

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


def git_commit(checkout=common.REPOSITORY):
    """The checkout's short commit, marked when the server's code has changes."""
    def git(*arguments):
        return subprocess.run(["git", *arguments], cwd=checkout, capture_output=True,
                              text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "keras_transformer"):
        commit += " (uncommitted changes in keras_transformer/)"
    return commit


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
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
    return parser


def parse_args(argv=None):
    """The options, checked (small counts with --quick), with the load table's
    concurrencies and the requests at which the RSS is read."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.concurrency = CONCURRENCY
    args.rss_marks = (1000, 5000)
    if args.quick:
        args.requests, args.warm_repeats, args.slow_requests, args.rounds = 16, 2, 5, 1
        args.slow_connections, args.rss_marks = 10, (20, 100)
    if min(args.requests, args.rounds, args.warm_repeats, args.slow_connections,
           args.slow_requests, args.rss_clients) < 1 or min(args.time_limit, args.phase_limit) <= 0:
        parser.error("counts and limits must be positive")
    return args


def batching_off(args, bank, results, deadline):
    """On a fresh server without batching: the model's metadata, the first
    request of every compiled shape, and the load table; into `results`."""
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


def batching_on(args, bank, results, deadline):
    """On a second server, with batching: the load table, the slow clients and
    the RSS over a long run, as far as the time limit allows; into `results`."""
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


def main(argv=None):
    args = parse_args(argv)
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
    batching_off(args, bank, results, deadline)
    if time.perf_counter() < deadline:
        batching_on(args, bank, results, deadline)

    results["seconds"] = time.perf_counter() - start
    results["targets"] = evaluate(results)
    command = results["command"] = common.command_line("serving.py", argv)
    print()
    print(markdown(results, command))
    print(f"\n(took {results['seconds'] / 60:.1f} min)")
    common.write_results(results, args.output)


if __name__ == "__main__":
    common.run_script(main)
