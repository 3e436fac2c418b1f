"""Crafted model files (issue 19): every loader refuses them, and none of their code runs.

A `.keras` file is a zip of config.json, metadata.json and model.weights.h5, and its config
names what Keras builds. Each test lays out a run directory as a recipe does (the tokenizer
saved with `saving.save_tokenizers`, the model as `model.keras`) whose model is crafted to
run code when loaded; running it writes a side-effect file, which must not exist afterwards:

* `lambda`: a Lambda layer holding Python bytecode, saved by Keras itself
  (`keras.saving.save_model`). Keras's safe mode refuses it; with safe mode off it runs while
  the model is rebuilt (`test_the_lambda_file_runs_its_code_without_safe_mode`).
* `module_class`, `module_function`: our tiny Transformer's file, or a small Sequential one,
  with the model's class or an activation named from a module that writes the file when imported
  (`test_the_payload_module_runs_its_code_when_imported`). Keras before 3.9 imported any module
  a config named (CVE-2025-1550); it now imports none outside its own packages, in safe mode or
  not, which is one reason for `keras>=3.14`.

The loaders: `keras-transformer translate`, `evaluate`, `plot attention`, `average` and
`export`, and the library calls behind them. `serve` reads only SavedModels
(`saved_model.load_saved_model`) and is given the crafted `.keras` file to show that it does not
open it. Legacy `.h5` files are refused by their name, before Keras reads them.
"""

import importlib
import json
import os
import subprocess
import sys
import uuid
import warnings
import zipfile

import keras
import pytest
from helpers import REPOSITORY, tiny_model

from keras_transformer import saving
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer.tokenizers import SubwordTokenizer
from keras_transformer_app import cli, run_files
from keras_transformer_app.training.averaging import average_checkpoints

# Keras refuses a crafted file while it reads its config, before any backend builds a layer;
# the TensorFlow pass also has the in-process exports.
pytestmark = pytest.mark.once("tensorflow")

# What a refusal says; Keras's advice to turn safe mode off must not reach the user.
REFUSED = "contains code that Keras's safe mode refuses to run"
NOT_OURS = "It is not a model that keras-transformer's recipes write"
NOT_KERAS_FILE = "is not a .keras file: keras-transformer loads only Keras 3 .keras files"

# An export under JAX or PyTorch loads the file in a TensorFlow-backend process (the
# command line runs itself again under TensorFlow):
# `test_an_export_from_another_backend_refuses_in_its_tensorflow_process` covers it there.
tensorflow_only = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="in-process export needs the tensorflow backend; other backends export in a "
           "tensorflow process, tested once below")


@pytest.fixture(scope="module")
def tokenizer():
    keras.utils.set_random_seed(0)
    corpus = synthetic_translation(300, seed=0)
    return SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=320)


@pytest.fixture(scope="module")
def transformer_file(tmp_path_factory, tokenizer):
    """A `model.keras` as the recipes write it: the base of the `module_class` file."""
    path = str(tmp_path_factory.mktemp("base") / saving.MODEL)
    saving.save_model(tiny_model(vocab_size=tokenizer.vocab_size, seed=0, num_layers=1), path)
    return path


def rewrite_config(source, target, edit):
    """Copies the `.keras` zip `source` to `target`, with `edit(config)` applied to its
    config.json."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as crafted:
        for item in original.infolist():
            data = original.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                edit(config)
                data = json.dumps(config)
            crafted.writestr(item, data)


def write_payload_module(directory, side_effect):
    """A module in `directory` that writes `side_effect` when imported; returns its name
    (new for every test, so that no earlier import has cached it)."""
    name = f"kt_payload_{uuid.uuid4().hex[:12]}"
    with open(os.path.join(directory, f"{name}.py"), "w") as f:
        f.write(f"import pathlib\npathlib.Path({side_effect!r}).write_text('imported')\n\n\n"
                "def payload(x):\n    return x\n\n\nclass Transformer:\n    pass\n")
    return name


def write_lambda_model(path, side_effect):
    """A model whose Lambda layer writes `side_effect` whenever it is called, saved by
    Keras: the file holds the lambda's bytecode."""
    # The path is a constant of the code: Keras serializes a lambda's code, and reloads
    # its defaults and closure badly.
    write = eval(f"lambda x: (open({side_effect!r}, 'w').write('ran'), x)[1]")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(write)])
    keras.saving.save_model(model, path)
    os.remove(side_effect)  # building the model called it once


@pytest.fixture(params=["lambda", "module_class", "module_function"])
def crafted(request, tmp_path, tokenizer, transformer_file, monkeypatch):
    """(run directory, its crafted model.keras, the side-effect file) for each kind of
    crafted file; the payload module, if any, is importable (on `sys.path` and
    `PYTHONPATH`), so only refusing to import it keeps it from running."""
    run = tmp_path / "run"
    saving.save_tokenizers(str(run), tokenizer)
    model_path = run_files.path(str(run), saving.MODEL)
    side_effect = str(tmp_path / "side_effect.txt")
    if request.param == "lambda":
        write_lambda_model(model_path, side_effect)
    else:
        payload_dir = tmp_path / "payload"
        payload_dir.mkdir()
        name = write_payload_module(str(payload_dir), side_effect)
        monkeypatch.syspath_prepend(str(payload_dir))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            [str(payload_dir)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        if request.param == "module_class":
            def edit(config):
                config.update(module=name, registered_name=None)  # class_name: Transformer
            rewrite_config(transformer_file, model_path, edit)
        else:
            base = str(tmp_path / "dense.keras")
            keras.saving.save_model(
                keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="relu")]),
                base)

            def edit(config):
                dense = config["config"]["layers"][1]
                dense["config"]["activation"] = {"module": name, "class_name": "function",
                                                 "config": "payload",
                                                 "registered_name": "payload"}
            rewrite_config(base, model_path, edit)
    assert not os.path.exists(side_effect)
    return run, model_path, side_effect


def command_line_error(argv, capsys):
    """Runs `cli.main(argv)`, expects exit status 2, returns the one stderr line."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def translate(run, model_path, tmp_path, capsys):
    return command_line_error(["translate", str(run), "kave tomi"], capsys)


def evaluate(run, model_path, tmp_path, capsys):
    corpus = synthetic_translation(2, seed=9)
    (tmp_path / "test.src").write_text("\n".join(corpus.sources) + "\n")
    (tmp_path / "test.ref").write_text("\n".join(corpus.targets) + "\n")
    return command_line_error(["evaluate", model_path, "--source", str(tmp_path / "test.src"),
                               "--reference", str(tmp_path / "test.ref")], capsys)


def plot_attention(run, model_path, tmp_path, capsys):
    return command_line_error(["plot", "attention", str(run), "kave tomi", "--output-dir",
                               str(tmp_path / "plots")], capsys)


def average_command(run, model_path, tmp_path, capsys):
    return command_line_error(["average", model_path, "--output",
                               str(tmp_path / "averaged.keras")], capsys)


def export_command(run, model_path, tmp_path, capsys):
    return command_line_error(["export", str(run), str(tmp_path / "saved_models"), "--quiet"],
                              capsys)


def load_translation_model(run, model_path, tmp_path, capsys):
    with pytest.raises(ValueError) as error:
        saving.load_translation_model(model_path)
    return str(error.value)


def average_library(run, model_path, tmp_path, capsys):
    with pytest.raises(ValueError) as error:
        average_checkpoints([model_path], str(tmp_path / "averaged.keras"))
    return str(error.value)


def export_library(run, model_path, tmp_path, capsys):
    from keras_transformer.export.saved_model import export_saved_model

    with pytest.raises(ValueError) as error:
        export_saved_model(model_path, str(tmp_path / "saved_models"), verbose=False)
    return str(error.value)


@pytest.mark.parametrize("loader", [
    translate, evaluate, plot_attention, average_command, load_translation_model,
    average_library,
    pytest.param(export_command, marks=tensorflow_only),
    pytest.param(export_library, marks=tensorflow_only),
])
@pytest.mark.backs("docs/serving.md", "file contains code that is refused")
def test_every_loader_refuses_a_crafted_file_and_runs_none_of_its_code(
        loader, crafted, tmp_path, capsys):
    run, model_path, side_effect = crafted
    try:
        message = loader(run, model_path, tmp_path, capsys)
    finally:  # before the message: a file that loaded fails here, naming why
        assert not os.path.exists(side_effect), "the crafted file's code ran"
    assert REFUSED in message and NOT_OURS in message, message
    assert repr(model_path) in message
    assert "safe_mode=False" not in message and "enable_unsafe" not in message
    # Nothing was written in its place.
    for output in ("averaged.keras", "saved_models/1"):
        assert not (tmp_path / output).exists()


@pytest.mark.once("torch")  # another backend than TensorFlow's; which one does not matter
def test_an_export_from_another_backend_refuses_in_its_tensorflow_process(tmp_path, tokenizer):
    run = tmp_path / "run"
    saving.save_tokenizers(str(run), tokenizer)
    side_effect = str(tmp_path / "side_effect.txt")
    write_lambda_model(run_files.path(str(run), saving.MODEL), side_effect)
    try:
        # The command line runs itself again under TensorFlow, which refuses in one line.
        result = subprocess.run(
            [sys.executable, "-m", "keras_transformer_app", "export", str(run),
             str(tmp_path / "saved_models")], capture_output=True, text=True, timeout=300,
            cwd=REPOSITORY)
    finally:
        assert not os.path.exists(side_effect), "the crafted file's code ran"
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert REFUSED in lines[0] and NOT_OURS in lines[0], lines[0]
    assert not (tmp_path / "saved_models" / "1").exists()


def test_serving_does_not_open_a_keras_file(crafted, capsys):
    run, model_path, side_effect = crafted
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", model_path, "--port", "0"])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(f"argument saved_model: {model_path!r} is a file, not a folder")
    assert not os.path.exists(side_effect)


# The controls: the crafted files are dangerous, so the tests above can fail.

def test_the_lambda_file_runs_its_code_without_safe_mode(tmp_path):
    model_path, side_effect = str(tmp_path / "model.keras"), str(tmp_path / "side_effect.txt")
    write_lambda_model(model_path, side_effect)
    keras.saving.load_model(model_path, compile=False, safe_mode=False)
    assert os.path.exists(side_effect)


def test_the_payload_module_runs_its_code_when_imported(tmp_path, monkeypatch):
    side_effect = str(tmp_path / "side_effect.txt")
    name = write_payload_module(str(tmp_path), side_effect)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)
    assert os.path.exists(side_effect)


# Only .keras files.

@pytest.fixture
def legacy_run(tmp_path, tokenizer):
    """A run directory whose model is a legacy HDF5 file, with the Lambda payload."""
    run = tmp_path / "run"
    saving.save_tokenizers(str(run), tokenizer)
    side_effect = str(tmp_path / "side_effect.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras says that .h5 is a legacy format
        write_lambda_model(str(run / "model.h5"), side_effect)
    return run, str(run / "model.h5"), side_effect


def export_into(path, tmp_path):
    from keras_transformer.export.saved_model import export_saved_model

    # The check comes first, whatever the backend.
    export_saved_model(path, str(tmp_path / "saved_models"), verbose=False)


@pytest.mark.parametrize("loader", [
    lambda path, tmp_path: saving.load_model(path),
    lambda path, tmp_path: saving.load_translation_model(path),
    lambda path, tmp_path: average_checkpoints([path]),
    export_into,
], ids=["load_model", "load_translation_model", "average_checkpoints", "export_saved_model"])
def test_an_h5_file_is_refused_by_its_name(loader, legacy_run, tmp_path):
    run, path, side_effect = legacy_run
    with pytest.raises(ValueError, match=NOT_KERAS_FILE) as error:
        loader(path, tmp_path)
    assert "Pass a .keras model or a run directory" in str(error.value)
    assert not os.path.exists(side_effect)
    assert not (tmp_path / "saved_models" / "1").exists()


def test_the_command_line_refuses_an_h5_file(legacy_run, capsys):
    run, path, side_effect = legacy_run
    message = command_line_error(["translate", path, "kave tomi"], capsys)
    assert message == (
        f"error: {path!r} {NOT_KERAS_FILE} (no legacy .h5 or other formats). Pass a .keras "
        "model or a run directory; convert a model you trust with "
        "keras.saving.load_model(PATH).save('NAME.keras').\n")
    assert not os.path.exists(side_effect)


def test_an_h5_file_named_keras_is_not_read_as_h5(legacy_run):
    run, path, side_effect = legacy_run
    renamed = str(run / "model.keras")
    os.rename(path, renamed)
    with pytest.raises(ValueError, match="truncated or not a .keras file"):
        saving.load_translation_model(str(run))
    assert not os.path.exists(side_effect)


@pytest.mark.backs("docs/serving.md",
                   "folders and remote paths are refused before Keras opens them")
def test_folders_and_remote_paths_are_not_model_files(tmp_path):
    folder = tmp_path / "model.keras"
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # Keras would read this folder as a model
    with pytest.raises(ValueError, match="is a folder, not a .keras file"):
        saving.load_model(str(folder))
    with pytest.raises(FileNotFoundError, match="No model at 'hf://someone/model.keras'"):
        saving.load_model("hf://someone/model.keras")  # never downloaded
