"""Quickstart (§5 training, §6.1 results): the main job. Trains a small Transformer with
`model.fit` on the embedded synthetic translation task, in a few minutes on a 2-core CPU.

The task (`keras_transformer.data.corpora.synthetic_translation`) is a made-up
language pair: 120 source words, a one-to-one dictionary, and a target word order
that reverses the source, so every output word must attend to a different source
position. The recipe learns a SentencePiece vocabulary, trains, saves
`runs/quickstart/model.keras` with its tokenizer, reports exact-match accuracy and
BLEU of beam search on held-out sentences, and exports a TensorFlow SavedModel to
`saved_models/quickstart/VERSION/` (version 1 on the first run, the next free version
after that). The run itself is `keras_transformer_app.training.run.run`.

    python -m recipes.quickstart [--steps 1250] [--precision float32] [--no-export]
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    from keras_transformer_app.logs import start

    start()

from keras_transformer_app.cli import errors, recipe
from keras_transformer_app.cli.options import positive_int

DEFAULTS = dict(
    preset="tiny", d_model=128, num_heads=4, d_ff=256, num_layers=2, dropout_rate=0.0,
    label_smoothing=0.1, warmup_steps=200, vocab_size=320, max_sentence_length=32,
    tokens_per_batch=2048, steps=1250, checkpoint_every=250,
    export_dir="saved_models/quickstart",
    # The synthetic language ends every sentence in the word ".": sacreBLEU's warning
    # about text that looks tokenized does not apply.
    bleu_force=True,
)


def build_parser():
    parser = recipe.build_parser(
        "quickstart", "Train a small Transformer on the synthetic translation task.", DEFAULTS)
    parser.add_argument("--train-pairs", type=positive_int, default=20000,
                        help="synthetic training pairs")
    parser.add_argument("--test-pairs", type=positive_int, default=500,
                        help="synthetic held-out pairs (validation and test each)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    options = recipe.run_options(parser, args, "quickstart")
    from keras_transformer.data.corpora import synthetic_translation
    from keras_transformer_app.training.run import run

    splits = {
        "train": synthetic_translation(args.train_pairs, seed=args.seed + 1),
        "validation": synthetic_translation(args.test_pairs, seed=args.seed + 2),
        "test": synthetic_translation(args.test_pairs, seed=args.seed + 3),
    }
    return run(splits, recipe.model_config(args, argv), options)


if __name__ == "__main__":
    errors.guarded(main)
