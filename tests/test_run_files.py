"""The run directory: names, atomic writes, which model is the model, loading."""

import os
import shutil
import signal
import subprocess
import sys

import pytest
from helpers import REPOSITORY

import keras_transformer as kt
from keras_transformer import saving
from keras_transformer.tokenizers import SubwordTokenizer
from keras_transformer_app import run_files

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")


def tiny_model():
    return kt.Transformer(kt.TransformerConfig.tiny(vocab_size=40, num_layers=1))


def test_corrupted_keras_file_is_reported_as_such(tmp_path):
    model = tiny_model()
    path = tmp_path / "model.keras"
    model.save(path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated or not a .keras file"):
        saving.load_translation_model(str(path))


def test_a_run_directory_without_a_model_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="No model.keras in"):
        saving.load_translation_model(str(tmp_path))


def test_the_run_model_is_model_keras_even_beside_an_averaged_one(tmp_path):
    model = tiny_model()
    saving.save_model(model, run_files.path(str(tmp_path), run_files.AVERAGED_MODEL))
    with pytest.raises(FileNotFoundError, match="No model.keras in"):
        saving.resolve_model_path(str(tmp_path))
    saving.save_model(model, run_files.path(str(tmp_path), saving.MODEL))
    assert saving.resolve_model_path(str(tmp_path)) == os.path.join(str(tmp_path), "model.keras")
    averaged = os.path.join(str(tmp_path), "model_averaged.keras")
    assert saving.resolve_model_path(averaged) == averaged  # named, it is used


def test_a_failed_save_leaves_the_previous_model_intact(tmp_path):
    path = run_files.path(str(tmp_path), saving.MODEL)
    saving.save_model(tiny_model(), path)
    before = open(path, "rb").read()

    class Unsavable:
        def save(self, filepath):
            with open(filepath, "wb") as f:
                f.write(b"half a model")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        saving.save_model(Unsavable(), path)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["model.keras"], "no temporary file left"


def test_json_round_trips(tmp_path):
    path = str(tmp_path / "results.json")
    assert saving.read_json(path, default={"none": 1}) == {"none": 1}
    saving.write_json(path, {"bleu": 36.5})
    assert saving.read_json(path) == {"bleu": 36.5}


def test_a_write_that_fails_keeps_the_previous_file(tmp_path):
    path = str(tmp_path / "results.json")
    saving.write_json(path, {"bleu": 36.5})
    with pytest.raises(OSError, match="disk full"):
        with saving.atomic_path(path) as partial:
            with open(partial, "w") as f:
                f.write('{"bleu": ')
            raise OSError("disk full")
    assert saving.read_json(path) == {"bleu": 36.5}
    assert os.listdir(tmp_path) == ["results.json"]


def test_a_write_larger_than_the_free_space_is_refused_before_it_starts(tmp_path):
    path = str(tmp_path / "backup" / "window-000001.weights.h5")
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(OSError, match=r"No space left on device to write .*window-000001"):
        with saving.atomic_path(path, size=free + 2**30):
            raise AssertionError("the write began")
    assert os.listdir(tmp_path / "backup") == []
    with saving.atomic_path(path, size=1) as partial:
        open(partial, "w").close()
    assert os.listdir(tmp_path / "backup") == ["window-000001.weights.h5"]


KILLED_WRITER = """
import os, signal, sys
from keras_transformer import saving
with saving.atomic_path(sys.argv[1]) as partial:
    with open(partial, "w") as f:
        f.write('{"bleu": ')
        f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_leaves_the_previous_file_and_a_partial_that_is_removed_later(
        tmp_path):
    path = str(tmp_path / "results.json")
    saving.write_json(path, {"bleu": 36.5})
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, path], cwd=REPOSITORY)
    assert killed.returncode == -signal.SIGKILL
    assert saving.read_json(path) == {"bleu": 36.5}
    leftover = f".partial-{_pid_of_partial(tmp_path)}-results.json"
    assert sorted(os.listdir(tmp_path)) == sorted(["results.json", leftover])
    # A writer of this process, still running, keeps its temporary file.
    with saving.atomic_path(str(tmp_path / "model.keras")) as ours:
        open(ours, "w").close()
        assert saving.remove_partials(str(tmp_path)) == [leftover]
        assert os.path.exists(ours)
    assert sorted(os.listdir(tmp_path)) == ["model.keras", "results.json"]


def _pid_of_partial(directory):
    names = [name for name in os.listdir(directory) if name.startswith(".partial-")]
    assert len(names) == 1, names
    return int(names[0].split("-")[1])


def test_a_folder_is_written_whole_or_not_at_all(tmp_path):
    final = tmp_path / "ct2_model"
    with pytest.raises(RuntimeError, match="conversion failed"):
        with saving.atomic_path(str(final)) as partial:
            os.makedirs(partial)
            open(os.path.join(partial, "model.bin"), "w").close()
            raise RuntimeError("conversion failed")
    assert os.listdir(tmp_path) == []
    with saving.atomic_path(str(final)) as partial:
        os.makedirs(partial)
        open(os.path.join(partial, "model.bin"), "w").close()
    assert os.listdir(final) == ["model.bin"]
    with pytest.raises(FileExistsError, match="nothing was overwritten"):
        with saving.atomic_path(str(final), overwrite=False) as partial:
            os.makedirs(partial)
    assert os.listdir(tmp_path) == ["ct2_model"]


@pytest.fixture(scope="module")
def learned_tokenizers(tmp_path_factory):
    """A shared vocabulary, then separate ones, saved as a run saves them
    (learned once: per-test seeding frees the tf-text resources of
    tokenizers made before it, so each test loads them again)."""
    directory = tmp_path_factory.mktemp("runs")
    texts = ["a man rides a bike", "two dogs play in the snow", "ein mann fährt fahrrad",
             "zwei hunde spielen im schnee"] * 10
    shared = SubwordTokenizer.train(texts, vocab_size=40)
    saving.save_tokenizers(str(directory / "shared"), shared, shared)
    saving.save_tokenizers(str(directory / "separate"),
                              SubwordTokenizer.train(texts[:2] * 10, vocab_size=30),
                              SubwordTokenizer.train(texts[2:] * 10, vocab_size=35))
    return directory


def test_a_shared_vocabulary_loads_as_one_tokenizer(learned_tokenizers):
    source, target = saving.load_tokenizers(str(learned_tokenizers / "shared"))
    assert source is target
    assert os.listdir(learned_tokenizers / "shared") == ["tokenizer"]
    assert source.detokenize(source.tokenize(["two dogs play"])) == ["two dogs play"]


def test_separate_vocabularies_load_as_source_and_target(learned_tokenizers):
    source, target = saving.load_tokenizers(str(learned_tokenizers / "separate"))
    assert sorted(os.listdir(learned_tokenizers / "separate")) == ["source_tokenizer",
                                                                   "target_tokenizer"]
    assert (source.vocab_size, target.vocab_size) == (30, 35)
    assert target.detokenize(target.tokenize(["zwei hunde"])) == ["zwei hunde"]


def test_a_folder_without_tokenizers_says_what_it_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected .*tokenizer/"):
        saving.load_tokenizers(str(tmp_path))
