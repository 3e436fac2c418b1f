"""SavedModel export and the TF-Serving-style HTTP server. The model is built
under the current backend (JAX and PyTorch models export through a
TensorFlow-backend subprocess); the parts that do not depend on that backend
(the server, saved_model_cli, a killed export) run in the TensorFlow pass."""

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import cli
from keras_transformer.export import (
    METADATA_PATH,
    _remove_abandoned_partials,
    export_model,
    export_saved_model,
    latest_version_path,
    load_saved_model,
)
from keras_transformer.inference import Translator, beam_search
from keras_transformer.serving import serve_in_thread
from keras_transformer.training.data import synthetic_translation
from keras_transformer.training.tokenizers import SubwordTokenizer

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
CORPUS = synthetic_translation(300, seed=0)
# Real sentences of the task, an empty one, and words the vocabulary never saw.
SENTENCES = CORPUS.sources[:3] + ["", "xyzzy quux"]
SOURCE_IDS = np.array([[5, 9, 17, 3, 0, 0], [40, 3, 0, 0, 0, 0]], "int32")

# What a serving process needs: TensorFlow and tensorflow_text, nothing of ours.
FRESH_PROCESS = """
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the tokenizer ops
loaded = tf.saved_model.load(sys.argv[1])
texts = loaded.signatures["serving_default"](inputs=tf.constant(json.loads(sys.argv[2])))
ids = loaded.signatures["translate_ids"](source_ids=tf.constant(json.loads(sys.argv[3]), tf.int32))
print(json.dumps({
    "translations": [t.decode("utf-8") for t in texts["translations"].numpy()],
    "ids": ids["ids"].numpy().tolist(),
    "scores": ids["scores"].numpy().tolist(),
    "imported_keras_transformer": any(m.startswith("keras_transformer") for m in sys.modules),
}))
"""


# The server, saved_model_cli and a killed export do not depend on the backend
# a model was trained under: they run once, in the TensorFlow-backend pass.
tensorflow_pass = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="backend-independent: runs in the tensorflow pass of the suite")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A run directory (model.keras + tokenizer/) built under the current
    backend, exported from memory as version 1 with the §6.1 beam search."""
    root = tmp_path_factory.mktemp("export")
    keras.utils.set_random_seed(0)
    tokenizer = SubwordTokenizer.train(CORPUS.sources + CORPUS.targets, vocab_size=320)
    run_dir = root / "run"
    tokenizer.save(str(run_dir / "tokenizer"))
    config = kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, num_layers=1)
    model = kt.Transformer(config)
    model.save(run_dir / "model.keras")
    base = str(root / "saved_models" / "tiny")
    beam = export_model(model, tokenizer, tokenizer, base)
    return {"run_dir": str(run_dir), "base": base, "beam": beam}


@pytest.fixture(scope="module")
def exported_greedy(exported):
    """Version 2 of the same model, greedy (beam 1, α 0), from the run directory."""
    greedy = export_saved_model(exported["run_dir"], exported["base"], beam_size=1, alpha=0.0,
                                verbose=False)
    return dict(exported, greedy=greedy)


def translator(run_dir):
    model = keras.saving.load_model(os.path.join(run_dir, "model.keras"))
    return Translator(model, SubwordTokenizer.load(os.path.join(run_dir, "tokenizer")))


@tensorflow_pass
def test_versions_follow_the_tf_serving_layout(exported_greedy):
    exported = exported_greedy
    assert exported["beam"] == os.path.join(exported["base"], "1")
    assert exported["greedy"] == os.path.join(exported["base"], "2")
    assert sorted(os.listdir(exported["base"])) == ["1", "2"], "no temporary directory left"
    assert latest_version_path(exported["base"]) == exported["greedy"]
    for version, settings in (("1", (4, 0.6)), ("2", (1, 0.0))):
        with open(os.path.join(exported["base"], version, METADATA_PATH)) as f:
            metadata = json.load(f)
        assert (metadata["beam_size"], metadata["alpha"]) == settings


def test_fresh_tensorflow_process_translates_like_the_translator(exported):
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, exported["beam"], json.dumps(SENTENCES),
         json.dumps(SOURCE_IDS.tolist())],
        capture_output=True, text=True, env=QUIET, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert not served["imported_keras_transformer"]

    expected = translator(exported["run_dir"])
    assert served["translations"] == expected.translate(SENTENCES)
    assert served["translations"][3] == ""
    ids, scores = beam_search(expected.model, SOURCE_IDS, bos_id=2, eos_id=3)
    served_ids = np.array(served["ids"])
    assert served_ids.shape == ids.shape
    np.testing.assert_array_equal(served_ids, ids)
    np.testing.assert_allclose(served["scores"], scores, rtol=1e-4, atol=1e-4)


@tensorflow_pass
def test_exported_greedy_version_matches_greedy_translation(exported_greedy):
    exported = exported_greedy
    loaded, _ = load_saved_model(exported["greedy"])
    import tensorflow as tf

    served = loaded.signatures["serving_default"](inputs=tf.constant(SENTENCES))
    served = [t.decode("utf-8") for t in served["translations"].numpy()]
    assert served == translator(exported["run_dir"]).translate(SENTENCES, beam_size=1, alpha=0)


def test_exported_model_handles_an_empty_batch(exported):
    loaded, _ = load_saved_model(exported["beam"])
    import tensorflow as tf

    out = loaded.signatures["serving_default"](inputs=tf.constant([], tf.string))
    assert out["translations"].shape == (0,)
    out = loaded.signatures["translate_ids"](source_ids=tf.zeros([0, 4], tf.int32))
    assert out["ids"].shape[0] == 0 and out["scores"].shape == (0,)


def _saved_model_cli(*arguments):
    # `run` executes the graph, which needs the tf-text ops registered first.
    command = [sys.executable, "-c",
               "import sys, tensorflow_text\n"
               "from tensorflow.python.tools import saved_model_cli\n"
               "sys.argv[0] = 'saved_model_cli'\n"
               "saved_model_cli.main()", *arguments]
    return subprocess.run(command, capture_output=True, text=True, env=QUIET, timeout=300)


@tensorflow_pass
def test_saved_model_cli_shows_and_runs_the_signatures(exported):
    executable = shutil.which("saved_model_cli")
    assert executable, "saved_model_cli comes with tensorflow"
    shown = subprocess.run([executable, "show", "--dir", exported["beam"], "--all"],
                           capture_output=True, text=True, env=QUIET, timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    for text in ("signature_def['serving_default']", "signature_def['translate_ids']",
                 "inputs['inputs']", "outputs['translations']", "outputs['scores']"):
        assert text in shown.stdout

    # saved_model_cli run loads the SavedModel into a TF1 session, as
    # TensorFlow Serving does.
    sentence = CORPUS.sources[0]
    ran = _saved_model_cli("run", "--dir", exported["beam"], "--tag_set", "serve",
                           "--signature_def", "serving_default",
                           "--input_exprs", f"inputs={[sentence]!r}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    expected = translator(exported["run_dir"]).translate([sentence])[0]
    assert "Result for output key translations" in ran.stdout
    assert repr(expected.encode("utf-8")) in ran.stdout


@tensorflow_pass
def test_killed_export_leaves_no_version_directory(exported, tmp_path):
    base = tmp_path / "saved_models" / "killed"
    command = [sys.executable, "-m", "keras_transformer.export", exported["run_dir"], str(base),
               "--version", "7", "--quiet"]
    process = subprocess.Popen(command, cwd=REPOSITORY, env=dict(QUIET, KERAS_BACKEND="tensorflow"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if base.exists() and any(name.startswith(".partial-") for name in os.listdir(base)):
            break
        time.sleep(0.02)
    assert process.poll() is None, "the export ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (base / "7").exists()
    with pytest.raises(FileNotFoundError, match="no version directory"):
        latest_version_path(str(base))
    # The next export removes what the killed one left.
    _remove_abandoned_partials(str(base))
    assert os.listdir(base) == []


@tensorflow_pass
def test_export_refuses_to_overwrite_a_version(exported):
    with pytest.raises(FileExistsError, match="never overwritten"):
        export_saved_model(exported["run_dir"], exported["base"], version=1)


@tensorflow_pass
@pytest.mark.parametrize("arguments, error, message", [
    (dict(version=0), ValueError, "positive integer"),
    (dict(beam_size=0), ValueError, "beam_size"),
    (dict(alpha=-1.0), ValueError, "alpha"),
])
def test_export_rejects_bad_options(exported, tmp_path, arguments, error, message):
    with pytest.raises(error, match=message):
        export_saved_model(exported["run_dir"], str(tmp_path / "out"), **arguments)


@tensorflow_pass
def test_export_command_reports_mistakes_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", str(tmp_path / "missing"), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: No model at {str(tmp_path / 'missing')!r}."


@tensorflow_pass
def test_loading_a_directory_without_versions_says_how_to_fix_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="keras-transformer export"):
        load_saved_model(str(tmp_path / "empty"))


# The HTTP server.

LIMITS = dict(max_instances=8, max_chars=1000, max_body_bytes=4096)


@pytest.fixture(scope="module")
def server(exported_greedy):
    # The highest version, 2: greedy search.
    server = serve_in_thread(exported_greedy["base"], port=0, log=False, **LIMITS)
    host, port = server.server_address[:2]
    server.url = f"http://{host}:{port}/v1/models/tiny"
    yield server
    server.shutdown()
    server.server_close()


def request(url, body=None, method=None):
    """(status, parsed JSON) of a real HTTP request; body: bytes, or JSON-able."""
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@tensorflow_pass
def test_server_binds_loopback_and_reports_the_highest_version(server):
    assert server.server_address[0] == "127.0.0.1"
    status, body = request(server.url)
    assert status == 200
    assert body["model_version_status"][0]["version"] == "2"
    assert body["model_version_status"][0]["state"] == "AVAILABLE"
    status, body = request(server.url + "/metadata")
    assert status == 200 and body["metadata"]["beam_size"] == 1


GREEDY = dict(beam_size=1, alpha=0.0)


@tensorflow_pass
def test_server_predicts_like_the_translator(server, exported):
    expected = translator(exported["run_dir"]).translate(SENTENCES, **GREEDY)
    assert request(server.url + ":predict", {"instances": SENTENCES}) == (
        200, {"predictions": expected})
    assert request(server.url + "/versions/2:predict", {"inputs": SENTENCES}) == (
        200, {"outputs": expected})
    status, body = request(server.url + ":predict",
                           {"instances": [{"inputs": s} for s in SENTENCES[:2]]})
    assert (status, body["predictions"]) == (200, expected[:2])


@tensorflow_pass
def test_server_translates_token_ids(server, exported):
    ids, scores = beam_search(translator(exported["run_dir"]).model, SOURCE_IDS, 2, 3, **GREEDY)
    rows = [[int(t) for t in row if t] for row in SOURCE_IDS]
    status, body = request(server.url + ":predict",
                           {"signature_name": "translate_ids", "instances": rows})
    assert status == 200
    assert [p["ids"] for p in body["predictions"]] == [[int(t) for t in r if t] for r in ids]
    np.testing.assert_allclose([p["scores"] for p in body["predictions"]], scores, atol=1e-4)


@tensorflow_pass
@pytest.mark.parametrize("body, status, message", [
    (b"not json", 400, "not valid JSON"),
    (b'{"instances": ["\xff"]}', 400, "not UTF-8"),
    ([], 400, "JSON object"),
    ({}, 400, "exactly one of"),
    ({"instances": "a sentence"}, 400, "must be a list"),
    ({"instances": [3]}, 400, "must be a string"),
    ({"instances": [None]}, 400, "must be a string"),
    ({"instances": ["a"] * 9}, 400, "limit of 8"),
    ({"instances": ["x" * 1001]}, 400, "at most 1000"),
    ({"instances": [" ".join(CORPUS.sources[0].split()[:1] * 80)]}, 400,
     "longer than the model accepts"),
    ({"instances": [{"b64": "/w=="}]}, 400, "not UTF-8"),
    ({"instances": [{"b64": "@@"}]}, 400, "not valid base64"),
    ({"instances": ["a"], "inputs": ["a"]}, 400, "exactly one of"),
    ({"instances": ["a"], "signature_name": "nope"}, 400, "Unknown signature_name"),
    ({"instances": ["a"], "extra": 1}, 400, "Unknown request field"),
    ({"instances": [[1, 99999]], "signature_name": "translate_ids"}, 400, "outside the vocab"),
    ({"instances": [[-1]], "signature_name": "translate_ids"}, 400, "outside the vocab"),
    ({"instances": [[1.5]], "signature_name": "translate_ids"}, 400, "integer token ids"),
    ({"instances": [list(range(4, 80))], "signature_name": "translate_ids"}, 400, "at most 64"),
    ({"instances": ["a" * 250] * 17}, 413, "at most 4096"),
])
def test_server_answers_bad_requests_with_an_error_and_keeps_serving(server, body, status,
                                                                     message):
    got_status, got = request(server.url + ":predict", body)
    assert got_status == status
    assert message in got["error"]
    assert request(server.url + ":predict", {"instances": [CORPUS.sources[0]]})[0] == 200


@tensorflow_pass
def test_server_answers_unknown_paths_with_404(server):
    assert request(server.url + "/versions/1:predict", {"instances": ["a"]})[0] == 404
    assert request(server.url.replace("tiny", "other") + ":predict", {"instances": ["a"]})[0] == 404
    assert request(server.url + "/nothing")[0] == 404


@tensorflow_pass
def test_server_handles_concurrent_requests(server, exported):
    sentences = CORPUS.sources[:16]
    expected = translator(exported["run_dir"]).translate(sentences, **GREEDY)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(
            lambda s: request(server.url + ":predict", {"instances": [s]}), sentences))
    assert [status for status, _ in answers] == [200] * 16
    assert [body["predictions"][0] for _, body in answers] == expected


@tensorflow_pass
def test_serve_command_reports_a_missing_model_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", str(tmp_path / "nothing")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: No SavedModel directory")
