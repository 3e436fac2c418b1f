"""A user's mistakes on every command line: `keras-transformer`'s commands and the
recipes each end with one `error:` line (or argparse's usage and error line) and exit
status 2, with no traceback and no file left half-written. Most cases fail before
anything is trained or translated; the one subprocess, the issue's smoke run, runs
in the torch pass."""

import gzip
import os
import signal
import subprocess
import sys

import pytest
from helpers import REPOSITORY, shared_data, untrained_run_dir

from keras_transformer_app import cli
from keras_transformer_app.cli import errors
from keras_transformer_app.training.distribution import PeerLostError
from keras_transformer_app.training.fit import NonFiniteLossError
from recipes import anki, multi30k, quickstart, table3

# The command lines' handling of a mistake does not depend on the backend (the export's
# TensorFlow process, which only JAX and torch start, has a test of its own in the JAX pass).
pytestmark = pytest.mark.once("torch")

TINY_MODEL = ["--preset", "tiny", "--d-model", "32", "--d-ff", "64", "--num-heads", "2",
              "--num-layers", "1", "--beam-size", "2", "--verbose", "0"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as a recipe leaves it: model.keras with tokenizer/ beside it."""
    return untrained_run_dir(tmp_path_factory.mktemp("run"), sentences=200, vocab_size=200)


@pytest.fixture
def files(tmp_path):
    """Input files a user might pass, good and bad."""
    (tmp_path / "test.src").write_text("kave tomi\nsipe\n")
    (tmp_path / "test.ref").write_text("a b .\nc .\n")
    (tmp_path / "short.ref").write_text("a b .\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.src").write_bytes(b"kave tomi\nka\xe9ve\n")
    (tmp_path / "not_a_model.keras").write_bytes(b"not a zip")
    (tmp_path / "a_file").write_text("in the way")
    (tmp_path / "no_tabs.txt").write_text("Hello.\nGood morning.\n")
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    return tmp_path


def files_in(folder):
    """Every file under `folder`, relative, with its size and modification time."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = (os.path.getsize(path),
                                                    os.path.getmtime(path))
    return found


def fails_with(main, argv, capsys, usage=False):
    """Runs `main(argv)` as the command line does; returns its stderr, after checking
    status 2 and one `error:` line (argparse's usage before it with `usage`)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    if usage:
        assert lines[0].startswith("usage: ") and ": error: " in lines[-1], err
    else:
        assert len(lines) == 1 and lines[0].startswith("error: "), err
    return err


def keras_transformer(argv):
    cli.main(argv)


def recipe(module):
    """A recipe's main as `python -m recipes.NAME` runs it."""
    return lambda argv: errors.guarded(module.main, argv)


# (argv with {dir} for the files' folder and {run} for the run directory, what stderr
# holds, whether argparse's usage comes with it).
COMMANDS = [
    (["translate", "{dir}/missing.keras", "hello"], "argument model: ", True),
    (["translate", "{dir}/not_a_model.keras", "hello"], "Cannot load", False),
    (["translate", "{run}", "--n-best", "5"], "--n-best 5 is more than --beam-size 4", False),
    (["translate", "{run}", "--top-p", "0.9"], "--top-p set(s) sampling: add --sample", False),
    (["translate", "{run}", "--bogus", "hello"],
     "keras-transformer translate: error: unrecognized arguments: --bogus", True),
    (["translate", "{run}", "hello", "--beam-size", "0"], "must be a positive integer", True),
    (["evaluate", "{run}", "--source", "{dir}/missing.src", "--reference", "{dir}/test.ref"],
     "argument --source: ", True),
    (["evaluate", "{run}", "--source", "{dir}/latin1.src", "--reference", "{dir}/test.ref"],
     "as UTF-8 text", False),
    (["evaluate", "{run}", "--source", "{dir}/test.src", "--reference", "{dir}/short.ref"],
     "has 2 lines but", False),
    (["evaluate", "{run}", "--source", "{dir}/empty.txt", "--reference", "{dir}/empty.txt"],
     "sources is empty", False),
    (["evaluate", "{run}", "--source", "{dir}/test.src"], "the following arguments are "
                                                          "required: --reference", True),
    (["average", "--run-dir", "{dir}/empty_run"], "No step-*.keras checkpoints", False),
    (["average", "{dir}/a_file", "--output", "{dir}/out.keras"], "not a .keras file", False),
    (["average", "{dir}/x.keras", "--run-dir", "{dir}/empty_run"],
     "keras-transformer average: error: give either checkpoint files or --run-dir", True),
    (["export", "{run}", "{dir}/exported", "--quantization", "int8"],
     "--quantization only applies to --format ctranslate2", False),
    (["export", "{run}", "{dir}/ct2", "--format", "ctranslate2", "--lengths", "16"],
     "--lengths applies only to --format saved_model", False),
    (["plot", "positions", "--output", "{dir}/a_file/positions.png"],
     "argument --output: ", True),
    (["plot", "training", "{dir}/empty_run"], "No training log", False),
    (["serve", "{dir}/missing"], "argument saved_model: ", True),
    (["serve", "{dir}/empty_run"], "holds no version directory", False),
    (["transl", "x"], "invalid choice: 'transl'", True),
]


@pytest.mark.parametrize("argv, message, usage", COMMANDS)
@pytest.mark.backs("README.md", "a mistake is one `error:` line with exit status 2")
@pytest.mark.backs("docs/troubleshooting.md",
                   "one `error:` line on stderr and exit with status 2, without a traceback")
def test_every_command_ends_a_mistake_with_one_error_line(argv, message, usage, files,
                                                         run_dir, capsys):
    argv = [word.format(dir=files, run=run_dir) for word in argv]
    before = files_in(files), files_in(run_dir)
    err = fails_with(keras_transformer, argv, capsys, usage)
    assert message in err
    assert (files_in(files), files_in(run_dir)) == before  # nothing written


RECIPES = [
    (quickstart, ["--steps", "0"], "argument --steps: must be a positive integer", True),
    (quickstart, ["--tune-alpha", ""], "must be comma-separated numbers from 0 to 10", True),
    (quickstart, ["--tune-alpha", "1", "--no-tune-alpha"],
     "argument --no-tune-alpha: not allowed with argument --tune-alpha", True),
    (quickstart, ["--run-dir", "{dir}/a_file", "--train-pairs", "50", "--steps", "1"],
     "a_file' is a file, not a folder to write into", True),
    (quickstart, ["--run-dir", "{dir}/run", "--train-pairs", "50", "--steps", "2",
                  "--max-length", "16", "--max-sentence-length", "32", *TINY_MODEL],
     "--max-length 16 is below --max-sentence-length 32", False),
    (multi30k, ["--data-dir", "{dir}/missing", "--steps", "1"], "argument --data-dir: ", True),
    (multi30k, ["--data-dir", "{dir}/empty_run", "--steps", "1"], "Multi30k file train.de",
     False),
    (multi30k, ["--data-dir", "{multi30k}", "--run-dir", "{dir}/run", "--train-limit", "150",
                "--steps", "2", "--no-export"],
     "--vocab-size 8000 is more than SentencePiece can learn from these 300 sentences", False),
    (multi30k, ["--direction", "fr-en"], "argument --direction: invalid choice", True),
    (anki, ["--data", "{dir}/missing.txt", "--steps", "1"], "argument --data: ", True),
    (anki, ["--data", "{dir}/no_tabs.txt", "--steps", "1"], "line 1 has no tab", False),
    (anki, ["--language", "fr"], "only English-Spanish is downloaded", True),
    (table3, ["--variants", "base,heads3"], "unknown variant(s) ['heads3']", True),
    (table3, ["--data-dir", "{multi30k}", "--run-dir", "{dir}/table3", "--train-limit", "200",
              "--variants", "base"], "--vocab-size 8000 is more than SentencePiece", False),
]


@pytest.mark.parametrize("module, argv, message, usage", RECIPES)
@pytest.mark.backs("docs/troubleshooting.md",
                   "one `error:` line on stderr and exit with status 2, without a traceback")
def test_every_recipe_ends_a_mistake_with_one_error_line(module, argv, message, usage, files,
                                                        capfd):
    # capfd: a native log line (SentencePiece's trainer writes hundreds) would show.
    argv = [word.replace("{multi30k}", shared_data("multi30k")) if "{multi30k}" in word
            else word.format(dir=files) for word in argv]
    before = files_in(files)
    err = fails_with(recipe(module), argv, capfd, usage)
    assert message in err
    # Nothing there before was changed, and no model or half-written file is new.
    after = files_in(files)
    assert {name: after.get(name) for name in before} == before
    new = [name for name in after if name not in before]
    assert not [name for name in new if name.endswith(".keras") or ".partial-" in name], new
    if "SentencePiece" in message:  # refused before any vocabulary was saved
        assert not [name for name in new if "tokenizer" in name], new


@pytest.mark.parametrize("raised, status, message", [
    (KeyboardInterrupt(), 130, ""),
    (ModuleNotFoundError("No module named 'tensorflow_datasets'", name="tensorflow_datasets"),
     2, "error: No module named 'tensorflow_datasets'"),
    (ImportError("recipes.wmt14 needs tensorflow-datasets: pip install tensorflow-datasets"),
     2, "error: recipes.wmt14 needs tensorflow-datasets: pip install tensorflow-datasets"),
    (FileExistsError("runs/x/model_averaged.keras exists"), 2,
     "error: runs/x/model_averaged.keras exists"),
    # A run that failed, not a mistake in the command: status 1.
    (NonFiniteLossError("The loss became nan at step 7"), 1,
     "error: The loss became nan at step 7"),
    (PeerLostError("Lost worker 1 of TF_CONFIG"), 1, "error: Lost worker 1 of TF_CONFIG"),
    # Out of memory, as each backend says it (a beam of 1,000,000 ended in a traceback).
    (MemoryError(), 1, "error: out of memory (MemoryError): ask for less at once, e.g. a "
     "smaller --beam-size or --batch-size (or --tokens-per-batch when training)"),
    (type("ResourceExhaustedError", (Exception,), {})("OOM when allocating tensor\nmore"), 1,
     "error: out of memory (OOM when allocating tensor): ask for less at once, e.g. a smaller "
     "--beam-size or --batch-size (or --tokens-per-batch when training)"),
    (RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 18.75TiB"), 1,
     "error: out of memory (RESOURCE_EXHAUSTED: Out of memory allocating 18.75TiB): ask for "
     "less at once, e.g. a smaller --beam-size or --batch-size (or --tokens-per-batch when "
     "training)"),
])
@pytest.mark.backs("docs/distributed.md",
                   "the survivors exit with status 1 and `error: Lost worker 1 of")
@pytest.mark.backs("docs/troubleshooting.md",
                   "`error: The loss became nan at step N: training stopped ...` (exit status 1)")
def test_interrupts_and_missing_packages_are_one_line(raised, status, message, capsys):
    def main():
        raise raised

    with pytest.raises(SystemExit) as exit_info:
        errors.guarded(main)
    assert exit_info.value.code == status
    assert capsys.readouterr().err.strip() == message


# A command line whose run raises a PeerLostError, with an exit handler standing for JAX's,
# which waits for the lost process until the heartbeat timeout aborts this one.
LOST_PEER_COMMAND = """
import atexit, sys
from keras_transformer_app.cli import errors
from keras_transformer_app.training.distribution import PeerLostError

atexit.register(lambda: print("the runtime's exit handler ran", flush=True))


def main():
    print("training", flush=True)
    lost = PeerLostError("Lost a process of the cluster, so training stopped.")
    lost.runtime_waits = sys.argv[1] == "waits"
    raise lost


errors.guarded(main)
"""


@pytest.mark.parametrize("runtime", ["waits", "does not wait"])
@pytest.mark.backs("docs/distributed.md", "ends at once with status 1 and")
def test_a_lost_peer_ends_the_command_before_a_runtime_that_would_wait_for_it(runtime):
    """Under JAX a survivor that said it lost a process then waited about 45 s at exit
    (JAX's shutdown barrier) and was aborted with a native stack trace
    (benchmarks/cluster_faults.py): it now ends after its line, its output flushed."""
    result = subprocess.run([sys.executable, "-c", LOST_PEER_COMMAND, runtime],
                            cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip() == "error: Lost a process of the cluster, so training stopped."
    assert result.stdout == "training\n" + (
        "the runtime's exit handler ran\n" if runtime == "does not wait" else "")


def test_a_failed_run_frees_what_its_frames_held_before_the_exit(capsys):
    """TensorFlow's all-reduce leaves a ThreadPool open in its frame when a lost worker
    raises through it: freed at the interpreter's exit, the pool printed `Exception ignored
    in: <function Pool.__del__ ...>` and a traceback under the error line (a cluster of
    two quickstart processes, one killed, 3 times in 3)."""
    freed = []

    class Pool:  # stands for the ThreadPool: its __del__ needs a live interpreter
        def __del__(self):
            freed.append("pool")

    def all_reduce():
        pool = Pool()  # noqa: F841  held by the frame, as TensorFlow's is
        raise RuntimeError("collective ops failed")

    def main():
        try:
            all_reduce()
        except RuntimeError as error:
            raise PeerLostError("Lost worker 1 of TF_CONFIG") from error

    with pytest.raises(SystemExit) as exit_info:
        errors.guarded(main)
    assert freed == ["pool"] and exit_info.value.code == 1
    assert capsys.readouterr().err.strip() == "error: Lost worker 1 of TF_CONFIG"


@pytest.mark.parametrize("interruption, status", [(KeyboardInterrupt, 130),
                                                  (errors.Terminated, 143)])
def test_an_error_raised_while_a_signal_unwinds_ends_as_the_signal(interruption, status,
                                                                   capsys):
    """A Ctrl-C inside TensorFlow's tracing of an export: the graph stack's cleanup
    asserted "Concurrent access?" in its place, and the command ended with status 1
    and a traceback."""
    class GraphStack:
        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            raise AssertionError("Concurrent access?")

    def main():
        try:
            with GraphStack():
                raise interruption()
        except AssertionError as error:  # a library wrapping it once more
            raise RuntimeError("tracing failed") from error

    with pytest.raises(SystemExit) as exit_info:
        errors.guarded(main)
    assert exit_info.value.code == status
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("signal_name, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_error_made_of_a_signal_with_no_link_to_it_ends_as_the_signal(signal_name, status,
                                                                          capsys):
    """A SIGTERM whose handler ran while TensorFlow's C++ built an exception of its own
    (in `tf.saved_model.save`): pybind11 raised `RuntimeError: ... MISMATCH of original
    and normalized active exception types: ORIGINAL InvalidArgumentError REPLACED BY
    Terminated`, with no cause or context, and the export ended with status 1 and a
    traceback (tests/test_signals.py::test_exporting, once in CI)."""
    def main():
        try:
            signal.raise_signal(getattr(signal, signal_name))  # the command's own handler
        except (KeyboardInterrupt, errors.Terminated):
            pass  # taken by the C++ in between, which raises its own error below
        raise RuntimeError("pybind11::error_already_set: MISMATCH of original and normalized "
                           "active exception types")

    with pytest.raises(SystemExit) as exit_info:
        errors.guarded(main)
    assert exit_info.value.code == status
    assert "Traceback" not in capsys.readouterr().err


def test_an_error_with_no_signal_before_it_keeps_its_traceback():
    """The signal of an earlier command in the same process, or one that the command
    answered itself and went on from (`errors.signal_answered`), does not stand for a
    later bug."""
    with pytest.raises(SystemExit):
        errors.guarded(lambda: signal.raise_signal(signal.SIGTERM))

    def main():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        errors.guarded(main)

    def answered_then_a_bug():
        try:
            signal.raise_signal(signal.SIGTERM)
        except errors.Terminated:
            errors.signal_answered()  # as an export found complete does
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        errors.guarded(answered_then_a_bug)


def test_an_import_error_inside_the_package_keeps_its_traceback():
    def main():
        raise ImportError("cannot import name 'x'", name="keras_transformer.model")

    with pytest.raises(ImportError):
        errors.guarded(main)


def test_a_smoke_run_with_too_large_a_vocabulary_is_one_line_in_a_real_process(tmp_path):
    """The issue's reproduction: a few pairs with the default --vocab-size (150 pairs: the
    300 sentences of both languages that the shared vocabulary learns from)."""
    command = [sys.executable, "-m", "recipes.multi30k", "--train-limit", "150", "--steps", "2",
               "--no-export", "--data-dir", shared_data("multi30k"),
               "--run-dir", str(tmp_path / "run")]
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_TRANSFORMER_NATIVE_LOGS")}
    result = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True,
                            timeout=300, env=environment)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --vocab-size 8000 is more than SentencePiece can learn from "
                           "these 300 sentences: at most ")
    assert "--vocab-size" in line
    assert not os.path.exists(tmp_path / "run" / "tokenizer")


def test_a_gzipped_file_that_is_not_gzip_is_one_line(files, run_dir, capsys):
    bad = files / "test.src.gz"
    bad.write_bytes(b"plain text, not gzip\n")
    with gzip.open(files / "test.ref.gz", "wt") as f:
        f.write("a b .\n")
    err = fails_with(keras_transformer, ["evaluate", str(run_dir), "--source", str(bad),
                                         "--reference", str(files / "test.ref.gz")], capsys)
    assert "Cannot read" in err


@pytest.mark.once("jax")
def test_a_mistake_the_exports_tensorflow_process_finds_is_one_line(run_dir, tmp_path):
    """Under JAX the command line runs itself again under TensorFlow to write the
    SavedModel: a mistake only that process finds (a compiled width past the model's
    longest input) is the same one line."""
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer_app", "export", str(run_dir),
         str(tmp_path / "exported"), "--lengths", "16,5000"], capture_output=True, text=True,
        timeout=300, cwd=REPOSITORY, env=dict(os.environ, KERAS_BACKEND="jax"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "go past the longest input" in lines[0] and "--lengths" in lines[0]
    assert not (tmp_path / "exported").exists() or os.listdir(tmp_path / "exported") == []


def test_a_beam_wider_than_a_few_dozen_is_taken_with_a_warning(capsys):
    from keras_transformer_app.cli.options import WIDE_BEAM
    from keras_transformer_app.cli.parser import build_parser

    parser = build_parser()
    for command in (["translate", "run", "hello"], ["evaluate", "run", "--source", "a",
                                                    "--reference", "b"]):
        assert parser.parse_args([*command, "--beam-size", str(WIDE_BEAM)]).beam_size == WIDE_BEAM
        assert capsys.readouterr().err == ""
        wide = WIDE_BEAM + 1
        assert parser.parse_args([*command, "--beam-size", str(wide)]).beam_size == wide
        warning = capsys.readouterr().err
        assert warning.startswith(f"warning: --beam-size {wide} keeps {wide} hypotheses")
        assert warning.count("\n") == 1
