"""Bad input across the API and the command line: each case gives a correct
result or an error that says what was wrong and how to fix it; the command
line prints one line and exits non-zero. (The HTTP server's bad requests are
in test_export.py.)"""

import gzip
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import CharTokenizer

import keras_transformer as kt
from keras_transformer import cli
from keras_transformer.inference import Translator, beam_search, greedy_search
from keras_transformer.inference.loading import load_translation_model
from keras_transformer.training.data import read_lines, read_parallel
from keras_transformer.training.tokenizers import SubwordTokenizer

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def model():
    config = kt.TransformerConfig.tiny(vocab_size=40, num_layers=1, max_length=16)
    return kt.Transformer(config)


# Invalid configurations: the error names the field, the value and the rule.
@pytest.mark.parametrize("overrides, message", [
    (dict(vocab_size=0), "vocab_size=0 must be a positive integer"),
    (dict(vocab_size=40, d_model=30, num_heads=4), "not divisible by num_heads"),
    (dict(vocab_size=40, dropout_rate=1.5), "dropout_rate=1.5 must be a number in [0, 1)"),
    (dict(vocab_size=40, label_smoothing=1.0), "label_smoothing=1.0"),
    (dict(vocab_size=40, position_encoding="rope"), "must be one of ('sinusoidal', 'learned')"),
    (dict(vocab_size=40, norm_position="middle"), "must be one of ('post', 'pre')"),
    (dict(vocab_size=40, num_layers=-2), "num_layers=-2"),
    (dict(vocab_size=40, max_length=0), "max_length=0"),
])
def test_invalid_configs_say_which_field_is_wrong(overrides, message):
    with pytest.raises(ValueError) as error:
        kt.TransformerConfig.tiny(**overrides)
    assert message in str(error.value)


def test_unknown_config_fields_are_listed_with_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown TransformerConfig fields \['heads'\]"):
        kt.TransformerConfig.from_dict({"vocab_size": 10, "heads": 3})


# Token ids: out of range, wrong shapes, empty batches.
@pytest.mark.parametrize("source_ids, message", [
    (np.array([[5, 40, 3]]), "outside the source vocabulary"),
    (np.array([[5, -1, 3]]), "outside the source vocabulary"),
    (np.array([5, 6, 3]), "add a batch axis"),
    ([[5, 6, 3], [7, 3]], "ragged list"),
    (np.array([[0.5, 3.0]]), "matrix of int ids"),
])
def test_bad_token_ids_are_rejected_before_decoding(model, source_ids, message):
    with pytest.raises(ValueError, match=message):
        beam_search(model, source_ids, bos_id=1, eos_id=2)


@pytest.mark.parametrize("options, message", [
    (dict(beam_size=0), "beam_size=0 must be a positive integer"),
    (dict(alpha=-0.5), "alpha=-0.5 must be a number >= 0"),
    (dict(max_length=0), "max_length=0 must be a positive integer"),
    (dict(eos_id=0), "equals the padding id"),
    (dict(bos_id=99), "bos_id=99 must be an integer id of the target vocabulary"),
])
def test_bad_search_options_say_what_to_pass(model, options, message):
    arguments = dict(bos_id=1, eos_id=2)
    arguments.update(options)
    with pytest.raises(ValueError, match=message):
        beam_search(model, np.array([[5, 6, 2]]), **arguments)


@pytest.mark.parametrize("side, ids", [("source", [[5, 40]]), ("source", [[-1, 5]]),
                                      ("target", [[1, 99]])])
def test_the_model_rejects_numpy_ids_outside_the_vocabulary(model, side, ids):
    inputs = {"source": np.array([[5, 6]]), "target": np.array([[1, 7]])}
    inputs[side] = np.array(ids)
    with pytest.raises(ValueError, match=f"{side} holds ids from .* outside the vocabulary"):
        model(inputs)


def test_an_empty_batch_decodes_to_an_empty_result(model):
    ids, scores = greedy_search(model, np.zeros((0, 4), "int32"), bos_id=1, eos_id=2)
    assert ids.shape == (0, 0) and scores.shape == (0,)


def test_all_padding_rows_give_finite_outputs(model):
    source = np.array([[0, 0, 0, 0], [5, 6, 2, 0]], "int32")
    logits = model({"source": source, "target": np.array([[1, 0, 0], [1, 7, 0]], "int32")})
    assert np.isfinite(keras.ops.convert_to_numpy(logits)).all()


def test_decoding_a_model_with_d_k_unequal_d_v_is_refused_clearly():
    config = kt.TransformerConfig.tiny(vocab_size=CharTokenizer.vocab_size, num_layers=1,
                                       key_dim=8, value_dim=16)
    translator = Translator(kt.Transformer(config), CharTokenizer())
    for beam_size in (1, 2):
        with pytest.raises(ValueError, match="needs key_dim == value_dim, got 8 and 16"):
            translator.translate(["abc"], beam_size=beam_size)


# Text: strings where lists are expected, bytes, empty and over-long sentences.
@pytest.fixture
def translator():
    config = kt.TransformerConfig.tiny(vocab_size=CharTokenizer.vocab_size, num_layers=1,
                                       max_length=16)
    return Translator(kt.Transformer(config), CharTokenizer())


def test_one_string_instead_of_a_list_says_to_wrap_it(translator):
    with pytest.raises(TypeError, match="wrap it in a list"):
        translator.translate("abc")


def test_bytes_instead_of_text_are_rejected(translator):
    with pytest.raises(TypeError, match=r"sentences\[1\] is a bytes, not a str"):
        translator.translate(["abc", b"\xff\xfe"])


def test_empty_sentences_and_empty_batches_translate_to_empty_results(translator):
    assert translator.translate([]) == []
    assert translator.translate(["", "ab"])[0] == ""


def test_over_long_sentences_name_the_limit(translator):
    with pytest.raises(ValueError, match=r"the limit is max_length=16"):
        translator.translate(["a" * 40])


# Files: missing or corrupted data, vocabularies and models.
def test_non_utf8_data_names_the_file(tmp_path):
    path = tmp_path / "train.de"
    path.write_bytes(b"gut\n\xff\xfe kaputt\n")
    with pytest.raises(ValueError, match=r"Cannot read .*train.de.* as UTF-8 text"):
        read_lines(str(path))


def test_corrupted_gzip_data_names_the_file(tmp_path):
    path = tmp_path / "train.en.gz"
    path.write_bytes(gzip.compress(b"one line\n")[:12])
    with pytest.raises(ValueError, match=r"Cannot read .*train.en.gz"):
        read_lines(str(path))


def test_misaligned_parallel_files_give_both_line_counts(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "b.txt").write_text("eins\n")
    with pytest.raises(ValueError, match="has 2 lines but .* has 1"):
        read_parallel(str(tmp_path / "a.txt"), str(tmp_path / "b.txt"))


def test_missing_vocabulary_says_where_it_should_be(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected tokenizer.json"):
        SubwordTokenizer.load(str(tmp_path))


def test_corrupted_vocabulary_is_reported_as_such(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"kind": "sentencepiece", "vocab_size": 300}')
    (tmp_path / "sentencepiece.model").write_bytes(b"not a protobuf")
    with pytest.raises(ValueError, match="missing or corrupted"):
        SubwordTokenizer.load(str(tmp_path))


def test_corrupted_keras_file_is_reported_as_such(tmp_path, model):
    path = tmp_path / "model.keras"
    model.save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated or not a .keras file"):
        load_translation_model(str(path))


def test_a_run_directory_without_a_model_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="No model.keras in"):
        load_translation_model(str(tmp_path))


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
    [sys.executable, "-m", "keras_transformer.export", "run", "out"],
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
