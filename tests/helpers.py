"""The test suite's one home of helpers.

* `run_layer_test`: what every layer of the package must do (after the keras
  and keras-hub test helpers): build and call eagerly, call on symbolic
  inputs, serialize → rebuild → give the same output, train for one `fit`
  step, and compute in the compute dtype of the mixed_float16 and
  mixed_bfloat16 policies while keeping float32 variables.
* `tiny_model`: a `TransformerConfig.tiny` Transformer.
* `untrained_run_dir`: a run directory as a recipe leaves it (model.keras with
  tokenizer/ beside it), of an untrained one-block model.
* `CharTokenizer`: one id per character, with the special ids of the
  project's `SubwordTokenizer` (pad 0, unk 1, bos 2, eos 3).
* `in_ci`, `require` and `shared_data`: whether this is a CI run, an optional
  module CI must have, and where the shared
  corpora live.
* `loopback_http` and `data_mirror`: a bounded HTTP server on 127.0.0.1, and
  the files of a `KERAS_TRANSFORMER_DATA_MIRROR` built from the shared corpora.
* `built_once`: a folder built by one pytest-xdist worker of a pass and read by
  the others (a trained model, an export), so that a heavy session fixture is
  built once per pass, not once per worker.
"""

import contextlib
import fcntl
import gzip
import http.server
import importlib
import importlib.util
import io
import os
import threading
import urllib.parse
import zipfile

import keras
import numpy as np
import pytest
from keras import ops
from tiers import in_ci

import keras_transformer as kt
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer.tokenizers import SubwordTokenizer

# The repository's root: the working directory of the tests' subprocesses.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def benchmark_module(name):
    """benchmarks/NAME.py, imported from its file (benchmarks/ is not a package)."""
    path = os.path.join(REPOSITORY, "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
PRECISION_POLICIES = ("mixed_float16", "mixed_bfloat16")
SHARED_DATA = os.path.join(REPOSITORY, "..", "shared",
                           "data")


def to_numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def _dtype(tensor):
    return keras.backend.standardize_dtype(tensor.dtype)


def run_layer_test(
    layer_cls,
    init_kwargs,
    inputs,
    expected_output_shape,
    call_kwargs=None,
    expected_output_dtype=None,
    run_training=True,
    run_mixed_precision=True,
):
    """Runs the common layer checks.

    Args:
        layer_cls: The layer class.
        init_kwargs: Constructor arguments.
        inputs: Dict of call-argument name → NumPy array; the first item is the
            first positional argument. Float arrays become model inputs in the
            symbolic and training checks, as do int arrays.
        expected_output_shape: Shape of the (first) output.
        call_kwargs: Non-tensor call arguments (e.g. `use_causal_mask=True`).
        expected_output_dtype: The dtype of the (first) output under every
            policy, for a layer documented to return it whatever the policy
            (e.g. "float32" logits). None means the policy's compute dtype:
            float32, float16 or bfloat16.
        run_training: Whether to run one `fit` step and check the weights move.
        run_mixed_precision: Whether to check the mixed-precision policies: the
            output has the expected dtype (the compute dtype unless
            `expected_output_dtype` says otherwise) eagerly and symbolically,
            every sublayer computes in that policy, and every variable stays
            float32.

    Returns:
        `(layer, outputs)`: the float32 layer and its eager outputs.
    """
    call_kwargs = call_kwargs or {}
    names = list(inputs)

    def call(layer, tensors, **extra):
        return layer(tensors[names[0]], **{n: tensors[n] for n in names[1:]},
                     **call_kwargs, **extra)

    def symbolic_inputs():
        return {
            name: keras.Input(shape=array.shape[1:], dtype=str(array.dtype), name=name)
            for name, array in inputs.items()
        }

    # Eager call.
    layer = layer_cls(**init_kwargs)
    outputs = call(layer, inputs)
    first = _first(outputs)
    assert tuple(first.shape) == tuple(expected_output_shape)
    assert _dtype(first) == (expected_output_dtype or "float32")
    assert np.all(np.isfinite(to_numpy(first)))

    # Config round trip, and a rebuilt layer with the same weights gives the same output.
    config = layer.get_config()
    assert layer_cls.from_config(config).get_config() == config
    revived = keras.layers.deserialize(keras.layers.serialize(layer))
    call(revived, inputs)
    revived.set_weights(layer.get_weights())
    revived_first = _first(call(revived, inputs))
    np.testing.assert_allclose(to_numpy(revived_first), to_numpy(first), atol=1e-6)

    # Symbolic call: the output shape is inferred from keras.Input.
    symbolic_first = _first(call(layer_cls(**init_kwargs), symbolic_inputs()))
    assert tuple(symbolic_first.shape[1:]) == tuple(expected_output_shape[1:])

    if run_training:
        trainable = layer_cls(**init_kwargs)
        model_inputs = symbolic_inputs()
        model = keras.Model(model_inputs, _first(call(trainable, model_inputs)))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        before = [to_numpy(w).copy() for w in trainable.trainable_weights]
        target = np.random.default_rng(0).normal(size=expected_output_shape)
        history = model.fit(inputs, target.astype("float32"), epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        after = [to_numpy(w) for w in trainable.trainable_weights]
        assert any(not np.allclose(b, a) for b, a in zip(before, after)), (
            "one fit step changed no weight"
        )

    if run_mixed_precision:
        for policy in PRECISION_POLICIES:
            mixed = layer_cls(**init_kwargs, dtype=policy)
            expected = expected_output_dtype or mixed.compute_dtype
            mixed_first = _first(call(mixed, inputs))
            assert _dtype(mixed_first) == expected, (
                f"under {policy}, {layer_cls.__name__} returned {_dtype(mixed_first)}, "
                f"expected {expected}"
            )
            assert np.all(np.isfinite(to_numpy(mixed_first)))
            for sublayer in mixed._flatten_layers(include_self=False):
                assert sublayer.dtype_policy.name == policy, (
                    f"{layer_cls.__name__}'s sublayer {sublayer.name} runs under "
                    f"{sublayer.dtype_policy.name}, not {policy}: create it with "
                    "dtype=self.dtype_policy"
                )
            for weight in mixed.weights:
                assert _dtype(weight) == "float32", (
                    f"under {policy}, variable {weight.path} is {_dtype(weight)}"
                )
            symbolic_mixed = _first(call(layer_cls(**init_kwargs, dtype=policy),
                                         symbolic_inputs()))
            assert _dtype(symbolic_mixed) == expected, (
                f"under {policy}, {layer_cls.__name__}'s symbolic output is "
                f"{_dtype(symbolic_mixed)}, expected {expected}"
            )
    return layer, outputs


def tiny_model(vocab_size=20, seed=None, **overrides):
    """A `Transformer` of `TransformerConfig.tiny(vocab_size, **overrides)`.

    Args:
        vocab_size: Vocabulary size (source and target unless overridden).
        seed: When given, `keras.utils.set_random_seed(seed)` runs first, so
            the weights are the same whatever ran before (module-scoped
            fixtures need it: the per-test seed of conftest.py has not been
            set for them).
        **overrides: Other `TransformerConfig` fields.
    """
    if seed is not None:
        keras.utils.set_random_seed(seed)
    return kt.Transformer(kt.TransformerConfig.tiny(vocab_size=vocab_size, **overrides))


def untrained_run_dir(path, sentences, vocab_size):
    """Writes into `path` (a pathlib.Path) what the commands read from a run
    directory: a SentencePiece tokenizer of `vocab_size` pieces learned on
    `sentences` synthetic pairs, and an untrained one-block tiny model."""
    corpus = synthetic_translation(sentences, seed=0)
    tokenizer = SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=vocab_size)
    tokenizer.save(str(path / "tokenizer"))
    config = kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, num_layers=1)
    kt.Transformer(config).save(path / "model.keras")
    return path


class CharTokenizer:
    """One id per character, after the special ids, with the tokenizer protocol
    of keras_transformer (`pad_id`, `unk_id`, `bos_id`, `eos_id`, `vocab_size`,
    `tokenize`, `detokenize`).

    The special ids default to `SubwordTokenizer`'s (pad 0, unk 1, bos 2,
    eos 3); the characters take the ids after the largest special id.
    Characters outside the alphabet become `unk_id`. Tests read the ids from
    the tokenizer, never as literals.

    Args:
        alphabet: The characters, in id order.
        pad_id, unk_id, bos_id, eos_id: Other special ids, for tests of
            tokenizers that differ from the model's.

    Example:

    >>> tokenizer = CharTokenizer()
    >>> tokenizer.tokenize(["bad"])
    [[5, 4, 7]]
    >>> tokenizer.detokenize([[tokenizer.bos_id, 5, 4, 7, tokenizer.eos_id]])
    ['bad']
    """

    ALPHABET = "abcdefgh "
    pad_id = SubwordTokenizer.pad_id
    unk_id = SubwordTokenizer.unk_id
    bos_id = SubwordTokenizer.bos_id
    eos_id = SubwordTokenizer.eos_id
    # The default alphabet's size, so that `CharTokenizer.vocab_size` works on
    # the class; an instance sets its own.
    vocab_size = 1 + max(pad_id, unk_id, bos_id, eos_id) + len(ALPHABET)

    def __init__(self, alphabet=ALPHABET, pad_id=None, unk_id=None, bos_id=None, eos_id=None):
        for name, value in (("pad_id", pad_id), ("unk_id", unk_id), ("bos_id", bos_id),
                            ("eos_id", eos_id)):
            if value is not None:
                setattr(self, name, value)
        special = (self.pad_id, self.unk_id, self.bos_id, self.eos_id)
        if len(set(special)) != len(special):
            raise ValueError(f"special ids {special} must differ")
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"alphabet {alphabet!r} repeats a character")
        self.special_ids = frozenset(special)
        self.first_char_id = max(special) + 1
        self.alphabet = alphabet
        self.vocab_size = self.first_char_id + len(alphabet)
        self._ids = {c: self.first_char_id + i for i, c in enumerate(alphabet)}

    def tokenize(self, texts):
        """Lists of ids, without BOS or EOS."""
        return [[self._ids.get(c, self.unk_id) for c in text] for text in texts]

    def detokenize(self, id_lists):
        """Texts, leaving out the special ids."""
        return ["".join(self.alphabet[int(i) - self.first_char_id] for i in ids
                        if int(i) not in self.special_ids) for ids in id_lists]


def require(module):
    """The module `module`, imported; a test that needs it skips when it is not
    installed, except in CI, where `.ci/run` installs every extra and a missing
    module fails."""
    if in_ci():
        return importlib.import_module(module)
    return pytest.importorskip(module)


def shared_data(*parts):
    """A path under ../shared/data; the test is skipped when it is absent,
    except in CI, where the real data must be tested."""
    path = os.path.normpath(os.path.join(SHARED_DATA, *parts))
    if not os.path.exists(path):
        if in_ci():
            pytest.fail(f"{path} is missing, and CI must test on the real data")
        pytest.skip(f"{path} is not here")
    return path


@contextlib.contextmanager
def loopback_http(files, lifetime=120.0):
    """Serves `files` on 127.0.0.1 at a free port; yields the base URL.

    `files` maps a URL path to its bytes, or to `(bytes, declared_length)` to
    announce a longer body than is sent (a truncated download). Other paths
    answer 404. The server stops when the block ends, or by itself after
    `lifetime` seconds.
    """

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (http.server's naming)
            entry = files.get(urllib.parse.urlsplit(self.path).path)
            if entry is None:
                self.send_error(404)
                return
            body, declared = entry if isinstance(entry, tuple) else (entry, len(entry))
            self.send_response(200)
            self.send_header("Content-Length", str(declared))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    watchdog = threading.Timer(lifetime, server.shutdown)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        watchdog.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def data_mirror():
    """{URL path: bytes} of a mirror of the recipes' downloads, made from
    ../shared/data: the Multi30k .gz files as they are, and spa-eng.zip built
    like the keras.io archive (spa-eng/spa.txt and spa-eng/_about.txt)."""
    from keras_transformer.data import downloads

    files = {}
    for remote in downloads.MULTI30K.files:
        with open(shared_data("multi30k", remote.name), "rb") as file:
            files[urllib.parse.urlsplit(remote.url).path] = file.read()
    (remote,) = downloads.ANKI_SPA_ENG.files
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with gzip.open(shared_data("anki", "spa-eng", "spa.txt.gz"), "rb") as file:
            archive.writestr(remote.member, file.read())
        with open(shared_data("anki", "spa-eng", "_about.txt"), "rb") as file:
            archive.writestr("spa-eng/_about.txt", file.read())
    files[urllib.parse.urlsplit(remote.url).path] = buffer.getvalue()
    return files


def built_once(tmp_path_factory, name, build):
    """The folder `name`, built by `build(folder)` once for the whole pass.

    pytest-xdist's workers of one run share the parent of their base
    temporary folders: the first worker to get there builds the folder under a
    lock while the others wait, then every worker reads it. `build` writes into the folder it
    is given; a failed build leaves nothing behind, and the next worker tries
    again.
    """
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base folder lies in the run's own folder.
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built_once"
    shared.mkdir(exist_ok=True)
    folder = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").exists():
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".complete").touch()
    return folder
