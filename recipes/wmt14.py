"""WMT14 English-German, the paper's setting (§5.1), for a GPU with internet.

`--config base` carries the paper's base hyperparameters (N=6, d_model=512, h=8,
d_ff=2048, P_drop=0.1, ε_ls=0.1, warmup 4000, ~25000 tokens per batch side, 100,000
steps, average of the last 5 checkpoints); `--config big` the big ones (d_model=1024,
h=16, d_ff=4096, P_drop=0.3, 300,000 steps, last 20 averaged). The paper's shared BPE
vocabulary had about 37000 tokens, here learned from `--tokenizer-sample` pairs drawn
uniformly. The data comes from a folder of text files (`--data-dir`: train.{en,de},
newstest2013.{en,de} for validation, newstest2014.{en,de} for test, plain or gzipped)
or from tensorflow-datasets (downloaded on first use). The training split is
tokenized once, on every core, into the run directory's token cache; a resumed run
and every process of a cluster read it back (docs/wmt14.md gives the disk, memory
and times). The run itself is `keras_transformer_app.training.run.run`.

    # one GPU, base model (the paper used 8 P100s for 12 hours):
    KERAS_BACKEND=jax python -m recipes.wmt14 --config base --precision mixed_bfloat16
    # the same from text files:
    KERAS_BACKEND=jax python -m recipes.wmt14 --data-dir data/wmt14 --precision mixed_bfloat16
    # big model:
    KERAS_BACKEND=jax python -m recipes.wmt14 --config big --precision mixed_bfloat16
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    from keras_transformer_app.logs import start

    start()

from keras_transformer_app.cli import errors, recipe
from keras_transformer_app.cli.options import path, positive_int

PAPER = {
    "base": dict(preset="base", steps=100_000, keep_checkpoints=5, dropout_rate=0.1),
    "big": dict(preset="big", steps=300_000, keep_checkpoints=20, dropout_rate=0.3),
}
# Buckets 4 tokens wide, as the Multi30k recipe's: on WMT14-length sentences 8% / 10% of
# the source / target positions are padding, against 14% / 16% at the default 8, for 18
# batch shapes to compile instead of 9 (benchmarks/wmt14_scale.py's corpus).
DEFAULTS = dict(vocab_size=37000, max_sentence_length=256, tokens_per_batch=25000,
                bucket_width=4, checkpoint_every=2000, warmup_steps=4000, label_smoothing=0.1,
                **PAPER["base"])


def build_parser():
    parser = recipe.build_parser(
        "wmt14", "Train the paper's base or big Transformer on WMT14 English-German.", DEFAULTS,
        run_dir="runs/wmt14-CONFIG-DIRECTION")
    parser.add_argument("--config", choices=tuple(PAPER), default="base",
                        help="the paper's base or big hyperparameters (sets --preset, --steps, "
                             "--keep-checkpoints and --dropout-rate unless given)")
    parser.add_argument("--direction", choices=("en-de", "de-en"), default="en-de",
                        help="translation direction")
    parser.add_argument("--data-dir", type=path("folder"),
                        help="folder with train.{en,de}, newstest2013.{en,de} and "
                             "newstest2014.{en,de}, plain or gzipped (default: "
                             "tensorflow-datasets)")
    parser.add_argument("--tfds-dir", default=None, type=path("output folder"),
                        help="tensorflow-datasets data_dir (without --data-dir)")
    parser.add_argument("--tokenizer-sample", type=positive_int, default=1_000_000,
                        help="training pairs, drawn uniformly with --seed, the vocabulary is "
                             "learned from (default: %(default)s)")
    recipe.add(parser, "train_limit", help="use only the first N training pairs")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    given = recipe.given(argv)
    if "epochs" in given:  # the length the user chose, not the paper's steps
        given.add("steps")
        args.steps = None
    for key, value in PAPER[args.config].items():
        if key not in given:
            setattr(args, key, value)
    options = recipe.run_options(parser, args, f"wmt14-{args.config}",
                                 run_dir=f"runs/wmt14-{args.config}-{args.direction}")
    if args.data_dir is not None and args.tfds_dir is not None:
        parser.error("give --data-dir or --tfds-dir, not both")
    from keras_transformer.data.corpus_files import wmt14_splits
    from keras_transformer_app.training.run import run

    splits = wmt14_splits(args.direction, args.data_dir, args.tfds_dir, args.train_limit)
    return run(splits, recipe.model_config(args, argv), options)


if __name__ == "__main__":
    errors.guarded(main)
