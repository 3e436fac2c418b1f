"""§5 Training and §6.1 results: the resumable training run behind every recipe.

`run(splits, config, options)` learns a subword vocabulary on the training split (or
reuses the run directory's) and sizes the config to it, batches the data by length
(§5.1), trains with the paper's optimizer, schedule and label smoothing (§5.2-§5.4)
through `fit.fit_steps`, saves `model.keras`, averages the last checkpoints (§6.1),
optionally picks the length penalty α on the validation split, scores both models on
the test split with beam search, optionally scores every checkpoint on the validation
split, and optionally exports a TensorFlow SavedModel.

Each of these is a phase ("training", "saved", "averaged", "tuned", "evaluated",
"evaluated_averaged", "validation_curve", "exported"). `results.json` records the phases
done, rewritten atomically after each, so the same call after a crash or a kill does
only what is left, and training resumes from the backup of its last window. A larger
`steps` trains on (every later phase runs again); `evaluate_only` scores a finished run
again without training. Under a cluster of processes (`distribution.py`:
`KERAS_DISTRIBUTION_*` for JAX, `TF_CONFIG` for TensorFlow, with `distribute="data"`)
every process trains, the chief (process 0) alone writes the run directory, which all
of them share, and does the phases after training. With `scoring.py`, the runs' outer layer.

Example, from your own script (a few minutes on a CPU):

    from keras_transformer import TransformerConfig
    from keras_transformer.data.corpora import synthetic_translation
    from keras_transformer_app.training.run import RunOptions, run

    splits = {"train": synthetic_translation(2000, seed=1),
              "validation": synthetic_translation(50, seed=2),
              "test": synthetic_translation(50, seed=3)}
    config = TransformerConfig.tiny(vocab_size=320)  # sized to the learned vocabulary
    options = RunOptions("runs/mine", steps=300, checkpoint_every=100, vocab_size=320,
                         max_sentence_length=32, tokens_per_batch=1024)
    results = run(splits, config, options)  # the same call again resumes, or reports
    print(results["bleu"], results["phases"])
"""

import dataclasses
import json
import os
import time

import keras

from keras_transformer import backend, saving
from keras_transformer.data import token_cache
from keras_transformer.data.corpora import ParallelCorpus
from keras_transformer.data.corpus_files import corpus_size
from keras_transformer.data.pipeline import dataset_from_pairs, make_dataset
from keras_transformer.inference import Translator
from keras_transformer.model import Transformer
from keras_transformer.training.compile import compile_model
from keras_transformer_app import provenance, run_files
from keras_transformer_app.training import distribution, run_options, scoring
from keras_transformer_app.training.averaging import average_checkpoints
from keras_transformer_app.training.fit import (
    backup_step,
    fit_steps,
    list_checkpoints,
    optimizer_step,
)
from keras_transformer_app.training.run_options import RunOptions, cooldown_steps
from keras_transformer_app.training.vocabulary import shared_tokenizers

__all__ = ["PHASES", "SPLITS", "RunOptions", "cooldown_steps", "run"]

PHASES = ("training", "saved", "averaged", "tuned", "evaluated", "evaluated_averaged",
          "validation_curve", "exported")
SPLITS = ("train", "validation", "test")
# The figures of `scoring.evaluate_split` (and the averaged model's) in results.json.
_TEST_FIGURES = ("bleu", "bleu_lowercase", "bleu_signature", "exact_match", "beam_size",
                 "alpha", "test_sentences", "test_references", "sentences_per_second",
                 "per_pair", "averaged")


class _Record:
    """results.json: a run's figures and the phases done, written atomically after each
    phase (by the chief alone: `write`). A run that is new, or trains further than the
    record, starts a new one."""

    def __init__(self, path, total_steps, write=True):
        results = saving.read_json(path, default={})
        if results.get("steps", 0) < total_steps:
            results = {}
        self.path, self.results, self.write = path, results, write
        self.phases = results.setdefault("phases", [])
        self.done_before = list(self.phases)

    def __contains__(self, phase):
        return phase in self.phases

    def finish(self, phase, **figures):
        self.results.update(figures)
        if phase not in self.phases:
            self.phases.append(phase)
        if self.write:
            saving.write_json(self.path, self.results)

    def forget(self, phase):
        if phase in self.phases:
            self.phases.remove(phase)


def run(splits, config, options):
    """Trains, saves and scores a model, doing only what `results.json` does not
    record as done.

    Args:
        splits: Maps "train" (required), "validation" and "test" to `ParallelCorpus`
            objects; "train" may also be a streamed corpus
            (`keras_transformer.data.corpus_files`), whose ids the run tokenizes once,
            in parallel, into its token cache (`keras_transformer.data.token_cache`).
            Without validation pairs, training reports no validation loss and
            `tune_alpha` and `validation_curve` are refused; without test pairs,
            nothing is scored.
        config: The model's `TransformerConfig`. Its vocabulary sizes are set to the
            learned tokenizers': `vocab_size` (and, with `separate_vocabularies`,
            `target_vocab_size` with untied embeddings); the rest is kept.
        options: `RunOptions`.

    Returns:
        The content of results.json: "phases" done, "steps", "train_seconds" (of
        every sitting of a resumed run, which adds the step it "resumed_from_step"),
        "parameters", "provenance" (`provenance.record()`), the test figures of
        `scoring.evaluate_split` (the averaged model's under "averaged"), "alpha_tuning",
        "validation_curve", "saved_model".

    Raises:
        ValueError: A bad split, a config that does not fit the options, a run
            directory trained with another vocabulary layout or model, or a cluster
            named in the environment with `distribute` other than "data" (or with
            `evaluate_only`, which runs on one process).
        FileNotFoundError: `evaluate_only` without a finished run.
        keras_transformer_app.training.fit.NonFiniteLossError: The loss became NaN or
            infinite; the run directory keeps its last finite state.
        keras_transformer_app.training.distribution.PeerLostError: A TensorFlow worker died
            (a JAX process that loses a peer is ended by JAX's runtime).
    """
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown or "train" not in splits:
        raise ValueError(f"splits maps {', '.join(SPLITS)} to ParallelCorpus objects "
                         f"(train required), got {sorted(splits)}.")
    distributed = _start(options)
    train, validation, test = (splits.get(name) or ParallelCorpus([], []) for name in SPLITS)
    print(f"Pairs: {corpus_size(train):,} train, {len(validation.sources):,} validation, "
          f"{len(test.sources):,} test")
    if options.evaluate_only:
        return _evaluate_again(options, test)
    if distributed.kind != "none":
        print(f"Devices: {distributed.description}")
    run_options.check_model_options(options, config, write=distributed.is_chief)
    tokenizer_pair = shared_tokenizers(
        distributed, options.run_dir, train, options.vocab_size, options.tokenizer,
        options.separate_vocabularies, options.tokenizer_sample, options.seed)
    config = _sized_config(config, options, tokenizer_pair)
    train_dataset, validation_dataset, total_steps = _datasets(
        options, config, tokenizer_pair, distributed, train, validation)
    record = _Record(run_files.path(options.run_dir, run_files.RESULTS), total_steps,
                     write=distributed.is_chief)
    _say_where_it_resumes(record, options, total_steps)
    if distributed.is_chief:
        for directory in (options.run_dir, run_files.path(options.run_dir, run_files.CHECKPOINTS)):
            saving.remove_partials(directory)  # saves that a kill cut short
    with distributed.lost_peers():
        model = _train(record, config, options, total_steps, distributed, train_dataset,
                       validation_dataset)
    if distributed.cluster is None:
        return _after_training(record, options, model, tokenizer_pair, validation, test)
    distributed.after_training()
    if not distributed.is_chief:
        distributed.finish()
        print("Training done: the chief (process 0) saves, averages and scores the model.")
        return record.results
    # The chief goes on alone, with the model on its own devices.
    try:
        model = saving.load_model(run_files.path(options.run_dir, saving.MODEL))
        return _after_training(record, options, model, tokenizer_pair, validation, test)
    finally:
        distributed.finish()


def _start(options):
    """A cluster's engine first (it starts before any computation), then the seed
    (the same initial weights in every process), the dtype policy and, on the
    chief, the run directory and JAX's compilation cache (a resumed run, or the
    same command again, reads its compiled steps back)."""
    if options.evaluate_only and distribution.cluster_from_environment() is not None:
        raise ValueError("evaluate_only scores on one process: run it without "
                         "KERAS_DISTRIBUTION_* or TF_CONFIG in the environment.")
    distributed = (distribution.Distributed("none", "one device") if options.evaluate_only
                   else distribution.setup(options.distribute, options.model_parallel,
                                           peer_timeout=options.peer_timeout))
    keras.utils.set_random_seed(options.seed)
    keras.config.set_dtype_policy(options.precision)
    print(f"Run {options.name}: backend {keras.backend.backend()}, precision "
          f"{options.precision}, run directory {options.run_dir}")
    if distributed.is_chief:
        os.makedirs(options.run_dir, exist_ok=True)
        backend.use_compilation_cache(run_files.path(options.run_dir,
                                                     run_files.COMPILATION_CACHE))
    return distributed


def _sized_config(config, options, tokenizer_pair):
    """The config with the learned vocabularies' sizes, checked against the options."""
    source_tokenizer, target_tokenizer = tokenizer_pair
    sizes = {"vocab_size": source_tokenizer.vocab_size, "target_vocab_size": None}
    if options.separate_vocabularies:
        sizes.update(target_vocab_size=target_tokenizer.vocab_size, share_embeddings=False)
    config = dataclasses.replace(config, **sizes)
    # The pipeline's limit counts EOS (and BOS), so no training input is longer.
    if config.max_length < options.max_sentence_length:
        raise ValueError(
            f"The model's max_length={config.max_length} is below max_sentence_length="
            f"{options.max_sentence_length}: raise the first or lower the second.")
    return config


def _datasets(options, config, tokenizer_pair, distributed, train, validation):
    """`(train_dataset, validation_dataset or None, total_steps)`: the batches of
    §5.1 (every id checked against the model's vocabulary, split by split) and
    the run's length in steps (`epochs` counted in passes over the data)."""
    dataset_args = dict(source_tokenizer=tokenizer_pair[0], target_tokenizer=tokenizer_pair[1],
                        max_sentence_length=options.max_sentence_length,
                        tokens_per_batch=options.tokens_per_batch,
                        bucket_width=options.bucket_width,
                        batch_multiple=distributed.batch_multiple,
                        shard=distributed.input_shard, source_vocab_size=config.vocab_size,
                        target_vocab_size=config.resolved_target_vocab_size)
    name = f"{options.name} train split"
    if isinstance(train, ParallelCorpus):
        train_dataset, train_stats = make_dataset(
            train.sources, train.targets, repeat=True, seed=options.seed, name=name,
            **dataset_args)
    else:  # a large split, streamed: its ids tokenized once, into the run directory
        train_dataset, train_stats = dataset_from_pairs(
            _cached_train_pairs(options, distributed, train, tokenizer_pair), repeat=True,
            seed=options.seed, name=name, **dataset_args)
    validation_dataset = None
    if validation.sources:
        validation_dataset, _ = make_dataset(
            validation.sources, validation.targets, shuffle=False, verbose=False,
            name=f"{options.name} validation split", **dataset_args)
    total_steps = options.steps
    if total_steps is None:
        batches = train_stats.batches_per_pass
        total_steps = max(1, int(round(options.epochs * batches)))
        print(f"Steps: {options.epochs} epochs x {batches} batches = {total_steps} steps")
    return train_dataset, validation_dataset, total_steps


def _cached_train_pairs(options, distributed, train, tokenizer_pair):
    """The streamed training split's ids, from the run's token cache: the chief
    tokenizes and writes it (the first time), the other processes read it."""
    folder = run_files.path(options.run_dir, run_files.TOKEN_CACHE)
    if distributed.is_chief:
        pairs = token_cache.cached_pairs(folder, train, *tokenizer_pair, verbose=True)
    distributed.barrier("token cache")
    if distributed.is_chief:
        return pairs
    if not os.path.exists(os.path.join(folder, token_cache.MANIFEST)):
        raise FileNotFoundError(
            f"Process {distributed.cluster.process_id} finds no token cache in {folder} "
            "after the chief wrote it: the run directory must be shared by every process.")
    return token_cache.cached_pairs(folder, train, *tokenizer_pair, verbose=True)


def _say_where_it_resumes(record, options, total_steps):
    """One line when the run directory holds an earlier start of this run: the
    phases done, or the step training resumes from (its last backup)."""
    if record.phases:
        print(f"Resuming {options.run_dir}: trained {record.results.get('steps')} steps; "
              f"the phases {', '.join(record.phases)} are done")
        return
    step = backup_step(options.run_dir)
    if step is not None:
        print(f"Resuming {options.run_dir}: training from step {step} of {total_steps} "
              "(its last backup)")


def _after_training(record, options, model, tokenizer_pair, validation, test):
    """The phases after "saved", on one process: averaging, α tuning, the test
    scores, the validation curve and the export."""
    model_path = run_files.path(options.run_dir, saving.MODEL)
    averaged_path = run_files.path(options.run_dir, run_files.AVERAGED_MODEL)
    checkpoints = list_checkpoints(run_files.path(options.run_dir, run_files.CHECKPOINTS))
    if "averaged" not in record and len(checkpoints) > 1:
        last = checkpoints[-options.keep_checkpoints:]
        average_checkpoints(last, averaged_path)
        print(f"Averaged the last {len(last)} checkpoints into {averaged_path}")
        record.finish("averaged")
    scorer = _Scorer(model, model_path, tokenizer_pair)
    if options.tune_alpha:
        tuned = averaged_path if "averaged" in record else model_path
        options = _tune_alpha(record, options, scorer, tuned, validation)
    if test.sources:
        if "evaluated" not in record:
            record.finish("evaluated", **_score_test(options, scorer.of(model_path), test))
        if "averaged" in record and "evaluated_averaged" not in record:
            print(f"Evaluating the averaged model {averaged_path}:")
            record.finish("evaluated_averaged", averaged=_score_test(
                options, scorer.of(averaged_path), test, "test_hypotheses_averaged"))
    if options.validation_curve and "validation_curve" not in record:
        if not validation.sources:
            raise ValueError("validation_curve needs validation pairs, and the split is empty.")
        record.finish("validation_curve", validation_curve=scoring.validation_curve(
            options.run_dir, validation, *tokenizer_pair, beam_size=options.beam_size,
            alpha=options.alpha, limit=options.eval_limit, translator=scorer.of(None)))
    if options.export_dir and "exported" not in record:
        record.finish("exported", saved_model=_export(options))
    if record.phases == record.done_before:
        print(f"Nothing left to do: {record.path} records every phase (--evaluate-only "
              "scores the run again; a larger --steps trains on).")
    return record.results


def _export(options):
    """The phase "exported": the run's model, as `keras-transformer export RUN_DIR`
    would pick it, as a SavedModel; from a TensorFlow-backend process of its own
    under another backend."""
    from keras_transformer_app.export_process import export_from_any_backend

    return export_from_any_backend(options.run_dir, options.export_dir,
                                   beam_size=options.beam_size, alpha=options.alpha)


def _train(record, config, options, total_steps, distributed, train_dataset,
           validation_dataset):
    """The phases "training" and "saved": the trained model, trained now (resuming from
    the backup of the last window) or read back from `model.keras`."""
    model_path = run_files.path(options.run_dir, saving.MODEL)
    if "saved" in record:
        print(f"Model: {model_path}, trained {record.results['steps']} steps")
        return saving.load_model(model_path) if distributed.cluster is None else None
    # fit_steps trains whole windows: the cooldown ends with the last one.
    every = min(options.checkpoint_every, total_steps)
    trained_steps = -(-total_steps // every) * every
    cooldown = cooldown_steps(options.cooldown_steps, trained_steps)
    if cooldown > trained_steps:
        raise ValueError(f"cooldown_steps={options.cooldown_steps} is more than the "
                         f"{trained_steps} steps of the run.")
    with distributed.scope():
        model = Transformer(config)
        compile_model(model, config, options.lr_scale, trained_steps, cooldown,
                      loss_chunk_size=options.loss_chunk_size or None)
    print(f"Model: {model.count_params():,} parameters, "
          f"{json.dumps(dataclasses.asdict(config))}")
    start = time.time()
    with distributed.writes_to(options.run_dir) as save_dir:
        # Resumes from the backup: after a kill, or with nothing left to train when
        # only the final save was missing.
        history = fit_steps(model, distributed.feed(train_dataset), options.run_dir,
                            total_steps, checkpoint_every=every,
                            validation_dataset=distributed.feed(validation_dataset),
                            keep_checkpoints=None if options.validation_curve else
                            options.keep_checkpoints, verbose=options.verbose, save_dir=save_dir)
        steps = optimizer_step(model)
        if "training" not in record:
            seconds = time.time() - start
            now = len(history.epoch) * every
            resumed = {}
            if now != steps:  # resumed: the windows of every sitting, from the log
                total = scoring.training_seconds_by_step(
                    run_files.path(save_dir, run_files.TRAINING_LOG)).get(steps, seconds)
                print(f"Trained to step {steps} ({now} steps in this run) in {seconds:.0f} s; "
                      f"{total:.0f} s over every sitting")
                seconds, resumed = total, {"resumed_from_step": steps - now}
            else:
                print(f"Trained {steps} steps in {seconds:.0f} s")
            record.finish("training", recipe=options.name, backend=keras.backend.backend(),
                          steps=steps, train_seconds=round(seconds, 1), **resumed,
                          parameters=model.count_params(), provenance=provenance.record())
        saving.save_model(model, run_files.path(save_dir, saving.MODEL))
    if distributed.is_chief:
        print(f"Saved {model_path} (tokenizer beside it)")
    record.finish("saved")
    return model


class _Scorer:
    """One `Translator` for the searches after training (α tuning, the test scores, the
    validation curve): its model takes each saved model's weights in turn, so the search
    compiles once, not once per model. `model` is the one saved at `model_path`."""

    def __init__(self, model, model_path, tokenizer_pair):
        self.translator = Translator(model, tokenizer_pair[0], target_tokenizer=tokenizer_pair[1])
        self.current = model_path

    def of(self, path):
        """The translator with the weights saved at `path` (None: as they are)."""
        if path not in (None, self.current):
            self.translator.model.set_weights(saving.load_model(path).get_weights())
        self.current = path
        return self.translator


def _tune_alpha(record, options, scorer, model_path, validation):
    """The phase "tuned": the options with the α of highest validation BLEU (of the
    model saved at `model_path`). Test scores of another α are forgotten, so a
    finished run given `tune_alpha` afterwards scores the test split again."""
    tuning = record.results.get("alpha_tuning") or {}
    if ("tuned" not in record
            or set(tuning.get("bleu_lowercase", ())) != {str(a) for a in options.tune_alpha}):
        if not validation.sources:
            raise ValueError("tune_alpha needs validation pairs, and the split is empty.")
        print(f"Tuning alpha with {model_path}:")
        tuned = scoring.tune_alpha(scorer.of(model_path), validation, options.tune_alpha,
                                   beam_size=options.beam_size, limit=options.eval_limit)
        record.finish("tuned", alpha_tuning={"alpha": tuned["alpha"], "model": model_path,
                                             "bleu_lowercase": tuned["bleu_lowercase"]})
    options = dataclasses.replace(options, alpha=record.results["alpha_tuning"]["alpha"])
    for phase, figures in (("evaluated", record.results),
                           ("evaluated_averaged", record.results.get("averaged", {}))):
        if phase in record and figures.get("alpha") != options.alpha:
            record.forget(phase)
    return options


def _score_test(options, translator, test, name="test_hypotheses"):
    """`scoring.evaluate_split` of the test split, hypotheses in RUN_DIR/NAME.txt."""
    return scoring.evaluate_split(
        translator, test, beam_size=options.beam_size, alpha=options.alpha,
        limit=options.eval_limit, verbose=1 if options.verbose else 0,
        hypotheses_path=os.path.join(options.run_dir, name + ".txt"),
        bleu_force=options.bleu_force)


def _evaluate_again(options, test):
    """`evaluate_only`: scores the saved model(s) of a finished run on the test split
    again and replaces the test figures of its results.json."""
    if not test.sources:
        raise ValueError("evaluate_only needs test pairs, and the split is empty.")
    try:
        model, *tokenizer_pair = saving.load_translation_model(options.run_dir)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"evaluate_only needs a finished run in {options.run_dir!r}: {error} Train it "
            "first, without evaluate_only.") from None
    scorer = _Scorer(model, run_files.path(options.run_dir, saving.MODEL), tokenizer_pair)
    path = run_files.path(options.run_dir, run_files.RESULTS)
    results = saving.read_json(path, default={"recipe": options.name})
    for key in _TEST_FIGURES:
        results.pop(key, None)
    results.update(_score_test(options, scorer.translator, test))
    averaged_path = run_files.path(options.run_dir, run_files.AVERAGED_MODEL)
    if os.path.exists(averaged_path):
        print(f"Evaluating the averaged model {averaged_path}:")
        results["averaged"] = _score_test(options, scorer.of(averaged_path), test,
                                          "test_hypotheses_averaged")
    saving.write_json(path, results)
    return results
