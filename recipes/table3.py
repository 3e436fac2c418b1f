"""§6.2 Table 3 at small scale: variations on the Transformer, trained on Multi30k.

The paper trains each variant of its base model for 100k steps on WMT14 and
reports dev perplexity and BLEU. Here every variant of a small Multi30k model
gets the same training *time* (`--minutes`), then is measured on the
validation split: perplexity per subword token (cross-entropy without label
smoothing) and BLEU of beam search. The rows follow Table 3:

    (A) heads 1 / 4 / 8 / 16 at constant compute, h · d_k = d_model
    (B) smaller attention keys d_k, with d_v = d_model / h kept
    (C) model size: N, d_model, d_ff
    (D) dropout 0 and 0.2, no label smoothing
    (E) learned instead of sinusoidal positions

The variants are configs, built by `keras_transformer.config.table3_variants`
from the base row (the `small` preset, or the sizes given on the command line);
this script picks them by name and trains them.

Each variant trains in `RUN_DIR/VARIANT/` with checkpoints, so an interrupted
run started again skips finished variants and resumes the current one (whose
time budget then starts over). The table goes to `RUN_DIR/results.md` (and
`.json`, and a bar chart `results.png`).

    python -m recipes.table3 --minutes 5 --eval-limit 400      # all 15 variants, 1 h 30 min on a 2-core CPU
    python -m recipes.table3 --variants base,heads1,heads16 --minutes 5
"""

import argparse
import json
import math
import os
import time

from keras_transformer.config import TABLE3_VARIANT_NAMES, table3_variants
from keras_transformer.training.data import load_multi30k
from keras_transformer.training.downloads import fetch_multi30k
from recipes import common


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m recipes.table3",
        description="Train the Table 3 variants on Multi30k under a time budget each and "
                    "tabulate dev perplexity and BLEU.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--variants", default=",".join(TABLE3_VARIANT_NAMES),
                        help=f"comma-separated subset of: {', '.join(TABLE3_VARIANT_NAMES)}")
    parser.add_argument("--minutes", type=float, default=8.0,
                        help="training time per variant")
    parser.add_argument("--max-steps", type=int, default=100000,
                        help="step cap per variant (the time budget usually ends training first)")
    parser.add_argument("--run-dir", default="runs/table3", help="results and one folder per variant")
    parser.add_argument("--direction", choices=("de-en", "en-de"), default="de-en")
    parser.add_argument("--data-dir",
                        help="folder with train.{de,en}[.gz], val.*, test_2016_flickr.* "
                             "(default: download them into the Keras cache on first use)")
    parser.add_argument("--train-limit", type=int, help="use only the first N training pairs")
    parser.add_argument("--eval-limit", type=int,
                        help="score BLEU on only the first N validation sentences")
    parser.add_argument("--vocab-size", type=int, default=8000, help="shared SentencePiece vocabulary")
    parser.add_argument("--max-sentence-length", type=int, default=64,
                        help="longest training sentence in subword tokens (longer pairs are "
                             "dropped); also the models' max_length, which sizes the learned "
                             "position table of row (E)")
    parser.add_argument("--tokens-per-batch", type=int, default=2048,
                        help="token budget per batch and side")
    parser.add_argument("--warmup-steps", type=int, default=400,
                        help="Noam warmup (short: each variant trains minutes)")
    parser.add_argument("--lr-scale", type=float, default=0.5,
                        help="constant factor on the Noam learning rate")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="steps between checkpoints (resumption granularity)")
    base = parser.add_argument_group("the base row (defaults: the small preset)")
    base.add_argument("--num-layers", type=int, default=3, help="N")
    base.add_argument("--d-model", type=int, default=256, help="d_model")
    base.add_argument("--num-heads", type=int, default=4, help="h")
    base.add_argument("--d-ff", type=int, default=1024, help="d_ff")
    parser.add_argument("--beam-size", type=int, default=4, help="beam size (§6.1: 4)")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty α")
    parser.add_argument("--seed", type=int, default=0, help="random seed (the same for every variant)")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=2,
                        help="model.fit verbosity")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in TABLE3_VARIANT_NAMES]
    if unknown or not names:
        parser.error(f"unknown variant(s) {unknown}: choose from "
                     f"{', '.join(TABLE3_VARIANT_NAMES)}")
    for name in ("max_steps", "vocab_size", "max_sentence_length", "tokens_per_batch",
                 "warmup_steps", "checkpoint_every", "num_layers", "d_model", "num_heads", "d_ff",
                 "beam_size"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if not args.minutes > 0:
        parser.error("--minutes must be positive")

    import keras

    import keras_transformer as kt

    keras.utils.set_random_seed(args.seed)
    splits = load_multi30k(args.data_dir or fetch_multi30k(), args.direction)
    splits["train"] = common.limit_pairs(splits["train"], args.train_limit)
    os.makedirs(args.run_dir, exist_ok=True)
    tokenizer_args = argparse.Namespace(run_dir=args.run_dir, separate_vocabularies=False,
                                        vocab_size=args.vocab_size, tokenizer="sentencepiece")
    tokenizer, _ = common.load_or_train_tokenizers(tokenizer_args, splits["train"])
    base = kt.TransformerConfig.small(
        vocab_size=tokenizer.vocab_size, num_layers=args.num_layers, d_model=args.d_model,
        num_heads=args.num_heads, d_ff=args.d_ff, max_length=args.max_sentence_length,
        warmup_steps=args.warmup_steps,
    )
    variants = table3_variants(base, names)

    rows = []
    for name, (group, config) in variants.items():
        print(f"== Table 3 variant {name} ({group or 'base'}), {args.minutes:g} min budget")
        rows.append(_train_and_measure(args, name, group, config, tokenizer, splits))
        _write_results(args.run_dir, rows)
    print(_markdown(rows))
    print(f"Wrote {os.path.join(args.run_dir, 'results.md')}")
    return rows


def _train_and_measure(args, name, group, config, tokenizer, splits):
    import keras

    import keras_transformer as kt
    from keras_transformer.evaluation import evaluate
    from keras_transformer.inference import Translator
    from keras_transformer.training.fit import TimeBudget, fit_steps
    from keras_transformer.training.pipeline import make_dataset

    run_dir = os.path.join(args.run_dir, name)
    results_path = os.path.join(run_dir, "results.json")
    if os.path.exists(results_path):
        with open(results_path) as f:
            row = json.load(f)
        print(f"   finished earlier: {results_path}")
        return row

    keras.utils.set_random_seed(args.seed)
    dataset_args = dict(source_tokenizer=tokenizer, target_tokenizer=tokenizer,
                        max_sentence_length=args.max_sentence_length,
                        tokens_per_batch=args.tokens_per_batch)
    train, _ = make_dataset(splits["train"].sources, splits["train"].targets, repeat=True,
                            seed=args.seed, verbose=False, **dataset_args)
    validation = splits["validation"]
    dev, _ = make_dataset(validation.sources, validation.targets, shuffle=False,
                          verbose=False, **dataset_args)

    model = kt.Transformer(config)
    common.compile_model(model, config, args.lr_scale)
    budget = TimeBudget(args.minutes * 60)
    start = time.time()
    fit_steps(model, train, run_dir, args.max_steps,
              checkpoint_every=min(args.checkpoint_every, args.max_steps),
              keep_checkpoints=1, verbose=args.verbose, extra_callbacks=[budget])
    train_seconds = time.time() - start
    steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))

    # Perplexity per subword token: plain cross-entropy, whatever ε_ls trained with.
    model.compile(loss=kt.LabelSmoothedCrossEntropy(0.0, pad_id=config.pad_id),
                  metrics=[kt.MaskedTokenAccuracy(pad_id=config.pad_id)])
    dev_loss = float(model.evaluate(dev, verbose=0, return_dict=True)["loss"])
    limit = args.eval_limit or len(validation.sources)
    result = evaluate(Translator(model, tokenizer), validation.sources[:limit],
                      validation.targets[:limit], beam_size=args.beam_size, alpha=args.alpha)

    row = {
        "variant": name, "group": group, "N": config.num_layers, "d_model": config.d_model,
        "d_ff": config.d_ff, "h": config.num_heads, "d_k": config.resolved_key_dim,
        "d_v": config.resolved_value_dim,
        "dropout": config.dropout_rate, "label_smoothing": config.label_smoothing,
        "positions": config.position_encoding, "parameters": model.count_params(),
        "steps": steps, "train_seconds": round(train_seconds, 1),
        "dev_perplexity": round(math.exp(dev_loss), 3), "dev_bleu": round(result.bleu, 2),
        "dev_bleu_lowercase": round(result.bleu_lowercase, 2), "dev_sentences": limit,
        "backend": keras.backend.backend(),
    }
    with open(results_path, "w") as f:
        json.dump(row, f, indent=2)
    print(f"   {steps} steps in {train_seconds:.0f} s: dev PPL {row['dev_perplexity']}, "
          f"BLEU {row['dev_bleu']}")
    return row


COLUMNS = [("variant", "variant"), ("group", "Table 3"), ("N", "N"), ("d_model", "d_model"),
           ("d_ff", "d_ff"), ("h", "h"), ("d_k", "d_k"), ("d_v", "d_v"), ("dropout", "P_drop"),
           ("label_smoothing", "ε_ls"), ("positions", "positions"), ("parameters", "params"),
           ("steps", "steps"), ("train_seconds", "train s"), ("dev_perplexity", "dev PPL"),
           ("dev_bleu", "dev BLEU"), ("dev_bleu_lowercase", "dev BLEU (lc)")]


def _markdown(rows):
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + " --- |" * len(COLUMNS)]
    for row in rows:
        cells = [f"{row[key]:,}" if key == "parameters" else str(row[key]) for key, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_results(run_dir, rows):
    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    with open(os.path.join(run_dir, "results.md"), "w") as f:
        f.write(_markdown(rows) + "\n")
    from keras_transformer.plots import plot_variants

    plot_variants(os.path.join(run_dir, "results.png"), rows,
                  title="Table 3 variants on Multi30k, equal training time each")


if __name__ == "__main__":
    common.main_guard(main)
