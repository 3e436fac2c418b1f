"""Smoke runs of every recipe under the current backend, resumption after a
real SIGKILL, checkpoint averaging, and the command lines' help and errors."""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time

import keras
import pytest
from helpers import REPOSITORY, data_mirror, loopback_http, shared_data

import keras_transformer as kt
from keras_transformer import saving
from keras_transformer.data import downloads
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer.export.versions import read_metadata
from keras_transformer_app.cli import recipe
from keras_transformer_app.training.run import cooldown_steps
from keras_transformer_app.training.vocabulary import learn_or_load_tokenizers
from recipes import anki, average, multi30k, quickstart, table3, wmt14

# The recipes are thin scripts over `run` (tests/training/test_run.py trains it on every
# backend): their smoke runs, downloads, resuming after a kill and command-line errors run
# once, in the torch pass, where a recipe trains fastest (no compilation).
pytestmark = pytest.mark.once("torch")
TINY_MODEL = ["--preset", "tiny", "--d-model", "32", "--d-ff", "64", "--num-heads", "2",
              "--num-layers", "1", "--warmup-steps", "10", "--beam-size", "2", "--verbose", "0"]


def read_log(run_dir):
    with open(os.path.join(run_dir, "training_log.csv")) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("recipe", [quickstart, multi30k, anki, wmt14, average, table3])
def test_help_explains_every_option(recipe, capsys):
    with pytest.raises(SystemExit) as exit_info:
        recipe.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: " in text
    options = {average: ("--last", "--output", "--force"),
               table3: ("--run-dir", "--variants", "--minutes", "--steps", "--precision",
                        "--seed", "--native-logs")}.get(
        recipe, ("--run-dir", "--precision", "--steps", "--epochs", "--checkpoint-every",
                 "--native-logs", "--no-tune-alpha"))
    for option in options:
        assert option in text
    # Defaults as a user would type them, said once, and only where there is one.
    words = " ".join(text.split())
    assert "(default: None)" not in words and "(default: False)" not in words
    assert "(0." not in words  # no Python tuple


@pytest.mark.parametrize("recipe, run_dir", [(quickstart, "runs/quickstart"),
                                             (multi30k, "runs/multi30k-DIRECTION"),
                                             (anki, "runs/anki-DIRECTION"),
                                             (wmt14, "runs/wmt14-CONFIG-DIRECTION"),
                                             (table3, "runs/table3")])
def test_help_says_where_a_run_goes(recipe, run_dir, capsys):
    with pytest.raises(SystemExit):
        recipe.main(["--help"])
    words = " ".join(capsys.readouterr().out.split())
    assert f"(default: {run_dir})" in words
    if recipe is multi30k:
        assert "(default: 0.8,1.0,1.2,1.4)" in words
        assert words.count("(default: download them") == 1


def test_quickstart_smoke_run_trains_saves_and_evaluates(tmp_path):
    run_dir = str(tmp_path / "run")
    results = quickstart.main([
        "--run-dir", run_dir, "--steps", "6", "--checkpoint-every", "3",
        "--train-pairs", "200", "--test-pairs", "8", "--vocab-size", "320", *TINY_MODEL,
        "--export-dir", str(tmp_path / "saved_models" / "quickstart"),
    ])
    assert results["steps"] == 6 and results["backend"] == keras.backend.backend()
    # The SavedModel lands in the TF Serving layout, version 1 on a first export.
    assert results["saved_model"] == str(tmp_path / "saved_models" / "quickstart" / "1")
    assert os.listdir(tmp_path / "saved_models" / "quickstart") == ["1"]
    assert os.path.exists(os.path.join(results["saved_model"], "saved_model.pb"))
    for name in ("model.keras", "model_averaged.keras", "tokenizer/tokenizer.json",
                 "checkpoints/step-0000003.keras", "checkpoints/step-0000006.keras",
                 "training_log.csv", "results.json", "test_hypotheses.txt"):
        assert os.path.exists(os.path.join(run_dir, name)), name
    assert os.path.isdir(os.path.join(run_dir, "logs"))
    # The backup stays (a larger --steps trains on from it), and every phase is recorded.
    assert sorted(os.listdir(os.path.join(run_dir, "backup"))) == ["state.json",
                                                                   "window-000002.weights.h5"]
    assert results["phases"] == ["training", "saved", "averaged", "evaluated",
                                 "evaluated_averaged", "exported"]
    # The exact match is that of the hypotheses written beside it (the test split
    # is the synthetic task's seed 3), and BLEU is a score, not a placeholder.
    references = synthetic_translation(8, seed=3).targets
    with open(os.path.join(run_dir, "test_hypotheses.txt"), encoding="utf-8") as f:
        hypotheses = f.read().splitlines()
    assert len(hypotheses) == len(references) == results["test_sentences"]
    exact = sum(h.strip() == r.strip() for h, r in zip(hypotheses, references)) / 8
    assert results["exact_match"] == pytest.approx(exact)
    assert isinstance(results["bleu"], float) and "tok:13a" in results["bleu_signature"]
    assert "bleu" in results["averaged"]
    # The export is the run's model: model.keras, not the averaged one.
    metadata = read_metadata(results["saved_model"])
    exported_model = saving.load_model(os.path.join(run_dir, "model.keras"))
    assert metadata["config"] == exported_model.config.to_dict()
    assert os.path.exists(os.path.join(run_dir, "test_hypotheses_averaged.txt"))
    assert [row["epoch"] for row in read_log(run_dir)] == ["0", "1"]

    # --evaluate-only scores the saved models again (here greedy) and keeps the
    # training figures; the checkpoints and the log are left as they were.
    again = quickstart.main([
        "--run-dir", run_dir, "--train-pairs", "200", "--test-pairs", "8", *TINY_MODEL,
        "--beam-size", "1", "--alpha", "0", "--evaluate-only",
    ])
    assert again["steps"] == 6 and again["train_seconds"] == results["train_seconds"]
    assert "bleu" in again and "bleu" in again["averaged"] and "saved_model" in again
    with open(os.path.join(run_dir, "results.json")) as f:
        assert json.load(f) == again
    assert [row["epoch"] for row in read_log(run_dir)] == ["0", "1"]
    with pytest.raises(FileNotFoundError, match="needs a finished run"):
        quickstart.main(["--run-dir", str(tmp_path / "nothing"), "--evaluate-only",
                         "--train-pairs", "200", "--test-pairs", "8", *TINY_MODEL])


def test_validation_curve_and_alpha_tuning_use_the_validation_split(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    arguments = [
        "--run-dir", run_dir, "--steps", "6", "--checkpoint-every", "2",
        "--keep-checkpoints", "2", "--train-pairs", "200", "--test-pairs", "6",
        "--vocab-size", "320", *TINY_MODEL, "--no-export", "--validation-curve",
    ]
    results = quickstart.main(arguments)
    assert results["phases"] == ["training", "saved", "averaged", "evaluated",
                                 "evaluated_averaged", "validation_curve"]
    assert results["alpha"] == results["averaged"]["alpha"] == 0.6
    # Every checkpoint is kept for the curve; the last two are averaged.
    assert [os.path.basename(p) for p in sorted(
        os.listdir(os.path.join(run_dir, "checkpoints")))] == [
        "step-0000002.keras", "step-0000004.keras", "step-0000006.keras"]
    assert "Averaged the last 2 checkpoints" in capsys.readouterr().out
    # The window times of training_log.csv add up to the curve's training times.
    log = read_log(run_dir)
    assert all(float(row["seconds"]) > float(row["validation_seconds"]) > 0 for row in log)
    seconds = [float(row["seconds"]) for row in log]
    with open(os.path.join(run_dir, "validation_curve.csv")) as f:
        curve = list(csv.DictReader(f))
    assert [int(row["step"]) for row in curve] == [2, 4, 6]
    assert [float(row["training_seconds"]) for row in curve] == pytest.approx(
        [sum(seconds[:1]), sum(seconds[:2]), sum(seconds)], abs=0.2)
    assert [row["bleu_lowercase"] for row in results["validation_curve"]] == [
        float(row["bleu_lowercase"]) for row in curve]
    # The same command with --tune-alpha tunes on the validation split, and scores the
    # test split again with the alpha of highest validation BLEU.
    results = quickstart.main([*arguments, "--tune-alpha", "0,1.5"])
    assert results["phases"] == ["training", "saved", "averaged", "validation_curve", "tuned",
                                 "evaluated", "evaluated_averaged"]
    tuning = results["alpha_tuning"]
    assert tuning["model"] == os.path.join(run_dir, "model_averaged.keras")
    assert set(tuning["bleu_lowercase"]) == {"0.0", "1.5"}
    assert tuning["bleu_lowercase"][str(tuning["alpha"])] == max(
        tuning["bleu_lowercase"].values())
    assert results["alpha"] == results["averaged"]["alpha"] == tuning["alpha"]
    from keras_transformer_app import cli

    output = str(tmp_path / "validation.png")
    cli.main(["plot", "validation", run_dir, "--output", output])
    assert os.path.getsize(output) > 10_000


@pytest.mark.backs("docs/training.md", "same command with a lower `--lr-scale` resumes from the")
def test_a_run_stopped_by_a_nan_loss_resumes_with_a_lower_lr_scale(tmp_path):
    from keras_transformer_app.training.fit import NonFiniteLossError

    command = ["--run-dir", str(tmp_path / "run"), "--checkpoint-every", "3",
               "--train-pairs", "200", "--test-pairs", "4", "--vocab-size", "320",
               *TINY_MODEL, "--no-export"]
    quickstart.main([*command, "--steps", "3"])
    # Trained on with a rate that overflows the weights: the second window's loss is NaN.
    with pytest.raises(NonFiniteLossError, match=r"The loss became (nan|inf) at step [456]"):
        quickstart.main([*command, "--steps", "6", "--lr-scale", "1e30"])
    assert [row["epoch"] for row in read_log(tmp_path / "run")] == ["0"]
    results = quickstart.main([*command, "--steps", "6", "--lr-scale", "0.5"])
    assert results["steps"] == 6 and math.isfinite(results["bleu"])
    # The finite first window was kept; the second was trained again, at the lower rate.
    assert [row["epoch"] for row in read_log(tmp_path / "run")] == ["0", "1"]
    assert all(math.isfinite(float(row["loss"])) for row in read_log(tmp_path / "run"))


@pytest.mark.parametrize("precision", ["mixed_bfloat16"])
def test_quickstart_smoke_run_in_mixed_precision(tmp_path, precision):
    results = quickstart.main([
        "--run-dir", str(tmp_path / "run"), "--steps", "3", "--checkpoint-every", "3",
        "--train-pairs", "100", "--test-pairs", "4", "--precision", precision, *TINY_MODEL,
        "--no-export", "--bucket-width", "4",
    ])
    assert results["steps"] == 3
    losses = [float(row["loss"]) for row in read_log(str(tmp_path / "run"))]
    assert losses and all(math.isfinite(loss) and loss > 0 for loss in losses), losses


@pytest.fixture
def mirrored_downloads(tmp_path, monkeypatch):
    """An empty Keras cache and a loopback mirror of the recipes' downloads,
    built from ../shared/data. Yields a function that takes the mirror away
    (pointing it at a closed port)."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    with loopback_http(data_mirror()) as base:
        monkeypatch.setenv(downloads.MIRROR_VARIABLE, base)
        yield lambda: monkeypatch.setenv(downloads.MIRROR_VARIABLE, "http://127.0.0.1:9")


def test_multi30k_smoke_run_downloads_verifies_and_caches_the_real_files(
        tmp_path, mirrored_downloads, capsys):
    arguments = [
        "--direction", "en-de", "--run-dir", str(tmp_path / "run"),
        "--train-limit", "300", "--steps", "2", "--checkpoint-every", "2", "--vocab-size", "500",
        "--eval-limit", "3", "--max-sentence-length", "48", "--tokens-per-batch", "1024",
        *TINY_MODEL,
    ]
    results = multi30k.main(arguments)
    assert results["recipe"] == "multi30k-en-de" and results["steps"] == 2
    output = capsys.readouterr().out
    assert "Downloading multi30k (6 file(s))" in output and "Elliott et al. 2016" in output
    cached = tmp_path / "keras_home" / "datasets" / "keras_transformer" / "multi30k"
    assert sorted(os.listdir(cached)) == sorted(f.name for f in downloads.MULTI30K.files)
    # Again with no network: the verified cache is read, and nothing is downloaded.
    mirrored_downloads()
    again = multi30k.main([*arguments, "--evaluate-only"])
    assert again["recipe"] == "multi30k-en-de" and "bleu" in again
    assert "Downloading" not in capsys.readouterr().out


def test_anki_smoke_run_downloads_and_reads_the_real_file(tmp_path, mirrored_downloads):
    results = anki.main([
        "--run-dir", str(tmp_path / "run"), "--train-limit", "300",
        "--steps", "2", "--checkpoint-every", "2", "--vocab-size", "400", "--eval-limit", "3",
        "--max-sentence-length", "32", "--tokens-per-batch", "512", *TINY_MODEL,
    ])
    assert results["recipe"] == "anki-en-es"
    # The first test sentences include "Help!", listed once per translation: it is
    # translated once and scored against all of them, and pair by pair as well.
    assert results["test_sentences"] == 3 and results["test_references"] > 3
    assert set(results["per_pair"]) == {"bleu", "bleu_lowercase"}


def test_anki_needs_data_for_a_language_it_does_not_download(capsys):
    with pytest.raises(SystemExit):
        anki.main(["--language", "fr"])
    assert "only English-Spanish is downloaded" in capsys.readouterr().err


def test_table3_smoke_run_tabulates_the_variants_and_skips_finished_ones(tmp_path):
    data_dir = shared_data("multi30k")
    run_dir = tmp_path / "table3"
    arguments = [
        "--data-dir", data_dir, "--run-dir", str(run_dir), "--train-limit", "200",
        "--variants", "base,heads1", "--steps", "2",
        "--checkpoint-every", "2", "--eval-limit", "2", "--vocab-size", "400", "--d-model", "32",
        "--d-ff", "64", "--num-layers", "1", "--num-heads", "2", "--beam-size", "1",
        "--max-sentence-length", "48", "--tokens-per-batch", "512", "--verbose", "0",
    ]
    rows = table3.main(arguments)
    assert [row["variant"] for row in rows] == ["base", "heads1"]
    assert [(row["h"], row["d_k"]) for row in rows] == [(2, 16), (1, 32)]
    assert all(row["steps"] == 2 and row["dev_perplexity"] > 1 for row in rows)
    table = (run_dir / "results.md").read_text()
    assert len(table.splitlines()) == 2 + 2
    assert "| heads1 | A | 1 | 32 | 64 | 1 | 32 | 32 |" in table
    assert (run_dir / "results.png").stat().st_size > 0
    # The results file names where it was made (benchmarks/records.py's table3 reads it).
    written = json.loads((run_dir / "results.json").read_text())
    assert written["variants"] == rows and written["minutes"] == 8.0
    assert {"commit", "command", "cpu", "isa", "cores"} <= set(written["provenance"])
    # Finished variants are read back, not trained again.
    assert table3.main(arguments) == rows


def test_table3_rejects_unknown_variants(capsys):
    with pytest.raises(SystemExit):
        table3.main(["--variants", "base,heads3"])
    assert "unknown variant(s) ['heads3']" in capsys.readouterr().err


@pytest.mark.once("jax")  # JAX's DataParallel over two virtual devices
def test_quickstart_trains_data_parallel(tmp_path):
    command = [sys.executable, "-m", "recipes.quickstart", "--run-dir", str(tmp_path / "run"),
               "--steps", "2", "--checkpoint-every", "2", "--train-pairs", "100",
               "--test-pairs", "4", "--no-export", "--distribute", "data", *TINY_MODEL]
    # Two virtual CPU devices for JAX (torch's refusal and TensorFlow's strategy are
    # tests/training/test_distribution.py's).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=" ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=2"]))
    result = subprocess.run(command, cwd=REPOSITORY, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Devices: keras.distribution.DataParallel over 2 devices" in result.stdout
    assert os.path.exists(tmp_path / "run" / "results.json")


@pytest.mark.parametrize("arguments, message", [
    (["--steps", "0"], "argument --steps: must be a positive integer"),
    (["--cooldown-steps", "-1"], "argument --cooldown-steps: must be 0 or positive"),
    (["--cooldown-steps", "101%"], "or a percentage such as 40%"),
    (["--cooldown-steps", "x%"], "or a percentage such as 40%"),
    (["--tune-alpha", "0.6,x"], "must be comma-separated numbers from 0 to 10"),
])
def test_bad_option_values_are_rejected(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        quickstart.main(arguments)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_lowercase_lowers_every_multi30k_split_references_included():
    arguments = ["--direction", "en-de", "--data-dir", shared_data("multi30k"),
                 "--train-limit", "50"]
    cased = multi30k.load_splits(multi30k.parse_args(arguments))
    lowered = multi30k.load_splits(multi30k.parse_args([*arguments, "--lowercase"]))
    assert multi30k.parse_args(arguments).lowercase is False
    assert set(lowered) == set(cased) == {"train", "validation", "test"}
    for name, corpus in cased.items():
        assert len(lowered[name].sources) == len(corpus.sources)
        assert lowered[name].sources == [line.lower() for line in corpus.sources]
        assert lowered[name].targets == [line.lower() for line in corpus.targets]
        assert any(line != line.lower() for line in corpus.targets)  # German nouns


def test_multi30k_defaults_are_the_one_hour_recipe():
    args = multi30k.parse_args([])
    assert (args.steps, args.epochs, args.tokens_per_batch, args.checkpoint_every) == (
        8000, None, 2048, 200)
    assert (args.vocab_size, args.separate_vocabularies, args.bucket_width) == (8000, False, 4)
    assert (args.d_model, args.num_layers, args.num_heads, args.d_ff, args.dropout_rate) == (
        128, 4, 4, 512, 0.3)
    assert args.cooldown_steps == "40%" and cooldown_steps(args.cooldown_steps, 8000) == 3200
    assert args.tune_alpha == (0.8, 1.0, 1.2, 1.4)
    # A length or an α given by hand replaces the default one.
    assert multi30k.parse_args(["--epochs", "3"]).steps is None
    assert multi30k.parse_args(["--alpha", "0.6"]).tune_alpha is None
    assert multi30k.parse_args(["--alpha=0.6", "--tune-alpha", "0.6,1"]).tune_alpha == (0.6, 1.0)
    assert multi30k.parse_args(["--no-tune-alpha"]).tune_alpha is None
    assert multi30k.parse_args(["--cooldown-steps", "300"]).cooldown_steps == 300
    assert multi30k.parse_args(["--separate-vocabularies"]).separate_vocabularies is True
    assert recipe.build_parser("x", "", {}).parse_args([]).separate_vocabularies is False
    assert cooldown_steps("12.5%", 200) == 25
    # Pre-norm, dropout 0.3 and label smoothing 0.2 in both directions (their trials), each
    # replaced by the option given by hand.
    for direction in ("de-en", "en-de"):
        chosen = multi30k.parse_args(["--direction", direction])
        assert (chosen.norm_position, chosen.dropout_rate, chosen.label_smoothing) == (
            "pre", 0.3, 0.2)
        config = recipe.model_config(chosen, ["--direction", direction])
        assert (config.norm_position, config.dropout_rate, config.label_smoothing) == (
            "pre", 0.3, 0.2)
    argv = ["--direction=en-de", "--dropout-rate", "0.2", "--norm-position", "post",
            "--label-smoothing", "0.1"]
    by_hand = multi30k.parse_args(argv)
    assert (by_hand.norm_position, by_hand.dropout_rate, by_hand.label_smoothing) == (
        "post", 0.2, 0.1)
    config = recipe.model_config(by_hand, argv)
    assert (config.norm_position, config.dropout_rate, config.label_smoothing) == (
        "post", 0.2, 0.1)
    # English→German trains twice the steps, warms up over 2000 to twice the rate, averages
    # the last 10 and tunes α up to 1.8 (its trials), each replaced by hand; German→English
    # keeps 8000, 1000, 1, 5 and α up to 1.4.
    assert (args.direction, args.steps, args.warmup_steps, args.lr_scale,
            args.keep_checkpoints) == ("de-en", 8000, 1000, 1.0, 5)
    en_de = multi30k.parse_args(["--direction", "en-de"])
    assert (en_de.steps, en_de.warmup_steps, en_de.lr_scale, en_de.keep_checkpoints) == (
        16000, 2000, 2.0, 10)
    assert en_de.tune_alpha == (0.8, 1.0, 1.2, 1.4, 1.6, 1.8)
    # One vocabulary for both languages in both directions, its embeddings shared (§3.4);
    # either spelling of the option given by hand wins, as does --no-tune-alpha.
    assert (args.separate_vocabularies, en_de.separate_vocabularies) == (False, False)
    for direction in ("de-en", "en-de"):
        shared = recipe.model_config(multi30k.parse_args(["--direction", direction]),
                                     ["--direction", direction])
        assert shared.share_embeddings and shared.target_vocab_size is None
    for flag, separate in (("--separate-vocabularies", True),
                           ("--no-separate-vocabularies", False)):
        argv = ["--direction", "en-de", flag]
        assert multi30k.parse_args(argv).separate_vocabularies is separate
        assert recipe.model_config(multi30k.parse_args(argv), argv).share_embeddings is (
            not separate)
    assert multi30k.parse_args(["--direction", "en-de", "--no-tune-alpha"]).tune_alpha is None
    assert multi30k.parse_args(["--direction", "en-de", "--alpha", "0.6"]).tune_alpha is None
    assert multi30k.parse_args(["--direction", "en-de", "--tune-alpha", "1"]).tune_alpha == (1.0,)
    assert recipe.model_config(en_de, ["--direction", "en-de"]).warmup_steps == 2000
    assert cooldown_steps(en_de.cooldown_steps, en_de.steps) == 6400
    by_hand = multi30k.parse_args(["--direction", "en-de", "--steps", "8000",
                                   "--warmup-steps", "1000", "--lr-scale", "1",
                                   "--keep-checkpoints", "5"])
    assert (by_hand.steps, by_hand.warmup_steps, by_hand.lr_scale,
            by_hand.keep_checkpoints) == (8000, 1000, 1.0, 5)
    assert multi30k.parse_args(["--direction", "en-de", "--epochs", "3"]).steps is None


@pytest.mark.parametrize("module, argv", [(multi30k, []), (quickstart, []), (anki, [])])
@pytest.mark.parametrize("preset", ["tiny", "big"])
def test_a_preset_given_replaces_the_recipes_own_model(module, argv, preset):
    """--preset starts the model from that preset, whatever the recipe's own sizes;
    model options given with it still override it, and the recipe's schedule stays."""
    from keras_transformer import TransformerConfig

    argv = [*argv, "--preset", preset]
    config = recipe.model_config(module.build_parser().parse_args(argv), argv)
    expected = getattr(TransformerConfig, preset)(vocab_size=config.vocab_size)
    for field in recipe.ARCHITECTURE_FIELDS:
        assert getattr(config, field) == getattr(expected, field), field
    assert config.warmup_steps == module.DEFAULTS["warmup_steps"]
    argv += ["--d-model", "64", "--num-heads", "2"]
    config = recipe.model_config(module.build_parser().parse_args(argv), argv)
    assert (config.d_model, config.num_heads) == (64, 2)
    assert config.num_layers == expected.num_layers
    # Without --preset, the recipe's own model.
    config = recipe.model_config(module.build_parser().parse_args([]), [])
    assert config.d_model == module.DEFAULTS.get("d_model", TransformerConfig.small(
        vocab_size=8).d_model)


@pytest.mark.parametrize("trained, option, flag", [
    ("tokenizer", "separate_vocabularies=False", "--no-separate-vocabularies"),
    ("source_tokenizer", "separate_vocabularies=True", "--separate-vocabularies")])
def test_a_run_directory_keeps_the_vocabulary_layout_it_was_trained_with(
        tmp_path, trained, option, flag):
    """A run of the earlier separate-vocabulary default, resumed under today's
    shared default (or the other way round), is refused before anything is
    learned or trained, and the message names the option that resumes it: on the
    command line its flag alone (it once read "--no-separate-vocabularies False")."""
    from keras_transformer_app.cli import errors
    os.makedirs(tmp_path / trained)
    (tmp_path / trained / "tokenizer.json").write_text("{}")
    args = multi30k.parse_args(["--run-dir", str(tmp_path)] + (
        ["--separate-vocabularies"] if trained == "tokenizer" else []))
    corpus = synthetic_translation(10, seed=0)
    with pytest.raises(ValueError, match=f"trained with .*: resume it with {option},") as raised:
        learn_or_load_tokenizers(args.run_dir, corpus, args.vocab_size,
                                 separate=args.separate_vocabularies)
    assert sorted(os.listdir(tmp_path)) == [trained]
    line = errors.flag_names(str(raised.value), errors.option_flags(multi30k.build_parser()))
    assert f"resume it with {flag}, or give a new run directory." in line


def test_a_cooldown_longer_than_the_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cooldown_steps=10 is more than the 4 steps"):
        quickstart.main(["--run-dir", str(tmp_path / "run"), "--steps", "4",
                         "--checkpoint-every", "2", "--cooldown-steps", "10",
                         "--train-pairs", "50", "--test-pairs", "2", "--vocab-size", "320",
                         *TINY_MODEL])


@pytest.mark.backs("docs/training.md",
                   "Killed while training, it resumes from the backup of its last window")
def test_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    """SIGKILL after the first checkpoint; the same command then finishes the run
    without repeating the windows that were saved."""
    run_dir = str(tmp_path / "run")
    command = [sys.executable, "-m", "recipes.quickstart", "--run-dir", run_dir,
               "--steps", "400", "--checkpoint-every", "20", "--train-pairs", "300",
               "--test-pairs", "4", "--no-export", *TINY_MODEL]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(command, cwd=REPOSITORY, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = os.path.join(run_dir, "checkpoints")
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(checkpoints) and len(os.listdir(checkpoints)) >= 2:
            break
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    epochs_before = [int(row["epoch"]) for row in read_log(run_dir)]
    assert epochs_before, "no window finished before the kill"

    command[command.index("--steps") + 1] = str(20 * (max(epochs_before) + 3))
    finished = subprocess.run(command, cwd=REPOSITORY, env=env, capture_output=True,
                              text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    epochs = [int(row["epoch"]) for row in read_log(run_dir)]
    resumed = epochs[len(epochs_before):]
    # The second run starts after the last backed-up window, not at epoch 0,
    # and loses at most the one window that was running at the kill.
    assert resumed[0] >= max(epochs_before) and resumed[0] > 0, epochs
    assert resumed[-1] == max(epochs_before) + 2
    assert os.path.exists(os.path.join(checkpoints, f"step-{20 * (resumed[-1] + 1):07d}.keras"))


KILL_AT = """
import os, signal, sys
from keras_transformer import evaluation
from keras_transformer import saving
from keras_transformer.export import saved_model as export
from keras_transformer_app.cli import errors
from recipes import quickstart

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

phase, argv = sys.argv[1], sys.argv[2:]
if phase in ("saved", "averaged"):
    # Killed inside the atomic save: the temporary file is written, not renamed.
    save_model, name = saving.save_model, {"saved": "model.keras",
                                            "averaged": "model_averaged.keras"}[phase]
    def save_then_die(model, path):
        if os.path.basename(path) != name:
            return save_model(model, path)
        model.save(os.path.join(os.path.dirname(path), f".partial-{os.getpid()}-{name}"))
        die()
    saving.save_model = save_then_die
elif phase == "evaluated":
    evaluation.evaluate = die
elif phase == "exported":
    export.export_saved_model = die
errors.guarded(quickstart.main, argv)
"""


@pytest.mark.once("jax")  # six short processes, which start faster under JAX (87 s, 97 s torch)
@pytest.mark.backs("docs/training.md",
                   "A run killed at any point, even with `kill -9`, finishes with the same command")
def test_a_run_killed_in_any_phase_finishes_with_the_same_command_without_training_again(
        tmp_path):
    """SIGKILL inside the final save, the averaging, the evaluation and the
    export, one after the other; each time the same command goes on from the
    phase that was cut, and the run trains its 6 steps only once."""
    run_dir = str(tmp_path / "run")
    arguments = ["--run-dir", run_dir, "--steps", "6", "--checkpoint-every", "3",
                 "--train-pairs", "200", "--test-pairs", "4", *TINY_MODEL,
                 "--export-dir", str(tmp_path / "saved_models" / "quickstart")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = []
    for phase in ("saved", "averaged", "evaluated", "exported", None):
        command = ([sys.executable, "-c", KILL_AT, phase] if phase else
                   [sys.executable, "-m", "recipes.quickstart"]) + arguments
        result = subprocess.run(command, cwd=REPOSITORY, env=env, capture_output=True,
                                text=True, timeout=300)
        if phase is None:
            assert result.returncode == 0, result.stderr[-3000:]
        else:
            assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
        # Trained once, in the first run; the later ones resume after it.
        assert ("Trained 6 steps" in result.stdout) == (phase == "saved"), result.stdout
        results = saving.read_json(os.path.join(run_dir, "results.json"))
        assert results["steps"] == 6
        assert results["phases"][:len(done)] == done
        done = results["phases"]
        assert phase not in done
    assert done == ["training", "saved", "averaged", "evaluated", "evaluated_averaged",
                    "exported"]
    assert [row["epoch"] for row in read_log(run_dir)] == ["0", "1"]
    assert os.listdir(tmp_path / "saved_models" / "quickstart") == ["1"]
    assert not [name for name in os.listdir(run_dir) if name.startswith(".partial-")]
    # Every model file of the run loads.
    for name in ("model.keras", "model_averaged.keras"):
        saving.load_model(os.path.join(run_dir, name))

    # Nothing is left to do: a further run only reports.
    again = subprocess.run([sys.executable, "-m", "recipes.quickstart"] + arguments,
                           cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Trained" not in again.stdout and "Averaged" not in again.stdout
    assert "Test, " not in again.stdout
    assert os.listdir(tmp_path / "saved_models" / "quickstart") == ["1"]


def test_average_command_writes_the_mean_model(tmp_path):
    config = kt.TransformerConfig.tiny(vocab_size=12)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    for step in (1, 2, 3):
        kt.Transformer(config).save(run_dir / "checkpoints" / f"step-{step:07d}.keras")
    average.main(["--run-dir", str(run_dir), "--last", "2"])
    assert (run_dir / "model_averaged.keras").exists()


def test_wmt14_smoke_run_with_mocked_tensorflow_datasets(tmp_path):
    """The WMT14 recipe end to end, on tensorflow-datasets' mock data (no download)."""
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=40):
        results = wmt14.main([
            "--config", "base", "--run-dir", str(tmp_path / "run"), "--steps", "2",
            "--checkpoint-every", "2", "--vocab-size", "60", "--eval-limit", "2",
            "--max-sentence-length", "64", "--tokens-per-batch", "512", *TINY_MODEL,
        ])
    assert results["recipe"] == "wmt14-base" and results["steps"] == 2
