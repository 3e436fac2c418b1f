"""The report of the serving benchmark (`serving.py`): the serving targets,
met or not, and the Markdown tables that `RESULTS.md` takes.
"""

from serving_load import percentile

# The targets of the serving issue.
MAX_FAILED_AT_64 = 0
MIN_BATCHING_SPEEDUP = 3.0
MAX_FIRST_OVER_WARM = 2.0
MAX_SLOW_CLIENT_DELAY_MS = 100.0
MAX_RSS_CHANGE = 0.10


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
    """The report of a run for RESULTS.md: the command, machine and model, then
    the servers' start-up, the load, first requests, slow clients and RSS
    figures, and the targets met or not."""
    machine = results["machine"]
    compiled = results["shapes_compiled"]
    lines = [f"- Command: `{command}`",
             (f"- Date: {results['date']}; machine: {machine['cpu']} "
              f"({machine.get('isa', 'instruction set not recorded')}), "
              f"{machine['logical_cores']} logical cores; Python {machine['python']}; "
              f"keras-transformer {results['commit']}"),
             (f"- Model: `{results['saved_model']}` (version {results['version']}), batch sizes "
              f"{compiled['batch_sizes']} × widths {compiled['lengths']}"), ""]
    lines += _server_lines(results)
    lines += _load_lines(results)
    lines += _shape_lines(results)
    lines += _slow_client_lines(results)
    lines += _rss_lines(results)
    lines += ["", "| target | measured | required | result |", "| --- | --- | --- | --- |"]
    for target, measured, required, met in results["targets"]:
        lines.append(f"| {target} | {measured} | {required} | {'met' if met else 'not met'} |")
    return "\n".join(lines)


def _server_lines(results):
    """The table of each server's start-up."""
    lines = ["| server | process start → AVAILABLE | warm-up (server log) | RSS at AVAILABLE |",
             "| --- | --- | --- | --- |"]
    for label, info in results["servers"].items():
        warmup = info["warmup"] or {}
        lines.append(f"| batching {label} | {info['start_to_available_s']:.1f} s | "
                     f"{warmup.get('requests')} requests, {warmup.get('seconds')} s | "
                     f"{info['rss_available_mb']:.0f} MiB |")
    return lines


def _load_lines(results):
    """The load table: a row per batching and concurrency."""
    lines = ["", ("Load: each row is the median of its rounds (by sentences/s); the rounds "
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
    return lines


def _shape_lines(results):
    """The first request of each shape against warm ones, a row per signature."""
    if not results["shapes"]:
        return []
    by_signature = {}
    for r in results["shapes"]:
        by_signature.setdefault(r["signature"], []).append(r)
    lines = ["", (f"First request of each shape vs {results['warm_repeats']} warm ones "
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
    return lines


def _slow_client_lines(results):
    """The good requests' latency without and with the slow connections open."""
    slow = results.get("slow_clients")
    if not slow:
        return []
    return ["", (f"Slow clients (batching on): {slow['requests']} serial one-sentence "
                 f"requests without, then with {slow['connections']} connections open "
                 "(half idle, half sending headers one byte per 0.1 s): p50 "
                 f"{slow['p50_without_ms']:.1f} → {slow['p50_with_ms']:.1f} ms, p95 "
                 f"{slow['p95_without_ms']:.1f} → {slow['p95_with_ms']:.1f} ms; the "
                 f"server closed {slow['slow_connections_closed_by_server']} of them "
                 f"meanwhile ({slow['their_answers'] or 'none'}).")]


def _rss_lines(results):
    """The server's RSS before and during the long run."""
    rss = results.get("rss")
    if not rss:
        return []
    load = rss["load"]
    return ["", (f"RSS (VmRSS, batching on, {load['clients']} clients, "
                 f"{load['requests']} requests at {load['sentences_per_s']:.1f} "
                 f"sentences/s, {load['failed']} failed): {rss['before_mb']:.0f} MiB "
                 f"before, {_mb(rss['at_first_mark_mb'])} at request {rss['marks'][0]:,}, "
                 f"{_mb(rss['at_last_mark_mb'])} at request {rss['marks'][1]:,}.")]


def _mb(value):
    return f"{value:.0f} MiB" if value else "n/a"
