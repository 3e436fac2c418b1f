"""Tests of the keras-transformer command line."""

import os
import subprocess
import sys

import keras
import pytest

import keras_transformer as kt
from keras_transformer import cli
from keras_transformer.training.data import synthetic_translation
from keras_transformer.training.tokenizers import SubwordTokenizer

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as a recipe leaves it: model.keras with tokenizer/ beside it."""
    corpus = synthetic_translation(300, seed=0)
    tokenizer = SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=320)
    tokenizer.save(str(tmp_path / "tokenizer"))
    config = kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, num_layers=1)
    kt.Transformer(config).save(tmp_path / "model.keras")
    return tmp_path


def test_translate_prints_one_line_per_sentence(run_dir, capsys):
    cli.main(["translate", str(run_dir), "kave tomi", "sipe", "--beam-size", "2"])
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_evaluate_writes_hypotheses_and_reports_bleu(run_dir, tmp_path, capsys):
    corpus = synthetic_translation(3, seed=9)
    (tmp_path / "test.src").write_text("\n".join(corpus.sources) + "\n")
    (tmp_path / "test.ref").write_text("\n".join(corpus.targets) + "\n")
    output = tmp_path / "hyp.txt"
    cli.main(["evaluate", str(run_dir / "model.keras"), "--source", str(tmp_path / "test.src"),
              "--reference", str(tmp_path / "test.ref"), "--output", str(output),
              "--beam-size", "1"])
    assert "BLEU" in capsys.readouterr().out
    assert len(output.read_text().splitlines()) == 3


def test_plot_commands_write_pngs(run_dir, tmp_path):
    cli.main(["plot", "positions", "--output", str(tmp_path / "pe.png"), "--length", "50",
              "--d-model", "64"])
    cli.main(["plot", "schedule", "--output", str(tmp_path / "lr.png")])
    cli.main(["plot", "attention", str(run_dir), "kave tomi tozu", "--output-dir",
              str(tmp_path / "attention"), "--beam-size", "1"])
    for path in (tmp_path / "pe.png", tmp_path / "lr.png",
                 tmp_path / "attention" / "attention_cross.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_user_mistakes_print_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", str(tmp_path / "missing.keras"), "hello"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: No model at {str(tmp_path / 'missing.keras')!r}."
    broken = tmp_path / "broken.keras"
    broken.write_bytes(b"not a zip")
    os.makedirs(tmp_path / "tokenizer")
    with pytest.raises(SystemExit):
        cli.main(["translate", str(broken), "hello"])
    assert "Cannot load" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["average"])
    assert exit_info.value.code == 2


# The command line: one line on stderr, non-zero exit, no traceback.
@pytest.mark.parametrize("argv, message", [
    (["translate", "no/such/run", "hallo"], "error: No model at 'no/such/run'."),
    (["evaluate", "no/such/run", "--source", "a.de", "--reference", "b"],
     "error: No such file: 'a.de'."),
    (["average", "no-such-checkpoint.keras"], "error: "),
    (["serve", "no/such/dir"], "error: No SavedModel directory"),
])
def test_command_line_mistakes_print_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1


def test_command_line_rejects_bad_numbers(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", "run", "hallo", "--beam-size", "0"])
    assert exit_info.value.code == 2
    assert "must be a positive integer" in capsys.readouterr().err


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="about the environment, not the backend: runs in the tensorflow pass")
@pytest.mark.parametrize("command", [
    ["keras-transformer", "translate", "run", "hallo"],
    [sys.executable, "-m", "keras_transformer.cli", "export", "run", "out"],
    [sys.executable, "-m", "recipes.quickstart", "--steps", "1"],
])
def test_an_unknown_backend_name_is_one_line_not_a_traceback(command):
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True,
                            env=dict(os.environ, KERAS_BACKEND="tensorflw"), timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: KERAS_BACKEND='tensorflw' is not a backend keras-transformer runs on: set it "
        "to one of tensorflow, jax, torch (or unset it for Keras's default)."
    ]
