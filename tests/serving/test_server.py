"""The TF-Serving-style server (`keras_transformer_app.serving`) over a
tiny exported model, once as a SavedModel and once as a CTranslate2 export (every
test runs for both engines): client mistakes down to malformed HTTP answered with a
4xx JSON error and the server still serving, batching that answers what
serial requests answer, a full batch queue answered 503, versions picked up
only once complete and warmed up, a 503 that says why once every version is
removed, a SIGTERM that answers the requests in flight, and Prometheus metrics.
The batching scheduler alone is tested in `test_batching.py`, the manager
alone in `test_manager.py`.

The server does not depend on the backend a model was trained under: this
file runs once, in the TensorFlow-backend pass of the suite. One model is
exported for the module with a single compiled shape (batch 4 × width 32),
so each version's warm-up compiles once; every socket is on 127.0.0.1 and
has a timeout, and every wait is on the event awaited, with a deadline.
"""

import base64
import collections
import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import keras
import numpy as np
import pytest
from helpers import REPOSITORY, require

from keras_transformer_app.serving.batching import BatchingParameters, QueueFullError
from keras_transformer_app.serving.options import ServerOptions
from keras_transformer_app.serving.server import TranslationServer

pytestmark = pytest.mark.once("tensorflow")  # backend-independent

HOST = "127.0.0.1"
NAME = "tiny"
MODEL = f"/v1/models/{NAME}"
PREDICT = MODEL + ":predict"
VOCAB_SIZE = 320
# The longest input served, ids + EOS (the export's one width).
MAX_SOURCE_LENGTH = 32
MAX_INSTANCES, MAX_CHARS, MAX_BODY_BYTES = 8, 400, 1 << 17
HEADER_TIMEOUT = BODY_TIMEOUT = 1.0
# Generous bounds for a shared, loaded 2-core machine.
LOAD_TIMEOUT = 300.0  # loading and warming up one version
ANSWER_TIMEOUT = 60.0  # any one HTTP answer
GOOD_SENTENCE = "nusi kave wipe vera peka"


# A raw HTTP/1.1 client: the malformed requests below are malformed on
# purpose, so no HTTP library may tidy them up.

Response = collections.namedtuple("Response", ["status", "headers", "body"])


def http(method, path, body=b"", headers=(), content_length=True):
    """The bytes of an HTTP/1.1 request (a Content-Length unless told not to)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}", *headers]
    if content_length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def json_body(value):
    """Bytes as they are, str as UTF-8, anything else as JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value).encode("utf-8")


def read_response(sock):
    """The next response on `sock`, or None when the server closed the
    connection without answering."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            assert not data, f"the connection closed inside a response: {data[:300]!r}"
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers["content-length"])  # every answer of this server has one
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Response(status, headers, body[:length])


def exchange(port, data):
    """Sends `data` on a new connection and reads one response (None: closed
    without an answer)."""
    with socket.create_connection((HOST, port), timeout=ANSWER_TIMEOUT) as sock:
        sock.sendall(data)
        return read_response(sock)


def request(port, method, path, body=None):
    """A well-formed request: (status, parsed JSON body or text)."""
    response = exchange(port, http(method, path, b"" if body is None else json_body(body)))
    assert response is not None, f"{method} {path}: closed without an answer"
    if response.headers["content-type"].startswith("application/json"):
        return response.status, json.loads(response.body)
    return response.status, response.body.decode("utf-8")


def predict(port, body, path=PREDICT):
    return request(port, "POST", path, body)


def metrics_text(port):
    status, text = request(port, "GET", "/monitoring/prometheus/metrics")
    assert status == 200
    return text


def metric_value(text, name):
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} is not in the metrics"
    return float(match.group(1))


def wait_for(condition, timeout, what, interval=0.1):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(interval)


# The exported model and the server.


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Replaces the suite's per-test seeding for this module: these tests use
    no Keras randomness (the model fixture seeds itself), and each
    `tf.random.set_seed` clears TensorFlow's kernel cache, which slows the
    next signature call of the in-process server enough that over 90 tests
    it would be most of the file's time."""
    keras.config.set_dtype_policy("float32")
    yield


@pytest.fixture(scope="module")
def network():
    """A tiny model with random weights, scaled up so that its greedy
    translations differ from sentence to sentence, and its tokenizer."""
    import keras_transformer as kt
    from keras_transformer.data.corpora import synthetic_translation
    from keras_transformer.tokenizers import SubwordTokenizer

    keras.utils.set_random_seed(0)
    corpus = synthetic_translation(300, seed=0)
    tokenizer = SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=VOCAB_SIZE)
    assert tokenizer.vocab_size == VOCAB_SIZE
    network = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=VOCAB_SIZE, num_layers=1))
    rng = np.random.default_rng(0)
    for weight in network.weights:
        if not weight.path.endswith(("gamma", "beta")):  # layer norms keep theirs
            weight.assign(rng.normal(0.0, 0.5, weight.shape).astype("float32"))
    # Padding and BOS out of the softmax, as CTranslate2's export puts them: both
    # engines then score from the same distribution.
    bias = network.target_embedding.output_bias
    values = np.array(keras.ops.convert_to_numpy(bias))
    values[[tokenizer.pad_id, tokenizer.bos_id]] = -1e9
    bias.assign(values)
    return types.SimpleNamespace(network=network, tokenizer=tokenizer, corpus=corpus)


def export(network, base, engine):
    """`network` exported greedy to `base/1` for `engine`: a SavedModel with one
    compiled shape, or a CTranslate2 export with the same search and limits."""
    search = dict(beam_size=1, alpha=0.0, max_output_length=16)
    if engine == "saved_model":
        from keras_transformer.export.saved_model import export_model

        return export_model(network.network, network.tokenizer, network.tokenizer, base,
                            batch_sizes=(4,), lengths=(MAX_SOURCE_LENGTH,), **search)
    require("ctranslate2")
    from keras_transformer.export.ctranslate2 import export_model

    return export_model(network.network, network.tokenizer, network.tokenizer, base,
                        max_source_length=MAX_SOURCE_LENGTH, **search)


@pytest.fixture(scope="module")
def exported(network, tmp_path_factory):
    """`exported(engine)`: the path of the tiny model's version 1 for `engine`,
    exported on first use."""
    paths = {}

    def version_path(engine):
        if engine not in paths:
            base = str(tmp_path_factory.mktemp(engine) / "saved_models" / NAME)
            paths[engine] = export(network, base, engine)
        return paths[engine]

    return version_path


@pytest.fixture(scope="module", params=["saved_model", "ctranslate2"])
def model(request, network, exported):
    """The tiny model exported as `saved_models/tiny/1` for one engine."""
    version_path = exported(request.param)
    base = os.path.dirname(version_path)
    # A sentence over the longest input (it is truncated), short enough to be taken.
    long_sentence = " ".join(network.corpus.sources[:7])[:MAX_CHARS].rsplit(" ", 1)[0]
    assert len(network.tokenizer.tokenize([long_sentence])[0]) + 1 > MAX_SOURCE_LENGTH
    return types.SimpleNamespace(base=base, version_path=version_path, engine=request.param,
                                 tokenizer=network.tokenizer, corpus=network.corpus,
                                 long_sentence=long_sentence)


def start_server(base, log, **options):
    settings = dict(port=0, max_instances=MAX_INSTANCES, max_chars=MAX_CHARS,
                    max_body_bytes=MAX_BODY_BYTES, header_timeout=HEADER_TIMEOUT,
                    body_timeout=BODY_TIMEOUT, file_system_poll_wait_seconds=0.0,
                    batching=BatchingParameters(batch_timeout_micros=20_000))
    settings.update(options)
    return TranslationServer(base, ServerOptions(**settings), log=log.append).start()


@pytest.fixture(scope="module")
def server(model):
    """The module's server on version 1: `port`, `server` (the
    TranslationServer), `log` (its log lines) and `good` (the answer to a
    predict request of GOOD_SENTENCE)."""
    log = []
    server = start_server(model.base, log)
    try:
        assert server.options.host == HOST
        server.wait_until_available(LOAD_TIMEOUT)
        port = server.port
        status, good = predict(port, {"instances": [GOOD_SENTENCE]})
        assert status == 200, good
        yield types.SimpleNamespace(port=port, server=server, log=log, good=good)
    finally:
        server.shutdown()


def assert_still_serving(server):
    """A good request on a new connection gets the usual answer."""
    assert predict(server.port, {"instances": [GOOD_SENTENCE]}) == (200, server.good)


# Malformed requests: each answered with a 4xx JSON error, then a good
# request on a new connection answered as usual.


def _keep_alive_then_stalled_headers(port):
    """A good request, then on the same connection headers that never end."""
    with socket.create_connection((HOST, port), timeout=ANSWER_TIMEOUT) as sock:
        sock.sendall(http("POST", PREDICT, json_body({"instances": [GOOD_SENTENCE]})))
        first = read_response(sock)
        assert first is not None and first.status == 200
        sock.sendall(f"POST {PREDICT} HTTP/1.1\r\nHost: {HOST}\r\n".encode())
        return read_response(sock)


def _post(value, path=PREDICT):
    return http("POST", path, json_body(value))


def _ids(*instances, **fields):
    return _post({"signature_name": "translate_ids", "instances": list(instances), **fields})


_CHUNKED = ("Transfer-Encoding: chunked",)
_B64 = base64.b64encode

MALFORMED = [
    # (id, request bytes or a function of the port that returns the
    #  response; status; a phrase of the error)
    ("not JSON", _post(b"not json"), 400, "not valid JSON"),
    ("not UTF-8", _post(b'{"instances": ["\xff\xfe"]}'), 400, "not UTF-8"),
    ("truncated JSON", _post(b'{"instances": ["a"'), 400, "not valid JSON"),
    ("JSON list", _post([GOOD_SENTENCE]), 400, "must be a JSON object"),
    ("JSON string", _post(b'"a sentence"'), 400, "must be a JSON object"),
    ("JSON null", _post(b"null"), 400, "must be a JSON object"),
    ("no instances or inputs", _post({}), 400, "exactly one of"),
    ("signature only", _post({"signature_name": "serving_default"}), 400, "exactly one of"),
    ("instances and inputs", _post({"instances": ["a"], "inputs": ["a"]}), 400,
     "exactly one of"),
    ("unknown field", _post({"instances": ["a"], "extra": 1}), 400, "Unknown request field"),
    ("unknown signature", _post({"instances": ["a"], "signature_name": "nope"}), 400,
     "Unknown signature_name"),
    ("signature name a list", _ids([5], signature_name=["translate_ids"]), 400,
     "Unknown signature_name"),
    ("n-best of a version exported without it",
     _post({"signature_name": "translate_n_best", "instances": ["a"]}), 400,
     "no translate_n_best signature: export it with `keras-transformer export --n-best N`"),
    ("instances a string", _post({"instances": "a sentence"}), 400, "must be a list"),
    ("instances an object", _post({"instances": {"inputs": "a"}}), 400, "must be a list"),
    ("instances empty", _post({"instances": []}), 400, "is empty"),
    ("inputs empty", _post({"inputs": []}), 400, "is empty"),
    ("too many instances", _post({"instances": ["a"] * (MAX_INSTANCES + 1)}), 400,
     f"limit of {MAX_INSTANCES}"),
    ("instance a number", _post({"instances": [3]}), 400, "must be a string"),
    ("instance null", _post({"instances": ["a", None]}), 400, "instances[1] must be a string"),
    ("instance a boolean", _post({"instances": [True]}), 400, "must be a string"),
    ("instance a nested list", _post({"instances": [["a"]]}), 400, "must be a string"),
    ("sentence too long", _post({"instances": ["x" * (MAX_CHARS + 1)]}), 400,
     f"at most {MAX_CHARS}"),
    # The escape as JSON text: json.loads makes a lone surrogate of it.
    ("lone surrogate", _post(b'{"instances": ["\\ud800"]}'), 400, "lone surrogate"),
    ("JSON nested 50,000 deep",
     _post(b'{"instances": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"), 400, "nested too deeply"),
    ("NaN", _post(b'{"instances": [NaN]}'), 400, "NaN is not a JSON number"),
    ("Infinity", _post(b'{"signature_name": "translate_ids", "instances": [[Infinity]]}'), 400,
     "Infinity is not a JSON number"),
    ("-Infinity", _post(b'{"signature_name": "translate_ids", "instances": [[-Infinity]]}'),
     400, "-Infinity is not a JSON number"),
    ("id 10**30", _ids([5, 10**30]), 400, "outside the vocabulary"),
    ("20,000-digit id",
     _post(b'{"signature_name": "translate_ids", "instances": [[' + b"7" * 20_000 + b"]]}"),
     400, "not valid JSON"),
    ("negative id", _ids([5, -1]), 400, "outside the vocabulary"),
    ("id = vocabulary size", _ids([5, VOCAB_SIZE]), 400, "outside the vocabulary"),
    ("float id", _ids([5, 1.5]), 400, "list of integer token ids"),
    ("integral float id", _ids([2.0]), 400, "list of integer token ids"),
    ("boolean id", _ids([5, True]), 400, "list of integer token ids"),
    ("id list a string", _ids("5 9 17"), 400, "list of integer token ids"),
    ("id list a number", _ids(5), 400, "list of integer token ids"),
    ("id list nested", _ids([[5]]), 400, "list of integer token ids"),
    ("id list too long", _ids([5] * (MAX_CHARS + 1)), 400, f"at most {MAX_CHARS} per instance"),
    ("b64 not base64", _post({"instances": [{"b64": "@@not base64@@"}]}), 400, "not base64"),
    ("b64 of non-UTF-8", _post({"instances": [{"b64": _B64(b"\xff\xfe").decode()}]}), 400,
     "not base64 of UTF-8"),
    ("b64 a number", _post({"instances": [{"b64": 5}]}), 400, "b64 must be a base64 string"),
    ("b64 sentence too long",
     _post({"instances": [{"b64": _B64(b"x" * (MAX_CHARS + 1)).decode()}]}), 400,
     f"at most {MAX_CHARS}"),
    ("instance object with a wrong key", _post({"instances": [{"text": "a"}]}), 400,
     'must be a value or {"inputs": value}'),
    ("b64 object with another key", _post({"instances": [{"b64": "YQ==", "x": 1}]}), 400,
     "must be a value or"),
    ("ids object with the text key", _ids({"inputs": [5]}), 400,
     'must be a value or {"source_ids": value}'),
    ("columnar inputs with a wrong key", _post({"inputs": {"text": ["a"]}}), 400,
     '"inputs" must be a list or {"inputs": [...]}'),
    ("columnar ids with the text key",
     _post({"signature_name": "translate_ids", "inputs": {"inputs": [[5]]}}), 400,
     '"inputs" must be a list or {"source_ids": [...]}'),
    # HTTP framing.
    ("Content-Length over max_body_bytes",
     # Only the headers: the answer comes from Content-Length, before any body.
     http("POST", PREDICT, headers=(f"Content-Length: {MAX_BODY_BYTES + 1}",),
          content_length=False), 413, f"at most {MAX_BODY_BYTES}"),
    ("chunked body over max_body_bytes",
     # No last chunk: the server reads every byte sent before it answers.
     http("POST", PREDICT, headers=_CHUNKED, content_length=False)
     + b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in
                [b"x" * 60_000, b"x" * 60_000, b"x" * (MAX_BODY_BYTES - 120_000 + 1)]),
     413, f"exceeds {MAX_BODY_BYTES} bytes"),
    ("Content-Length not a number",
     http("POST", PREDICT, b"{}", headers=("Content-Length: abc",), content_length=False), 400,
     "Malformed HTTP request"),
    ("Content-Length negative",
     http("POST", PREDICT, b"{}", headers=("Content-Length: -2",), content_length=False), 400,
     "Malformed HTTP request"),
    ("Content-Length twice, different",
     http("POST", PREDICT, b"{}", headers=("Content-Length: 2", "Content-Length: 3"),
          content_length=False), 400, "Malformed HTTP request"),
    # Without Content-Length or chunked framing a request has no body (the
    # bytes after the headers would start the next request).
    ("body without Content-Length",
     http("POST", PREDICT, json_body({"instances": [GOOD_SENTENCE]}), content_length=False),
     400, "not valid JSON"),
    ("chunk size not hexadecimal",
     http("POST", PREDICT, headers=_CHUNKED, content_length=False) + b"zz\r\nabc\r\n0\r\n\r\n",
     400, "Malformed HTTP request"),
    ("unsupported Transfer-Encoding",
     http("POST", PREDICT, b"{}", headers=("Transfer-Encoding: gzip",), content_length=False),
     400, "Malformed HTTP request"),
    # Over 16 KiB of headers that have not ended (the server's bound on an
    # incomplete request head).
    ("20 KB header",
     f"POST {PREDICT} HTTP/1.1\r\nHost: {HOST}\r\nX-Padding: ".encode() + b"a" * 20_000, 400,
     "Malformed HTTP request"),
    ("request line garbage", b"GARBAGE\r\n\r\n", 400, "Malformed HTTP request"),
    ("request line without version", f"GET {MODEL}\r\n\r\n".encode(), 400,
     "Malformed HTTP request"),
    ("request target not ASCII", b"GET /v1/models/\xff HTTP/1.1\r\nHost: x\r\n\r\n", 400,
     "Malformed HTTP request"),
    ("header line without a colon",
     f"GET {MODEL} HTTP/1.1\r\nHost: {HOST}\r\nnot a header\r\n\r\n".encode(), 400,
     "Malformed HTTP request"),
    ("HTTP/1.1 without Host", f"GET {MODEL} HTTP/1.1\r\n\r\n".encode(), 400,
     "Malformed HTTP request"),
    ("Host twice", f"GET {MODEL} HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n".encode(), 400,
     "more than one Host header"),
    ("Host invalid", f"GET {MODEL} HTTP/1.1\r\nHost: a b@c/d\r\n\r\n".encode(), 400,
     "an invalid Host header"),
    ("chunk extensions over max_body_bytes",
     # A 20-byte body in chunks whose extensions run to 1 MB: the raw bytes count.
     http("POST", PREDICT, headers=_CHUNKED, content_length=False)
     + b"".join(b"2;x=%s\r\nab\r\n" % (b"e" * 100_000) for _ in range(10)), 413,
     f"exceeds {MAX_BODY_BYTES} bytes"),
    # Methods and paths.
    ("GET on :predict", http("GET", PREDICT), 405, "Method GET is not allowed here; use POST"),
    ("PUT on :predict", _post({"instances": ["a"]}).replace(b"POST", b"PUT", 1), 405,
     "Method PUT is not allowed here; use POST"),
    ("POST on the status URL", _post({"instances": ["a"]}, MODEL), 405, "use GET"),
    ("POST on the metadata URL", _post({}, MODEL + "/metadata"), 405, "use GET"),
    ("POST on the metrics URL", _post({}, "/monitoring/prometheus/metrics"), 405, "use GET"),
    ("unknown path", http("GET", "/nothing/here"), 404, "No such endpoint"),
    # Routed on the path as sent: %2F is no separator, so a proxy's path rules hold.
    ("metrics path with %2F", http("GET", "/monitoring%2Fprometheus%2Fmetrics"), 404,
     "No such endpoint"),
    ("model path with %2F", http("GET", "/v1/models%2F" + NAME), 404, "No such endpoint"),
    ("unknown path under the model", http("GET", MODEL + "/signatures"), 404,
     "No such endpoint"),
    ("unknown model name", _post({"instances": ["a"]}, "/v1/models/other:predict"), 404,
     "No such endpoint"),
    ("version not served", _post({"instances": ["a"]}, MODEL + "/versions/7:predict"), 404,
     "Version 7 of tiny is not AVAILABLE"),
    ("version not numeric", _post({"instances": ["a"]}, MODEL + "/versions/abc:predict"), 404,
     "is not a version number"),
    ("version of 30 digits", http("GET", MODEL + "/versions/" + "9" * 30), 404,
     "is not a version number"),
    ("status of a version not known", http("GET", MODEL + "/versions/7"), 404,
     "Version 7 of tiny is not known"),
    ("metadata of a version not served", http("GET", MODEL + "/versions/7/metadata"), 404,
     "is not AVAILABLE"),
    # Timeouts.
    ("body shorter than Content-Length",
     http("POST", PREDICT, headers=("Content-Length: 100",), content_length=False)
     + b'{"instances": ', 408, f"did not arrive within {BODY_TIMEOUT:g} s"),
    ("headers never end (keep-alive connection)", _keep_alive_then_stalled_headers, 408,
     f"did not arrive within {HEADER_TIMEOUT:g} s"),
]


@pytest.mark.parametrize("what, status, phrase", [case[1:] for case in MALFORMED],
                         ids=[case[0] for case in MALFORMED])
@pytest.mark.backs("docs/serving.md",
                   "every client mistake, down to malformed HTTP, gets a 4xx JSON")
@pytest.mark.backs("docs/serving.md", "exported without it answers 400 with how to export one")
def test_malformed_request_is_answered_with_a_json_error_and_the_server_keeps_serving(
        server, what, status, phrase):
    if callable(what):
        response = what(server.port)
    else:
        response = exchange(server.port, what)
    assert response is not None, "the server closed the connection without answering"
    assert response.status == status, response
    assert response.headers["content-type"] == "application/json"
    error = json.loads(response.body)
    assert list(error) == ["error"] and isinstance(error["error"], str)
    assert phrase in error["error"]
    assert_still_serving(server)


def test_head_is_get_without_the_body_and_a_405_names_the_methods_allowed(server):
    with socket.create_connection((HOST, server.port), timeout=ANSWER_TIMEOUT) as sock:
        sock.sendall(http("HEAD", MODEL, content_length=False) + http("GET", MODEL))
        data = b""
        while data.count(b"\r\n\r\n") < 2:  # HEAD's head, then GET's head
            data += sock.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and rest.startswith(b"HTTP/1.1 200 ")
        length = int(re.search(rb"content-length: (\d+)", head).group(1))
        assert length > 0  # GET's length, with no body after it
    for method, path, allow in [("GET", PREDICT, "POST"), ("POST", MODEL, "GET, HEAD"),
                                ("DELETE", "/monitoring/prometheus/metrics", "GET, HEAD")]:
        response = exchange(server.port, http(method, path))
        assert (response.status, response.headers["allow"]) == (405, allow)


def test_an_absolute_form_target_is_served_like_its_path(server):
    response = exchange(server.port, f"GET http://example.org:8501{MODEL} HTTP/1.1\r\n"
                                     f"Host: {HOST}\r\n\r\n".encode())
    assert response.status == 200
    assert json.loads(response.body)["model_version_status"][0]["state"] == "AVAILABLE"


def test_there_are_at_least_40_malformed_cases():
    assert len(MALFORMED) >= 40


def test_headers_that_never_end_on_a_new_connection_get_408(server):
    response = exchange(server.port, f"POST {PREDICT} HTTP/1.1\r\nHost: {HOST}\r\n".encode())
    assert response is not None, "closed without an answer"
    assert response.status == 408
    assert "did not arrive" in json.loads(response.body)["error"]


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(server):
    with socket.create_connection((HOST, server.port), timeout=ANSWER_TIMEOUT) as sock:
        start = time.monotonic()
        assert sock.recv(1024) == b""
        assert HEADER_TIMEOUT * 0.9 <= time.monotonic() - start < ANSWER_TIMEOUT
    assert_still_serving(server)


def test_20_kb_header_in_one_piece_is_refused(server):
    response = exchange(server.port, http("POST", PREDICT,
                                          json_body({"instances": [GOOD_SENTENCE]}),
                                          headers=("X-Padding: " + "a" * 20_000,)))
    assert response.status == 400


def errors_counted(port):
    """Requests answered with a 4xx or 5xx, as the metrics count them."""
    counts = re.findall(rf'^keras_transformer_request_count_total\{{model_name="{NAME}",'
                        r'status="[45]\d\d"\} (\S+)$', metrics_text(port), re.MULTILINE)
    return sum(float(count) for count in counts)


def test_broken_framing_is_not_a_server_fault(server):
    before, errors = len(server.log), errors_counted(server.port)
    response = exchange(server.port, http("POST", PREDICT, headers=_CHUNKED, content_length=False)
                        + b"zz\r\nabc\r\n0\r\n\r\n")
    assert response.status == 400  # from the protocol, which closes the connection
    # The request's own task ends after that answer, on the closed connection:
    # it logs a fault, if any, before it counts its status.
    wait_for(lambda: errors_counted(server.port) > errors, ANSWER_TIMEOUT,
             "the request's task counting its answer", interval=0.02)
    assert not any("Internal error" in line for line in server.log[before:])
    assert 'status="500"' not in metrics_text(server.port)


def test_chunked_body_is_read(server):
    body = json_body({"instances": [GOOD_SENTENCE]})
    pieces = [body[:7], body[7:20], body[20:]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"
    response = exchange(server.port, http("POST", PREDICT, headers=_CHUNKED,
                                          content_length=False) + chunked)
    assert (response.status, json.loads(response.body)) == (200, server.good)


@pytest.mark.backs("docs/serving.md", "predicts in flight; the batch queue")
def test_predicts_over_max_concurrent_requests_get_503_with_retry_after(server, monkeypatch):
    """docs/serving.md, "Limits and timeouts": `--max-concurrent-requests` predicts in
    flight, 503 beyond."""
    limit = server.server.options.max_concurrent_requests
    monkeypatch.setattr(server.server, "_in_flight", limit)  # as if `limit` were waiting
    response = exchange(server.port, _post({"instances": [GOOD_SENTENCE]}))
    assert (response.status, response.headers["retry-after"]) == (503, "1")
    assert "Too many requests in flight" in json.loads(response.body)["error"]
    monkeypatch.undo()
    assert_still_serving(server)


@pytest.mark.backs("docs/serving.md", "a server fault gets a 500 whose body says")
def test_a_server_fault_is_a_500_that_says_nothing_of_internals(server, monkeypatch):
    """docs/serving.md, "Errors": a server fault gets a 500 whose body says nothing of
    internals (the log has the traceback)."""
    def fault(*args):
        raise RuntimeError("secret detail of the batch scheduler")

    before = len(server.log)
    monkeypatch.setattr(server.server.scheduler, "submit", fault)
    response = exchange(server.port, _post({"instances": [GOOD_SENTENCE]}))
    monkeypatch.undo()
    assert response.status == 500
    assert "secret" not in response.body.decode() and "Internal server error" in json.loads(
        response.body)["error"]
    assert any("secret detail" in line and "Traceback" in line
               for line in server.log[before:])
    assert_still_serving(server)


def test_a_port_in_use_is_named_in_the_error(model):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"Cannot listen on {HOST}:{port}: Address already "
                                          "in use; another server holds it"):
            start_server(model.base, [], port=port)


@pytest.mark.backs("docs/serving.md", "full, the answer is 503 with `Retry-After`")
def test_a_full_queue_is_answered_503_with_retry_after(server, monkeypatch):
    def full(*args):
        raise QueueFullError("The batch queue is full (test); retry later.")

    monkeypatch.setattr(server.server.scheduler, "submit", full)
    response = exchange(server.port, _post({"instances": [GOOD_SENTENCE]}))
    assert response.status == 503
    assert response.headers["retry-after"] == "1"
    assert "queue is full" in json.loads(response.body)["error"]
    monkeypatch.undo()
    assert_still_serving(server)


# Answers.


def test_request_forms_give_the_same_translations(server, model):
    sentences = [GOOD_SENTENCE] + model.corpus.sources[:3]
    status, rows = predict(server.port, {"instances": sentences})
    assert status == 200 and len(rows["predictions"]) == 4
    assert rows["predictions"][0] == server.good["predictions"][0]
    assert all(set(p) == {"translations", "truncated"} and p["truncated"] is False
               for p in rows["predictions"])
    # An untrained model whose translations still depend on the sentence.
    assert len({p["translations"] for p in rows["predictions"]}) > 1
    columnar = {name: [p[name] for p in rows["predictions"]] for name in rows["predictions"][0]}
    for body in ({"inputs": sentences}, {"inputs": {"inputs": sentences}},
                 {"signature_name": "serving_default", "inputs": sentences}):
        assert predict(server.port, body) == (200, {"outputs": columnar})
    for instances in ([{"inputs": s} for s in sentences],
                      [{"b64": base64.b64encode(s.encode()).decode()} for s in sentences]):
        assert predict(server.port, {"instances": instances}) == (200, rows)
    assert predict(server.port, {"instances": sentences}, MODEL + "/versions/1:predict") == (
        200, rows)


def test_empty_inputs_translate_to_empty_outputs(server):
    status, body = predict(server.port, {"signature_name": "translate_ids", "instances": [[]]})
    assert status == 200
    assert body == {"predictions": [{"ids": [], "scores": 0.0, "truncated": False}]}
    status, body = predict(server.port, {"instances": ["", GOOD_SENTENCE]})
    assert status == 200
    assert body["predictions"] == [{"translations": "", "truncated": False},
                                   server.good["predictions"][0]]


def test_an_over_long_sentence_is_truncated_and_the_others_answered_as_alone(server, model):
    sentences = [GOOD_SENTENCE, model.long_sentence, model.corpus.sources[5]]
    alone = [predict(server.port, {"instances": [s]})[1]["predictions"][0] for s in sentences]
    assert [p["truncated"] for p in alone] == [False, True, False]
    status, body = predict(server.port, {"instances": sentences})
    assert status == 200
    assert body["predictions"] == alone
    # The same with ids: the long row keeps its first 31 ids and EOS.
    eos = model.tokenizer.eos_id
    rows = [ids + [eos] for ids in model.tokenizer.tokenize(sentences)]
    assert len(rows[1]) > MAX_SOURCE_LENGTH
    alone = [predict(server.port, {"signature_name": "translate_ids", "instances": [row]})[1]
             ["predictions"][0] for row in rows]
    assert [p["truncated"] for p in alone] == [False, True, False]
    cut = rows[1][:MAX_SOURCE_LENGTH - 1] + [eos]
    assert predict(server.port, {"signature_name": "translate_ids", "instances": [cut]})[1][
        "predictions"][0] == dict(alone[1], truncated=False)
    status, body = predict(server.port, {"signature_name": "translate_ids", "instances": rows})
    assert status == 200 and len(body["predictions"]) == 3
    for got, expected in zip(body["predictions"], alone):
        assert got["ids"] == expected["ids"] and got["truncated"] == expected["truncated"]
        assert got["scores"] == pytest.approx(expected["scores"], rel=1e-5, abs=1e-5)


def test_concurrent_requests_get_the_serial_answers(server, model):
    sentences = model.corpus.sources[10:18]
    eos = model.tokenizer.eos_id
    id_rows = [ids + [eos] for ids in model.tokenizer.tokenize(model.corpus.sources[18:26])]
    bodies = ([{"instances": [s]} for s in sentences]
              + [{"signature_name": "translate_ids", "instances": [row]} for row in id_rows])
    serial = [predict(server.port, body) for body in bodies]
    assert all(status == 200 for status, _ in serial)
    assert len({body["predictions"][0]["translations"] for _, body in serial[:8]}) > 1

    batches = metric_value(metrics_text(server.port), "keras_transformer_batch_size_count")
    barrier = threading.Barrier(len(bodies), timeout=ANSWER_TIMEOUT)

    def send(body):
        barrier.wait()
        return predict(server.port, body)

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(send, bodies))
    for (status, got), (_, expected) in zip(answers, serial):
        assert status == 200
        got, expected = got["predictions"][0], expected["predictions"][0]
        assert got.keys() == expected.keys()
        for key in got:
            if key == "scores":
                assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-5)
            else:
                assert got[key] == expected[key]
    ran = metric_value(metrics_text(server.port), "keras_transformer_batch_size_count") - batches
    assert 2 <= ran < len(bodies), f"{ran} batches for {len(bodies)} requests: none merged"


def test_both_engines_answer_alike(network, exported):
    """One model's SavedModel and CTranslate2 export give the same translations,
    ids, flags and (to float32 round-off) scores."""
    from keras_transformer_app.serving.ctranslate2 import CTranslate2Servable
    from keras_transformer_app.serving.servable import Servable

    servables = [kind(exported(engine), MAX_INSTANCES, MAX_CHARS) for kind, engine in (
        (Servable, "saved_model"), (CTranslate2Servable, "ctranslate2"))]
    sentences = network.corpus.sources[30:34]
    ours, theirs = (servable.run("serving_default", sentences) for servable in servables)
    assert ours == theirs
    eos = network.tokenizer.eos_id
    rows = [ids + [eos] for ids in network.tokenizer.tokenize(sentences)]
    ours, theirs = (servable.run("translate_ids", rows) for servable in servables)
    assert [(r["ids"], r["truncated"]) for r in ours] == [(r["ids"], r["truncated"])
                                                          for r in theirs]
    assert [r["scores"] for r in theirs] == pytest.approx([r["scores"] for r in ours], rel=1e-4)


# Status, metadata, metrics.


def test_status_and_metadata_follow_tf_serving(server, model):
    status_json = {"model_version_status": [{
        "version": "1", "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""}}]}
    assert request(server.port, "GET", MODEL) == (200, status_json)
    assert request(server.port, "GET", MODEL + "/versions/1") == (200, status_json)
    for path in (MODEL + "/metadata", MODEL + "/versions/1/metadata"):
        status, body = request(server.port, "GET", path)
        assert status == 200
        assert body["model_spec"] == {"name": NAME, "version": "1"}
        metadata = body["metadata"]
        if model.engine == "saved_model":
            assert metadata["shapes"] == {"batch_sizes": [4], "lengths": [MAX_SOURCE_LENGTH]}
        else:  # CTranslate2 compiles no shapes
            assert (metadata["engine"], metadata["quantization"]) == ("ctranslate2", "float32")
        assert set(metadata["signatures"]) == {"serving_default", "translate_ids"}
        assert (metadata["beam_size"], metadata["alpha"]) == (1, 0.0)
        assert metadata["max_source_tokens"] == MAX_SOURCE_LENGTH - 1
        assert metadata["config"]["vocab_size"] == VOCAB_SIZE


def test_prometheus_metrics(server):
    assert predict(server.port, {"instances": [GOOD_SENTENCE]})[0] == 200
    assert predict(server.port, {"instances": []})[0] == 400
    assert request(server.port, "GET", "/nothing")[0] == 404
    response = exchange(server.port, http("GET", "/monitoring/prometheus/metrics"))
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.body.decode("utf-8")
    for status in ("200", "400", "404"):
        line = re.search(rf'^keras_transformer_request_count_total\{{model_name="{NAME}",'
                         rf'status="{status}"\}} (\S+)$', text, re.MULTILINE)
        assert line and float(line.group(1)) >= 1, f"no count of status {status}"
    buckets = [line for line in text.splitlines()
               if line.startswith("keras_transformer_request_latency_seconds_bucket{")]
    assert any(f'model_name="{NAME}"' in line and 'signature="serving_default"' in line
               for line in buckets)
    assert re.search(r'^keras_transformer_batch_size_bucket\{le="4.0"\} ', text, re.MULTILINE)
    assert metric_value(text, "keras_transformer_batch_size_count") >= 1
    assert metric_value(text, "keras_transformer_queue_depth") == 0
    assert re.search(rf'^keras_transformer_warmup_seconds\{{model_name="{NAME}",version="1"\}} ',
                     text, re.MULTILINE)


# Versions.


class Polls:
    """Counts a manager's polls of its base path, so that a test can wait for
    polls that began after it changed the base path."""

    def __init__(self, manager):
        self._condition = threading.Condition()
        self._begun = self._ended = 0
        poll = manager.poll

        def counted_poll():
            with self._condition:
                self._begun += 1
            try:
                poll()
            finally:
                with self._condition:
                    self._ended += 1
                    self._condition.notify_all()

        manager.poll = counted_poll  # the polling thread looks it up on each poll

    def wait(self, count=1):
        """Waits until `count` polls that begin after this call have ended
        (polls run one after another: once poll number begun + count has
        ended, so have the `count` polls after this call)."""
        with self._condition:
            last = self._begun + count
            assert self._condition.wait_for(lambda: self._ended >= last, ANSWER_TIMEOUT), (
                f"{count} polls did not end within {ANSWER_TIMEOUT} s")


@pytest.mark.backs("docs/serving.md", "until the first version is AVAILABLE, predict answers 503")
def test_a_new_version_is_served_once_complete_and_warmed_up(model, tmp_path, monkeypatch):
    base = tmp_path / NAME
    shutil.copytree(model.version_path, base / "1")
    log = []
    # The first version's loading waits for the checks of the loading state below:
    # a CTranslate2 export can load and warm up before a first request arrives.
    checked, open_version = threading.Event(), TranslationServer._open

    def held_open(server, version_path):
        checked.wait(LOAD_TIMEOUT)
        return open_version(server, version_path)

    monkeypatch.setattr(TranslationServer, "_open", held_open)
    polling = start_server(str(base), log, file_system_poll_wait_seconds=0.2)
    port = polling.port
    try:
        # Bound at once; loading and warming up go on in the background.
        status, body = request(port, "GET", MODEL)
        assert status == 200 and body["model_version_status"][0]["state"] in ("START", "LOADING")
        response = exchange(port, _post({"instances": [GOOD_SENTENCE]}))
        assert response.status == 503 and response.headers["retry-after"] == "1"
        assert "warming up" in json.loads(response.body)["error"]
        checked.set()
        polling.wait_until_available(LOAD_TIMEOUT)
        polls = Polls(polling.manager)
        status, answer = predict(port, {"instances": [GOOD_SENTENCE]})
        assert status == 200

        # (a) An incomplete version (no saved_model.pb or CTranslate2 settings yet)
        # is never loaded.
        shutil.copytree(base / "1", base / "2", ignore=shutil.ignore_patterns(
            "saved_model.pb", "keras_transformer.json"))
        polls.wait(2)
        assert request(port, "GET", MODEL)[1] == {"model_version_status": [{
            "version": "1", "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""}}]}
        assert request(port, "GET", MODEL + "/versions/2")[0] == 404
        assert predict(port, {"instances": [GOOD_SENTENCE]}) == (200, answer)

        # (b) A version written as an export writes it: complete in a hidden
        # folder, then renamed.
        partial = base / f".partial-3-{os.getpid()}-test"
        shutil.copytree(model.version_path, partial)
        polls.wait()
        assert polling.manager.servable.version == 1, "a hidden folder is no version"
        os.rename(partial, base / "3")

        def served():
            status, body = request(port, "GET", MODEL)
            assert status == 200
            states = {s["version"]: s["state"] for s in body["model_version_status"]}
            # Version 1 answers until version 3 is AVAILABLE.
            if states.get("3") != "AVAILABLE":
                assert states["1"] == "AVAILABLE"
                assert predict(port, {"instances": [GOOD_SENTENCE]}) == (200, answer)
            return states.get("3") == "AVAILABLE"

        wait_for(served, LOAD_TIMEOUT, "version 3 AVAILABLE", interval=0.5)
        assert request(port, "GET", MODEL)[1] == {"model_version_status": [
            {"version": "3", "state": "AVAILABLE",
             "status": {"error_code": "OK", "error_message": ""}},
            {"version": "1", "state": "END",
             "status": {"error_code": "OK", "error_message": ""}}]}
        assert predict(port, {"instances": [GOOD_SENTENCE]}) == (200, answer)
        assert predict(port, {"instances": [GOOD_SENTENCE]},
                       MODEL + "/versions/3:predict") == (200, answer)
        status, body = predict(port, {"instances": [GOOD_SENTENCE]},
                               MODEL + "/versions/1:predict")
        assert status == 404 and "version 3 is" in body["error"]
        assert request(port, "GET", MODEL + "/metadata")[1]["model_spec"]["version"] == "3"
        assert request(port, "GET", MODEL + "/versions/2")[0] == 404

        # Served only after its warm-up.
        assert polling.manager.servable.version == 3
        assert polling.manager.servable.warmup_seconds is not None
        replayed = [i for i, line in enumerate(log)
                    if line.startswith("Replayed ") and "of version 3" in line]
        available = [i for i, line in enumerate(log) if line.startswith("Version 3 AVAILABLE")]
        assert replayed and available and replayed[0] < available[0], log
        assert not any("Internal error" in line or "failed" in line for line in log), log
    finally:
        polling.shutdown()


def _write_placeholder_version(path):
    """A folder that `versions.is_version` takes for a SavedModel version."""
    os.makedirs(path / "assets.extra")
    for name in ("saved_model.pb", "assets.extra/keras_transformer.json"):
        (path / name).write_text("{}")


@pytest.mark.backs("docs/serving.md", "predict answers 503 with an error that says why")
def test_with_every_version_removed_predict_answers_503_saying_why(tmp_path, monkeypatch):
    base = tmp_path / NAME
    for version in (1, 2):
        _write_placeholder_version(base / str(version))

    def load(server, version_path):  # no model: what the manager needs of a servable
        return types.SimpleNamespace(version=int(os.path.basename(version_path)),
                                     warmup_seconds=0.0)

    monkeypatch.setattr(TranslationServer, "_load_servable", load)
    polling = start_server(str(base), [])  # polls only when the test calls poll()
    port = polling.port
    try:
        polling.wait_until_available(ANSWER_TIMEOUT)
        shutil.rmtree(base / "2")
        polling.manager.poll()
        assert polling.manager.servable.version == 1
        shutil.rmtree(base / "1")
        polling.manager.poll()
        response = exchange(port, _post({"instances": [GOOD_SENTENCE]}))
        assert response.status == 503 and response.headers["retry-after"] == "1"
        assert json.loads(response.body) == {"error": (
            f"No version of {NAME} is AVAILABLE: every version was removed from {base}; one "
            "copied or exported there is served.")}
        status, body = request(port, "GET", MODEL)
        assert status == 200 and [(s["version"], s["state"]) for s in
                                  body["model_version_status"]] == [("2", "END"), ("1", "END")]
        text = metrics_text(port)
        for version in (1, 2):
            assert metric_value(text, "keras_transformer_load_attempts_total{model_name="
                                      f'"{NAME}",outcome="success",version="{version}"}}') == 1
    finally:
        polling.shutdown()


# SIGTERM.


def _free_port():
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _refused(port):
    """Whether a connection to `port` is refused (nothing listens there)."""
    try:
        socket.create_connection((HOST, port), timeout=ANSWER_TIMEOUT).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture(scope="module")
def sigterm_run(model, tmp_path_factory):
    """`keras-transformer serve` in a process, sent SIGTERM with 8 requests
    in flight: 4 whose body is not all sent yet (their request has surely
    begun) and 4 complete ones of 8 sentences. Their responses, the exit
    status and the output."""
    port = _free_port()
    output_path = tmp_path_factory.mktemp("sigterm") / "serve.log"
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    with open(output_path, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "keras_transformer_app", "serve", model.base, "--host", HOST,
             "--port", str(port), "--file-system-poll-wait-seconds", "0"],
            cwd=REPOSITORY, env=environment, stdout=output, stderr=subprocess.STDOUT)
    sockets = []
    try:
        def available():
            assert process.poll() is None, output_path.read_text()
            try:
                status, body = request(port, "GET", MODEL)
            except OSError:
                return False
            return status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"

        wait_for(available, LOAD_TIMEOUT, "the serve process AVAILABLE", interval=0.5)
        stalled_body = json_body({"instances": [GOOD_SENTENCE]})
        full_body = json_body({"instances": model.corpus.sources[:MAX_INSTANCES]})
        for i in range(8):
            sock = socket.create_connection((HOST, port), timeout=ANSWER_TIMEOUT)
            sockets.append(sock)
            if i < 4:
                sock.sendall(http("POST", PREDICT, stalled_body)[:-5])
            else:
                sock.sendall(http("POST", PREDICT, full_body))
        # Answered only after the 8 requests have begun: their bytes were in
        # the server's sockets before this connection was made, and the event
        # loop reads every ready connection (parsing a request's headers and
        # starting its task) before it runs the tasks so started, in order.
        assert request(port, "GET", MODEL)[0] == 200
        process.send_signal(signal.SIGTERM)
        # The shutdown has begun once the server closes its listening socket:
        # only then are the 4 bodies completed.
        wait_for(lambda: _refused(port), ANSWER_TIMEOUT, "the listening socket closing",
                 interval=0.02)
        for sock in sockets[:4]:
            sock.sendall(stalled_body[-5:])
        responses = []
        for sock in sockets:
            try:
                responses.append(read_response(sock))
            except OSError as error:
                responses.append(error)
        try:
            returncode = process.wait(timeout=ANSWER_TIMEOUT)
        except subprocess.TimeoutExpired:
            returncode = None
        return types.SimpleNamespace(port=port, responses=responses, returncode=returncode,
                                     output=output_path.read_text())
    finally:
        for sock in sockets:
            sock.close()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=ANSWER_TIMEOUT)


@pytest.mark.backs("docs/serving.md", "stops accepting connections, answers the requests in flight")
def test_sigterm_answers_the_requests_in_flight(sigterm_run):
    run = sigterm_run
    assert run.returncode is not None, "the server did not exit within the time limit"
    for i, response in enumerate(run.responses):
        assert isinstance(response, Response), (i, response, run.output[-3000:])
        assert response.status == 200, (i, response)
        predictions = json.loads(response.body)["predictions"]
        assert len(predictions) == (1 if i < 4 else MAX_INSTANCES)
    assert "Internal error" not in run.output
    with pytest.raises(OSError):  # closed for good
        socket.create_connection((HOST, run.port), timeout=5).close()


def test_sigterm_exits_with_status_143_after_the_requests_in_flight(sigterm_run):
    assert sigterm_run.returncode == 143  # 128 + SIGTERM, as a shell reports it
