"""The `keras-transformer` command: translate, evaluate, plot, average, export and serve.

    keras-transformer translate runs/quickstart "kave tomi tozu"
    keras-transformer translate runs/multi30k-de-en < test.de > hypotheses.en
    keras-transformer evaluate runs/multi30k-de-en --source test.de --reference test.en
    keras-transformer plot attention runs/quickstart "kave tomi tozu" --output-dir plots
    keras-transformer plot positions --output plots/positions.png
    keras-transformer plot schedule --output plots/schedule.png
    keras-transformer plot training runs/multi30k-de-en runs/multi30k-en-de --steps-per-window 200
    keras-transformer average --run-dir runs/multi30k-de-en --last 5
    keras-transformer export runs/quickstart saved_models/quickstart
    keras-transformer serve saved_models/quickstart --port 8501

Training lives in the recipes (`python -m recipes.NAME --help`). A MODEL argument
is a `.keras` file with its tokenizer beside it, or a run directory (its
`model.keras`; name `RUN_DIR/model_averaged.keras` for the averaged model, see
`keras_transformer.run_files`). Every command line of the package is parsed
here; the library raises, and user mistakes print one line and exit with
status 2.
"""

import argparse
import functools
import itertools
import os
import re
import sys
import warnings


def _translator(path, max_source_length=None):
    from keras_transformer import run_files
    from keras_transformer.inference import Translator

    model, source_tokenizer, target_tokenizer = run_files.load_translation_model(path)
    return Translator(model, source_tokenizer, target_tokenizer=target_tokenizer,
                      max_source_length=max_source_length)


# Lines translated together when reading a file or a pipe.
_BATCH_SIZE = 32


def _sampling(args):
    """A `Sampling` from --sample and its options, or None for beam search."""
    from keras_transformer.inference.decoding import Sampling

    given = [flag for flag, name in (("--temperature", "temperature"), ("--top-k", "top_k"),
                                     ("--top-p", "top_p"), ("--seed", "seed"))
             if getattr(args, name) is not None]
    if not args.sample:
        if given:
            raise ValueError(f"{', '.join(given)} set(s) sampling: add --sample to sample "
                             "instead of running beam search.")
        return None
    defaults = Sampling()
    return Sampling(**{name: getattr(defaults, name) if getattr(args, name) is None
                       else getattr(args, name)
                       for name in ("temperature", "top_k", "top_p", "seed")})


def _translate(args):
    sampling = _sampling(args)
    if sampling is None and args.n_best is not None and args.n_best > args.beam_size:
        raise ValueError(f"--n-best {args.n_best} is more than --beam-size {args.beam_size}: "
                         "beam search keeps beam-size hypotheses, so raise --beam-size.")
    translator = _translator(args.model, args.max_source_length)
    batch_size = args.batch_size or _BATCH_SIZE
    if args.sentences:
        lines, unit = iter(args.sentences), "sentence"
    else:
        # Read at call time, so that a caller (or a test) may replace sys.stdin.
        stdin, unit = sys.stdin, "line"
        if _is_terminal(stdin):
            # Someone types: translate each line as it is entered.
            batch_size = args.batch_size or 1
            print("Translating each line typed; end with Ctrl-D.", file=sys.stderr)
        lines = _stream_lines(stdin)
    search = dict(beam_size=args.beam_size, alpha=args.alpha, sampling=sampling,
                  return_alignment=args.print_alignment)
    _write_translations(translator, lines, sys.stdout, batch_size, args.n_best, search, unit)


def _is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _stream_lines(stream):
    """The lines of `stream` as they arrive (`readline`, no read-ahead), each
    without its line ending ("\n" or "\r\n"), nothing else stripped."""
    for line in iter(stream.readline, ""):
        if line.endswith("\r\n"):
            line = line[:-2]
        elif line.endswith("\n"):
            line = line[:-1]
        yield line


def _write_translations(translator, lines, out, batch_size, n_best, search, unit):
    """Reads `batch_size` lines at a time, translates them, writes one line
    per line read (`n_best` lines in the n-best format) and flushes `out`
    before reading on. Empty lines are not decoded. With
    `search["return_alignment"]`, each translation is followed by a tab and
    its alignment."""
    from keras_transformer.inference.translator import (
        Hypothesis,
        SourceTruncatedWarning,
        Translation,
    )

    num_return = n_best or 1
    aligned = search.get("return_alignment", False)
    first = 0  # the input number of the batch's first line
    while batch := list(itertools.islice(lines, batch_size)):
        rows = [row for row, line in enumerate(batch) if line]
        with warnings.catch_warnings():
            # Said below, with the input's own line numbers.
            warnings.simplefilter("ignore", SourceTruncatedWarning)
            # Input line numbers name the random streams of sampling, so a
            # line's samples do not depend on --batch-size.
            results = translator.translate(
                [batch[row] for row in rows], batch_size=batch_size, num_return=num_return,
                stream_ids=[first + row for row in rows], **search)
        translations = [Translation([Hypothesis("", 0.0, [], [])] * num_return)] * len(batch)
        for row, result in zip(rows, results):
            translations[row] = result
            if result.truncated:
                print(f"warning: {unit} {first + row + 1} is longer than max_source_length="
                      f"{translator.max_source_length} (tokens + EOS); it was translated "
                      "truncated to it", file=sys.stderr)
        for index, result in enumerate(translations, start=first):
            for hypothesis in result.hypotheses:
                fields = [] if n_best is None else [str(index), f"{hypothesis.score:.4f}"]
                fields.append(_one_line(hypothesis.text))
                if aligned:
                    fields.append(" ".join(f"{source}-{target}" for target, source
                                           in enumerate(hypothesis.alignment)))
                out.write("\t".join(fields) + "\n")
        out.flush()
        first += len(batch)


def _one_line(text):
    """`text` with any line break replaced by a space: one output line per input."""
    return re.sub(r"[\r\n]+", " ", text)


def _evaluate(args):
    from keras_transformer.evaluation import evaluate
    from keras_transformer.training.data import read_parallel

    corpus = read_parallel(args.source, args.reference)
    sources, references = corpus.sources[: args.limit], corpus.targets[: args.limit]
    result = evaluate(
        _translator(args.model, args.max_source_length), sources, references,
        hypotheses_path=args.output,
        beam_size=args.beam_size, alpha=args.alpha, batch_size=args.batch_size,
    )
    print(result.summary())


def _plot(args):
    from keras_transformer import plots

    if args.figure == "positions":
        print(plots.plot_position_encoding(args.output, length=args.length, d_model=args.d_model))
    elif args.figure == "schedule":
        print(plots.plot_learning_rate(args.output, d_model=args.d_model,
                                       warmup_steps=args.warmup_steps, num_steps=args.num_steps))
    elif args.figure == "training":
        runs = {os.path.basename(os.path.normpath(run)): run for run in args.runs}
        print(plots.plot_training_log(args.output, runs, steps_per_window=args.steps_per_window))
    elif args.figure == "validation":
        runs = {os.path.basename(os.path.normpath(run)): run for run in args.runs}
        print(plots.plot_validation_curve(args.output, runs))
    else:
        paths = plots.plot_translation_attention(
            _translator(args.model), args.sentence, args.output_dir,
            beam_size=args.beam_size, alpha=args.alpha,
        )
        for path in paths.values():
            print(path)


def _average(args):
    from keras_transformer import run_files
    from keras_transformer.training.averaging import average_checkpoints
    from keras_transformer.training.fit import list_checkpoints

    paths = args.checkpoints
    if args.run_dir:
        checkpoints = run_files.path(args.run_dir, run_files.CHECKPOINTS)
        paths = list_checkpoints(checkpoints)[-args.last:]
        if not paths:
            raise FileNotFoundError(f"No step-*.keras checkpoints in {checkpoints}.")
    output = args.output or (run_files.path(args.run_dir, run_files.AVERAGED_MODEL)
                             if args.run_dir else "averaged.keras")
    average_checkpoints(paths, output)
    print(f"Averaged {len(paths)} checkpoints into {output}")


def _export(args):
    if args.format == "ctranslate2":
        # SavedModel settings fixed at export: CTranslate2 takes its decoding
        # options at translate time instead.
        given = [flag for flag, value in (
            ("--version", args.version), ("--max-output-length", args.max_output_length),
            ("--max-source-length", args.max_source_length),
            ("--batch-sizes", args.batch_sizes), ("--lengths", args.lengths),
            ("--n-best", args.n_best)) if value is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(
                f"{', '.join(given)} {verb} only to --format saved_model: a CTranslate2 model "
                "takes its decoding options (beam_size, max_decoding_length, ...) in "
                "translate_batch.")
        from keras_transformer.inference.ctranslate2_export import export_ctranslate2

        try:
            export_ctranslate2(args.model, args.export_base, quantization=args.quantization,
                               verbose=not args.quiet)
        except ImportError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        return
    if args.quantization is not None:
        raise ValueError("--quantization only applies to --format ctranslate2: a SavedModel "
                         "keeps the model's own weights.")
    from keras_transformer.inference.export import export_saved_model

    export_saved_model(args.model, args.export_base, version=args.version,
                       beam_size=args.beam_size, alpha=args.alpha,
                       max_output_length=args.max_output_length,
                       max_source_length=args.max_source_length, batch_sizes=args.batch_sizes,
                       lengths=args.lengths, n_best=args.n_best, verbose=not args.quiet)


def _serve(args):
    import dataclasses

    from keras_transformer.inference.serving import BatchingParameters, ServerOptions, serve

    # Every batching parameter, and every server option that has a flag.
    batching = BatchingParameters(**{
        field.name: getattr(args, field.name) for field in dataclasses.fields(BatchingParameters)})
    options = ServerOptions(batching=batching, **{
        field.name: getattr(args, field.name) for field in dataclasses.fields(ServerOptions)
        if field.name != "batching" and hasattr(args, field.name)})
    serve(args.saved_model, options)


def _positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _probability(text):
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


def _positive_ints(text):
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated positive integers such as 1,2,4, got {text!r}")
    return tuple(values)


_TRANSLATOR_LIMIT = ("the model's max_length with learned positions, at least 1024 with "
                     "sinusoidal ones")


def _add_source_limit(parser, default):
    parser.add_argument("--max-source-length", type=_positive_int,
                        help="longest input (tokens + EOS); longer sentences are truncated to "
                             f"it and flagged (default: {default})")


def _add_search_options(parser):
    parser.add_argument("--beam-size", type=_positive_int, default=4, help="beam size (§6.1: 4)")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty α (§6.1: 0.6)")


_NATIVE_LOGS_HELP = "show TensorFlow's and absl's C++ log lines (hidden by default)"

_TRANSLATE_DESCRIPTION = """\
Translates the SENTENCES given or, without any, standard input line by line:
one output line per input line, in order, written and flushed after every
--batch-size lines, so it works in pipes, with paste and with sacrebleu.
An empty line gives an empty line without running the model. A line longer
than --max-source-length (tokens + EOS) is translated truncated to it, with a
warning on stderr. Only the line ending ("\\n" or "\\r\\n") is stripped."""

_TRANSLATE_EPILOG = """\
--n-best N writes N lines per input, best first:
  INDEX<TAB>SCORE<TAB>TRANSLATION
INDEX is the input's line number counted from 0, SCORE is log P(Y|X) / lp(Y)
with 4 decimals (§6.1), higher is better. An empty input line gives N lines
with score 0.0000 and an empty translation.

--print-alignment adds a tab and the translation's alignment to each line:
SOURCE-TARGET pairs of token positions counted from 0 (the tokenizer's
pieces, EOS left out), one per target token, each aligned to the source
token of highest encoder-decoder attention in the last decoder block,
averaged over heads (fairseq's option).

--sample draws each token instead of running beam search (--temperature,
--top-k, --top-p, --seed); with --n-best N it writes N samples per input, in
the order drawn, and SCORE is log P(Y|X). A line's samples depend on the seed
and its line number only, so the same command gives the same output.

  keras-transformer translate runs/quickstart < test.src > test.hyp
  keras-transformer translate runs/quickstart --n-best 4 < test.src | cut -f3
  keras-transformer translate runs/quickstart --sample --top-p 0.9 --seed 1 < test.src"""


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="Translate, evaluate, plot and average with keras-transformer models. "
                    "Train with python -m recipes.NAME.",
    )
    parser.add_argument("--native-logs", action="store_true", help=_NATIVE_LOGS_HELP)
    # Every command takes it after its name too; SUPPRESS keeps the value
    # given before the name when it is not repeated.
    native_logs = argparse.ArgumentParser(add_help=False)
    native_logs.add_argument("--native-logs", action="store_true", default=argparse.SUPPRESS,
                             help=_NATIVE_LOGS_HELP)
    commands = parser.add_subparsers(dest="command", required=True)
    command = functools.partial(commands.add_parser, parents=[native_logs])

    translate = command(
        "translate", help="translate sentences (or stdin lines)",
        description=_TRANSLATE_DESCRIPTION, epilog=_TRANSLATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    translate.add_argument("model", help=".keras file or run directory")
    translate.add_argument("sentences", nargs="*",
                           help="sentences; standard input is read line by line if none")
    translate.add_argument("--batch-size", type=_positive_int,
                           help=f"lines decoded together (default: {_BATCH_SIZE}; 1 when "
                                "standard input is a terminal)")
    translate.add_argument("--n-best", type=_positive_int, metavar="N",
                           help="write the N best hypotheses of each input as "
                                "INDEX<TAB>SCORE<TAB>TRANSLATION lines (see below); "
                                "N <= --beam-size")
    translate.add_argument("--print-alignment", action="store_true",
                           help="append each translation's SOURCE-TARGET token alignment "
                                "after a tab (see below)")
    _add_search_options(translate)
    sampling = translate.add_argument_group("sampling (instead of beam search)")
    sampling.add_argument("--sample", action="store_true",
                          help="draw each token from the model's distribution")
    sampling.add_argument("--temperature", type=_positive_float,
                          help="divide the logits by this (default 1)")
    sampling.add_argument("--top-k", type=_non_negative_int,
                          help="keep the k most probable tokens (default 0: all)")
    sampling.add_argument("--top-p", type=_probability,
                          help="keep the most probable tokens up to this mass (default 1: all)")
    sampling.add_argument("--seed", type=_non_negative_int, help="random seed (default 0)")
    _add_source_limit(translate, _TRANSLATOR_LIMIT)
    translate.set_defaults(run=_translate)

    evaluate = command("evaluate", help="translate a test set and report BLEU")
    evaluate.add_argument("model", help=".keras file or run directory")
    evaluate.add_argument("--source", required=True, help="source sentences, one per line (.gz ok)")
    evaluate.add_argument("--reference", required=True, help="reference translations, aligned")
    evaluate.add_argument("--output", help="file for the translations, one per line")
    evaluate.add_argument("--limit", type=_positive_int, help="only the first N sentences")
    evaluate.add_argument("--batch-size", type=_positive_int, default=32,
                          help="sentences decoded together")
    _add_search_options(evaluate)
    _add_source_limit(evaluate, _TRANSLATOR_LIMIT)
    evaluate.set_defaults(run=_evaluate)

    plot = command("plot", help="draw a figure as a PNG file")
    figures = plot.add_subparsers(dest="figure", required=True)
    figure = functools.partial(figures.add_parser, parents=[native_logs])
    attention = figure("attention", help="encoder, decoder and cross attention "
                                   "of one translated sentence, per layer and head")
    attention.add_argument("model", help=".keras file or run directory")
    attention.add_argument("sentence", help="the source sentence")
    attention.add_argument("--output-dir", default="plots", help="folder for the PNG files")
    _add_search_options(attention)
    positions = figure("positions", help="the §3.5 positional-encoding matrix")
    positions.add_argument("--output", default="plots/positions.png", help="PNG file")
    positions.add_argument("--length", type=_positive_int, default=100, help="positions drawn")
    positions.add_argument("--d-model", type=_positive_int, default=512, help="encoding width")
    schedule = figure("schedule", help="the §5.3 learning-rate schedule")
    schedule.add_argument("--output", default="plots/schedule.png", help="PNG file")
    schedule.add_argument("--d-model", type=_positive_int, default=512, help="model width")
    schedule.add_argument("--warmup-steps", type=_positive_int, default=4000, help="warmup steps")
    schedule.add_argument("--num-steps", type=_positive_int, default=20000, help="steps drawn")
    training = figure("training", help="loss and accuracy curves of recipe runs")
    training.add_argument("runs", nargs="+", help="run directories (or training_log.csv files)")
    training.add_argument("--output", default="plots/training.png", help="PNG file")
    training.add_argument("--steps-per-window", type=_positive_int,
                          help="the runs' --checkpoint-every, to count optimizer steps")
    curve = figure("validation", help="validation BLEU against training time of recipe runs "
                                      "trained with --validation-curve")
    curve.add_argument("runs", nargs="+", help="run directories (or validation_curve.csv files)")
    curve.add_argument("--output", default="plots/validation.png", help="PNG file")
    plot.set_defaults(run=_plot)

    average = command("average", help="average checkpoints into one model (§6.1)")
    average.add_argument("checkpoints", nargs="*", help=".keras files to average")
    average.add_argument("--run-dir", help="average this run's newest checkpoints")
    average.add_argument("--last", type=_positive_int, default=5,
                         help="with --run-dir: how many of the newest checkpoints")
    average.add_argument("--output", help="where to write the averaged model")
    average.set_defaults(run=_average)

    from keras_transformer.inference.ctranslate2_export import QUANTIZATIONS
    from keras_transformer.inference.serving import BatchingParameters, ServerOptions

    defaults, batching = ServerOptions(), BatchingParameters()
    export = command(
        "export", help="write a TensorFlow SavedModel (strings in, translations out) to "
                       "EXPORT_BASE/VERSION/, or a CTranslate2 model directory")
    export.add_argument("model", help=".keras file with its tokenizer beside it, or run "
                                      "directory")
    export.add_argument("export_base", help="serving directory, e.g. saved_models/NAME; the "
                                            "SavedModel goes to EXPORT_BASE/VERSION/. With "
                                            "--format ctranslate2: the new model directory "
                                            "(absent or empty)")
    export.add_argument("--format", choices=("saved_model", "ctranslate2"),
                        default="saved_model",
                        help="saved_model (TensorFlow Serving, beam search inside) or "
                             "ctranslate2 (a CTranslate2 Translator model; the options below "
                             "about versions, search and compiled shapes do not apply)")
    export.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="with --format ctranslate2: CTranslate2 weight type "
                             "(default: float32)")
    export.add_argument("--version", type=_positive_int,
                        help="version number (default: one above the highest present)")
    _add_search_options(export)
    export.add_argument("--max-output-length", type=_positive_int,
                        help="most output tokens (default: source length + 50, §6.1)")
    _add_source_limit(export, "the model's max_length")
    export.add_argument("--batch-sizes", type=_positive_ints,
                        help="batch sizes compiled, ascending (default: 1,2,4,8,16,32,64)")
    export.add_argument("--lengths", type=_positive_ints,
                        help="source widths compiled, ascending (default: 16,32,48,64, then "
                             "about 1.5x apart up to --max-source-length)")
    export.add_argument("--n-best", type=_positive_int, metavar="N",
                        help="also write the translate_n_best signature: the N best "
                             "hypotheses of the beam per sentence, 2 <= N <= --beam-size")
    export.add_argument("--quiet", action="store_true", help="print nothing on success")
    export.set_defaults(run=_export)

    serve = command(
        "serve", help="serve a SavedModel over HTTP with TensorFlow Serving's REST API")
    serve.add_argument("saved_model", help="saved_models/NAME (its highest version is served, "
                                           "new versions are picked up) or a version folder")
    serve.add_argument("--host", default=defaults.host,
                       help="address to bind; 0.0.0.0 exposes the server to the network")
    serve.add_argument("--port", type=int, default=defaults.port,
                       help="port (TensorFlow Serving's REST default; 0 picks a free one)")
    serve.add_argument("--name", help="model name in the URL (default: the directory's name)")
    limits = serve.add_argument_group("limits and timeouts")
    for flag, kind, help_text in (
        ("--max-instances", _positive_int, "instances per request"),
        ("--max-chars", _positive_int, "characters per sentence (ids per id list)"),
        ("--max-body-bytes", _positive_int, "request body size"),
        ("--max-connections", _positive_int, "open connections (more get 503)"),
        ("--max-concurrent-requests", _positive_int, "predict requests in flight (more get 503)"),
        ("--header-timeout", _positive_float, "seconds to send a request's headers"),
        ("--body-timeout", _positive_float, "seconds to send a request's body"),
        ("--keep-alive-timeout", _positive_float, "seconds an idle connection stays open"),
        ("--file-system-poll-wait-seconds", float, "seconds between polls for new versions "
                                                   "(0: never)"),
        ("--warmup-threads", _positive_int, "warm-up requests replayed at once"),
    ):
        name = flag[2:].replace("-", "_")
        limits.add_argument(flag, type=kind, default=getattr(defaults, name),
                            help=f"{help_text} (default: %(default)s)")
    group = serve.add_argument_group("batching (TensorFlow Serving's batching parameters)")
    group.add_argument("--enable-batching", dest="enabled", action=argparse.BooleanOptionalAction,
                       default=batching.enabled, help="merge concurrent requests into one call")
    for flag, help_text in (
        ("--max-batch-size", "instances per signature call"),
        ("--batch-timeout-micros", "longest wait for more requests after a batch opens"),
        ("--max-enqueued-batches", "queue bound in batches (a full queue answers 503)"),
        ("--num-batch-threads", "batches run at once"),
    ):
        name = flag[2:].replace("-", "_")
        kind = int if name == "batch_timeout_micros" else _positive_int
        group.add_argument(flag, type=kind, default=getattr(batching, name),
                           help=f"{help_text} (default: %(default)s)")
    serve.set_defaults(run=_serve)
    return parser


def check_backend():
    """Exits with one line for an unknown `KERAS_BACKEND`, before Keras is
    imported (its own error is a traceback from deep inside keras). The
    command-line entry points (this one and the recipes') call it first."""
    from keras_transformer.backend import check_backend_name

    try:
        check_backend_name(os.environ.get("KERAS_BACKEND"))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    check_backend()
    parser = build_parser()
    args = parser.parse_args(argv)
    from keras_transformer.logs import quiet_native_logs

    quiet_native_logs(args.native_logs)
    if args.command == "average" and bool(args.checkpoints) == bool(args.run_dir):
        parser.error("average: give either checkpoint files or --run-dir")
    try:
        args.run(args)
    except BrokenPipeError:
        # The reader of stdout has gone (`| head`): stop quietly, as Unix tools do.
        _discard_stdout()
        sys.exit(1)
    except (FileNotFoundError, FileExistsError, ValueError, TypeError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def _discard_stdout():
    """Points file descriptor 1 at the null device, so that the interpreter's
    last flush of stdout at exit does not fail on the closed pipe again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file
        pass


if __name__ == "__main__":
    main()
