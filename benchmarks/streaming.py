"""`keras-transformer translate` reading standard input: a file against a pipe, and a slow
writer's lines answered as they come (docs/translation.md, "Streaming and batching, measured").

For MODEL (a run directory or a `.keras` file with its tokenizer), runs the command line as
a user does, a process each time (`python -m keras_transformer_app translate MODEL`, this
checkout's program), and measures:

    start-up     the command with an empty input: the process loads TensorFlow and the
                 model and ends (the median of `--repeats` runs)
    file         `--lines` sources (the quickstart's synthetic ones, seed 7) read from a
                 file, translated to /dev/null, start-up included (median)
    pipe         the same lines from a pipe that a fast writer (`cat`) fills (median)
    writer       one process fed by a slow writer: after `--start-wait` seconds (the
                 command has loaded), one line, a wait of 5 s, then five more a second
                 apart; each line's answer time minus its write time. The first line's
                 search compiles; the others' include the time the command waits for more
                 lines before it translates what it has (`WAIT_MS` of
                 keras_transformer_app/cli/translate.py, recorded as `wait_ms`).

The backend is KERAS_BACKEND's, which the processes inherit. The searches are the
command's defaults (beam 4). A full run took 2.5 minutes on 2 cores of an AMD EPYC.

    python benchmarks/streaming.py runs/quickstart --output docs/results/streaming-quickstart.json
    python benchmarks/streaming.py runs/quickstart --quick   # a smoke run, figures meaningless
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

import os
import queue
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

WRITER_LINES = ("kave tomi tozu", "sipe rato", "tomi kave sipe tozu", "rato vewi", "kave sipe",
                "tozu tomi rato")
FIRST_PAUSE = 5.0  # seconds after the writer's first line was written
LATER_PAUSE = 1.0  # seconds after each of the others


def translate_command(model):
    """The command line, as this checkout's program (what `keras-transformer` runs)."""
    return [sys.executable, "-m", "keras_transformer_app", "translate", model]


def timed_run(command, stdin, shell=False):
    """Seconds from start to exit of `command` (its output to /dev/null); its error output
    is raised with its status if it fails."""
    began = time.perf_counter()
    result = subprocess.run(command, stdin=stdin, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, shell=shell, cwd=common.REPOSITORY)
    seconds = time.perf_counter() - began
    if result.returncode != 0:
        raise RuntimeError(f"{command} ended with status {result.returncode}: "
                           f"{result.stderr[-2000:]}")
    return seconds


def writer_latencies(model, start_wait, lines=WRITER_LINES, timeout=120):
    """Seconds from each line's write to its answer, the writer as the module says. An
    answer that has not come within `timeout` seconds, or a command that ends before its
    answers, is an error with the command's last error lines."""
    errors = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(translate_command(model), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=errors, text=True, bufsize=1,
                               cwd=common.REPOSITORY)
    answers = queue.Queue()  # read by a thread, so that a silent command cannot hang us

    def read():
        for answer in process.stdout:
            answers.put(answer)
        answers.put(None)  # the end of its output

    threading.Thread(target=read, daemon=True).start()

    def failed(what):
        errors.seek(0)
        return RuntimeError(f"the writer's command {what}: {errors.read()[-2000:]}")

    latencies = []
    try:
        time.sleep(start_wait)
        for index, line in enumerate(lines):
            wrote = time.perf_counter()
            try:
                process.stdin.write(line + "\n")
                process.stdin.flush()
                if answers.get(timeout=timeout) is None:
                    raise BrokenPipeError
            except (BrokenPipeError, queue.Empty):
                raise failed(f"did not answer {line!r} (status {process.poll()})") from None
            latencies.append(time.perf_counter() - wrote)
            pause = (FIRST_PAUSE if index == 0 else LATER_PAUSE) - latencies[-1]
            if index + 1 < len(lines) and pause > 0:
                time.sleep(pause)
        process.stdin.close()
        if process.wait(timeout=timeout) != 0:
            raise failed(f"ended with status {process.returncode}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        errors.close()
    return latencies


def build_parser():
    parser = common.argument_parser(__doc__)
    parser.add_argument("model", help="a run directory, or a .keras file with its tokenizer")
    parser.add_argument("--lines", type=int, default=300, help="sources read (default 300)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each of start-up, file and pipe, the median reported "
                             "(default 3)")
    parser.add_argument("--start-wait", type=float, default=20.0,
                        help="seconds the writer waits before its first line, for the command "
                             "to load (default 20)")
    parser.add_argument("--quick", action="store_true",
                        help="30 lines, 1 repeat, a writer's wait of 8 s, whatever the options "
                             "above say: a smoke run, whose first latency may hold the start-up")
    parser.add_argument("--output", help="write the results to this JSON file")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.quick:
        args.lines, args.repeats, args.start_wait = 30, 1, 8.0
    if args.lines < 1 or args.repeats < 1 or args.start_wait < 0:
        raise ValueError("--lines and --repeats must be at least 1, --start-wait at least 0")
    if not os.path.exists(args.model):
        raise FileNotFoundError(f"no model at {args.model}")
    model = os.path.abspath(args.model)
    from keras_transformer.data.corpora import synthetic_translation

    runs = {"start-up": [], "file": [], "pipe": []}
    with tempfile.TemporaryDirectory(prefix="streaming-") as folder:
        sources = os.path.join(folder, "sources.txt")
        with open(sources, "w", encoding="utf-8") as file:
            file.write("\n".join(synthetic_translation(args.lines, seed=7).sources) + "\n")
        command = shlex.join(translate_command(model))
        for repeat in range(args.repeats):  # interleaved, so that a slow moment hits all three
            common.progress(f"round {repeat + 1} of {args.repeats}")
            with open(os.devnull) as empty:
                runs["start-up"].append(timed_run(translate_command(model), empty))
            with open(sources) as lines:
                runs["file"].append(timed_run(translate_command(model), lines))
            runs["pipe"].append(timed_run(f"cat {shlex.quote(sources)} | {command}", None,
                                          shell=True))
    common.progress("the slow writer")
    latencies = writer_latencies(model, args.start_wait)
    from keras_transformer_app.cli import translate

    results = {"backend": common.backend_name(), "model": args.model, "lines": args.lines,
               "wait_ms": translate.WAIT_MS, "batch_size": translate.BATCH_SIZE,
               "repeats": args.repeats, "start_wait": args.start_wait, "seconds": runs,
               "median_seconds": {name: statistics.median(values)
                                  for name, values in runs.items()},
               "writer_latencies": latencies}
    common.write_results(results, args.output)


if __name__ == "__main__":
    common.run_script(main)
