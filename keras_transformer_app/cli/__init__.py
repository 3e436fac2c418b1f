"""The `keras-transformer` command (§6.1 decoding, the paper's figures, export, serving).

Translate, evaluate, plot, average, export and serve:

    keras-transformer translate runs/quickstart "kave tomi tozu"
    keras-transformer translate runs/multi30k-de-en < test.de > hypotheses.en
    keras-transformer evaluate runs/multi30k-de-en --source test.de --reference test.en
    keras-transformer plot attention runs/quickstart "kave tomi tozu" --output-dir plots
    keras-transformer plot positions --output plots/positions.png
    keras-transformer plot schedule --output plots/schedule.png
    keras-transformer plot training runs/multi30k-de-en runs/multi30k-en-de --steps-per-window 200
    keras-transformer average --run-dir runs/multi30k-de-en --last 3 --output last3.keras
    keras-transformer export runs/quickstart saved_models/quickstart
    keras-transformer serve saved_models/quickstart --port 8501

Training lives in the recipes (`python -m recipes.NAME --help`), whose options are built
by `recipe.py`. The package is the outermost ring: `parser.py` reads the command line,
`translate.py` translates sentences, files and pipes line by line as they arrive (§6.1
decoding), `commands.py` calls the library for the rest (evaluation, the paper's figures,
checkpoint averaging, export and serving), `options.py` holds the options that the
commands and the recipes share, and `errors.py` turns a user's mistake into one `error:`
line and exit status 2.
Nothing here imports the library, Keras or a backend until a command runs: `--help` and
every mistake the parser reports answer at once (`tests/test_cli.py` checks what a parse
leaves in `sys.modules`), and an unknown `KERAS_BACKEND` is one line rather than a
traceback.
"""

import sys

from keras_transformer_app.cli import errors, parser


def main(argv=None):
    """Runs `keras-transformer` with `argv` (the process's arguments by default)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from keras_transformer_app import logs

    with errors.command_line(native_logs=logs.NATIVE_LOGS_FLAG in argv):
        args = parser.parse_args(argv)
        with logs.signals_end_the_process():  # nothing has begun: a signal just ends it
            import keras_transformer  # noqa: F401  the library, Keras and the backend
        args.run(args)


__all__ = ["main"]
