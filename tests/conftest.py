"""Shared fixtures and settings. Every test runs under the backend in KERAS_BACKEND.

The tests come in two tiers (`runs_in`):
- the suite, which the README's test command runs once per backend. A test whose subject
  does not depend on the backend is marked `@pytest.mark.once("jax")` (or by a module's
  `pytestmark = pytest.mark.once("jax")`): it runs in that backend's pass only, and the
  other passes leave it out (deselected, not skipped). Every other test runs in all three.
- the walk through the pages (`@pytest.mark.walk`, tests/test_pages.py), which runs only
  with `--walk`, whatever the backend: `python -m pytest -q -n 2 --dist loadgroup --walk
  tests/test_pages.py`, right after the suite in .ci/run.
tests/test_tiers.py checks that every test runs in exactly one of those places.

Hypothesis runs with its default profile (random examples, an example
database under .hypothesis/) on a workstation. In CI (the CI environment
variable set, as CI does with CI=true; see `tiers.in_ci`) it runs the "ci"
profile: derandomized, so every run tries the same examples, with no
database, no deadline (an example's first call compiles and is slow), and the
reproduction blob of a failure printed.

The fixture shared across folders is `reversal`, a model trained on the toy
reversal task.
"""

import os

# Before anything imports TensorFlow (keras does), or its C++ logging is on.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# XLA (JAX's compiler, and TensorFlow's for jit-compiled functions) compiles the
# tests' small programs without LLVM's optimizations: compiling, not running, is
# most of a test's time under JAX (its attention, model and training tests: 129 s of
# test time with them, 108 s without; with --xla_llvm_disable_expensive_passes as
# well, which alone gained nothing, JAX's layer, model and decoding tests took 160 s
# and 130 s, TensorFlow's decoding, export and model tests 174 s and 156 s). Long
# training loops run slower (a 768-step fit: 19 s and 37 s), which is why the suite
# trains few steps. The flag changes how fast the compiled code runs;
# results may differ in the last bits (the tests' tolerances allow for it), and the
# optimized code users get is the benchmarks' to measure. Set before JAX or
# TensorFlow starts, for the test processes and the processes they start (which
# inherit the environment); a level already in XLA_FLAGS is kept.
# XLA also fuses with its older emitters (--xla_cpu_use_fusion_emitters=false): at level
# 0 they compile a small program in half the time of the newer ones that JAX 0.10.2 uses
# by default (470 tiny programs: 12.3 s and 6.0 s), and the JAX pass took 261 s instead of
# 368 s (2-core Intel Xeon, AVX-512). At the default level, as users compile, the older
# emitters were slower (a walk-sized Multi30k run trained in 8 s instead of 5 s). A
# choice already in XLA_FLAGS is kept.
_OPTIMIZATION_LEVEL = "--xla_backend_optimization_level"
if _OPTIMIZATION_LEVEL not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_OPTIMIZATION_LEVEL}=0".strip()
_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters"
if _FUSION_EMITTERS not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += f" {_FUSION_EMITTERS}=false"

import importlib.metadata  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402
from _pytest.doctest import DoctestItem  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from tiers import BACKENDS, COLLECTED, in_ci, runs_in  # noqa: E402

# Keras, the library and the tests' helpers are imported by the hooks and fixtures that use
# them, not here: under pytest-xdist, pytest's own process only starts the workers, and an
# import of Keras there came before every worker started (tests/tiers.py).

# Replaces the "ci" profile that recent Hypothesis versions register and load
# whenever CI is in the environment, even as CI=false, so the choice follows
# in_ci() and the settings are ours on every version.
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if in_ci() else "default")


def _a_share_of_the_cores_per_worker(config):
    """Under pytest-xdist, each worker, and every process a test starts, runs
    cores / workers OpenMP threads (unless OMP_NUM_THREADS is set already): by
    default torch's OpenMP runtime in every process takes all the cores, and on
    the 2-core CI machine the two workers' waiting threads took a third of the
    torch pass's time (tests/test_recipes.py, inference/test_compiled.py and
    inference/test_decoding.py: 244 s with the default, 161 s with one thread per
    worker). TensorFlow and JAX lost nothing to it and keep their own defaults.
    Set here, before xdist starts the workers, which inherit the environment."""
    workers = getattr(config.option, "numprocesses", None)
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    cores = os.cpu_count() or 1
    workers = workers if isinstance(workers, int) else cores  # "auto", "logical"
    os.environ["OMP_NUM_THREADS"] = str(max(1, cores // workers))


# The files that take longest in some pass (they start processes, train, export or
# compile many searches), longest first. Under pytest-xdist's `--dist loadfile` each
# worker starts with two files and is sent the next one in order when two or fewer of
# its tests are left: one of these sent last keeps the other worker idle until it
# ends (test_multiprocess.py, two tests, was among the last files when xdist ordered
# the files by their number of tests).
LONG_FILES = ("tests/test_recipes.py", "tests/test_signals.py",
              "tests/test_multiprocess.py",
              "tests/inference/test_decoding.py", "tests/export/test_saved_model.py",
              "tests/test_model.py", "tests/serving/test_server.py", "tests/test_docs.py",
              "tests/training/test_distribution.py", "tests/training/test_run.py",
              "tests/layers/test_attention.py", "tests/layers/test_blocks.py")


def _long_files_first(items):
    """Orders the tests so that the LONG_FILES come first (pytest_configure tells
    xdist to keep the order)."""
    rank = {name: index for index, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONG_FILES)))


def pytest_addoption(parser):
    parser.addoption("--walk", action="store_true", help="run the walk through the pages "
                     "(tests marked walk) and nothing else; without it they are left out")


# The quick loop that a developer runs while editing leaves out the tests marked `slow`:
# those of these files (they start processes, export, serve, or train and decode with XLA),
# those that use the trained `reversal` model, and the few elsewhere marked one by one
# (docs/installation.md, "Running the tests").
SLOW_FILES = ("tests/test_multiprocess.py", "tests/test_signals.py", "tests/test_recipes.py",
              "tests/test_cli_errors.py", "tests/test_imports.py", "tests/test_benchmarks.py",
              "tests/test_option_matrix.py", "tests/test_figures.py", "tests/test_pages.py",
              "tests/inference/test_decoding.py", "tests/export/test_saved_model.py",
              "tests/export/test_ctranslate2.py", "tests/serving/test_server.py",
              "tests/test_chunked_loss.py", "tests/training/test_distribution.py",
              "tests/training/test_run.py", "tests/test_properties.py",
              # docstring examples that train a tokenizer or compile searches
              "keras_transformer/export/ctranslate2.py",
              "keras_transformer/inference/translator.py", "keras_transformer/inference/beam.py",
              "keras_transformer/inference/sampling.py", "keras_transformer_app/plots/attention.py")


# Docstring examples whose subject does not depend on the backend (BLEU, argument checks,
# tokenizers, configs, plots of formulas), as if marked once("torch").
ONCE_DOCTESTS = ("keras_transformer/evaluation.py", "keras_transformer/validation.py",
                 "keras_transformer/tokenizers/__init__.py", "keras_transformer/config.py",
                 "keras_transformer/data/toy_tasks.py", "keras_transformer_app/plots/curves.py",
                 "tests/helpers.py")


# Under JAX the test processes and the processes they start keep the programs XLA compiles
# in one folder per run of pytest, so that a test compiling a program another test compiled
# (the same tiny model's training step, search or loss) reads it: JAX's persistent cache,
# keyed by the program, the compiler's flags and the versions, so a program read is the one
# the test would have compiled. Every compilation is kept (JAX keeps those of a second or
# more by default). Measured on the JAX pass's in-process tests (the model's, layers',
# decoding's, training's and the loss in chunks): 201 s without, 178 s with (AMD EPYC with
# AVX2). TensorFlow's own persistent XLA cache (TF_XLA_FLAGS) gained nothing there (113 s and
# 117 s on its model and decoding tests: its tests trace different functions). A folder
# already in JAX_COMPILATION_CACHE_DIR is kept, and then not removed: a developer who names
# one keeps the programs for the next run. The recipes' runs still put theirs in their run
# directory (keras_transformer.backend.use_compilation_cache), as users' runs do, but under
# the tests every compilation, where a user's run keeps those of a second or more: the
# processes the tests start inherit the two thresholds set here.
_JAX_CACHE = "JAX_COMPILATION_CACHE_DIR"


def _one_compilation_cache_per_run(config):
    """Sets the JAX cache's environment in pytest's own process, before xdist starts the
    workers (they inherit it); returns the folder to remove at the end, or None. Not for
    the walk, whose commands run as a user's would, each chain in a clone of its own."""
    if hasattr(config, "workerinput") or config.getoption("walk"):
        return None
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    if os.environ.get(_JAX_CACHE):
        return None
    import tempfile

    os.environ[_JAX_CACHE] = tempfile.mkdtemp(prefix="keras-transformer-tests-xla-")
    return os.environ[_JAX_CACHE]


_CACHE_FOLDER = pytest.StashKey[str]()


def _markers(item):
    """{marker name: its args}, a test's own marker over its module's."""
    return {mark.name: mark.args for mark in reversed(list(item.iter_markers()))}


def pytest_configure(config):
    _a_share_of_the_cores_per_worker(config)
    folder = _one_compilation_cache_per_run(config)
    if folder:
        config.stash[_CACHE_FOLDER] = folder
    if hasattr(config.option, "loadscopereorder"):  # xdist's files in collection order
        config.option.loadscopereorder = False
    config.addinivalue_line(
        "markers", "xla: trains with XLA under TensorFlow, as the library chooses (the other "
                   "tests train without it: see _tensorflow_trains_without_xla_unless_asked)")
    config.addinivalue_line(
        "markers", "once(backend): the test's subject does not depend on the backend; it "
                   "runs in that backend's pass of the suite only")
    config.addinivalue_line(
        "markers", "slow: left out of the quick loop (`-m \"not slow\"`); SLOW_FILES are slow "
                   "as a whole")
    config.addinivalue_line(
        "markers", "walk: walks pages of the README and docs/ (tests/test_pages.py); runs only "
                   "with --walk")
    config.addinivalue_line(
        "markers", "backs(page, quote): the test checks the statement of the page that the "
                   "quote (a piece of one line) is taken from; docs/claims.md lists them "
                   "(tests/claims.py)")


def pytest_unconfigure(config):
    folder = config.stash.get(_CACHE_FOLDER, None)
    if folder:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        del os.environ[_JAX_CACHE]


@pytest.hookimpl(tryfirst=True)  # before `-m` reads the markers added here
def pytest_collection_modifyitems(config, items):
    """Leaves out the tests of the other tier, and those marked `once` for another
    backend's pass; puts the long files first."""
    import keras

    backend, walk = keras.backend.backend(), config.getoption("walk")
    kept, left_out, collected = [], [], {}
    for item in items:
        path = item.nodeid.split("::")[0]
        if isinstance(item, DoctestItem) and path in ONCE_DOCTESTS:
            item.add_marker(pytest.mark.once("torch"))
        if path in SLOW_FILES or "reversal" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        markers = _markers(item)
        if "once" in markers and markers["once"][0] not in BACKENDS:
            raise pytest.UsageError(f"{item.nodeid}: once() takes a backend, got "
                                    f"{markers['once'][0]!r}")
        collected[item.nodeid] = markers
        (kept if runs_in(markers, backend, walk) else left_out).append(item)
    config.stash[COLLECTED] = collected
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
    _long_files_first(items)


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with a fixed seed and float32, whatever the last one set."""
    import keras

    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    # No keras.backend.clear_session() here: under TensorFlow it frees the
    # resources of tf-text ops that module-scoped tokenizer fixtures still use.
    keras.config.set_dtype_policy("float32")


def pytest_report_header(config):
    """Keras's version and the KERAS_BACKEND the pass was given, read without importing
    Keras (see the imports above)."""
    backend = os.environ.get("KERAS_BACKEND", "not set (Keras reads keras.json)")
    header = f"keras {importlib.metadata.version('keras')}, KERAS_BACKEND {backend}"
    return header + (", hypothesis profile ci" if in_ci() else "")



@pytest.fixture(autouse=True)
def _tensorflow_trains_without_xla_unless_asked(request, monkeypatch):
    """Under TensorFlow on a CPU, `Transformer.compile` turns XLA on, and XLA compiles
    every batch shape for seconds: most tests train a few steps, where that would be
    most of their time. They train without it; a test of the XLA path itself is marked
    `@pytest.mark.xla` (and the recipes' processes, the docs' snippets and the
    benchmarks keep the library's choice)."""
    import keras

    if keras.backend.backend() == "tensorflow" and request.node.get_closest_marker("xla") is None:
        from keras_transformer import backend

        monkeypatch.setattr(backend, "use_xla_for_training", lambda model: False)
    yield


class _OneTorchThread:
    """Trains torch on one thread: on a shared 2-core machine, tiny matrices and
    two spinning OpenMP threads make training several times slower."""

    def __enter__(self):
        import keras

        self._threads = None
        if keras.backend.backend() == "torch":
            import torch

            self._threads = torch.get_num_threads()
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads)


@pytest.fixture(scope="session")
def reversal(tmp_path_factory):
    """A tiny model trained on the toy reversal task (about 10 s on 2 CPU
    cores, once per pass: `built_once`): non-trivial outputs with clear
    margins, shared by the session: the learning check (test_training.py)
    and the tests of decoding and translation (tests/inference/).

    Attributes: `model`; `vocabulary`, the `ToyVocabulary` of its ids (special
    ids, then 6 words); `max_sentence_length` (5); `training_set()`, the
    (inputs, labels) it was trained on; and `held_out(n)`, which gives n
    (batch, S) encoder inputs drawn with another seed and the expected outputs
    (id lists, EOS included). Sequences of 1 to 5 of 6 words repeat: about
    two thirds of the held-out ones also occur in the training set.
    """
    import keras
    from helpers import built_once

    import keras_transformer as kt
    from keras_transformer import saving
    from keras_transformer.data.toy_tasks import ToyVocabulary, reverse_task

    vocabulary, max_sentence_length = ToyVocabulary(10), 5

    def training_set():
        return reverse_task(2048, vocabulary=vocabulary,
                            max_sentence_length=max_sentence_length, seed=1)

    def train(folder):
        keras.utils.set_random_seed(0)
        config = kt.TransformerConfig.tiny(
            vocab_size=vocabulary.vocab_size, d_model=64, d_ff=128, num_heads=4,
            label_smoothing=0.0, max_length=16,
        )
        model = kt.Transformer(config)
        inputs, labels = training_set()
        steps = 12 * len(labels) // 128
        # Without XLA under TensorFlow, as the tests train (see
        # _tensorflow_trains_without_xla_unless_asked): at the suite's XLA optimization level
        # these 192 steps took 19.9 s, against 13.6 s without it (2-core Intel Xeon).
        model.compile(
            optimizer=keras.optimizers.Adam(
                keras.optimizers.schedules.PolynomialDecay(5e-3, steps, 5e-4),
                beta_1=0.9, beta_2=0.98, epsilon=1e-9,
            ),
            loss=kt.LabelSmoothedCrossEntropy(0.0),
            jit_compile=False if keras.backend.backend() == "tensorflow" else "auto",
        )
        with _OneTorchThread():
            model.fit(inputs, labels, batch_size=128, epochs=12, verbose=0)
        saving.save_model(model, folder / "model.keras")

    folder = built_once(tmp_path_factory, "reversal", train)
    model = saving.load_model(folder / "model.keras")

    def held_out(num_examples=128):
        inputs, labels = reverse_task(num_examples, vocabulary=vocabulary,
                                      max_sentence_length=max_sentence_length, seed=2)
        expected = [[int(t) for t in row if t != vocabulary.pad_id] for row in labels]
        return inputs["source"], expected

    return types.SimpleNamespace(model=model, vocabulary=vocabulary,
                                 max_sentence_length=max_sentence_length,
                                 training_set=training_set, held_out=held_out)
