"""The resumable run as a library (keras_transformer_app/training/run.py): `run(splits, config,
RunOptions(...))` from a script, without the recipes' command line. The recipes' tests
(tests/test_recipes.py) kill real processes in every phase; these call the library."""

import csv
import dataclasses
import os

import keras
import pytest

from keras_transformer import TransformerConfig, saving
from keras_transformer.data.corpora import ParallelCorpus, synthetic_translation
from keras_transformer_app import provenance, run_files
from keras_transformer_app.training import scoring
from keras_transformer_app.training.run import PHASES, RunOptions, cooldown_steps, run

# One window of two steps is enough to leave checkpoints, a backup and models; greedy
# search (beam 1, α 0) keeps the scoring quick.
CONFIG = TransformerConfig.tiny(vocab_size=320, d_model=32, d_ff=64, num_heads=2,
                                num_layers=1, warmup_steps=10)
FAST = dict(checkpoint_every=2, vocab_size=320, max_sentence_length=32, tokens_per_batch=512,
            beam_size=1, alpha=0.0, verbose=0)


@pytest.fixture(scope="module")
def splits():
    return {"train": synthetic_translation(200, seed=1),
            "validation": synthetic_translation(4, seed=2),
            "test": synthetic_translation(4, seed=3)}


def windows(run_dir):
    with open(run_files.path(run_dir, run_files.TRAINING_LOG)) as f:
        return [row["epoch"] for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, splits):
    """A run of 4 steps through every phase, under the pass's backend, with the loss in
    chunks of 16 positions: its directory and results."""
    run_dir = str(tmp_path_factory.mktemp("finished") / "run")
    options = RunOptions(run_dir, steps=4, name="mine", separate_vocabularies=True,
                         loss_chunk_size=16, **FAST)
    return run_dir, run(splits, CONFIG, options)


def test_a_run_trains_saves_averages_and_evaluates(finished_run):
    run_dir, results = finished_run
    assert results["phases"] == ["training", "saved", "averaged", "evaluated",
                                 "evaluated_averaged"]
    assert (results["recipe"], results["steps"]) == ("mine", 4)
    assert windows(run_dir) == ["0", "1"]
    assert saving.read_json(run_files.path(run_dir, run_files.RESULTS)) == results
    # The config's vocabulary sizes follow the two learned vocabularies.
    source, target = saving.load_tokenizers(run_dir)
    model_path = run_files.path(run_dir, saving.MODEL)
    # The model was compiled with the run's chunked loss (load_model leaves it uncompiled).
    assert keras.saving.load_model(model_path).loss.chunk_size == 16
    config = saving.load_model(model_path).config
    assert (config.vocab_size, config.target_vocab_size) == (source.vocab_size,
                                                             target.vocab_size)
    assert not config.share_embeddings and config.d_model == CONFIG.d_model
    # It names where its figures come from: the commit, the command, the CPU and its class.
    made = results["provenance"]
    assert made["commit"] == provenance.commit() and made["command"] == provenance.command()
    assert made["isa"] in ("AVX-512", "AVX2", "other") and made["cpu"] and made["cores"] >= 1


@pytest.mark.once("torch")
def test_the_command_recorded_is_the_one_typed_with_its_backend(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    typed = ["-m", "recipes.multi30k", "--direction", "en-de", "--data-dir", "my data"]
    assert provenance.command(typed) == ("KERAS_BACKEND=jax python -m recipes.multi30k "
                                         "--direction en-de --data-dir 'my data'")
    assert provenance.commit("/") == "unknown commit"  # not a git checkout
    monkeypatch.setenv("KERAS_TRANSFORMER_COMMIT", "8b19823")  # a copy told its commit
    assert provenance.commit("/") == provenance.commit() == "8b19823"


# Which phases a run does again is decided from results.json, the same under every
# backend (the restore of a backup that training on needs is test_fit.py's, on
# every backend).
@pytest.mark.once("torch")
@pytest.mark.backs("docs/training.md", "the same command skips the phases that are done")
def test_a_run_does_only_what_results_json_lacks(tmp_path, splits, capsys):
    run_dir = str(tmp_path / "run")
    options = RunOptions(run_dir, steps=4, name="mine", separate_vocabularies=True, **FAST)
    results = run(splits, CONFIG, options)
    assert "Trained 4 steps" in capsys.readouterr().out

    # A run stopped before its last phase: the same call scores the averaged model only.
    stopped = dict(results, phases=results["phases"][:-1])
    del stopped["averaged"]
    saving.write_json(run_files.path(run_dir, run_files.RESULTS), stopped)
    again = run(splits, CONFIG, options)
    out = capsys.readouterr().out
    assert "Trained" not in out and "Averaged" not in out
    assert out.count("Test, ") == 1 and "Evaluating the averaged model" in out
    assert again["phases"] == results["phases"]
    assert again["averaged"]["bleu"] == results["averaged"]["bleu"]
    assert run(splits, CONFIG, options) == again
    assert "Nothing left to do" in capsys.readouterr().out

    # A larger `steps` trains on from the backup, and every later phase runs again.
    more = run(splits, CONFIG, dataclasses.replace(options, steps=6))
    assert "Trained to step 6 (2 steps in this run)" in capsys.readouterr().out
    assert more["steps"] == 6 and more["phases"] == results["phases"]
    # Its training time is every sitting's: the windows of training_log.csv.
    log = scoring.training_seconds_by_step(run_files.path(run_dir, run_files.TRAINING_LOG))
    assert more["resumed_from_step"] == 4 and more["train_seconds"] == log[6] > log[4]
    assert windows(run_dir) == ["0", "1", "2"]


def test_evaluate_only_needs_a_finished_run(tmp_path, splits):
    options = RunOptions(str(tmp_path / "none"), steps=2, evaluate_only=True, **FAST)
    with pytest.raises(FileNotFoundError, match="evaluate_only needs a finished run"):
        run(splits, CONFIG, options)


def test_evaluate_only_scores_on_one_process(tmp_path, splits, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                                    '"task": {"type": "worker", "index": 0}}')
    options = RunOptions(str(tmp_path / "run"), steps=2, evaluate_only=True, **FAST)
    with pytest.raises(ValueError, match="evaluate_only scores on one process"):
        run(splits, CONFIG, options)
    assert not os.listdir(tmp_path)


def test_a_config_shorter_than_the_training_sentences_is_refused(tmp_path, splits):
    options = RunOptions(str(tmp_path / "run"), steps=2, **FAST)
    with pytest.raises(ValueError, match="max_length=16 is below max_sentence_length=32"):
        run(splits, dataclasses.replace(CONFIG, max_length=16), options)
    assert not os.path.exists(run_files.path(options.run_dir, run_files.CHECKPOINTS))


def test_splits_other_than_train_validation_and_test_are_refused(tmp_path, splits):
    with pytest.raises(ValueError, match="train required"):
        run({"valid": splits["validation"]}, CONFIG, RunOptions(str(tmp_path), steps=2))
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("changes, message", [
    (dict(), "Give steps or epochs"),
    (dict(steps=10, epochs=1.0), "Give steps or epochs"),
    (dict(steps=0), "steps=0 must be a positive integer"),
    (dict(epochs=-1.0), "epochs=-1.0 must be a finite number > 0"),
    (dict(steps=10, tokens_per_batch=64), "tokens_per_batch=64 is below max_sentence_length"),
    (dict(steps=10, precision="float16"), "precision='float16' must be one of"),
    (dict(steps=10, cooldown_steps="120%"), "cooldown_steps='120%' must be steps"),
    (dict(steps=10, cooldown_steps=-3), "cooldown_steps=-3 must be a non-negative integer"),
    (dict(steps=10, tune_alpha=()), "tune_alpha is empty"),
    (dict(steps=10, loss_chunk_size=-1), "loss_chunk_size=-1 must be a non-negative integer"),
    (dict(steps=10, tune_alpha=(0.6, -1)), "tune_alpha=-1 must be a number >= 0"),
    (dict(steps=10, peer_timeout=0), "peer_timeout=0 must be a positive integer"),
])
def test_impossible_options_are_refused_where_they_are_made(changes, message):
    with pytest.raises(ValueError, match=message):
        RunOptions("runs/x", **changes)


def test_options_keep_alpha_lists_as_tuples_and_name_every_phase():
    assert RunOptions("runs/x", epochs=2.5, tune_alpha=[0.6, 1.0]).tune_alpha == (0.6, 1.0)
    assert PHASES == ("training", "saved", "averaged", "tuned", "evaluated",
                      "evaluated_averaged", "validation_curve", "exported")


@pytest.mark.parametrize("value, steps, expected", [
    (0, 100, 0), (30, 100, 30), ("40%", 8000, 3200), ("12.5%", 200, 25), ("0%", 50, 0)])
def test_cooldown_steps_are_steps_or_a_share_of_the_run(value, steps, expected):
    assert cooldown_steps(value, steps) == expected


def test_an_empty_validation_split_refuses_tuning_after_training(tmp_path, splits):
    run_dir = str(tmp_path / "run")
    options = RunOptions(run_dir, steps=2, tune_alpha=(0.6, 1.0), **FAST)
    no_validation = dict(splits, validation=ParallelCorpus([], []))
    with pytest.raises(ValueError, match="tune_alpha needs validation pairs"):
        run(no_validation, CONFIG, options)
    # Training and the final save are recorded: a corrected call does not train again.
    assert saving.read_json(run_files.path(run_dir, run_files.RESULTS))["phases"] == [
        "training", "saved"]


# Which models the searches after training use is decided in run.py, the same under
# every backend.
@pytest.mark.once("torch")
def test_one_translator_scores_every_model_after_training_each_with_its_own_weights(
        tmp_path, splits, monkeypatch):
    from keras_transformer.inference import Translator
    from keras_transformer_app.training import run as run_module

    made = []

    def counted(cls):
        class Counted(cls):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                made.append(self)
        return Counted

    monkeypatch.setattr(run_module, "Translator", counted(Translator))
    monkeypatch.setattr(scoring, "Translator", counted(Translator))
    run_dir = str(tmp_path / "run")
    options = RunOptions(run_dir, steps=4, tune_alpha=(0.0, 1.0), validation_curve=True,
                         **FAST)
    results = run(splits, CONFIG, options)
    assert {"tuned", "evaluated", "evaluated_averaged", "validation_curve"} <= set(
        results["phases"])
    # α tuning, both test scores and the validation curve: one translator, one compiled search.
    assert len(made) == 1
    source, target = saving.load_tokenizers(run_dir)
    for model, hypotheses in ((saving.MODEL, "test_hypotheses.txt"),
                              (run_files.AVERAGED_MODEL, "test_hypotheses_averaged.txt")):
        fresh = Translator(saving.load_model(run_files.path(run_dir, model)), source,
                           target_tokenizer=target)
        expected = [t.text for t in fresh.translate(splits["test"].sources, beam_size=1,
                                                     alpha=results["alpha_tuning"]["alpha"])]
        with open(os.path.join(run_dir, hypotheses), encoding="utf-8") as f:
            assert f.read().splitlines() == expected, model
