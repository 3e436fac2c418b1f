"""The run directory: names, atomic writes, which model is the model, loading."""

import os

import pytest

import keras_transformer as kt
from keras_transformer import run_dir


def tiny_model():
    return kt.Transformer(kt.TransformerConfig.tiny(vocab_size=40, num_layers=1))


def test_corrupted_keras_file_is_reported_as_such(tmp_path):
    model = tiny_model()
    path = tmp_path / "model.keras"
    model.save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated or not a .keras file"):
        run_dir.load_translation_model(str(path))


def test_a_run_directory_without_a_model_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="No model.keras in"):
        run_dir.load_translation_model(str(tmp_path))




def test_the_run_model_is_model_keras_even_beside_an_averaged_one(tmp_path):
    model = tiny_model()
    run_dir.save_model(model, run_dir.path(str(tmp_path), run_dir.AVERAGED_MODEL))
    with pytest.raises(FileNotFoundError, match="No model.keras in"):
        run_dir.resolve_model_path(str(tmp_path))
    run_dir.save_model(model, run_dir.path(str(tmp_path), run_dir.MODEL))
    assert run_dir.resolve_model_path(str(tmp_path)) == os.path.join(str(tmp_path), "model.keras")
    averaged = os.path.join(str(tmp_path), "model_averaged.keras")
    assert run_dir.resolve_model_path(averaged) == averaged  # named, it is used


def test_a_failed_save_leaves_the_previous_model_intact(tmp_path):
    path = run_dir.path(str(tmp_path), run_dir.MODEL)
    run_dir.save_model(tiny_model(), path)
    before = open(path, "rb").read()

    class Unsavable:
        def save(self, filepath):
            with open(filepath, "wb") as f:
                f.write(b"half a model")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run_dir.save_model(Unsavable(), path)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["model.keras"], "no temporary file left"


def test_json_is_written_atomically_and_read_back(tmp_path):
    path = str(tmp_path / "results.json")
    assert run_dir.read_json(path, default={"none": 1}) == {"none": 1}
    run_dir.write_json(path, {"bleu": 36.5})
    assert run_dir.read_json(path) == {"bleu": 36.5}
    assert os.listdir(tmp_path) == ["results.json"]


def test_tokenizers_are_saved_where_they_are_loaded(tmp_path):
    from keras_transformer.training.toy_tasks import ToyVocabulary

    saved = []

    class Recorder(ToyVocabulary):
        def save(self, directory):
            saved.append(os.path.basename(directory))

    shared = Recorder(8)
    run_dir.save_tokenizers(str(tmp_path), shared, shared)
    run_dir.save_tokenizers(str(tmp_path), Recorder(8), Recorder(9))
    assert saved == ["tokenizer", "source_tokenizer", "target_tokenizer"]
    with pytest.raises(FileNotFoundError, match="expected .*tokenizer/"):
        run_dir.load_tokenizers(str(tmp_path))
