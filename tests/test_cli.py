"""Tests of the keras-transformer command line."""

import io
import json
import os
import re
import subprocess
import sys
import threading

import keras
import pytest
from helpers import REPOSITORY, untrained_run_dir

import keras_transformer as kt
from keras_transformer import saving
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer.inference import Translator
from keras_transformer_app import cli, logs
from keras_transformer_app.cli import commands

# The command line's own behaviour (its reading, writing, options and messages) is
# the same under every backend, and runs in the torch pass; the translator under it
# is tested on every backend (tests/inference), and so is this file's
# test_translate_prints_one_line_per_sentence, end to end.
command_line_only = pytest.mark.once("torch")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as a recipe leaves it: model.keras with tokenizer/ beside it."""
    keras.utils.set_random_seed(0)
    return untrained_run_dir(tmp_path_factory.mktemp("run"), sentences=300, vocab_size=320)


@pytest.fixture(scope="module")
def loaded(run_dir):
    """The run's model and tokenizer, loaded once: the tests that hand it to
    the command line share its compiled searches."""
    model, tokenizer, _ = saving.load_translation_model(str(run_dir))
    return model, tokenizer


@pytest.fixture
def command_line(loaded, monkeypatch, tmp_path):
    """Runs `cli.main` with the loaded model (whatever MODEL it is given, "run"
    for one) and `stdin` (text or a stream) as standard input; returns (stdout,
    stderr)."""
    model, tokenizer = loaded
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path)

    def translator(path, max_source_length=None, compute_type="default", intra_threads=0):
        return Translator(model, tokenizer, max_source_length=max_source_length)

    monkeypatch.setattr(commands, "load_translator", translator)

    def run(argv, stdin="", stdout=None, stderr=None):
        stdout = io.StringIO() if stdout is None else stdout
        stderr = io.StringIO() if stderr is None else stderr
        with monkeypatch.context() as patch:
            patch.setattr(sys, "stdin", io.StringIO(stdin) if isinstance(stdin, str) else stdin)
            patch.setattr(sys, "stdout", stdout)
            patch.setattr(sys, "stderr", stderr)
            cli.main(argv)
        return stdout.getvalue(), stderr.getvalue()

    return run


# Beam size 2 and batches of 2 everywhere: few compiled shapes for the module.
SEARCH = ["--beam-size", "2", "--batch-size", "2"]
LINES = ["kave tomi", "", "sipe", "tozu kave sipe", "kave"]


def test_translate_prints_one_line_per_sentence(run_dir, capsys):
    cli.main(["translate", str(run_dir), "kave tomi", "sipe", "--beam-size", "2"])
    assert len(capsys.readouterr().out.splitlines()) == 2


@command_line_only
def test_stdin_gives_one_line_per_line_in_order_as_arguments_do(command_line):
    from_arguments, _ = command_line(["translate", "run", *LINES, *SEARCH])
    # \r\n endings, and a last line without any, read like the rest.
    stdin = "kave tomi\r\n\nsipe\ntozu kave sipe\r\nkave"
    from_stdin, err = command_line(["translate", "run", *SEARCH], stdin=stdin)
    assert from_stdin == from_arguments and err == ""
    lines = from_stdin.split("\n")
    assert len(lines) == len(LINES) + 1 and lines[-1] == ""  # each line ends in "\n"
    assert lines[1] == "" and all(lines[i] for i in (0, 2, 3, 4))
    assert command_line(["translate", "run", *SEARCH], stdin="") == ("", "")


@command_line_only
def test_n_best_writes_index_score_and_translation_per_hypothesis(command_line):
    best, _ = command_line(["translate", "run", *SEARCH], stdin="\n".join(LINES) + "\n")
    n_best, _ = command_line(["translate", "run", *SEARCH, "--n-best", "2"],
                             stdin="\n".join(LINES) + "\n")
    rows = [re.fullmatch(r"(\d+)\t(-?\d+\.\d{4})\t(.*)", line).groups()
            for line in n_best.splitlines()]
    assert [int(index) for index, _, _ in rows] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert rows[2:4] == [("1", "0.0000", "")] * 2  # the empty line
    scores = [float(score) for _, score, _ in rows]
    assert all(scores[i] >= scores[i + 1] for i in range(0, 10, 2)), "best first"
    assert [text for _, _, text in rows[::2]] == best.splitlines()


@command_line_only
def test_sampled_translations_do_not_depend_on_the_batch_size(command_line):
    stdin = "\n".join(LINES) + "\n"
    sample = ["translate", "run", "--sample", "--top-k", "5", "--seed", "3"]
    whole, _ = command_line([*sample, "--batch-size", "8"], stdin=stdin)
    one_by_one, _ = command_line([*sample, "--batch-size", "1"], stdin=stdin)
    assert whole == one_by_one
    assert len(whole.splitlines()) == len(LINES) and whole.splitlines()[1] == ""
    samples, _ = command_line([*sample, "--n-best", "3"], stdin=stdin)
    rows = [re.fullmatch(r"(\d+)\t(-?\d+\.\d{4})\t(.*)", line).groups()
            for line in samples.splitlines()]
    assert [int(index) for index, _, _ in rows] == [i for i in range(len(LINES)) for _ in "abc"]
    # The n-best's first sample of each line is that line's single sample.
    assert [text for _, _, text in rows[::3]] == whole.splitlines()


@command_line_only
def test_print_alignment_appends_source_target_pairs(command_line, loaded):
    stdin = "\n".join(LINES) + "\n"
    plain, _ = command_line(["translate", "run", *SEARCH], stdin=stdin)
    aligned, _ = command_line(["translate", "run", *SEARCH, "--print-alignment"], stdin=stdin)
    _, tokenizer = loaded
    texts, alignments = [], []
    for line, source in zip(aligned.splitlines(), LINES):
        text, pairs = line.split("\t")
        texts.append(text)
        pairs = [tuple(map(int, pair.split("-"))) for pair in pairs.split()]
        # One pair per target token, in order; sources within the sentence's tokens.
        assert [target for _, target in pairs] == list(range(len(pairs)))
        source_length = len(tokenizer.tokenize([source])[0])
        assert all(0 <= position < max(source_length, 1) for position, _ in pairs)
        alignments.append(pairs)
    assert texts == plain.splitlines()
    assert alignments[1] == []  # the empty line
    n_best, _ = command_line(["translate", "run", *SEARCH, "--n-best", "2",
                              "--print-alignment"], stdin=stdin)
    rows = [line.split("\t") for line in n_best.splitlines()]
    assert all(len(row) == 4 for row in rows)
    assert [row[3] for row in rows[::2]] == [line.split("\t")[1] for line in aligned.splitlines()]


@command_line_only
@pytest.mark.backs('docs/translation.md', "are refused. A line's samples")
def test_sampling_options_without_sample_are_refused(command_line, monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", "run", "--top-p", "0.9", "--seed", "1"])
    assert exit_info.value.code == 2
    assert "--top-p, --seed set(s) sampling: add --sample" in stderr.getvalue()


class Flushes(io.StringIO):
    """A stdout that records how many lines it holds at each flush, and lets a
    test wait for a count."""

    def __init__(self):
        super().__init__()
        self.counts, self.changed = [], threading.Condition()

    def flush(self):
        with self.changed:
            self.counts.append(self.getvalue().count("\n"))
            self.changed.notify_all()

    def wait_for_lines(self, count, timeout):
        with self.changed:
            return self.changed.wait_for(lambda: self.counts and self.counts[-1] >= count,
                                         timeout)


@command_line_only
def test_a_file_is_translated_in_full_batches(command_line):
    text = "\n".join(LINES) + "\n"
    stdout = Flushes()
    command_line(["translate", "run", *SEARCH], stdin=text, stdout=stdout)
    assert stdout.counts == [2, 4, 5]


class ClosedAfterOneLine(io.StringIO):
    """A stdout whose reader goes away after the first line (`| head -n 1`)."""

    def write(self, text):
        if self.getvalue().count("\n") >= 1:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


@command_line_only
@pytest.mark.backs("docs/troubleshooting.md",
                   "A closed output pipe (`| head`) ends it with status 1")
def test_a_closed_output_pipe_ends_the_command_quietly_with_status_1(command_line):
    """A BrokenPipeError on standard output: status 1, nothing on stderr."""
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        command_line(["translate", "run", *SEARCH], stdin="\n".join(LINES) + "\n",
                     stdout=ClosedAfterOneLine(), stderr=stderr)
    assert exit_info.value.code == 1
    assert stderr.getvalue() == ""


@command_line_only
def test_a_pipe_is_answered_line_by_line_as_lines_arrive(command_line):
    """Three lines written one at a time, each after the answer to the one before:
    each comes back while the pipe is still open, without waiting for
    --batch-size (32) lines or for the end of the input."""
    read_end, write_end = os.pipe()
    stdout, failures = Flushes(), []

    def translate():
        try:
            with os.fdopen(read_end) as stdin:
                command_line(["translate", "run", "--beam-size", "2"], stdin=stdin,
                             stdout=stdout)
        except BaseException as error:  # noqa: BLE001  reported by the test
            failures.append(error)

    thread = threading.Thread(target=translate)
    thread.start()
    try:
        with os.fdopen(write_end, "w") as writer:
            for count, line in enumerate(LINES[2:5], start=1):
                writer.write(line + "\n")
                writer.flush()
                assert stdout.wait_for_lines(count, timeout=120), (
                    f"line {count} not answered while the pipe is open", failures)
    finally:
        thread.join(timeout=120)
    assert not failures and not thread.is_alive()
    expected, _ = command_line(["translate", "run", "--beam-size", "2", *LINES[2:5]])
    assert stdout.getvalue() == expected and stdout.counts == [1, 2, 3]


@command_line_only
@pytest.mark.backs("docs/translation.md",
                   "other lines are translated, and the command exits with status 2 at the end")
def test_a_line_that_is_not_utf8_gets_an_empty_line_and_an_error(command_line):
    out, err = io.StringIO(), io.StringIO()
    stdin = io.TextIOWrapper(io.BytesIO(b"kave tomi\nka\xe9ve\n\nsipe\n"))
    with pytest.raises(SystemExit) as exit_info:
        command_line(["translate", "run", *SEARCH], stdin=stdin, stdout=out, stderr=err)
    assert exit_info.value.code == 2
    # The good lines are translated, the bad one's line is empty like an empty line's.
    good, _ = command_line(["translate", "run", *SEARCH], stdin="kave tomi\n\n\nsipe\n")
    assert out.getvalue() == good and len(good.splitlines()) == 4
    assert err.getvalue() == ("error: line 2: byte 0xe9 at offset 2 is not valid UTF-8; its "
                              "output line is left empty\n")


@command_line_only
def test_a_sentence_argument_that_is_not_utf8_gets_the_same_message(command_line):
    # sys.argv keeps the bytes it cannot decode as surrogate escapes.
    sentence = b"ka\xe9ve".decode("utf-8", "surrogateescape")
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        command_line(["translate", "run", "kave tomi", sentence, *SEARCH], stdout=out,
                     stderr=err)
    assert exit_info.value.code == 2
    good, _ = command_line(["translate", "run", "kave tomi", *SEARCH])
    assert out.getvalue() == good + "\n"
    assert err.getvalue() == ("error: sentence 2: byte 0xe9 at offset 2 is not valid UTF-8; "
                              "its output line is left empty\n")


@command_line_only
def test_options_may_come_anywhere_among_the_sentences(command_line):
    last, _ = command_line(["translate", "run", "kave tomi", "sipe", "--n-best", "2",
                            "--beam-size", "2"])
    between, _ = command_line(["translate", "run", "--n-best", "2", "kave tomi",
                               "--beam-size", "2", "sipe"])
    assert between == last and len(last.splitlines()) == 4


@command_line_only
@pytest.mark.backs("docs/translation.md",
                   "a wrong option, or a path that cannot be right (a missing model or file)")
def test_a_translate_mistake_shows_translates_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", "run", "--n-best", "5", "kave", "--bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: keras-transformer translate ")
    assert err.strip().splitlines()[-1] == ("keras-transformer translate: error: unrecognized "
                                            "arguments: --bogus")


@command_line_only
def test_over_long_lines_are_truncated_with_a_warning_naming_the_line(command_line):
    long_line = " ".join(["kave tomi tozu sipe"] * 3)
    out, err = command_line(["translate", "run", *SEARCH, "--max-source-length", "4"],
                            stdin=f"kave\n\n{long_line}\n")
    assert len(out.splitlines()) == 3
    assert err.strip().splitlines() == [
        "warning: line 3 is longer than max_source_length=4 (tokens + EOS); it was "
        "translated truncated to it"]


@command_line_only
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


@command_line_only
@pytest.mark.parametrize("flag", ["--reference", "--source"])
def test_evaluate_refuses_an_output_that_is_its_input(run_dir, tmp_path, flag, capsys):
    files = {"--source": tmp_path / "test.src", "--reference": tmp_path / "test.ref"}
    files["--source"].write_text("kave tomi\n")
    files["--reference"].write_text("foko pude\n")
    # The same file under another name: through a symbolic link.
    (tmp_path / "link").symlink_to(files[flag])
    with pytest.raises(SystemExit) as raised:
        cli.main(["evaluate", str(run_dir / "model.keras"), "--source", str(files["--source"]),
                  "--reference", str(files["--reference"]), "--output", str(tmp_path / "link")])
    assert raised.value.code != 0
    assert f"is the {flag} file" in capsys.readouterr().err
    assert files["--source"].read_text() == "kave tomi\n"
    assert files["--reference"].read_text() == "foko pude\n"


@command_line_only
def test_plot_commands_write_pngs(run_dir, tmp_path):
    cli.main(["plot", "positions", "--output", str(tmp_path / "pe.png"), "--length", "50",
              "--d-model", "64"])
    cli.main(["plot", "schedule", "--output", str(tmp_path / "lr.png")])
    cli.main(["plot", "attention", str(run_dir), "kave tomi tozu", "--output-dir",
              str(tmp_path / "attention"), "--beam-size", "1"])
    for path in (tmp_path / "pe.png", tmp_path / "lr.png",
                 tmp_path / "attention" / "attention_cross.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@command_line_only
@pytest.mark.backs("README.md", "a mistake is one `error:` line with exit status 2")
@pytest.mark.backs("docs/translation.md",
                   "a wrong option, or a path that cannot be right (a missing model or file)")
def test_user_mistakes_print_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", str(tmp_path / "missing.keras"), "hello"])
    assert exit_info.value.code == 2
    missing = str(tmp_path / 'missing.keras')
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("usage: keras-transformer translate")
    assert err[-1] == ("keras-transformer translate: error: argument model: "
                       f"{missing!r} does not exist")
    broken = tmp_path / "broken.keras"
    broken.write_bytes(b"not a zip")
    os.makedirs(tmp_path / "tokenizer")
    with pytest.raises(SystemExit):
        cli.main(["translate", str(broken), "hello"])
    assert "Cannot load" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["average"])
    assert exit_info.value.code == 2


# The command line: one line on stderr (after the command's usage for a mistake in the
# options), non-zero exit, no traceback.
@command_line_only
@pytest.mark.parametrize("argv, message, usage", [
    (["translate", "no/such/run", "hallo"], "argument model: 'no/such/run' does not exist",
     True),
    (["evaluate", "{dir}", "--source", "a.de", "--reference", "b"],
     "argument --source: 'a.de' does not exist", True),
    (["average", "no-such-checkpoint.keras"],
     "argument checkpoints: 'no-such-checkpoint.keras' does not exist", True),
    (["serve", "no/such/dir"], "argument saved_model: 'no/such/dir' does not exist", True),
    (["serve", "{dir}"], "holds no version directory", False),
    (["translate", "{dir}", "--n-best", "5"], "error: --n-best 5 is more than --beam-size 4",
     False),
])
def test_command_line_mistakes_print_one_line(argv, message, usage, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([word.format(dir=tmp_path) for word in argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert message in lines[-1] and "Traceback" not in "\n".join(lines)
    assert len(lines) == 1 or (usage and lines[0].startswith("usage: "))


@pytest.mark.parametrize("argv, native_logs", [
    (["translate", "no/such/run", "hallo"], False),
    (["--native-logs", "translate", "no/such/run", "hallo"], True),
    (["translate", "no/such/run", "hallo", "--native-logs"], True),
    (["plot", "positions", "--native-logs", "--output", "no/such/dir/x.png"], True),
])
def test_native_logs_are_hidden_unless_asked_for(argv, native_logs, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(logs, "quiet_native_logs", calls.append)
    monkeypatch.setattr(commands, "plot", lambda args: None)
    try:
        cli.main(argv)
    except SystemExit:
        pass
    assert calls == [native_logs]


@command_line_only
def test_command_line_rejects_bad_numbers(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", "run", "hallo", "--beam-size", "0"])
    assert exit_info.value.code == 2
    assert "must be a positive integer" in capsys.readouterr().err


@pytest.mark.once("tensorflow")  # about the environment, not the backend
@pytest.mark.parametrize("command", [
    ["keras-transformer", "translate", "run", "hallo"],
    [sys.executable, "-m", "keras_transformer_app", "export", "run", "out"],
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


@command_line_only
def test_a_terminal_is_told_how_to_end(command_line):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out, err = command_line(["translate", "run", *SEARCH], stdin=Terminal("kave\n"))
    assert len(out.splitlines()) == 1 and "Ctrl-D" in err


@command_line_only
def test_serve_help_shows_the_port_and_host_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 8501)" in text and "(default: 127.0.0.1)" in text


@command_line_only
def test_average_warns_of_missing_checkpoints_and_keeps_an_existing_output(tmp_path, capsys):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    kt.Transformer(kt.TransformerConfig.tiny(vocab_size=12)).save(
        checkpoints / "step-0000001.keras")
    cli.main(["average", "--run-dir", str(tmp_path), "--last", "5"])
    out, err = capsys.readouterr()
    averaged = tmp_path / "model_averaged.keras"
    assert out.strip() == f"Averaged 1 checkpoint into {averaged}"
    assert err.strip().splitlines() == [
        f"warning: --last 5 asks for 5 checkpoints, but {checkpoints} holds 1: averaging 1",
        f"warning: no tokenizer beside {checkpoints / 'step-0000001.keras'} or in its run "
        f"directory: copy the model's tokenizer/ folder beside {averaged} to translate with it"]
    written = averaged.stat().st_mtime_ns
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["average", "--run-dir", str(tmp_path), "--last", "1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {averaged} exists: add --force to replace it, or give another --output.")
    assert averaged.stat().st_mtime_ns == written
    cli.main(["average", "--run-dir", str(tmp_path), "--last", "1", "--force"])
    assert averaged.stat().st_mtime_ns != written


def test_a_compiled_model_loads_without_keras_compile_warning(tmp_path, recwarn):
    from keras_transformer.training.compile import compile_model

    config = kt.TransformerConfig.tiny(vocab_size=12)
    model = kt.Transformer(config)
    compile_model(model, config)
    model.save(tmp_path / "model.keras")
    saving.load_model(str(tmp_path / "model.keras"))
    assert not [w for w in recwarn if "compile()" in str(w.message)]


@pytest.mark.slow
@pytest.mark.once("tensorflow")  # about the environment, not the backend
def test_evaluate_redirected_to_a_file_writes_only_results(run_dir, tmp_path):
    corpus = synthetic_translation(3, seed=9)
    (tmp_path / "test.src").write_text("\n".join(corpus.sources) + "\n")
    (tmp_path / "test.ref").write_text("\n".join(corpus.targets) + "\n")
    with open(tmp_path / "out.txt", "w") as out:
        result = subprocess.run(
            ["keras-transformer", "evaluate", str(run_dir), "--source", str(tmp_path / "test.src"),
             "--reference", str(tmp_path / "test.ref"), "--beam-size", "1"],
            cwd=REPOSITORY, stdout=out, stderr=subprocess.PIPE, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "out.txt").read_text()
    assert not re.search(r"[\x1b\b\r]", text), repr(text)
    lines = text.splitlines()
    assert lines[0].startswith("BLEU ") and lines[1].startswith("BLEU lower-cased")
    assert lines[2].startswith("3 sentences in ") and len(lines) == 3
    assert not re.search(r"[\x1b\b\r]", result.stderr)  # stderr is no terminal either


# What the parser must not load: the library, Keras, a backend, the server's parser,
# CTranslate2 (a command imports what it needs when it runs).
HEAVY = {"keras_transformer", "keras", "keras_hub", "tensorflow", "jax", "torch", "httptools",
         "ctranslate2", "numpy"}
PARSE_IN_A_FRESH_PROCESS = """
import json, sys
from keras_transformer_app import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit:
    status = exit.code
# A None entry is a module skipped, not loaded (logs.skip_jax_unless_backend).
loaded = sorted({name.split(".")[0] for name, module in sys.modules.items()
                 if module is not None} & set(json.loads(HEAVY)))
print(json.dumps([status, loaded]), file=sys.__stderr__)
"""


@command_line_only
@pytest.mark.parametrize("argv, status", [
    (["--help"], 0), (["translate", "--help"], 0), (["evaluate", "--help"], 0),
    (["plot", "attention", "--help"], 0), (["average", "--help"], 0), (["export", "--help"], 0),
    (["serve", "--help"], 0), ([], 2), (["translate", "m", "s", "--beam-size", "0"], 2),
    (["export", "m", "out", "--quantization", "int4"], 2), (["serve", "m", "--bogus"], 2),
    (["average", "a.keras", "--run-dir", "r"], 2),
])
def test_the_parser_answers_without_loading_the_library_or_a_backend(argv, status):
    code = PARSE_IN_A_FRESH_PROCESS.replace("json.loads(HEAVY)", repr(sorted(HEAVY)))
    result = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPOSITORY,
                            capture_output=True, text=True, timeout=60)
    assert json.loads(result.stderr.strip().splitlines()[-1]) == [status, []], result.stderr


@command_line_only
def test_the_parsers_copies_of_the_librarys_names_agree_with_it():
    from keras_transformer import backend
    from keras_transformer.export.ctranslate2 import QUANTIZATIONS
    from keras_transformer.inference.ctranslate2 import COMPUTE_TYPES
    from keras_transformer_app.cli import errors, options

    assert options.COMPUTE_TYPES == COMPUTE_TYPES and options.QUANTIZATIONS == QUANTIZATIONS
    assert errors.BACKENDS == backend.BACKENDS
    with pytest.raises(ValueError) as library_error:
        backend.check_backend_name("tensorflw")
    with pytest.raises(SystemExit), pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERAS_BACKEND", "tensorflw")
        stderr = io.StringIO()
        patch.setattr(sys, "stderr", stderr)
        errors.check_backend()
    assert stderr.getvalue() == f"error: {library_error.value}\n"
