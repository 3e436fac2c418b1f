"""§6.2 Table 3 at small scale: variations on the Transformer, trained on Multi30k.

The paper trains each variant of its base model for 100k steps on WMT14 and reports dev
perplexity and BLEU. Here every variant of a small Multi30k model gets the same training
*time* (`--minutes`), then is measured on the validation split: perplexity per subword
token (cross-entropy without label smoothing) and BLEU of beam search. The variants are
the configs of `keras_transformer.config.table3_variants` on the base row given here:
(A) heads at constant compute, (B) smaller keys, (C) model size, (D) regularization,
(E) learned positions. They share one vocabulary. Each trains in `RUN_DIR/VARIANT/`
with checkpoints, so a run started again skips finished variants and resumes the
current one (whose time budget starts over). The table goes to `RUN_DIR/results.md`
(and `.json`, with the commit, command and machine of the run, and a bar chart
`results.png`).

    python -m recipes.table3 --minutes 5 --eval-limit 400      # all the variants
    python -m recipes.table3 --variants base,heads1,heads16 --minutes 5

Each variant trains for `--minutes`, capped at `--steps`; `--precision`, `--seed` and
`--native-logs` mean what they mean for the other recipes.
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    from keras_transformer_app.logs import start

    start()

import argparse
import os

from keras_transformer.config import TABLE3_VARIANT_NAMES, table3_variants
from keras_transformer_app.cli import errors, options, recipe
from keras_transformer_app.cli.options import positive_float, positive_int, text
from recipes import multi30k

DEFAULTS = dict(run_dir="runs/table3", vocab_size=8000, max_sentence_length=64,
                tokens_per_batch=2048, warmup_steps=400, lr_scale=0.5, checkpoint_every=100,
                num_layers=3, d_model=256, num_heads=4, d_ff=1024, verbose=2)
HELP = dict(
    run_dir="results and one folder per variant", vocab_size="shared SentencePiece vocabulary",
    eval_limit="score BLEU on only the first N validation sentences",
    max_sentence_length="longest training sentence in subword tokens (longer pairs are "
                        "dropped); also the models' max_length, which sizes the learned "
                        "position table of row (E)",
    seed="random seed (the same for every variant)")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m recipes.table3",
        description="Train the Table 3 variants on Multi30k under a time budget each and "
                    "tabulate dev perplexity and BLEU.",
        formatter_class=recipe.HelpFormatter)
    parser.add_argument("--variants", default=",".join(TABLE3_VARIANT_NAMES), type=text,
                        help=f"comma-separated subset of: {', '.join(TABLE3_VARIANT_NAMES)} "
                             "(default: all of them)")
    parser.add_argument("--minutes", type=positive_float, default=8.0,
                        help="training time per variant")
    parser.add_argument("--steps", "--max-steps", dest="max_steps", type=positive_int,
                        default=100000, metavar="N",
                        help="step cap per variant (the time budget usually ends training "
                             "first; there is no --epochs)")
    multi30k.add_data_options(parser)
    for name in ("run_dir", "precision", "eval_limit", "vocab_size", "max_sentence_length",
                 "tokens_per_batch", "warmup_steps", "lr_scale", "checkpoint_every", "seed",
                 "verbose", "native_logs"):
        recipe.add(parser, name, **({"help": HELP[name]} if name in HELP else {}))
    options.add_search_options(parser)
    base = parser.add_argument_group("the base row (defaults: the small preset)")
    for name in ("num_layers", "d_model", "num_heads", "d_ff"):
        recipe.add(base, name)
    parser.set_defaults(**DEFAULTS)
    errors.name_options_of(parser)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    options.check_paths(parser, args)
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in TABLE3_VARIANT_NAMES]
    if unknown or not names:
        parser.error(f"unknown variant(s) {unknown}: choose from "
                     f"{', '.join(TABLE3_VARIANT_NAMES)}")
    import keras

    from keras_transformer import TransformerConfig, saving
    from keras_transformer_app import plots, provenance
    from keras_transformer_app.training import variants
    from keras_transformer_app.training.vocabulary import learn_or_load_tokenizers

    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.precision)  # every variant's model is built under it
    splits = multi30k.load_splits(args)
    os.makedirs(args.run_dir, exist_ok=True)
    tokenizer, _ = learn_or_load_tokenizers(args.run_dir, splits["train"], args.vocab_size)
    base = TransformerConfig.small(
        vocab_size=tokenizer.vocab_size, num_layers=args.num_layers, d_model=args.d_model,
        num_heads=args.num_heads, d_ff=args.d_ff, max_length=args.max_sentence_length,
        warmup_steps=args.warmup_steps)
    rows, made = [], provenance.record()
    for name, (group, config) in table3_variants(base, names).items():
        print(f"== Table 3 variant {name} ({group or 'base'}), {args.minutes:g} min budget")
        rows.append(variants.train_and_measure(
            config, tokenizer, splits, os.path.join(args.run_dir, name), variant=name,
            group=group, minutes=args.minutes, max_steps=args.max_steps,
            checkpoint_every=args.checkpoint_every, lr_scale=args.lr_scale,
            max_sentence_length=args.max_sentence_length,
            tokens_per_batch=args.tokens_per_batch, beam_size=args.beam_size, alpha=args.alpha,
            eval_limit=args.eval_limit, seed=args.seed, verbose=args.verbose))
        saving.write_json(os.path.join(args.run_dir, "results.json"),
                          {"provenance": made, "minutes": args.minutes, "variants": rows})
        saving.write_text(os.path.join(args.run_dir, "results.md"),
                             variants.markdown(rows) + "\n")
        plots.plot_variants(os.path.join(args.run_dir, "results.png"), rows,
                            title="Table 3 variants on Multi30k, equal training time each")
    print(variants.markdown(rows))
    print(f"Wrote {os.path.join(args.run_dir, 'results.md')}")
    return rows


if __name__ == "__main__":
    errors.guarded(main)
