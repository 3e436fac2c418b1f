"""What every recipe shares: command-line options and the training run.

A recipe supplies its corpus and its defaults; `run` does the rest:

1. learn a subword vocabulary on the training split (or reuse the run's),
2. build the tf.data pipeline (token-budget buckets),
3. build and compile the model (Noam schedule, label smoothing),
4. `model.fit` for the requested steps with checkpoints, BackupAndRestore,
   TensorBoard and CSV logs (see keras_transformer/training/fit.py),
5. save `model.keras` with `tokenizer/` beside it, average the last
   checkpoints (§6.1), with `--tune-alpha` pick the length penalty on the
   validation split, and evaluate both models on the test split with beam
   search,
6. with `--validation-curve`, score every checkpoint on the validation split
   (`validation_curve.csv`: BLEU against training time),
7. with `--export-dir`, export the run's model (`model.keras`, see
   `keras_transformer.run_files`) as a TensorFlow SavedModel.

Run it again with the same command after a crash or a kill, at any point: it
resumes. results.json records the phases that are done ("training", "saved",
"averaged", "tuned", "evaluated", "evaluated_averaged", "validation_curve",
"exported"), each written
atomically, and the same command does only the missing ones; training resumes
from the backup of its last window. A larger --steps trains on from there.
Add `--evaluate-only` to score a finished run again without training.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import threading
import time

from keras_transformer.logs import quiet_native_logs

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
PRESETS = ("tiny", "small", "base", "big")


def build_parser(name, description, defaults):
    """The options every recipe takes; `defaults` maps option dest → default."""
    parser = argparse.ArgumentParser(
        prog=f"python -m recipes.{name}", description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run = parser.add_argument_group("run")
    run.add_argument("--run-dir", default=f"runs/{name}",
                     help="folder for checkpoints, logs, the tokenizer and the final model; "
                          "running the same command again resumes from it")
    run.add_argument("--precision", choices=PRECISIONS, default="float32",
                     help="Keras dtype policy for training (mixed_* keep float32 variables)")
    run.add_argument("--seed", type=int, default=0, help="random seed")
    run.add_argument("--native-logs", action="store_true",
                     help="show TensorFlow's and absl's C++ log lines (hidden by default)")
    run.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                     help="model.fit verbosity: 0 silent, 1 progress bar, 2 one line per window")
    run.add_argument("--distribute", choices=("none", "data", "model"), default="none",
                     help="several devices: data parallel (JAX DataParallel, TF "
                          "MirroredStrategy) or model parallel (JAX ModelParallel)")
    run.add_argument("--model-parallel", type=int, default=2,
                     help="with --distribute model: devices along the model axis")

    length = run.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="optimizer steps in all (the paper counts steps)")
    length.add_argument("--epochs", type=float,
                        help="passes over the training data, converted to steps")
    run.add_argument("--checkpoint-every", type=int, default=500,
                     help="steps between checkpoints and BackupAndRestore backups")
    run.add_argument("--keep-checkpoints", type=int, default=5,
                     help="newest checkpoints kept and averaged at the end (§6.1: 5 base, 20 big)")

    data = parser.add_argument_group("data")
    data.add_argument("--tokenizer", choices=("sentencepiece", "wordpiece"),
                      default="sentencepiece", help="subword algorithm (SentencePiece = BPE)")
    data.add_argument("--vocab-size", type=int, default=8000, help="subword vocabulary size")
    data.add_argument("--separate-vocabularies", action=argparse.BooleanOptionalAction,
                      default=False,
                      help="learn one vocabulary per language (--vocab-size each); "
                           "--no-separate-vocabularies learns one shared by both")
    data.add_argument("--max-sentence-length", type=int, default=128,
                      help="longest training source / target in subword tokens; longer "
                           "pairs are dropped")
    data.add_argument("--tokens-per-batch", type=int, default=4096,
                      help="token budget per batch and side, padding included (paper: ~25000)")
    data.add_argument("--bucket-width", type=int, default=8,
                      help="length step of the batching buckets: smaller pads less but "
                           "compiles more train-step shapes")

    model = parser.add_argument_group("model (TransformerConfig; unset options keep the preset)")
    model.add_argument("--preset", choices=PRESETS, default="small",
                       help="TransformerConfig preset")
    model.add_argument("--max-length", type=int,
                       help="most positions the model accepts (TransformerConfig.max_length): "
                            "its longest input, ids + EOS")
    model.add_argument("--num-layers", type=int, help="N, blocks per stack")
    model.add_argument("--d-model", type=int, help="model width")
    model.add_argument("--num-heads", type=int, help="h, attention heads")
    model.add_argument("--d-ff", type=int, help="feed-forward inner width")
    model.add_argument("--dropout-rate", type=float, help="P_drop")
    model.add_argument("--attention-dropout-rate", type=float,
                       help="dropout on the attention weights (not in the paper)")
    model.add_argument("--activation-dropout-rate", type=float,
                       help="dropout on the feed-forward ReLU activations (not in the paper)")
    model.add_argument("--label-smoothing", type=float, help="ε_ls")
    model.add_argument("--warmup-steps", type=int, help="learning-rate warmup steps")
    model.add_argument("--position-encoding", choices=("sinusoidal", "learned"),
                       help="positional encoding")
    model.add_argument("--norm-position", choices=("post", "pre"), help="LayerNorm placement")
    model.add_argument("--lr-scale", type=float, default=1.0,
                       help="constant factor on the Noam learning-rate schedule")
    model.add_argument("--cooldown-steps", type=_cooldown, default=0, metavar="N|P%",
                       help="over the last N steps of the run (or the last P percent of "
                            "them), lower the rate linearly towards 0 (not in the paper; "
                            "0: none)")

    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument("--beam-size", type=int, default=4, help="beam size (§6.1: 4)")
    evaluation.add_argument("--alpha", type=float, default=0.6, help="length penalty α (§6.1: 0.6)")
    evaluation.add_argument("--tune-alpha", type=_alphas, metavar="A,B,...",
                            help="before the test split, translate the validation split with "
                                 "each of these length penalties (the averaged model's, else "
                                 "the final one's) and use the one of highest lower-cased BLEU "
                                 "instead of --alpha; the test split plays no part. Added to "
                                 "the command of a finished run, it tunes and scores the test "
                                 "split again")
    evaluation.add_argument("--eval-limit", type=int,
                            help="evaluate on only the first N distinct test sentences")
    evaluation.add_argument("--validation-curve", action="store_true",
                            help="keep every checkpoint, and after training score each on the "
                                 "validation split (beam search, --beam-size, --alpha) into "
                                 "RUN_DIR/validation_curve.csv: BLEU against training time "
                                 "(keras-transformer plot validation RUN_DIR draws it); "
                                 "--keep-checkpoints still says how many are averaged")
    evaluation.add_argument("--evaluate-only", action="store_true",
                            help="train nothing: evaluate the run directory's model.keras (and "
                                 "model_averaged.keras) on the test split again, e.g. with "
                                 "another --beam-size or --eval-limit; results.json keeps the "
                                 "training figures")
    evaluation.add_argument("--export-dir",
                            help="also export model.keras as a TensorFlow SavedModel to "
                                 "EXPORT_DIR/VERSION/ (the next free version), e.g. "
                                 "saved_models/NAME; serve it with keras-transformer serve")
    evaluation.add_argument("--no-export", action="store_true",
                            help="skip the SavedModel export even if --export-dir is set")
    parser.set_defaults(**defaults)
    return parser


def _cooldown(text):
    """--cooldown-steps: an int of steps, or a str such as "40%" (of the run's
    steps, resolved by `cooldown_steps`)."""
    if isinstance(text, int):
        return text
    try:
        value = float(text[:-1]) if text.endswith("%") else int(text)
    except ValueError:
        value = -1
    if value < 0 or (isinstance(value, float) and value > 100):
        raise argparse.ArgumentTypeError(
            f"--cooldown-steps must be 0 or positive steps, or a percentage such as 40%, "
            f"got {text!r}")
    return text if text.endswith("%") else value


def cooldown_steps(value, steps):
    """The cooldown's steps: `value` itself, or its percentage of `steps`."""
    if isinstance(value, str):
        return int(round(float(value[:-1]) / 100 * steps))
    return value


def _alphas(text):
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not value >= 0 for value in values):
        raise argparse.ArgumentTypeError(
            f"must be comma-separated non-negative numbers such as 0.6,0.8,1.0, got {text!r}")
    return values


def limit_pairs(corpus, limit):
    """The first `limit` pairs of a ParallelCorpus (all of them for None)."""
    if not limit:
        return corpus
    return corpus._replace(sources=corpus.sources[:limit], targets=corpus.targets[:limit])


def check_args(parser, args):
    """Rejects impossible values with one line instead of a traceback later,
    then quiets the native logs (before TensorFlow loads)."""
    for name in ("steps", "checkpoint_every", "keep_checkpoints", "vocab_size",
                 "max_sentence_length", "max_length", "bucket_width",
                 "tokens_per_batch", "beam_size", "eval_limit"):
        value = getattr(args, name, None)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.epochs is not None and args.epochs <= 0:
        parser.error(f"--epochs must be positive, got {args.epochs}")
    if args.model_parallel < 1:
        parser.error(f"--model-parallel must be positive, got {args.model_parallel}")
    if args.tokens_per_batch < args.max_sentence_length:
        parser.error(f"--tokens-per-batch ({args.tokens_per_batch}) must be at least "
                     f"--max-sentence-length ({args.max_sentence_length})")
    quiet_native_logs(args.native_logs)


def model_config(args, vocab_size, target_vocab_size=None):
    from keras_transformer import TransformerConfig

    overrides = {
        field: getattr(args, field)
        for field in ("num_layers", "d_model", "num_heads", "d_ff", "dropout_rate",
                      "attention_dropout_rate", "activation_dropout_rate", "label_smoothing",
                      "warmup_steps", "position_encoding", "norm_position", "max_length")
        if getattr(args, field, None) is not None
    }
    if target_vocab_size is not None:
        overrides.update(target_vocab_size=target_vocab_size, share_embeddings=False)
    preset = getattr(TransformerConfig, args.preset)
    config = preset(vocab_size=vocab_size, **overrides)
    # The pipeline's limit counts EOS (and BOS), so no training input is longer.
    if config.max_length < args.max_sentence_length:
        raise ValueError(
            f"The model's max_length={config.max_length} is below --max-sentence-length="
            f"{args.max_sentence_length}: raise --max-length or lower --max-sentence-length.")
    return config


def compile_model(model, config, lr_scale=1.0, total_steps=None, cooldown_steps=0):
    """The paper's training setup: Adam(0.9, 0.98, 1e-9) with the eq. (3)
    schedule (× lr_scale, with an optional linear cooldown over the last
    `cooldown_steps` of `total_steps`), label smoothing ε_ls, masked token
    accuracy."""
    import keras_transformer as kt

    model.compile(
        optimizer=kt.paper_adam(config.d_model, config.warmup_steps, lr_scale, total_steps,
                                cooldown_steps),
        loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id),
        metrics=[kt.MaskedTokenAccuracy(pad_id=config.pad_id)],
    )


def load_or_train_tokenizers(args, corpus):
    """The run's tokenizer(s): reused from the run directory when present, so a
    resumed run keeps its vocabulary."""
    from keras_transformer import run_files
    from keras_transformer.tokenizers import SubwordTokenizer

    def saved(directory):
        return os.path.exists(os.path.join(directory, "tokenizer.json"))

    directories = run_files.tokenizer_directories(args.run_dir, args.separate_vocabularies)
    other = run_files.tokenizer_directories(args.run_dir, not args.separate_vocabularies)
    if any(map(saved, other)):
        # Learning the other layout beside it would train a new model over
        # the run's checkpoints, whose embeddings have other shapes.
        kind, option = (("a shared vocabulary", "--no-separate-vocabularies")
                        if args.separate_vocabularies else
                        ("separate vocabularies", "--separate-vocabularies"))
        raise ValueError(
            f"The run directory {args.run_dir} was trained with {kind} ("
            f"{', '.join(os.path.basename(d) + '/' for d in other)}): resume it with {option}, "
            "or give a new --run-dir.")
    if all(map(saved, directories)):
        source_tokenizer, target_tokenizer = run_files.load_tokenizers(args.run_dir)
        print(f"Tokenizer: reusing {', '.join(directories)}")
        return source_tokenizer, target_tokenizer
    start = time.time()
    texts = ([corpus.sources, corpus.targets] if args.separate_vocabularies
             else [corpus.sources + corpus.targets])
    per_language = " per language" if len(texts) > 1 else ""
    with elapsed_progress(f"Tokenizer: learning a {args.tokenizer} vocabulary of "
                          f"{args.vocab_size}{per_language} from "
                          f"{' and '.join(f'{len(t):,}' for t in texts)} sentences"):
        tokenizers = [SubwordTokenizer.train(t, args.vocab_size, kind=args.tokenizer)
                      for t in texts]
    run_files.save_tokenizers(args.run_dir, tokenizers[0], tokenizers[-1])
    print(f"Tokenizer: learned {args.tokenizer} "
          f"{'vocabulary' if len(tokenizers) == 1 else 'vocabularies'} of "
          f"{' and '.join(str(t.vocab_size) for t in tokenizers)} tokens in "
          f"{time.time() - start:.0f} s")
    return tokenizers[0], tokenizers[-1]


@contextlib.contextmanager
def elapsed_progress(label, interval=1.0):
    """Shows `label` with the seconds elapsed, updated every `interval` on a
    terminal, while the block runs (a phase whose length cannot be known, such
    as SentencePiece's training)."""
    interactive = sys.stdout.isatty()
    start, done = time.time(), threading.Event()

    def tick():
        while not done.wait(interval):
            print(f"\r{label}... {time.time() - start:.0f} s", end="", flush=True)

    print(f"{label}...", end="" if interactive else "\n", flush=True)
    ticker = threading.Thread(target=tick, daemon=True) if interactive else None
    if ticker is not None:
        ticker.start()
    try:
        yield
    finally:
        done.set()
        if ticker is not None:
            ticker.join()
            print(f"\r{label}... {time.time() - start:.0f} s")


def run(args, splits, name):
    """Trains, saves and evaluates. `splits` maps "train"/"validation"/"test" to
    ParallelCorpus objects. Returns a dict of results."""
    import keras

    import keras_transformer as kt
    from keras_transformer import backend, distribution, run_files
    from keras_transformer.training.averaging import average_checkpoints
    from keras_transformer.training.fit import fit_steps, list_checkpoints, optimizer_step
    from keras_transformer.training.pipeline import make_dataset

    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.precision)
    os.makedirs(args.run_dir, exist_ok=True)
    print(f"Recipe {name}: backend {keras.backend.backend()}, precision {args.precision}, "
          f"run directory {args.run_dir}")
    # A resumed run (or the same command again) reads its compiled steps back.
    backend.use_compilation_cache(run_files.path(args.run_dir, run_files.COMPILATION_CACHE))
    train, validation, test = splits["train"], splits["validation"], splits["test"]
    print(f"Pairs: {len(train.sources)} train, {len(validation.sources)} validation, "
          f"{len(test.sources)} test")
    if args.evaluate_only:
        return _evaluate_finished_run(args, test, name)

    distributed = distribution.setup(args.distribute, args.model_parallel)
    if distributed.kind != "none":
        print(f"Devices: {distributed.description}")
    source_tokenizer, target_tokenizer = load_or_train_tokenizers(args, train)
    separate = args.separate_vocabularies
    config = model_config(args, source_tokenizer.vocab_size,
                          target_tokenizer.vocab_size if separate else None)
    # Every id is checked against the model's vocabulary, split by split.
    dataset_args = dict(source_tokenizer=source_tokenizer, target_tokenizer=target_tokenizer,
                        max_sentence_length=args.max_sentence_length,
                        tokens_per_batch=args.tokens_per_batch,
                        bucket_width=args.bucket_width,
                        batch_multiple=distributed.batch_multiple,
                        source_vocab_size=config.vocab_size,
                        target_vocab_size=config.resolved_target_vocab_size)
    train_dataset, train_stats = make_dataset(train.sources, train.targets, repeat=True,
                                              seed=args.seed, name=f"{name} train split",
                                              **dataset_args)
    validation_dataset = None
    if validation.sources:
        validation_dataset, _ = make_dataset(validation.sources, validation.targets,
                                             shuffle=False, verbose=False,
                                             name=f"{name} validation split", **dataset_args)

    total_steps = args.steps
    if total_steps is None:
        batches = train_stats.batches_per_pass
        total_steps = max(1, int(round(args.epochs * batches)))
        print(f"Steps: {args.epochs} epochs x {batches} batches = {total_steps} steps")

    results_path = run_files.path(args.run_dir, run_files.RESULTS)
    results = run_files.read_json(results_path, default={})
    if results.get("steps", 0) < total_steps:
        results = {}  # a new run, or one that trains further: every phase again
    phases = results.setdefault("phases", [])
    done_before = list(phases)
    if phases:
        print(f"Resuming a run whose phases {', '.join(phases)} are done")

    def finish(phase, **figures):
        """Records a finished phase in results.json (atomically), so that the
        same command after a kill does only what is left."""
        results.update(figures)
        if phase not in phases:
            phases.append(phase)
        run_files.write_json(results_path, results)

    for directory in (args.run_dir, run_files.path(args.run_dir, run_files.CHECKPOINTS)):
        run_files.remove_partials(directory)  # saves that a kill cut short
    model_path = run_files.path(args.run_dir, run_files.MODEL)
    if "saved" not in phases:
        # fit_steps trains whole windows: the cooldown ends with the last one.
        every = min(args.checkpoint_every, total_steps)
        trained_steps = -(-total_steps // every) * every
        cooldown = cooldown_steps(args.cooldown_steps, trained_steps)
        if cooldown > trained_steps:
            raise ValueError(f"--cooldown-steps {args.cooldown_steps} is more than the "
                             f"{trained_steps} steps of the run.")
        with distributed.scope():
            model = kt.Transformer(config)
            compile_model(model, config, args.lr_scale, trained_steps, cooldown)
        print(f"Model: {args.preset} preset, {model.count_params():,} parameters, "
              f"{json.dumps(dataclasses.asdict(config))}")
        start = time.time()
        # Resumes from the backup: after a kill, or with nothing left to train
        # when only the final save was missing.
        history = fit_steps(model, train_dataset, args.run_dir, total_steps,
                            checkpoint_every=every, validation_dataset=validation_dataset,
                            keep_checkpoints=None if args.validation_curve
                            else args.keep_checkpoints, verbose=args.verbose)
        steps = optimizer_step(model)
        if "training" not in phases:
            train_seconds = time.time() - start
            now = len(history.epoch) * every
            print(f"Trained {steps} steps in {train_seconds:.0f} s" if now == steps else
                  f"Trained to step {steps} ({now} steps in this run) in {train_seconds:.0f} s")
            finish("training", recipe=name, backend=keras.backend.backend(), steps=steps,
                   train_seconds=round(train_seconds, 1), parameters=model.count_params())
        run_files.save_model(model, model_path)
        print(f"Saved {model_path} (tokenizer beside it)")
        finish("saved")
    else:
        model = run_files.load_model(model_path)
        print(f"Model: {model_path}, trained {results['steps']} steps")

    averaged_path = run_files.path(args.run_dir, run_files.AVERAGED_MODEL)
    checkpoints = list_checkpoints(run_files.path(args.run_dir, run_files.CHECKPOINTS))
    if "averaged" not in phases and len(checkpoints) > 1:
        average_checkpoints(checkpoints[-args.keep_checkpoints:], averaged_path)
        print(f"Averaged the last {len(checkpoints[-args.keep_checkpoints:])} checkpoints "
              f"into {averaged_path}")
        finish("averaged")
    if args.tune_alpha:
        tuning = results.get("alpha_tuning") or {}
        if ("tuned" not in phases
                or set(tuning.get("bleu_lowercase", ())) != {str(a) for a in args.tune_alpha}):
            if not validation.sources:
                raise ValueError("--tune-alpha: this corpus has no validation split.")
            tuned = averaged_path if "averaged" in phases else model_path
            finish("tuned", alpha_tuning=tune_alpha(
                args, run_files.load_model(tuned), tuned, source_tokenizer, target_tokenizer,
                validation))
        args.alpha = results["alpha_tuning"]["alpha"]
        # A finished run given --tune-alpha afterwards: test scores of another α go.
        for phase, figures in (("evaluated", results),
                               ("evaluated_averaged", results.get("averaged", {}))):
            if phase in phases and figures.get("alpha") != args.alpha:
                phases.remove(phase)
    if test.sources:
        if "evaluated" not in phases:
            finish("evaluated", **evaluate_test(args, model, source_tokenizer,
                                                target_tokenizer, test))
        if "averaged" in phases and "evaluated_averaged" not in phases:
            print(f"Evaluating the averaged model {averaged_path}:")
            averaged = run_files.load_model(averaged_path)
            finish("evaluated_averaged", averaged=evaluate_test(
                args, averaged, source_tokenizer, target_tokenizer, test,
                "test_hypotheses_averaged"))
    if args.validation_curve and "validation_curve" not in phases:
        if not validation.sources:
            raise ValueError("--validation-curve: this corpus has no validation split.")
        finish("validation_curve", validation_curve=validation_curve(
            args, checkpoints, source_tokenizer, target_tokenizer, validation))
    if args.export_dir and not args.no_export and "exported" not in phases:
        from keras_transformer.inference.export import export_saved_model

        # The run's model, as `keras-transformer export RUN_DIR` would pick it.
        finish("exported", saved_model=export_saved_model(
            args.run_dir, args.export_dir, beam_size=args.beam_size, alpha=args.alpha))
    if phases == done_before:
        print(f"Nothing left to do: {results_path} records every phase. Use --evaluate-only "
              "to score the run again, or a larger --steps to train on.")
    return results


def scored_pairs(args, corpus):
    """The distinct sources of a split with their references
    (`group_references`), the first --eval-limit of them."""
    from keras_transformer.evaluation import group_references

    sources, references = group_references(corpus.sources, corpus.targets)
    limit = args.eval_limit or len(sources)
    return sources[:limit], references[:limit]


def tune_alpha(args, model, model_path, source_tokenizer, target_tokenizer, validation):
    """Translates the validation split with beam search (--beam-size) once per
    α of --tune-alpha and returns {"alpha": the α of highest lower-cased BLEU
    (the first on a tie), "model": model_path, "bleu_lowercase": {α: BLEU}}."""
    from keras_transformer.evaluation import evaluate
    from keras_transformer.inference import Translator

    sources, references = scored_pairs(args, validation)
    translator = Translator(model, source_tokenizer, target_tokenizer=target_tokenizer)
    scores = {}
    for alpha in args.tune_alpha:
        result = evaluate(translator, sources, references, beam_size=args.beam_size,
                          alpha=alpha, verbose=0)
        scores[str(alpha)] = round(result.bleu_lowercase, 2)
        print(f"Tuning alpha on {len(sources)} validation sentences ({model_path}): alpha "
              f"{alpha}, BLEU lower-cased {result.bleu_lowercase:.2f}, cased "
              f"{result.bleu:.2f}", flush=True)
    best = max(args.tune_alpha, key=lambda alpha: scores[str(alpha)])
    print(f"Alpha {best} from the validation split (lower-cased BLEU {scores[str(best)]:.2f})")
    return {"alpha": best, "model": model_path, "bleu_lowercase": scores}


def validation_curve(args, checkpoints, source_tokenizer, target_tokenizer, validation):
    """Scores every checkpoint on the validation split with the recipe's beam
    search and writes RUN_DIR/validation_curve.csv, one row per checkpoint:
    its step, the training time up to it (the `seconds` of its window and the
    windows before, from training_log.csv), cased and lower-cased BLEU.

    Returns the rows as dicts.
    """
    import csv
    import io

    from keras_transformer import run_files
    from keras_transformer.evaluation import evaluate
    from keras_transformer.inference import Translator
    from keras_transformer.training.fit import CHECKPOINT_PATTERN

    elapsed = training_seconds_by_step(run_files.path(args.run_dir, run_files.TRAINING_LOG))
    sources, references = scored_pairs(args, validation)
    rows = []
    for index, path in enumerate(checkpoints, 1):
        step = int(CHECKPOINT_PATTERN.search(path).group(1))
        translator = Translator(run_files.load_model(path), source_tokenizer,
                                target_tokenizer=target_tokenizer)
        result = evaluate(translator, sources, references, beam_size=args.beam_size,
                          alpha=args.alpha, verbose=0)
        rows.append({"step": step, "training_seconds": elapsed.get(step),
                     "bleu": round(result.bleu, 2),
                     "bleu_lowercase": round(result.bleu_lowercase, 2)})
        print(f"Validation curve {index}/{len(checkpoints)}: step {step}, BLEU "
              f"{result.bleu:.2f}, lower-cased {result.bleu_lowercase:.2f} "
              f"({len(sources)} sentences in {result.seconds:.0f} s)", flush=True)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=["step", "training_seconds", "bleu",
                                              "bleu_lowercase"])
    writer.writeheader()
    writer.writerows(rows)
    path = run_files.path(args.run_dir, run_files.VALIDATION_CURVE)
    run_files.write_text(path, text.getvalue())
    print(f"Wrote {path}")
    return rows


def training_seconds_by_step(log_path):
    """{step at the end of a window: training seconds up to it} from a
    recipe's training_log.csv (`fit.WindowClock`'s `step` and `seconds`
    columns; logs from before those columns give {})."""
    import csv

    if not os.path.exists(log_path):
        return {}
    with open(log_path) as f:
        rows = [row for row in csv.DictReader(f) if row.get("seconds") and row.get("step")]
    total, elapsed = 0.0, {}
    for row in sorted(rows, key=lambda row: float(row["step"])):
        total += float(row["seconds"])
        elapsed[int(float(row["step"]))] = round(total, 1)
    return elapsed


def evaluate_test(args, model, source_tokenizer, target_tokenizer, test, name="test_hypotheses"):
    """Beam-search translation of the test split: BLEU, exact match, speed.

    A source that appears on several test lines (Tatoeba lists a sentence once
    per translation) is translated once and scored against all its references;
    `per_pair` then also gives BLEU with each line's hypothesis scored against
    that line's reference alone.
    """
    from keras_transformer.evaluation import bleu_scores, evaluate
    from keras_transformer.inference import Translator

    sources, references = scored_pairs(args, test)
    translator = Translator(model, source_tokenizer, target_tokenizer=target_tokenizer)
    result = evaluate(
        translator, sources, references,
        hypotheses_path=os.path.join(args.run_dir, name + ".txt"),
        beam_size=args.beam_size, alpha=args.alpha, verbose=1 if args.verbose else 0,
        bleu_force=getattr(args, "bleu_force", False),
    )
    exact = sum(h.strip() in {r.strip() for r in refs}
                for h, refs in zip(result.hypotheses, references))
    pairs = sum(len(refs) for refs in references)
    print(f"Test, {len(sources)} sentences ({pairs} reference translations), "
          f"beam {args.beam_size}, alpha {args.alpha}:")
    print(result.summary())
    print(f"Exact match (any reference) {exact / len(references):.2%}")
    for source, hypothesis, refs in list(zip(sources, result.hypotheses, references))[:5]:
        print(f"  source:     {source}\n  translated: {hypothesis}\n  reference:  "
              + "\n              ".join(refs))
    results = {"bleu": result.bleu, "bleu_lowercase": result.bleu_lowercase,
               "bleu_signature": result.bleu_signature, "exact_match": exact / len(references),
               "beam_size": args.beam_size, "alpha": args.alpha,
               "test_sentences": len(sources), "test_references": pairs,
               "sentences_per_second": round(result.sentences_per_second, 2)}
    if pairs > len(sources):
        cased, lowercase = bleu_scores(
            [h for h, refs in zip(result.hypotheses, references) for _ in refs],
            [r for refs in references for r in refs])
        results["per_pair"] = {"bleu": cased.score, "bleu_lowercase": lowercase.score}
        print(f"Scored pair by pair ({pairs} pairs, one reference each): BLEU "
              f"{cased.score:.2f}, lower-cased {lowercase.score:.2f}")
    return results


def _evaluate_finished_run(args, test, name):
    """`--evaluate-only`: scores the saved model(s) of a finished run again and
    updates the evaluation figures of its results.json."""
    from keras_transformer import run_files

    if not test.sources:
        raise ValueError("--evaluate-only: this corpus has no test split.")
    try:
        model, source_tokenizer, target_tokenizer = run_files.load_translation_model(args.run_dir)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"--evaluate-only needs a finished run in {args.run_dir!r}: {error} Train it "
            "first with the same command without --evaluate-only.") from None
    results_path = run_files.path(args.run_dir, run_files.RESULTS)
    results = run_files.read_json(results_path, default={"recipe": name})
    for key in ("bleu", "bleu_lowercase", "bleu_signature", "exact_match", "beam_size",
                "alpha", "test_sentences", "test_references", "sentences_per_second",
                "per_pair", "averaged"):
        results.pop(key, None)
    results.update(evaluate_test(args, model, source_tokenizer, target_tokenizer, test))
    averaged_path = run_files.path(args.run_dir, run_files.AVERAGED_MODEL)
    if os.path.exists(averaged_path):
        print(f"Evaluating the averaged model {averaged_path}:")
        results["averaged"] = evaluate_test(args, run_files.load_model(averaged_path),
                                            source_tokenizer, target_tokenizer, test,
                                            "test_hypotheses_averaged")
    run_files.write_json(results_path, results)
    return results


def main_guard(main):
    """Runs `main`, turning user mistakes (an unknown KERAS_BACKEND, missing
    files, bad values) into one line on stderr and exit status 2."""
    from keras_transformer import cli

    cli.check_backend()
    from keras_transformer.training.fit import NonFiniteLossError

    try:
        return main()
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
