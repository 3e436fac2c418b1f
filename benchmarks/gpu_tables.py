"""The tables made from gpu_all.sh's JSON lines (`results.jsonl` of a run on the GPU
machine): its runs against their peers, before and after a change, and the paper's training
time at the measured rate; `benchmarks/tables.py` writes and checks them, by kind."""

from records import BACKEND_NAMES


def gpu(kind, lines):
    """gpu_all.sh's JSON lines (results.jsonl): a row for each run's model and each of its
    peers, in the file's order, then ours / peer; a run that failed or ran past its limit is
    said in a line of its own. The lines' commit is not shown: the page names the one the
    copy was (KERAS_TRANSFORMER_COMMIT records it since)."""
    import run_all

    def row(name, model, result):
        return (name, model, f"{result['median_step_s'] * 1000:.1f}",
                f"{result['tokens_per_s']:,.0f}", f"{result['achieved_tflops']:.1f}",
                f"{result['mfu']:.1%}", f"{result['peak_gpu_memory_mb']:,.0f}",
                f"{result['first_window_s']:.1f} s")

    rows, ratios, failed = [], [], []
    for line in lines:
        result = line.get("result")
        if result is None:
            failed.append(f"`{line['run']}` ended with status {line['exit_status']} after "
                          f"{line['wall_s']} s")
            continue
        model = f"{result['config']} ({result['params'] / 1e6:.1f}M)"
        rows.append(row(f"ours, {BACKEND_NAMES[result['backend']]} (`{line['run']}`)", model,
                        result))
        for mode, peer in result.get("peers", {}).items():
            label = "`torch.compile`" if mode == "compile" else mode
            rows.append(row(f"torch.nn.Transformer, {label} (`{line['run']}`)", model, peer))
            ratios.append(f"`{line['run']}` {peer['ours_over_peer']:.3f} × the "
                          f"{'compiled' if mode == 'compile' else mode} peer")
    text = run_all.table(("run", "model", "ms/step", "target tokens/s", "TFLOP/s", "MFU",
                          "peak GPU MiB", "first window"), rows)
    text += "\n\nOurs / the peer, from the same invocation: " + "; ".join(ratios) + "."
    if failed:
        text += "\n\nNot measured: " + "; ".join(failed) + "."
    return text


# The paper's training length per model (§5.2): steps, and target tokens a step (about 25,000).
PAPER_STEPS = {"base": 100_000, "big": 300_000}
PAPER_TOKENS_PER_STEP = 25_000


def gpu_paper_time(kind, lines):
    """How long the paper's training (§5.2) takes at the target tokens per second that
    gpu_all.sh's JSON lines measured for our JAX runs in mixed_bfloat16, a row per model (a
    baseline's runs, profiles and runs on real ids left out)."""
    import run_all

    rows = []
    for line in lines:
        result = line.get("result")
        if (not result or result["backend"] != "jax" or result["precision"] != "mixed_bfloat16"
                or line["run"].startswith("before-") or line["run"].endswith("-profile")
                or not result["ids"].startswith("zipf")):
            continue
        steps = PAPER_STEPS[result["config"]]
        tokens = steps * PAPER_TOKENS_PER_STEP
        seconds = tokens / result["tokens_per_s"]
        rows.append((result["config"], f"{steps:,} × ~{PAPER_TOKENS_PER_STEP:,}",
                     f"{tokens / 1e9:g} billion", f"{result['tokens_per_s']:,.0f}",
                     f"{tokens / 1e9:g}e9 / {result['tokens_per_s']:,.0f} = {seconds:,.0f} s ≈ "
                     f"{seconds / 3600:.1f} hours"))
    return run_all.table(("model", "steps × target tokens per step", "tokens",
                          "measured target tokens/s", "time"), rows)


def gpu_before_after(kind, lines):
    """gpu_all.sh's JSON lines of a run with BEFORE: the JAX base model's rows, the
    baseline's (runs named "before-...") beside this commit's, by precision, then the run on
    real ids; the float16 rows say how many steps the loss scaler skipped."""
    import run_all

    def order(line):
        result = line["result"]
        return (result["precision"] != "mixed_bfloat16", not result["ids"].startswith("zipf"),
                not line["run"].startswith("before-"))

    rows = []
    chosen = [line for line in lines if line.get("result") and line["result"]["backend"] == "jax"
              and line["result"]["config"] == "base" and not line["run"].endswith("-profile")]
    for line in sorted(chosen, key=order):
        result = line["result"]
        name = "before" if line["run"].startswith("before-") else "after"
        if not result["ids"].startswith("zipf"):
            name += ", ids of real text"
        skipped = (f"{result['skipped_steps']} of {result['steps']}"
                   if result["precision"] == "mixed_float16" else "–")
        rows.append((f"{name} (`{line['run']}`)", result["precision"], str(result["steps"]),
                     f"{result['median_step_s'] * 1000:.1f}", f"{result['tokens_per_s']:,.0f}",
                     skipped))
    return run_all.table(("run (JAX, base)", "precision", "steps", "ms/step", "target tokens/s",
                          "steps skipped by loss scaling"), rows)
