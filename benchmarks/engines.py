"""Two engines behind one server: the SavedModel against CTranslate2, throughput and BLEU.

For each model (`--model NAME=RUN_DIR`, by default the quickstart's run and the
Multi30k German→English run), exports the SavedModel and a CTranslate2 export of the
same weights with the same search (beam 4, the model's α from `--alpha NAME=A`, 0.6
otherwise). Then, engine by engine (the SavedModel; CTranslate2 at each of
`--compute-types`), it starts `keras-transformer serve` with the same options (batching
on, its defaults), and measures on 127.0.0.1:

    throughput  sentences/s at 1, 8, 32 and 64 concurrent clients, each holding one
                keep-alive connection and sending one-sentence requests
                (`serving_load.run_load`), in `--rounds` interleaved rounds (the
                median round is reported), and the failed requests
    BLEU        for a model with a test set (`--test NAME=SOURCE,REFERENCE`; the
                Multi30k model's is test2016 from `--data-dir`), the served
                translations of every test sentence, sent 8 to a request:
                cased and lower-cased sacreBLEU (`keras_transformer.evaluation`)

The load's sentences are the model's test sentences, or the quickstart's
(`synthetic_translation(500, seed=3)`) for a model without a test set. The clients
run on the same machine as the server and take CPU from it. Goal (issue 54):
CTranslate2 int8 at >= 3x the SavedModel's sentences/s at 32 clients, with no failed
request at 64. The three runs of benchmarks/RESULTS.md took 7.2, 4.4 and 3.2 minutes
on 2 cores of an AMD EPYC with AVX-512.

`--baseline CHECKOUT` also serves each export with the server of another checkout (a
git worktree of an earlier commit), right after this checkout's server, so that a
change to the server is measured against the code before it in the same run: its rows
are marked with that checkout's commit, and "× baseline at 32" compares the two.

    TF_CPP_MIN_LOG_LEVEL=3 python benchmarks/engines.py --alpha multi30k=0.8
    git worktree add /tmp/before HEAD~1
    python benchmarks/engines.py --model quickstart=runs/quickstart --baseline /tmp/before
    python benchmarks/engines.py --quick --model tiny=RUN_DIR   # a smoke run, figures meaningless
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
from serving import git_commit, load_table
from serving_load import Client, ServerProcess

CONCURRENCY = (1, 8, 32, 64)
BLEU_BATCH = 8
DATA_DIR = common.multi30k_dir()


def build_parser():
    """The script's command-line options."""
    parser = common.argument_parser(__doc__)
    parser.add_argument("--model", action="append", metavar="NAME=RUN_DIR",
                        help="a model to serve (repeat for several; default: "
                             "quickstart=runs/quickstart and multi30k=runs/multi30k-de-en)")
    parser.add_argument("--alpha", action="append", default=[], metavar="NAME=A",
                        help="a model's length penalty (default 0.6)")
    parser.add_argument("--test", action="append", default=[], metavar="NAME=SOURCE,REFERENCE",
                        help="a model's test set for BLEU (default: multi30k's test2016 in "
                             "--data-dir)")
    parser.add_argument("--data-dir", default=DATA_DIR,
                        help="Multi30k's files (test_2016_flickr.de.gz, .en.gz)")
    parser.add_argument("--compute-types", default="int8,float32",
                        help="CTranslate2 compute types served, comma-separated")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of the load table; each row reports the median")
    parser.add_argument("--requests", type=int, default=600,
                        help="requests per load configuration (at least 20 per client)")
    parser.add_argument("--phase-limit", type=float, default=90,
                        help="seconds for one load configuration")
    parser.add_argument("--startup-timeout", type=float, default=600,
                        help="seconds for a server to become AVAILABLE")
    parser.add_argument("--max-batch-size", type=int,
                        help="the servers' --max-batch-size (default: the server's own)")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="also serve each export with this checkout's server (a git "
                             "worktree), for a side-by-side comparison")
    parser.add_argument("--quick", action="store_true",
                        help="few requests, one round, 100 test sentences (figures meaningless)")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    return parser


def _pairs(parser, values, name):
    """{NAME: VALUE} from NAME=VALUE options."""
    pairs = {}
    for value in values:
        key, equals, rest = value.partition("=")
        if not equals or not key or not rest:
            parser.error(f"{name} takes NAME=VALUE, got {value!r}")
        pairs[key] = rest
    return pairs


def parse_args(argv=None):
    """The options, with `models` ({name: run dir}), `alphas` and `tests` as dicts."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.models = _pairs(parser, args.model or ["quickstart=runs/quickstart",
                                                "multi30k=runs/multi30k-de-en"], "--model")
    args.alphas = {name: float(a) for name, a in _pairs(parser, args.alpha, "--alpha").items()}
    args.tests = {name: tuple(files.split(",")) for name, files in
                  _pairs(parser, args.test, "--test").items()}
    if "multi30k" in args.models and "multi30k" not in args.tests:
        args.tests["multi30k"] = tuple(os.path.join(args.data_dir, f"test_2016_flickr.{side}.gz")
                                       for side in ("de", "en"))
    for name, run_dir in args.models.items():
        if not os.path.isdir(run_dir):
            parser.error(f"--model {name}={run_dir}: no such run directory (train it first)")
    if args.baseline is not None:
        args.baseline = os.path.abspath(args.baseline)
        if not os.path.isdir(os.path.join(args.baseline, "keras_transformer")):
            parser.error(f"--baseline {args.baseline}: not a checkout of this project")
    args.compute_types = [c for c in args.compute_types.split(",") if c]
    args.concurrency = CONCURRENCY
    if args.quick:
        args.requests, args.rounds = 16, 1
    if min(args.requests, args.rounds) < 1 or args.phase_limit <= 0:
        parser.error("counts and limits must be positive")
    return args


def export(run_dir, base, engine, alpha):
    """`keras-transformer export` of `run_dir` to `base/1` for `engine`, in a
    TensorFlow-backend process (the SavedModel's batch sizes are the server's)."""
    command = [sys.executable, "-m", "keras_transformer_app", "export", run_dir, base,
               "--beam-size", "4", "--alpha", str(alpha), "--quiet"]
    command += (["--format", "ctranslate2"] if engine == "ctranslate2"
                else ["--batch-sizes", "1,2,4"])
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=common.REPOSITORY,
                   env=dict(os.environ, KERAS_BACKEND="tensorflow"))
    return time.perf_counter() - start


def test_set(args, name):
    """(sources, references) of a model's test set, or None."""
    if name not in args.tests:
        return None
    from keras_transformer.data.corpora import read_parallel

    corpus = read_parallel(*args.tests[name])
    limit = 100 if args.quick else None
    return list(corpus.sources[:limit]), list(corpus.targets[:limit])


def served_bleu(server, sources, references):
    """BLEU of the served translations of `sources` (requests of BLEU_BATCH)."""
    from keras_transformer.evaluation import bleu_scores

    client, hypotheses, failed = Client(server.port), [], 0
    try:
        for start in range(0, len(sources), BLEU_BATCH):
            batch = sources[start:start + BLEU_BATCH]
            status, payload = client.request("POST", f"/v1/models/{server.name}:predict",
                                             json.dumps({"instances": batch}))
            if status != 200:
                failed += len(batch)
                hypotheses += [""] * len(batch)
                continue
            hypotheses += [p["translations"] for p in payload["predictions"]]
    finally:
        client.close()
    cased, lowercase = bleu_scores(hypotheses, references)
    return {"cased": cased.score, "lowercase": lowercase.score, "sentences": len(sources),
            "failed": failed}


def measure(args, name, base, flags, label, test, checkout=None, server_commit=None):
    """One engine: a fresh server (of `checkout`, if given), its load table and its
    test BLEU."""
    if args.max_batch_size is not None:
        flags = [*flags, "--max-batch-size", str(args.max_batch_size)]
    server = ServerProcess(base, ["--enable-batching", *flags], args.startup_timeout,
                           checkout=checkout)
    server.__enter__()
    try:
        available = server.wait_until_available()
        row = {"model": name, "engine": label, "available_s": available,
               "server": server_commit}
        if checkout is not None:
            label = f"{label} ({server_commit} server)"
        common.progress(f"{name}, {label}: AVAILABLE {available:.1f} s after process start")
        bodies = [json.dumps({"instances": [s]}) for s in args.sentences]
        row["load"] = load_table(server, bodies, args, float("inf"), label)
        if test is not None:
            row["bleu"] = served_bleu(server, *test)
            common.progress(f"  BLEU {row['bleu']['cased']:.2f} cased, "
                            f"{row['bleu']['lowercase']:.2f} lower-cased")
        return row
    finally:
        server.stop()


def engines_of(args, folder, name, run_dir):
    """[(label, base, server flags)]: the model exported for each engine."""
    alpha = args.alphas.get(name, 0.6)
    engines = []
    for engine in ("saved_model", "ctranslate2"):
        base = os.path.join(folder, engine, name)
        seconds = export(run_dir, base, engine, alpha)
        common.progress(f"{name}: exported for {engine} in {seconds:.0f} s (alpha {alpha:g})")
        if engine == "saved_model":
            engines.append(("SavedModel", base, []))
        else:
            engines += [(f"CTranslate2 {kind}", base, ["--compute-type", kind])
                        for kind in args.compute_types]
    return engines


def _rate_at_32(row):
    return {r["clients"]: r["sentences_per_s"] for r in row["load"]}.get(32)


def _ratio(row, other):
    base = None if other is None else _rate_at_32(other)
    rate = _rate_at_32(row)
    return f"{rate / base:.2f}" if rate and base else "—"


def _row(row, rows, commit, baseline):
    """A row's cells: its rates, its rate at 32 clients against the SavedModel behind the
    same server (and against the same engine behind the baseline's server), the failed
    requests and p99 at 64 clients, its start and its BLEU."""
    load = {r["clients"]: r for r in row["load"]}
    server = row.get("server")
    saved_model = next((r for r in rows if r["model"] == row["model"]
                        and r["engine"] == "SavedModel" and r.get("server") == server), None)
    other = None if server is not None else next(
        (r for r in rows if r["model"] == row["model"] and r["engine"] == row["engine"]
         and r.get("server") is not None), None)
    at_64, bleu = load.get(64), row.get("bleu")
    return (row["model"], row["engine"], *([f"`{server or commit}`"] if baseline else []),
            *(f"{load[c]['sentences_per_s']:,.0f}" if c in load else "—" for c in CONCURRENCY),
            _ratio(row, saved_model), *([_ratio(row, other)] if baseline else []),
            *((f"{at_64['failed_all_rounds']}", f"{at_64['p99_ms']:,.0f}") if at_64
              else ("—", "—")),
            f"{row['available_s']:.1f} s",
            f"{bleu['cased']:.2f} / {bleu['lowercase']:.2f}" if bleu else "—")


def table(results):
    """The Markdown of a run's results (`--output`), or of a folder of runs (benchmarks/
    tables.py's kind `engines`): for each run its command, commit and machine, then a row
    per model and engine (and server, with `--baseline`): sentences/s at each number of
    clients (the median round), the rate at 32 clients against the SavedModel behind the same
    server (and against the same engine behind the baseline's server), the failed requests
    and the p99 latency at 64 clients, the seconds from the server's start to AVAILABLE, and
    the served test set's BLEU."""
    import records
    import run_all

    blocks = []
    for result in results if isinstance(results, list) else [results]:
        if result.get("quick"):
            raise ValueError(f"an engines.py --quick run's figures are meaningless: "
                             f"{result['command']}")
        made, commit, baseline = result["machine"], result["commit"], result.get("baseline")
        head = ("model", "engine", *(["server"] if baseline else []),
                *(f"{c} client{'s' * (c > 1)}" for c in CONCURRENCY), "× SavedModel at 32",
                *([f"× `{baseline}` at 32"] if baseline else []), "failed at 64",
                "p99 ms at 64", "AVAILABLE after", "BLEU cased / lower-cased")
        blocks += [f"`{result['command']}` at commit `{commit}`, on {made['usable_cores']} "
                   f"cores of {records._machine(made)}"
                   + (f", each export also behind the server of commit `{baseline}`"
                      if baseline else "") + "; sentences/s:", "",
                   run_all.table(head, [_row(row, result["rows"], commit, baseline)
                                        for row in result["rows"]]), ""]
    return "\n".join(blocks[:-1])


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    results = {"machine": common.machine(), "commit": git_commit(), "quick": args.quick,
               "rows": []}
    if args.baseline is not None:
        results["baseline"] = git_commit(args.baseline)
    with tempfile.TemporaryDirectory(prefix="engines-") as folder:
        for name, run_dir in args.models.items():
            test = test_set(args, name)
            if test is None:
                from keras_transformer.data.corpora import synthetic_translation

                args.sentences = list(synthetic_translation(500, seed=3).sources)
            else:
                args.sentences = test[0]
            for label, base, flags in engines_of(args, folder, name, os.path.abspath(run_dir)):
                results["rows"].append(measure(args, name, base, flags, label, test))
                if args.baseline is not None:
                    results["rows"].append(measure(args, name, base, flags, label, test,
                                                   args.baseline, results["baseline"]))
    results["seconds"] = time.perf_counter() - start
    results["command"] = common.command_line("engines.py", argv)
    print()
    print(table(dict(results, quick=False)))
    print(f"\n(took {results['seconds'] / 60:.1f} min)")
    common.write_results(results, args.output)


if __name__ == "__main__":
    common.run_script(main)
