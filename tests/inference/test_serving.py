"""The TF-Serving-style HTTP server over an exported SavedModel. It does not
depend on the backend a model was trained under: it runs once, in the
TensorFlow-backend pass of the suite."""

import concurrent.futures
import json
import urllib.error
import urllib.request

import keras
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.inference import beam_search
from keras_transformer.inference.serving import serve_in_thread

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="backend-independent: runs in the tensorflow pass of the suite")

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


def test_server_binds_loopback_and_reports_the_highest_version(server):
    assert server.server_address[0] == "127.0.0.1"
    status, body = request(server.url)
    assert status == 200
    assert body["model_version_status"][0]["version"] == "2"
    assert body["model_version_status"][0]["state"] == "AVAILABLE"
    status, body = request(server.url + "/metadata")
    assert status == 200 and body["metadata"]["beam_size"] == 1


GREEDY = dict(beam_size=1, alpha=0.0)


def test_server_predicts_like_the_translator(server, exported, reference_translator):
    expected = reference_translator.translate(exported["sentences"], **GREEDY)
    assert request(server.url + ":predict", {"instances": exported["sentences"]}) == (
        200, {"predictions": expected})
    assert request(server.url + "/versions/2:predict", {"inputs": exported["sentences"]}) == (
        200, {"outputs": expected})
    status, body = request(server.url + ":predict",
                           {"instances": [{"inputs": s} for s in exported["sentences"][:2]]})
    assert (status, body["predictions"]) == (200, expected[:2])


def test_server_translates_token_ids(server, exported, reference_translator):
    tokenizer = reference_translator.target_tokenizer
    ids, scores = beam_search(reference_translator.model, np.array(exported["source_ids"]),
                              tokenizer.bos_id, tokenizer.eos_id, **GREEDY)
    rows = [[int(t) for t in row if t != tokenizer.pad_id] for row in exported["source_ids"]]
    status, body = request(server.url + ":predict",
                           {"signature_name": "translate_ids", "instances": rows})
    assert status == 200
    assert [p["ids"] for p in body["predictions"]] == [
        [int(t) for t in row if t != tokenizer.pad_id] for row in ids]
    np.testing.assert_allclose([p["scores"] for p in body["predictions"]], scores, atol=1e-4)


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
    ({"instances": [" ".join(["kave"] * 80)]}, 400, "longer than the model accepts"),
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
def test_server_answers_bad_requests_with_an_error_and_keeps_serving(server, exported, body,
                                                                     status, message):
    got_status, got = request(server.url + ":predict", body)
    assert got_status == status
    assert message in got["error"]
    good = {"instances": [exported["sentences"][0]]}
    assert request(server.url + ":predict", good)[0] == 200


def test_server_answers_unknown_paths_with_404(server):
    assert request(server.url + "/versions/1:predict", {"instances": ["a"]})[0] == 404
    assert request(server.url.replace("tiny", "other") + ":predict", {"instances": ["a"]})[0] == 404
    assert request(server.url + "/nothing")[0] == 404


def test_server_handles_concurrent_requests(server, exported, reference_translator):
    sentences = exported["corpus"].sources[:16]
    expected = reference_translator.translate(sentences, **GREEDY)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(
            lambda s: request(server.url + ":predict", {"instances": [s]}), sentences))
    assert [status for status, _ in answers] == [200] * 16
    assert [body["predictions"][0] for _, body in answers] == expected


def test_serve_command_reports_a_missing_model_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", str(tmp_path / "nothing")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: No SavedModel directory")
