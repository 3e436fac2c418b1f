"""Multi30k task 1 (En-De image captions): the standard small translation
benchmark, trainable on a CPU.

Reads train / val / test_2016_flickr from `--data-dir` (plain or gzipped files,
one sentence per line); without it, downloads the six files of the dataset's
GitHub repository into the Keras cache on first use and checks their sha256
(`keras_transformer.training.downloads`). Learns a shared SentencePiece vocabulary, trains the
`small` preset with the paper's optimizer and label smoothing, and reports
BLEU of beam search (beam 4, α 0.6) on test2016.

    python -m recipes.multi30k --direction de-en [--data-dir FOLDER]
"""

from recipes import common

DEFAULTS = dict(preset="small", vocab_size=8000, max_sentence_length=64, tokens_per_batch=4096,
                epochs=10.0, checkpoint_every=500, warmup_steps=1000)


def main(argv=None):
    from keras_transformer.training.data import load_multi30k
    from keras_transformer.training.downloads import fetch_multi30k

    parser = common.build_parser(
        "multi30k", "Train a Transformer on Multi30k German<->English.", DEFAULTS
    )
    parser.add_argument("--direction", choices=("de-en", "en-de"), default="de-en",
                        help="translation direction")
    parser.add_argument("--data-dir",
                        help="folder with train.{de,en}[.gz], val.*, test_2016_flickr.* "
                             "(default: download them into the Keras cache on first use)")
    parser.add_argument("--train-limit", type=int,
                        help="use only the first N training pairs (smoke runs)")
    args = parser.parse_args(argv)
    common.check_args(parser, args)
    splits = load_multi30k(args.data_dir or fetch_multi30k(), args.direction)
    splits["train"] = common.limit_pairs(splits["train"], args.train_limit)
    if args.run_dir == "runs/multi30k":
        args.run_dir = f"runs/multi30k-{args.direction}"
    return common.run(args, splits, f"multi30k-{args.direction}")


if __name__ == "__main__":
    common.main_guard(main)
