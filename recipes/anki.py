"""Tatoeba/Anki sentence pairs (English-Spanish by default): §5 training, §6.1 results.

The file lists one English sentence with several translations, so the pairs are split
into train / validation / test by English sentence: no English sentence appears in two
splits. Without `--data`, English-Spanish is downloaded on first use (`spa-eng.zip`, the
archive of the keras.io English-to-Spanish Transformer example) and its `spa.txt`
checked against a pinned sha256 (`keras_transformer.data.downloads`); other
languages need `--data` (files from www.manythings.org/anki). The run itself is
`keras_transformer_app.training.run.run`.

    python -m recipes.anki [--data spa.txt[.gz]] [--direction en-es]
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    from keras_transformer_app.logs import start

    start()

from keras_transformer_app.cli import errors, recipe
from keras_transformer_app.cli.options import path, rate, text

DEFAULTS = dict(preset="small", vocab_size=8000, max_sentence_length=48, tokens_per_batch=4096,
                epochs=5.0, checkpoint_every=1000, warmup_steps=1000)


def build_parser():
    parser = recipe.build_parser(
        "anki", "Train a Transformer on Tatoeba/Anki sentence pairs.", DEFAULTS,
        run_dir="runs/anki-DIRECTION")
    parser.add_argument("--data", type=path("file"),
                        help="tab-separated 'English<TAB>translation' file, optionally gzipped "
                             "(default for --language es: download spa-eng.zip into the Keras "
                             "cache on first use)")
    parser.add_argument("--language", default="es", type=text,
                        help="code of the file's second language (es for spa-eng, fr for fra-eng)")
    parser.add_argument("--direction", default=None, type=text,
                        help="en-XX or XX-en with XX = --language (default: en-XX)")
    parser.add_argument("--validation-fraction", type=rate, default=0.05,
                        help="share of English sentences held out for validation")
    parser.add_argument("--test-fraction", type=rate, default=0.05,
                        help="share of English sentences held out for testing")
    recipe.add(parser, "train_limit")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.data is None and args.language != "es":
        parser.error(f"only English-Spanish is downloaded; for --language {args.language} "
                     "pass --data with the pairs file (e.g. fra.txt from "
                     "www.manythings.org/anki)")
    direction = args.direction or f"en-{args.language}"
    name = f"anki-{direction}"
    options = recipe.run_options(parser, args, name, run_dir=f"runs/{name}")
    from keras_transformer.data.corpora import first_pairs, load_tatoeba
    from keras_transformer.data.downloads import fetch_anki_spa_eng
    from keras_transformer_app.training.run import run

    splits = load_tatoeba(args.data or fetch_anki_spa_eng(), direction,
                          languages=("en", args.language),
                          validation_fraction=args.validation_fraction,
                          test_fraction=args.test_fraction, seed=args.seed)
    splits["train"] = first_pairs(splits["train"], args.train_limit)
    return run(splits, recipe.model_config(args, argv), options)


if __name__ == "__main__":
    errors.guarded(main)
