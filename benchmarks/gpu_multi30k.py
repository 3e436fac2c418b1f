"""Multi30k trials on a GPU machine that has no TensorFlow (§5 training, §6.1 results):
the recipe's model, optimizer, schedule, label smoothing, checkpoint averaging and beam
search, many trials side by side, to learn in minutes what a CPU learns in hours.

Three steps, the first and the last on a machine with the project installed:

    python benchmarks/gpu_multi30k.py prepare --data-dir ../shared/data/multi30k --out DATA
    python benchmarks/gpu_multi30k.py train --data DATA/shared-8000.npz --out OUT --name N [...]
    python benchmarks/gpu_multi30k.py score --data-dir ../shared/data/multi30k --prepared DATA OUT

`prepare` learns the recipe's SentencePiece vocabularies (`vocabulary.learn_or_load_tokenizers`,
as `recipes.multi30k` does) for each `--vocabularies` layout and writes the ids of the
training pairs and of the distinct validation and test2016 sources into one .npz per layout.
`train` needs only Keras and a backend: it batches the ids as the tf.data pipeline does
(`pipeline.bucket_plan`: pairs longer than `--max-sentence-length` dropped, buckets
`--bucket-width` wide of `--tokens-per-batch` tokens, each pass in a new order), trains with
`training.compile_model`, keeps the weights of the last `--keep-checkpoints` checkpoints (every
200 steps) and averages them, then writes the beam-search ids of both splits at every α of
`--alphas` to OUT/NAME.json. `score` detokenizes them, picks α on the validation split's
lower-cased BLEU and reads test2016 at that α alone, as the recipe does (`scoring.tune_alpha`,
`scoring.evaluate_split`), and prints one row per trial (`--json` adds them to a JSON-lines
file).

On one H200 (benchmarks/gpu_runs/h200-multi30k/), the English→German defaults of the time
(two vocabularies, `separate-8000`) train 16,000 steps in about 3 minutes with two trials side
by side, after a first compile of the 16 bucket shapes; eight side by side spent 6 minutes
compiling at once and then shared the GPU at a quarter of the speed. Run two or three at a
time, with JAX's compilation cache (`JAX_COMPILATION_CACHE_DIR`): a trial whose model, length
and schedule repeat an earlier one's compiles nothing.

What differs from the recipe: the batches come from NumPy, not tf.data (the same plan, another
order), no validation loss is computed, and nothing is saved but the ids. A trial here is a
guide to which CPU run to make, not a result of the recipe.
"""

if __name__ == "__main__":  # the process is this script's own: set up before Keras loads
    import checkout  # noqa: F401  this tree's library and program, installed or not

    from keras_transformer_app.logs import start

    start()

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np

LAYOUTS = {"separate": True, "shared": False}


def prepare(args):
    """The .npz of ids per vocabulary layout ("separate-8000", "shared-8000", ...)."""
    from keras_transformer.data.corpora import load_multi30k
    from keras_transformer_app.training.scoring import scored_pairs
    from keras_transformer_app.training.vocabulary import learn_or_load_tokenizers

    splits = load_multi30k(args.data_dir, args.direction)
    if args.lowercase:
        splits = {name: corpus._replace(sources=[s.lower() for s in corpus.sources],
                                        targets=[t.lower() for t in corpus.targets])
                  for name, corpus in splits.items()}
    os.makedirs(args.out, exist_ok=True)
    for layout in args.vocabularies:
        kind, size = layout.rsplit("-", 1)
        source, target = learn_or_load_tokenizers(
            os.path.join(args.out, f"vocabulary-{layout}"), splits["train"], int(size),
            separate=LAYOUTS[kind])
        arrays = dict(source_vocab_size=source.vocab_size, target_vocab_size=target.vocab_size,
                      separate=LAYOUTS[kind], pad_id=target.pad_id, bos_id=target.bos_id,
                      eos_id=target.eos_id, source_eos_id=source.eos_id)
        train = splits["train"]
        arrays.update(_ragged("train_source", source.tokenize(list(train.sources))))
        arrays.update(_ragged("train_target", target.tokenize(list(train.targets))))
        for name in ("validation", "test"):
            sources, _ = scored_pairs(splits[name])
            arrays.update(_ragged(f"{name}_source", source.tokenize(sources)))
        path = os.path.join(args.out, f"{layout}.npz")
        np.savez_compressed(path, **arrays)
        print(f"{path}: {len(train.sources):,} training pairs, vocabularies "
              f"{source.vocab_size} and {target.vocab_size}")


def _ragged(name, rows):
    lengths = np.array([len(row) for row in rows], np.int64)
    return {f"{name}_ids": np.array([i for row in rows for i in row], np.int32),
            f"{name}_offsets": np.concatenate([[0], np.cumsum(lengths)])}


def _rows(data, name):
    ids, offsets = data[f"{name}_ids"], data[f"{name}_offsets"]
    return [ids[offsets[k]:offsets[k + 1]] for k in range(len(offsets) - 1)]


def batches(data, max_sentence_length, tokens_per_batch, bucket_width, seed):
    """Endless `({"source", "target"}, labels)` batches, as `pipeline.dataset_from_pairs`
    makes them with repeat=True: each pass a new order, pairs streamed into buckets by
    their longer side (with EOS / BOS), a bucket emitted when full."""
    from keras_transformer.data.pipeline import bucket_plan

    _, sizes, lengths = bucket_plan(max_sentence_length, tokens_per_batch, bucket_width)
    sources, targets = _rows(data, "train_source"), _rows(data, "train_target")
    kept = [k for k, (s, t) in enumerate(zip(sources, targets))
            if 0 < len(s) < max_sentence_length and 0 < len(t) < max_sentence_length]
    pad, bos, eos = int(data["pad_id"]), int(data["bos_id"]), int(data["eos_id"])
    source_eos = int(data["source_eos_id"])
    buckets = [[] for _ in lengths]
    rng = np.random.default_rng(seed)
    while True:
        for k in rng.permutation(kept):
            longer = max(len(sources[k]), len(targets[k])) + 1
            b = next(i for i, length in enumerate(lengths) if longer <= length)
            buckets[b].append(k)
            if len(buckets[b]) == sizes[b]:
                width = lengths[b]
                source = np.full((sizes[b], width), pad, np.int32)
                target, labels = source.copy(), source.copy()
                for row, j in enumerate(buckets[b]):
                    s, t = sources[j], targets[j]
                    source[row, :len(s) + 1] = [*s, source_eos]
                    target[row, :len(t) + 1] = [bos, *t]
                    labels[row, :len(t) + 1] = [*t, eos]
                buckets[b] = []
                yield {"source": source, "target": target}, labels


def train(args):
    import keras

    from keras_transformer import Transformer, TransformerConfig
    from keras_transformer.training.compile import compile_model

    data = dict(np.load(args.data))
    keras.utils.set_random_seed(args.seed)
    sizes = dict(vocab_size=int(data["source_vocab_size"]))
    if bool(data["separate"]):
        sizes.update(target_vocab_size=int(data["target_vocab_size"]), share_embeddings=False)
    config = TransformerConfig.small(
        **sizes, d_model=args.d_model, num_layers=args.num_layers, num_heads=args.num_heads,
        d_ff=args.d_ff, norm_position=args.norm_position, dropout_rate=args.dropout_rate,
        label_smoothing=args.label_smoothing, warmup_steps=args.warmup_steps)
    every = 200
    steps = -(-args.steps // every) * every
    cooldown = int(round(args.cooldown / 100 * steps))
    model = Transformer(config)
    compile_model(model, config, args.lr_scale, steps, cooldown)
    snapshots, log = [], []

    class Snapshot(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            snapshots.append([np.array(keras.ops.convert_to_numpy(w)) for w in model.weights])
            del snapshots[:-args.keep_checkpoints]
            log.append({"step": (epoch + 1) * every, "loss": float(logs["loss"]),
                        "seconds": round(time.time() - began, 1)})
            if len(log) % 10 == 0:  # the curve so far, should a time limit cut the trial
                _write(args, {"name": args.name, "options": vars(args), "log": log, "ids": {}})

    began = time.time()
    model.fit(batches(data, args.max_sentence_length, args.tokens_per_batch, args.bucket_width,
                      args.seed), steps_per_epoch=every, epochs=steps // every,
              callbacks=[Snapshot()], shuffle=False, verbose=0)
    train_seconds = time.time() - began
    for k, weight in enumerate(model.weights):
        if keras.backend.is_float_dtype(weight.dtype):
            weight.assign(np.mean([s[k].astype("float64") for s in snapshots], axis=0)
                          .astype(keras.backend.standardize_dtype(weight.dtype)))
    result = {"name": args.name, "data": os.path.basename(args.data), "options": vars(args),
              "parameters": model.count_params(), "train_seconds": round(train_seconds, 1),
              "averaged": len(snapshots), "log": log, "ids": {}}
    print(f"{args.name}: trained {steps} steps in {train_seconds:.0f} s, last loss "
          f"{log[-1]['loss']:.3f}", flush=True)
    _write(args, result)
    _search(args, model, data, result, began)


def _search(args, model, data, result, began):
    """The beam-search ids of both splits at every α, into `result`, written after each."""
    import keras

    from keras_transformer.inference.beam import beam_search
    from keras_transformer.inference.limits import source_limit, source_width, truncate_source

    config = model.config
    limit, source_eos = source_limit(config), int(data["source_eos_id"])
    for split in ("validation", "test"):
        # Encoder inputs as the Translator makes them: ids + [EOS], cut to the model's limit.
        rows = [truncate_source([*map(int, row), source_eos], limit, source_eos)[0]
                for row in _rows(data, f"{split}_source")]
        matrix = np.full((len(rows), source_width(max(map(len, rows)), limit)),
                         config.pad_id, np.int32)
        for r, row in enumerate(rows):
            matrix[r, :len(row)] = row
        for alpha in args.alphas:
            ids, _ = beam_search(model, matrix, int(data["bos_id"]), int(data["eos_id"]),
                                 beam_size=4, alpha=alpha)
            ids = np.asarray(keras.ops.convert_to_numpy(ids)).reshape(len(rows), -1)
            result["ids"].setdefault(split, {})[str(alpha)] = [
                [int(t) for t in row if t not in (config.pad_id, int(data["eos_id"]))]
                for row in ids]
            print(f"{args.name}: {split} at alpha {alpha} searched "
                  f"({time.time() - began:.0f} s)", flush=True)
            _write(args, result)  # what a time limit cuts short is kept


def _write(args, result):
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}.json")
    with open(path + ".part", "w") as file:
        json.dump(result, file)
    os.replace(path + ".part", path)


def score(args):
    from keras_transformer import evaluation, saving
    from keras_transformer.data.corpora import load_multi30k
    from keras_transformer_app.training.scoring import scored_pairs

    splits = load_multi30k(args.data_dir, args.direction)
    references = {name: scored_pairs(splits[name])[1] for name in ("validation", "test")}
    rows = []
    for path in args.results:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as file:
            result = json.load(file)
        layout = result["data"][:-len(".npz")]
        _, tokenizer = saving.load_tokenizers(os.path.join(args.prepared,
                                                           f"vocabulary-{layout}"))
        if "validation" not in result["ids"]:
            print(f"{result['name']:<24} not searched: trained {result['log'][-1]['step']} "
                  f"steps, last loss {result['log'][-1]['loss']:.3f}")
            continue
        def bleu(split, alpha):
            hypotheses = tokenizer.detokenize(result["ids"][split][alpha])
            return round(evaluation.bleu_scores(hypotheses, references[split])[1].score, 2)

        validation = {alpha: bleu("validation", alpha) for alpha in result["ids"]["validation"]}
        alpha = max(validation, key=validation.get)
        # test2016 is read at validation's α alone, though train searched it at each.
        test = bleu("test", alpha) if alpha in result["ids"].get("test", {}) else None
        row = {"name": result["name"], "alpha": float(alpha),
               "validation": validation[alpha], "test2016": test,
               "parameters": result["parameters"], "train_seconds": result["train_seconds"],
               "last_loss": result["log"][-1]["loss"], "validation_by_alpha": validation,
               "options": result["options"]}
        rows.append(row)
        print(f"{row['name']:<24} val {row['validation']:6.2f} (alpha {alpha}) test2016 "
              f"{row['test2016']}  loss {row['last_loss']:.3f}  {row['train_seconds']:.0f} s")
    if args.json:
        with open(args.json, "a") as file:
            for row in rows:
                file.write(json.dumps(row) + "\n")


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="vocabularies and ids (needs TensorFlow)")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--vocabularies", nargs="+", default=["shared-8000"],
                   help="layouts LAYOUT-SIZE, LAYOUT separate or shared "
                        "(the recipe's: shared-8000)")
    for q in (p, s := commands.add_parser("score", help="BLEU of the trials' ids")):
        q.add_argument("--direction", choices=("de-en", "en-de"), default="en-de")
    p.add_argument("--lowercase", action="store_true")
    s.add_argument("--data-dir", required=True)
    s.add_argument("--prepared", required=True, help="prepare's --out")
    s.add_argument("--json", help="append one JSON line per trial to this file")
    s.add_argument("results", nargs="+", help="train's OUT/NAME.json files (or .json.gz)")
    t = commands.add_parser("train", help="one trial (Keras and a backend only)")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--name", required=True)
    t.add_argument("--seed", type=int, default=0)
    # The English→German defaults of recipes/multi30k.py.
    for name, value in dict(steps=16000, d_model=128, num_layers=4, num_heads=4, d_ff=512,
                            warmup_steps=2000, keep_checkpoints=10, max_sentence_length=64,
                            tokens_per_batch=2048, bucket_width=4).items():
        t.add_argument("--" + name.replace("_", "-"), type=int, default=value)
    for name, value in dict(dropout_rate=0.3, label_smoothing=0.2, lr_scale=2.0,
                            cooldown=40.0).items():
        t.add_argument("--" + name.replace("_", "-"), type=float, default=value)
    t.add_argument("--norm-position", choices=("pre", "post"), default="pre")
    t.add_argument("--alphas", type=float, nargs="+", default=[0.8, 1.0, 1.2, 1.4, 1.6, 1.8])
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    {"prepare": prepare, "train": train, "score": score}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
