"""A cluster of two processes with one of them killed: how soon the other stops, with
which exit status and which line (docs/distributed.md, "When a process dies").

For each backend (`--backends`: JAX's distributed runtime, TensorFlow's
MultiWorkerMirroredStrategy) and each process (`--killed`: 1, then 0, the chief and
JAX's coordinator), `--repeats` times, it starts the quickstart recipe as two processes on
127.0.0.1 (`--distribute data`, a tiny model, a backup every `--checkpoint-every`
steps, the default peer timeout), waits for the chief's first backup, kills the
process with SIGKILL and times the other from the kill to its `error:` line and to its
exit. It reports for each: those seconds, the survivor's exit status and the line that
says why it stopped (its `error:` line, else the last line of its output).

    python benchmarks/cluster_faults.py --output docs/results/cluster-faults.json
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

from keras_transformer_app import run_files

BACKENDS = ("jax", "tensorflow")
# The quickstart's model made tiny: the processes reach their first backup in seconds.
MODEL = ["--preset", "tiny", "--d-model", "32", "--d-ff", "64", "--num-heads", "2",
         "--num-layers", "1", "--warmup-steps", "10", "--train-pairs", "400",
         "--test-pairs", "8", "--no-export", "--verbose", "2"]
LIMIT = 600  # seconds any one process may take
FATAL = re.compile(r"^F\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ")  # a glog FATAL line's prefix
ADDRESS = re.compile(r"\[127\.0\.0\.1\]:\d+")  # a peer's address, its port new each run


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                        help="the engines whose clusters are measured (default: both)")
    parser.add_argument("--killed", nargs="+", type=int, choices=(1, 0), default=[1, 0],
                        help="the processes killed, each in a cluster of its own (default: "
                        "1, then 0)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="kills of each process per backend (default: %(default)s)")
    parser.add_argument("--checkpoint-every", type=int, default=4,
                        help="the recipe's steps between backups (default: %(default)s)")
    parser.add_argument("--work-dir", help="where the runs go (default: a temporary folder, "
                        "removed at the end)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    return parser


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cluster_environments(backend):
    """Each of the two processes' variables, by the engine's rules (docs/distributed.md)."""
    if backend == "jax":
        address = f"127.0.0.1:{free_port()}"
        return [{"KERAS_DISTRIBUTION_JOB_ADDRESSES": address,
                 "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                 "KERAS_DISTRIBUTION_PROCESS_ID": str(index)} for index in (0, 1)]
    workers = [f"127.0.0.1:{free_port()}" for _ in (0, 1)]
    return [{"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                      "task": {"type": "worker", "index": index}})}
            for index in (0, 1)]


def reason(output):
    """The line of a stopped process's output that says why: its `error:` line, else the
    message of the native runtime's fatal log line (JAX's, when the coordinator is gone:
    `F1206 02:25:05.302430 23069 client.h:80] Terminating process because ...`), else
    its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    fatal = [FATAL.sub("", line) for line in lines if FATAL.match(line)]
    return (errors or fatal or lines or ["(no output)"])[-1][:300]


def kill_one(backend, victim, run_dir, checkpoint_every):
    """Starts the two processes, kills `victim` after the chief's first backup, and
    returns the survivor's seconds from the kill to its exit, its status and its line."""
    command = [sys.executable, "-m", "recipes.quickstart", "--run-dir", run_dir,
               "--distribute", "data", "--steps", "100000", "--checkpoint-every",
               str(checkpoint_every), *MODEL]
    logs = [open(f"{run_dir}.{index}.log", "w+") for index in (0, 1)]
    processes = [subprocess.Popen(command, cwd=common.REPOSITORY, stdout=log,
                                  stderr=subprocess.STDOUT,
                                  env=dict(os.environ, KERAS_BACKEND=backend,
                                           TF_CPP_MIN_LOG_LEVEL="3", **environment))
                 for log, environment in zip(logs, cluster_environments(backend))]
    try:
        state = os.path.join(run_files.path(run_dir, run_files.BACKUP), "state.json")
        deadline = time.monotonic() + LIMIT
        while not os.path.exists(state):
            for process, log in zip(processes, logs):
                if process.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"error: a {backend} process ended ({process.returncode}) "
                                     f"before the first backup:\n{log.read()[-3000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"error: no backup within {LIMIT} s ({backend})")
            time.sleep(0.05)
        processes[victim].send_signal(signal.SIGKILL)
        return {"killed": victim, **survivor_ends(processes[1 - victim], logs[1 - victim].name)}
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        for log in logs:
            log.close()


def survivor_ends(survivor, log, killed=None):
    """Watches `survivor` (its output in the file `log`) from the kill (`killed`, by
    `time.monotonic`; now when None) to its exit: {"seconds" to its exit, "line_seconds"
    to its first `error:` line (None if none came), its "status" and its "line"}."""
    killed = time.monotonic() if killed is None else killed
    line_seconds = None
    while survivor.poll() is None:
        if line_seconds is None:
            with open(log, encoding="utf-8", errors="replace") as output:
                if any(line.startswith("error:") for line in output):
                    line_seconds = round(time.monotonic() - killed, 2)
        if time.monotonic() > killed + LIMIT:
            raise SystemExit(f"error: the other process still ran {LIMIT} s after the kill")
        time.sleep(0.05)
    seconds = round(time.monotonic() - killed, 2)
    with open(log, encoding="utf-8", errors="replace") as output:
        text = output.read()
    if line_seconds is None and any(line.startswith("error:") for line in text.splitlines()):
        line_seconds = seconds  # written as it ended
    return {"seconds": seconds, "line_seconds": line_seconds, "status": survivor.returncode,
            "line": reason(text)}


def first_sentence(line):
    """"error: Lost worker 1 of TF_CONFIG, so training stopped.": a line up to the end of
    its first sentence, its backquotes made quotes (the table sets it as code)."""
    end = line.find(". ")
    return (line if end < 0 else line[:end + 1]).replace("`", "'")


def exit_status(status):
    """"1", or "SIGABRT (134)" for a process that a signal ended (`Popen`'s negative
    status; a shell gives 128 and the signal's number)."""
    return str(status) if status >= 0 else f"{signal.Signals(-status).name} ({128 - status})"


def table(result):
    """The Markdown of a run's results (`--output`; benchmarks/tables.py's kind
    `cluster_faults`): how it was run, then a row per backend and process killed: each
    kill's seconds to the survivor's exit and to its `error:` line, its exit statuses, and
    the first sentence of its lines, the peers' addresses left out."""
    import records
    import run_all

    made = result["machine"]
    rows = []
    for backend in result["backends"]:
        for victim in (1, 0):
            kills = [kill for kill in result["kills"]
                     if kill["backend"] == backend and kill["killed"] == victim]
            if not kills:
                continue
            lines = sorted({first_sentence(ADDRESS.sub("[ADDRESS]", kill["line"]))
                            for kill in kills})
            rows.append((records.BACKEND_NAMES[backend],
                         f"{victim} ({'the chief' if victim == 0 else 'a worker'})",
                         ", ".join(f"{kill['seconds']:.1f} s" for kill in kills),
                         ", ".join("–" if kill.get("line_seconds") is None else
                                   f"{kill['line_seconds']:.1f} s" for kill in kills),
                         ", ".join(sorted({exit_status(kill["status"]) for kill in kills})),
                         "; ".join(f"`{line}`" for line in lines)))
    return "\n".join([
        f"`{result['command']}` at commit `{result['commit']}`, on {made['usable_cores']} "
        f"cores of {records._machine(made, True)}: the quickstart recipe with a tiny model, "
        f"a backup every {result['checkpoint_every']} steps, the default peer timeout; "
        "each process killed with SIGKILL after the chief's first backup.", "",
        run_all.table(("backend", "process killed", "the other ended after",
                       "its `error:` line after", "its exit status", "its line"), rows)])


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.checkpoint_every < 1:
        raise SystemExit("error: --repeats and --checkpoint-every take a number from 1")
    work = args.work_dir or tempfile.mkdtemp(prefix="cluster_faults-")
    kills = []
    try:
        for backend in args.backends:
            for victim in args.killed:
                for repeat in range(args.repeats):
                    run_dir = os.path.join(work, f"{backend}-{victim}-{repeat}")
                    shutil.rmtree(run_dir, ignore_errors=True)
                    common.progress(f"{backend}: killing process {victim} ({repeat + 1} of "
                                    f"{args.repeats})")
                    kill = {"backend": backend,
                            **kill_one(backend, victim, run_dir, args.checkpoint_every)}
                    common.progress(f"  the other stopped {kill['seconds']:.1f} s later, "
                                    f"status {kill['status']}: {kill['line']}")
                    kills.append(kill)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    command = " ".join(shlex.quote(word) for word in [
        "python", "benchmarks/cluster_faults.py", *(sys.argv[1:] if argv is None else argv)])
    results = common.completed({"command": command, "backends": args.backends,
                                "repeats": args.repeats,
                                "checkpoint_every": args.checkpoint_every, "kills": kills})
    print(f"\n{table(results)}\n")
    common.write_results(results, args.output)


if __name__ == "__main__":
    common.run_script(main)
