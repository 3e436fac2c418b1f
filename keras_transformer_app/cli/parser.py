"""The options of `keras-transformer` (§6.1 decoding options; the rest is the outer ring).

One subcommand per job: translate, evaluate, plot, average, export and serve. Each sets
`run` to its function in `commands` (`translate.run` for translate); the options it
shares with the recipes come from `options`. A subcommand's options may come anywhere
among its positionals (`translate MODEL --n-best 4 SENTENCE`), as argparse's
intermixed parsing reads them, and a mistake is reported with that subcommand's usage.
"""

import argparse
import dataclasses
import functools

from keras_transformer_app.cli import commands, errors, options
from keras_transformer_app.cli import translate as translate_command
from keras_transformer_app.cli.options import (
    model_name,
    non_negative_float,
    non_negative_int,
    path,
    port,
    positive_float,
    positive_int,
    positive_ints,
    probability,
    text,
)

_MODEL_HELP = (".keras file or run directory, or a CTranslate2 export (ct2_models/NAME: its "
               "highest version, or one version folder)")
_TRANSLATOR_LIMIT = ("the model's max_length with learned positions, at least 1024 with "
                     "sinusoidal ones")

_TRANSLATE_DESCRIPTION = f"""\
Translates the SENTENCES given or, without any, standard input line by line:
one output line per input line, in order, so it works in pipes, with paste
and with sacrebleu. Lines are translated together in batches of those that
have arrived within {translate_command.WAIT_MS} ms of a batch's first line, at most
--batch-size: a file is read in full batches, and a pipe or a terminal is
answered as its lines arrive. Each batch is written and flushed at once.
An empty line gives an empty line without running the model. A line that is
not valid UTF-8 gives an empty line too, and an error on stderr naming the
line and the byte; the other lines are translated, and the exit status is 2.
A line longer than --max-source-length (tokens + EOS) is translated
truncated to it, with a warning on stderr. Only the line ending ("\\n" or
"\\r\\n") is stripped."""

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
and its line number only, so the same command gives the same output, except
with a CTranslate2 export as MODEL: --seed does not reproduce CTranslate2's
samples (a warning says so).

  keras-transformer translate runs/quickstart < test.src > test.hyp
  keras-transformer translate runs/quickstart --n-best 4 < test.src | cut -f3
  keras-transformer translate runs/quickstart --sample --top-p 0.9 --seed 1 < test.src"""


class _Parser(argparse.ArgumentParser):
    """A parser whose options may come anywhere among its positionals
    (`parse_intermixed_args`, which argparse refuses for a parser with
    subcommands: those parse as usual and hand the rest to their subcommand's
    parser)."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._subparsers is not None or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # argparse's intermixed parsing calls back here
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _subcommand(subparsers, name, **kwargs):
    """A subcommand's parser, which `parse_args` finds as `command_parser` to report
    a mistake with the subcommand's usage."""
    parser = subparsers.add_parser(name, **kwargs)
    parser.set_defaults(command_parser=parser)
    return parser


def build_parser():
    """The `keras-transformer` parser; each subcommand's `run` is its function in
    `commands` (`translate.run` for translate)."""
    parser = _Parser(
        prog="keras-transformer",
        description="Translate, evaluate, plot, average, export and serve keras-transformer "
                    "models. Train with python -m recipes.NAME.",
    )
    options.add(parser, "native_logs")
    # Every command takes it after its name too; SUPPRESS keeps the value
    # given before the name when it is not repeated.
    native_logs = argparse.ArgumentParser(add_help=False)
    options.add(native_logs, "native_logs", default=argparse.SUPPRESS)
    subcommands = parser.add_subparsers(dest="command", required=True)
    command = functools.partial(_subcommand, subcommands, parents=[native_logs])
    for add_command in (_add_translate, _add_evaluate, _add_plot, _add_average, _add_export,
                        _add_serve):
        add_command(command, native_logs)
    return parser


def _add_translate(command, native_logs):
    translate = command(
        "translate", help="translate sentences (or stdin lines)",
        description=_TRANSLATE_DESCRIPTION, epilog=_TRANSLATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    translate.add_argument("model", type=path("model"), help=_MODEL_HELP)
    translate.add_argument("sentences", nargs="*", type=text,
                           help="sentences; standard input is read line by line if none")
    translate.add_argument("--batch-size", type=positive_int, default=translate_command.BATCH_SIZE,
                           help="most lines decoded together (default: %(default)s)")
    translate.add_argument("--n-best", type=positive_int, metavar="N",
                           help="write the N best hypotheses of each input as "
                                "INDEX<TAB>SCORE<TAB>TRANSLATION lines (see below); "
                                "N <= --beam-size")
    translate.add_argument("--print-alignment", action="store_true",
                           help="append each translation's SOURCE-TARGET token alignment "
                                "after a tab (see below)")
    options.add_search_options(translate)
    sampling = translate.add_argument_group("sampling (instead of beam search)")
    sampling.add_argument("--sample", action="store_true",
                          help="draw each token from the model's distribution")
    sampling.add_argument("--temperature", type=positive_float,
                          help="divide the logits by this (default 1)")
    sampling.add_argument("--top-k", type=non_negative_int,
                          help="keep the k most probable tokens (default 0: all)")
    sampling.add_argument("--top-p", type=probability,
                          help="keep the most probable tokens up to this mass (default 1: all)")
    sampling.add_argument("--seed", type=non_negative_int, help="random seed (default 0)")
    options.add_max_source_length(translate, _TRANSLATOR_LIMIT)
    options.add_engine_options(translate)
    translate.set_defaults(run=translate_command.run)


def _add_evaluate(command, native_logs):
    evaluate = command("evaluate", help="translate a test set and report BLEU")
    evaluate.add_argument("model", type=path("model"), help=_MODEL_HELP)
    evaluate.add_argument("--source", required=True, type=path("file"),
                          help="source sentences, one per line (.gz ok)")
    evaluate.add_argument("--reference", required=True, type=path("file"),
                          help="reference translations, aligned")
    evaluate.add_argument("--output", type=path("output file"),
                          help="file for the translations, one per line")
    evaluate.add_argument("--limit", type=positive_int, help="only the first N sentences")
    evaluate.add_argument("--batch-size", type=positive_int, default=32,
                          help="sentences decoded together")
    options.add_search_options(evaluate)
    options.add_max_source_length(evaluate, _TRANSLATOR_LIMIT)
    options.add_engine_options(evaluate)
    evaluate.set_defaults(run=commands.evaluate)


def _add_plot(command, native_logs):
    plot = command("plot", help="draw a figure as a PNG file")
    figures = plot.add_subparsers(dest="figure", required=True)
    figure = functools.partial(_subcommand, figures, parents=[native_logs])
    attention = figure("attention", help="encoder, decoder and cross attention "
                                   "of one translated sentence, per layer and head")
    attention.add_argument("model", type=path("model"), help=".keras file or run directory")
    attention.add_argument("sentence", type=text, help="the source sentence")
    attention.add_argument("--output-dir", default="plots", type=path("output folder"),
                           help="folder for the PNG files")
    options.add_search_options(attention)
    positions = figure("positions", help="the §3.5 positional-encoding matrix")
    positions.add_argument("--output", default="plots/positions.png", type=path("output file"),
                           help="PNG file")
    positions.add_argument("--length", type=positive_int, default=100, help="positions drawn")
    positions.add_argument("--d-model", type=positive_int, default=512, help="encoding width")
    schedule = figure("schedule", help="the §5.3 learning-rate schedule")
    schedule.add_argument("--output", default="plots/schedule.png", type=path("output file"),
                          help="PNG file")
    schedule.add_argument("--d-model", type=positive_int, default=512, help="model width")
    schedule.add_argument("--warmup-steps", type=positive_int, default=4000, help="warmup steps")
    schedule.add_argument("--num-steps", type=positive_int, default=20000, help="steps drawn")
    training = figure("training", help="loss and accuracy curves of recipe runs")
    training.add_argument("runs", nargs="+", type=path("model"),
                          help="run directories (or training_log.csv files)")
    training.add_argument("--output", default="plots/training.png", type=path("output file"),
                          help="PNG file")
    training.add_argument("--steps-per-window", type=positive_int,
                          help="the runs' --checkpoint-every, to count optimizer steps")
    curve = figure("validation", help="validation BLEU against training time (or steps) of "
                                      "recipe runs trained with --validation-curve")
    curve.add_argument("runs", nargs="+", type=path("model"),
                       help="run directories (or validation_curve.csv files)")
    curve.add_argument("--output", default="plots/validation.png", type=path("output file"),
                       help="PNG file")
    curve.add_argument("--against", choices=("minutes", "steps"), default="minutes",
                       help="the x axis: training minutes, or optimizer steps (which compare "
                            "runs of other backends, machines or sittings)")
    plot.set_defaults(run=commands.plot)


def _add_average(command, native_logs):
    average = command("average", help="average checkpoints into one model (§6.1)")
    average.add_argument("checkpoints", nargs="*", type=path("file"),
                         help=".keras files to average")
    average.add_argument("--run-dir", type=path("folder"),
                         help="average this run's newest checkpoints")
    average.add_argument("--last", type=positive_int, default=5,
                         help="with --run-dir: how many of the newest checkpoints")
    average.add_argument("--output", type=path("new file"),
                         help="where to write the averaged model (default: "
                                          "RUN_DIR/model_averaged.keras with --run-dir, else "
                                          "averaged.keras)")
    average.add_argument("--force", action="store_true",
                         help="replace the output if it exists (refused otherwise)")
    average.set_defaults(run=commands.average)


def _add_export(command, native_logs):
    export = command(
        "export", help="write a TensorFlow SavedModel (strings in, translations out) or a "
                       "CTranslate2 export to EXPORT_BASE/VERSION/")
    export.add_argument("model", type=path("model"),
                        help=".keras file with its tokenizer beside it, or run directory")
    export.add_argument("export_base", type=path("output folder"),
                        help="serving directory, e.g. saved_models/NAME or ct2_models/NAME; "
                             "the export goes to EXPORT_BASE/VERSION/")
    export.add_argument("--format", choices=("saved_model", "ctranslate2"),
                        default="saved_model",
                        help="saved_model (TensorFlow Serving, beam search inside) or "
                             "ctranslate2 (CTranslate2's C++ engine, its tokenizer and search "
                             "settings beside it; --batch-sizes and --lengths do not apply)")
    export.add_argument("--quantization", choices=options.QUANTIZATIONS,
                        help="with --format ctranslate2: CTranslate2 weight type "
                             "(default: float32)")
    export.add_argument("--version", type=positive_int,
                        help="version number (default: one above the highest present)")
    options.add_search_options(export)
    export.add_argument("--max-output-length", type=positive_int,
                        help="most output tokens (default: source length + 50, §6.1)")
    options.add_max_source_length(export, "the model's max_length")
    export.add_argument("--batch-sizes", type=positive_ints,
                        help="batch sizes compiled, ascending (default: 1,2,4,8,16,32,64)")
    export.add_argument("--lengths", type=positive_ints,
                        help="source widths compiled, ascending (default: 16,32,48,64, then "
                             "about 1.5x apart up to --max-source-length)")
    export.add_argument("--n-best", type=positive_int, metavar="N",
                        help="also write the translate_n_best signature: the N best "
                             "hypotheses of the beam per sentence, 2 <= N <= --beam-size")
    export.add_argument("--quiet", action="store_true", help="print nothing on success")
    export.set_defaults(run=commands.export)


def _add_serve(command, native_logs):
    from keras_transformer_app.serving.options import ServerOptions

    defaults = _defaults(ServerOptions)
    serve = command(
        "serve", help="serve a SavedModel or a CTranslate2 export over HTTP with TensorFlow "
                      "Serving's REST API")
    serve.add_argument("saved_model", type=path("folder"),
                       help="saved_models/NAME or ct2_models/NAME (its highest version is "
                            "served, new versions are picked up) or a version folder")
    serve.add_argument("--host", default=defaults["host"], type=text,
                       help="address to bind; 0.0.0.0 exposes the server to the network "
                            "(default: %(default)s)")
    serve.add_argument("--port", type=port, default=defaults["port"],
                       help="port, TensorFlow Serving's REST default; 0 picks a free one "
                            "(default: %(default)s)")
    serve.add_argument("--name", type=model_name,
                       help="model name in the URL (default: the directory's name)")
    limits = serve.add_argument_group("limits and timeouts")
    for flag, kind, help_text in (
        ("--max-instances", positive_int, "instances per request"),
        ("--max-chars", positive_int, "characters per sentence (ids per id list)"),
        ("--max-body-bytes", positive_int, "request body size"),
        ("--max-connections", positive_int, "open connections (more get 503)"),
        ("--max-concurrent-requests", positive_int, "predict requests in flight (more get 503)"),
        ("--header-timeout", positive_float, "seconds to send a request's headers"),
        ("--body-timeout", positive_float, "seconds to send a request's body"),
        ("--keep-alive-timeout", positive_float, "seconds an idle connection stays open"),
        ("--write-timeout", positive_float, "seconds for a client to read what it is sent, "
                                            "once the buffers are full (then it is cut off)"),
        ("--file-system-poll-wait-seconds", non_negative_float,
         "seconds between polls for new versions (0: never)"),
        ("--max-num-load-retries", non_negative_int,
         "tries after a failed load of a version (0: one try)"),
        ("--load-retry-interval-micros", non_negative_int, "microseconds between those tries"),
        ("--warmup-threads", positive_int, "warm-up requests replayed at once"),
    ):
        name = flag[2:].replace("-", "_")
        limits.add_argument(flag, type=kind, default=defaults[name],
                            help=f"{help_text} (default: %(default)s)")
    _add_batching(serve)
    options.add_engine_options(serve)
    serve.set_defaults(run=commands.serve)


def _add_batching(serve):
    """TensorFlow Serving's batching parameters, as `serve`'s options."""
    from keras_transformer_app.serving.batching import BatchingParameters

    batching = _defaults(BatchingParameters)
    group = serve.add_argument_group("batching (TensorFlow Serving's batching parameters)")
    group.add_argument("--enable-batching", dest="enabled", action=argparse.BooleanOptionalAction,
                       default=batching["enabled"], help="merge concurrent requests into one call")
    for flag, help_text in (
        ("--max-batch-size", "instances per signature call"),
        ("--batch-timeout-micros", "longest wait for more requests after a batch opens"),
        ("--max-enqueued-batches", "queue bound in batches (a full queue answers 503)"),
    ):
        name = flag[2:].replace("-", "_")
        kind = non_negative_int if name == "batch_timeout_micros" else positive_int
        group.add_argument(flag, type=kind, default=batching[name],
                           help=f"{help_text} (default: %(default)s)")
    # Its default is the machine's (BatchingParameters'), left out of the parser so that
    # the help and the command reference read the same everywhere.
    group.add_argument("--num-batch-threads", type=positive_int,
                       help="batches run at once (default: the CPU cores)")


def _defaults(options):
    """`{field: default}` of the dataclass `options`, read without making one (which
    would check them with the library's `validation`, and load Keras)."""
    return {field.name: field.default for field in dataclasses.fields(options)
            if field.default is not dataclasses.MISSING}


def parse_args(argv=None, check_paths=True):
    """The parsed command line, with the checks that span several options and, with
    `check_paths`, of the paths it names (`options.check_paths`); a mistake exits
    with status 2 and the usage of the subcommand it was made in."""
    parser = build_parser()
    errors.name_options_of(parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "average" and bool(args.checkpoints) == bool(args.run_dir):
        args.command_parser.error("give either checkpoint files or --run-dir")
    if check_paths:
        options.check_paths(args.command_parser, args)
    return args
