"""Faults users meet (not a paper section): a full disk, an output that cannot be
written, a corpus that cannot be downloaded, a vocabulary size out of range, a length
penalty that ranks nothing, a run directory given other model options, an averaged
model without its tokenizer. Each ends in one `error:` line with the right status and
leaves nothing half-written. A full disk is a small tmpfs, which only root can mount:
the tests that need one skip elsewhere.
"""

import contextlib
import json
import os
import subprocess
import sys
import uuid

import keras
import pytest
from helpers import REPOSITORY, untrained_run_dir

from keras_transformer import saving
from keras_transformer.inference.search import MAX_ALPHA, check_search_options
from keras_transformer_app import cli, run_files
from keras_transformer_app.cli import errors, options
from keras_transformer_app.training import run_options
from keras_transformer_app.training.run_options import RunOptions

# What the command line does with a fault is meant to be the same under every backend;
# the tests run in the JAX pass, where a command's process starts fastest (the module took
# 47 s there, 52 s in the PyTorch pass, AMD EPYC with AVX2), and where a full disk during
# training once crashed the process at its exit after the one line (the PyTorch and
# TensorFlow backends ended with status 1).
pytestmark = pytest.mark.once("jax")


@contextlib.contextmanager
def _mounted(path, mount_options):
    """A tmpfs mounted at `path` with `mount_options` (root only; skips otherwise)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", mount_options, "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(kilobytes)`: a folder on a tmpfs of that size."""
    with contextlib.ExitStack() as stack:
        yield lambda kilobytes: stack.enter_context(
            _mounted(tmp_path / f"disk-{uuid.uuid4().hex[:6]}", f"size={kilobytes}k"))


@pytest.fixture
def read_only(tmp_path):
    """A folder nothing can be written into: a read-only tmpfs as root, a folder
    without write permission otherwise."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    with _mounted(tmp_path / "read-only", "size=64k,ro") as folder:
        yield folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    keras.utils.set_random_seed(0)
    return untrained_run_dir(tmp_path_factory.mktemp("run"), sentences=300, vocab_size=320)


def _run(command, timeout=300, **env):
    return subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))


def _error_line(result):
    """The one `error:` line a command ended with; fails on a traceback or a crash."""
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, \
        result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), result.stderr[-3000:]
    assert sum(line.startswith("error: ") for line in lines) == 1
    return lines[-1]


def _partials(folder):
    return [os.path.join(root, name) for root, dirs, files in os.walk(folder)
            for name in dirs + files if name.startswith(saving.PARTIAL_PREFIX)]


# A full disk -------------------------------------------------------------------

WRITE_WEIGHTS = """
import sys, keras
from keras_transformer import saving
model = keras.Sequential([keras.Input((100,)), keras.layers.Dense(2000)])
try:
    with saving.atomic_path(sys.argv[1]) as partial:
        model.save_weights(partial)
except OSError as error:
    print(error.errno, error.strerror)
"""


def test_a_full_disk_during_a_weights_write_is_an_error_naming_the_file(small_disk):
    """A `.weights.h5` write (a training run's backup) that met a full disk ended the
    process in a segmentation fault, after HDF5's "Exception ignored" tracebacks."""
    disk = small_disk(256)
    target = disk / "backup" / "window-000001.weights.h5"
    result = _run([sys.executable, "-c", WRITE_WEIGHTS, str(target)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Exception ignored" not in result.stderr
    errno_, message = result.stdout.strip().split(" ", 1)
    assert int(errno_) == 28
    assert message.startswith(f"No space left on device to write {target} (")
    assert "free some space" in message
    assert os.listdir(disk / "backup") == []  # nothing half-written


@pytest.mark.slow
def test_a_training_run_on_a_full_disk_ends_in_one_line(small_disk):
    """The run's first backup meets a full disk: one line, status 1. Under JAX the
    failed HDF5 write's objects were let go while the disk was full, and the process
    then crashed at its exit; a backup now checks the room first (`atomic_path`'s
    `size`)."""
    disk = small_disk(3072)  # room for the tokenizer, not for the first backup
    result = _run([sys.executable, "-m", "recipes.quickstart", "--run-dir", str(disk / "run"),
                   "--steps", "2", "--checkpoint-every", "1", "--train-pairs", "300",
                   "--test-pairs", "20", "--no-export"])
    assert result.returncode == 1, result.stderr[-3000:]
    line = _error_line(result)
    assert line.startswith(f"error: No space left on device to write {disk / 'run'}")
    assert _partials(disk) == []


@pytest.mark.slow
def test_a_full_disk_during_export_is_not_taken_for_memory(run_dir, small_disk):
    """TensorFlow's SaveV2 reports a full disk as RESOURCE_EXHAUSTED, which the
    command line took for memory ("ask for less at once, e.g. a smaller
    --beam-size")."""
    disk = small_disk(256)
    result = _run(["keras-transformer", "export", str(run_dir), str(disk / "tiny"),
                   "--batch-sizes", "1", "--lengths", "8"], KERAS_BACKEND="tensorflow")
    assert result.returncode == 1, result.stderr[-3000:]
    line = _error_line(result)
    assert line.startswith(f"error: No space left on device to write {disk / 'tiny'}")
    assert "memory" not in line
    assert _partials(disk) == [] and not os.listdir(disk / "tiny")


class ResourceExhaustedError(Exception):
    """Named as TensorFlow's, whose SaveV2 raises it for a full disk."""


@pytest.mark.parametrize("error, status, words", [
    (ResourceExhaustedError("{{function_node SaveV2}} ... : No space left on device"), 1,
     "No space left on device"),
    (ResourceExhaustedError("OOM when allocating tensor"), 1, "out of memory"),
    (OSError(28, "No space left on device to write out/1 (0.1 MB free there): free some "
                 "space, or write to another disk"), 1, "error: No space left on device to"),
])
def test_a_full_disk_and_exhausted_memory_are_told_apart(error, status, words, capsys):
    with pytest.raises(SystemExit) as exit_info, errors.user_errors(flags={}):
        raise error
    assert exit_info.value.code == status
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert ("memory" in err) == (words == "out of memory") and "[Errno" not in err


# An output that cannot be written ----------------------------------------------

@pytest.mark.parametrize("argv", [
    ["evaluate", "{run}", "--source", "{src}", "--reference", "{src}", "--output",
     "{ro}/hyp.txt"],
    ["export", "{run}", "{ro}/base"],
    ["average", "{run}/model.keras", "--output", "{ro}/averaged.keras"],
    ["plot", "positions", "--output", "{ro}/plots/positions.png"],
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(argv, run_dir, read_only,
                                                                     tmp_path, capsys):
    """`evaluate --output` translated every line, and `export` exported for 12 s,
    before they failed on a read-only folder, naming a hidden `.partial-` path."""
    source = tmp_path / "test.src"
    source.write_text("kave tomi\n")
    words = [word.format(run=run_dir, src=source, ro=read_only) for word in argv]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(words)
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    reason = "on a read-only file system" if os.geteuid() == 0 else "not writable by this user"
    assert f"cannot be written: {str(read_only)!r} is {reason}" in line, line


def test_a_recipes_run_directory_that_cannot_be_written_is_refused_at_once(read_only,
                                                                           capsys):
    from recipes import quickstart

    with pytest.raises(SystemExit) as exit_info:
        quickstart.main(["--run-dir", str(read_only / "run")])
    assert exit_info.value.code == 2
    assert f"argument --run-dir: '{read_only / 'run'}' cannot be written" in \
        capsys.readouterr().err


def test_a_failed_write_names_the_users_path_not_the_temporary_one(read_only):
    with pytest.raises(OSError) as raised:
        saving.write_text(read_only / "hyp.txt", "a\n")
    assert str(raised.value).endswith(f"Cannot write {read_only / 'hyp.txt'}: "
                                      + raised.value.strerror.split(": ", 1)[1])
    assert saving.PARTIAL_PREFIX not in str(raised.value)


# Options out of range -------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["translate", "run", "hallo", "--alpha", "inf"],
    ["translate", "run", "hallo", "--alpha", "1e308"],
    ["translate", "run", "hallo", "--alpha", "nan"],
    ["evaluate", "run", "--source", "s", "--reference", "r", "--alpha", "11"],
    ["export", "run", "out", "--alpha", "inf"],
])
def test_a_length_penalty_that_would_rank_nothing_is_refused(argv, capsys):
    """With α = inf or 1e308 every n-best score was -0.0000 and the ranking arbitrary."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert f"argument --alpha: must be a number from 0 to {MAX_ALPHA:g}" in \
        capsys.readouterr().err


def test_the_recipes_tune_alpha_refuses_an_infinite_length_penalty(capsys):
    from recipes import quickstart

    with pytest.raises(SystemExit) as exit_info:
        quickstart.main(["--tune-alpha", "0.6,inf"])
    assert exit_info.value.code == 2
    assert "argument --tune-alpha: must be comma-separated numbers from 0 to 10" in \
        capsys.readouterr().err


@pytest.mark.parametrize("alpha", [float("inf"), 1e308, MAX_ALPHA + 0.5])
def test_the_library_refuses_the_same_length_penalties(alpha):
    assert options.MAX_ALPHA == MAX_ALPHA  # the parser's copy
    with pytest.raises(ValueError, match="overflows float32"):
        check_search_options(alpha=alpha)
    check_search_options(alpha=MAX_ALPHA)
    check_search_options(alpha=50.0, max_output_length=3)  # finite at that length
    with pytest.raises(ValueError, match="overflows float32"):
        check_search_options(alpha=50.0, max_output_length=100)


@pytest.mark.slow
@pytest.mark.parametrize("argv, env, words", [
    (["recipes.multi30k", "--steps", "1"],
     {"KERAS_TRANSFORMER_DATA_MIRROR": "http://127.0.0.1:9"},
     "error: Cannot download http://127.0.0.1:9/"),
    (["recipes.quickstart", "--vocab-size", "5", "--train-pairs", "200", "--test-pairs", "10"],
     {}, "error: --vocab-size 5 is fewer than SentencePiece needs for these 400 sentences: "
         "at least "),
], ids=["no network", "vocab-size 5"])
def test_a_recipes_data_and_vocabulary_faults_are_one_line(argv, env, words, tmp_path):
    """Without network and --data-dir, and with --vocab-size 5, a recipe printed 86
    lines: a traceback (and SentencePiece's log)."""
    result = _run([sys.executable, "-m", *argv, "--run-dir", str(tmp_path / "run")],
                  KERAS_HOME=str(tmp_path / "keras"), **env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert _error_line(result).startswith(words)
    assert "trainer_interface" not in result.stderr


# A run directory given other model options -----------------------------------------

def test_a_run_directory_refuses_other_model_options_in_one_line(tmp_path):
    """A finished run said "Nothing left to do" to --d-model 64, and an unfinished one
    failed on its backup with 2.4 KB of Keras's variables."""
    import keras_transformer as kt

    def start(**changes):
        config = kt.TransformerConfig.tiny(vocab_size=100, **changes.pop("config", {}))
        changes.setdefault("steps", 10)
        run_options.check_model_options(RunOptions(run_dir=str(tmp_path), **changes), config)

    start(vocab_size=320)
    recorded = saving.read_json(run_files.path(tmp_path, run_files.MODEL_OPTIONS))
    assert recorded["d_model"] == kt.TransformerConfig.tiny(vocab_size=100).d_model
    start(vocab_size=320, steps=99, tokens_per_batch=512)  # not the model's: allowed
    with pytest.raises(ValueError) as raised:
        start(vocab_size=200, config={"d_model": 64})
    tiny = kt.TransformerConfig.tiny(vocab_size=100)
    flags = {"d_model": "--d-model", "vocab_size": "--vocab-size", "run_dir": "--run-dir"}
    assert errors.flag_names(str(raised.value), flags) == (
        f"The run directory {tmp_path} holds a model of --d-model {tiny.d_model}, "
        "--vocab-size 320; this command asks for --d-model 64, --vocab-size 200. Give "
        "another --run-dir for a new model, or this run's own options to go on with it.")


def test_a_run_started_before_the_record_is_neither_checked_nor_recorded(tmp_path):
    import keras_transformer as kt

    (tmp_path / run_files.RESULTS).write_text(json.dumps({"phases": ["training"]}))
    run_options.check_model_options(RunOptions(run_dir=str(tmp_path), steps=10, vocab_size=320),
                             kt.TransformerConfig.tiny(vocab_size=100))
    assert not (tmp_path / run_files.MODEL_OPTIONS).exists()


# An averaged model and its tokenizer -----------------------------------------------

def test_an_averaged_model_elsewhere_gets_its_tokenizer_and_translates(run_dir, tmp_path,
                                                                       capsys):
    """The README's `average ... --output last3.keras` wrote a model that `translate`
    could not use: there was no tokenizer beside it."""
    output = tmp_path / "elsewhere" / "last.keras"
    cli.main(["average", str(run_dir / "model.keras"), "--output", str(output)])
    assert capsys.readouterr().out.splitlines() == [
        f"Averaged 1 checkpoint into {output}", f"Wrote the tokenizer of {run_dir} beside it"]
    cli.main(["translate", str(output), "kave tomi", "--beam-size", "1"])
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_an_averaged_model_is_not_written_beside_another_models_tokenizer(run_dir, tmp_path,
                                                                          capsys):
    other = untrained_run_dir(tmp_path, sentences=100, vocab_size=200)
    output = other / "averaged.keras"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["average", str(run_dir / "model.keras"), "--output", str(output)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {other} holds the tokenizer of another model: write the averaged model "
        "into another folder (--output).")
    assert not output.exists()
