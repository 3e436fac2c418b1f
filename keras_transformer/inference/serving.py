"""An HTTP server for exported translation models, following TensorFlow Serving's REST API.

It serves the highest version of a `saved_models/NAME/` directory written by
`keras_transformer.inference.export` (the model of §3 with the beam search of §6.1 in
the graph), with TensorFlow and tensorflow_text only:

    GET  /v1/models/NAME                      version status
    GET  /v1/models/NAME/metadata             signatures and export settings
    POST /v1/models/NAME:predict              {"instances": ["ein Satz", ...]}
                                              -> {"predictions": ["a sentence", ...]}
    POST /v1/models/NAME/versions/V:predict   the same, for the version served

Requests may also use the columnar form `{"inputs": [...]}` (answered with
`{"outputs": [...]}`) and `"signature_name": "translate_ids"` with instances
that are lists of token ids (encoder inputs: ids + EOS), answered with
`{"ids": [...], "scores": s}` per instance.

Bad requests (not JSON, wrong types, too many instances, over-long or
non-UTF-8 strings, sentences over the model's length) get status 400 and a
JSON `{"error": "..."}`; a body over the size limit gets 413. The server keeps
serving after any of them. It binds 127.0.0.1 unless told otherwise, and
handles requests concurrently (one thread each).

    keras-transformer serve saved_models/quickstart --port 8501
"""

import base64
import binascii
import http.server
import json
import os
import re
import sys
import threading
import time

from keras_transformer import validation
from keras_transformer.inference import saved_model

DEFAULT_PORT = 8501
DEFAULT_MAX_INSTANCES = 64
DEFAULT_MAX_CHARS = 2000
DEFAULT_MAX_BODY_BYTES = 1 << 20
_SIGNATURES = ("serving_default", "translate_ids")


class RequestError(ValueError):
    """A client mistake: answered with `status` and a JSON error message."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


class TranslationService:
    """The exported model behind the server: checks requests and runs signatures.

    Args:
        path: `saved_models/NAME` (its highest version is served) or a version
            directory.
        max_instances: Most sentences (or id lists) per request.
        max_chars: Most characters per sentence.
    """

    def __init__(self, path, max_instances=DEFAULT_MAX_INSTANCES, max_chars=DEFAULT_MAX_CHARS):
        validation.check_positive_int("max_instances", max_instances)
        validation.check_positive_int("max_chars", max_chars)
        self.loaded, self.version_path = saved_model.load_saved_model(path)
        missing = [s for s in _SIGNATURES if s not in self.loaded.signatures]
        if missing:
            raise ValueError(
                f"{self.version_path!r} lacks the signature(s) {', '.join(missing)}: it was not "
                "written by keras-transformer export."
            )
        self.version = os.path.basename(os.path.normpath(self.version_path))
        self.metadata = saved_model.read_metadata(self.version_path)
        self.max_instances = max_instances
        self.max_chars = max_chars
        self.vocab_size = self.metadata["config"]["vocab_size"]
        self.max_source_length = self.metadata["config"]["max_length"]
        # Exports before the pad id was written padded with the config's.
        self.pad_id = self.metadata.get("pad_id", self.metadata["config"]["pad_id"])

    def predict(self, request):
        """Answers a parsed predict request (a dict) with a JSON-ready dict."""
        import tensorflow as tf

        if not isinstance(request, dict):
            raise RequestError('The request must be a JSON object such as {"instances": [...]}.')
        signature = request.get("signature_name") or "serving_default"
        if signature not in _SIGNATURES:
            raise RequestError(f"Unknown signature_name {signature!r}: use one of {_SIGNATURES}.")
        unknown = set(request) - {"instances", "inputs", "signature_name"}
        if unknown:
            raise RequestError(f"Unknown request field(s) {sorted(unknown)}: send \"instances\" "
                               "(row format) or \"inputs\" (columnar format).")
        if ("instances" in request) == ("inputs" in request):
            raise RequestError('Send exactly one of "instances" and "inputs".')
        columnar = "inputs" in request
        values = request["inputs" if columnar else "instances"]
        input_name = "inputs" if signature == "serving_default" else "source_ids"
        if isinstance(values, dict) and columnar:
            if set(values) != {input_name}:
                raise RequestError(f'"inputs" must be a list or {{"{input_name}": [...]}}.')
            values = values[input_name]
        if not isinstance(values, list):
            raise RequestError(f'"{"inputs" if columnar else "instances"}" must be a list, got '
                               f"{type(values).__name__}.")
        if len(values) > self.max_instances:
            raise RequestError(f"{len(values)} instances exceed this server's limit of "
                               f"{self.max_instances} per request: send several requests.")
        values = [self._unwrap(value, input_name, i) for i, value in enumerate(values)]

        if signature == "serving_default":
            sentences = [self._sentence(value, i) for i, value in enumerate(values)]
            outputs = self._call(signature, inputs=tf.constant(sentences, dtype=tf.string))
            predictions = [text.decode("utf-8", errors="replace")
                           for text in outputs["translations"].numpy()]
            key = "outputs" if columnar else "predictions"
            return {key: predictions}

        matrix = self._id_matrix(values)
        outputs = self._call(signature, source_ids=tf.constant(matrix, dtype=tf.int32)
                             if matrix else tf.zeros([0, 0], tf.int32))
        ids = [[int(t) for t in row if t != self.pad_id] for row in outputs["ids"].numpy()]
        scores = [float(s) for s in outputs["scores"].numpy()]
        if columnar:
            return {"outputs": {"ids": ids, "scores": scores}}
        return {"predictions": [{"ids": i, "scores": s} for i, s in zip(ids, scores)]}

    def status(self):
        return {"model_version_status": [{
            "version": self.version, "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""},
        }]}

    def _call(self, signature, **inputs):
        import tensorflow as tf

        try:
            return self.loaded.signatures[signature](**inputs)
        except tf.errors.InvalidArgumentError as error:
            # The graph's own checks (e.g. a sentence over max_length tokens).
            found = re.search(r"assertion failed: \[([^\]]*)\]", error.message)
            message = found.group(1) if found else error.message.strip().splitlines()[0]
            raise RequestError(message) from None

    @staticmethod
    def _unwrap(value, input_name, index):
        if isinstance(value, dict):
            if set(value) == {"b64"}:
                return value
            if set(value) != {input_name}:
                raise RequestError(f"instances[{index}] must be a value or "
                                   f'{{"{input_name}": value}}, got keys {sorted(value)}.')
            return value[input_name]
        return value

    def _sentence(self, value, index):
        if isinstance(value, dict):  # {"b64": "..."}: binary input, as TF Serving takes it
            try:
                raw = base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise RequestError(f"instances[{index}].b64 is not valid base64.") from None
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError(f"instances[{index}] is not UTF-8 text.") from None
        if not isinstance(value, str):
            raise RequestError(f"instances[{index}] must be a string (a sentence), got "
                               f"{type(value).__name__}.")
        if len(value) > self.max_chars:
            raise RequestError(f"instances[{index}] has {len(value)} characters; this server "
                               f"takes at most {self.max_chars} per sentence.")
        return value

    def _id_matrix(self, values):
        rows = []
        for index, row in enumerate(values):
            if not isinstance(row, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in row
            ):
                raise RequestError(f"instances[{index}] must be a list of integer token ids.")
            if len(row) > self.max_source_length:
                raise RequestError(f"instances[{index}] has {len(row)} ids; the model takes at "
                                   f"most {self.max_source_length} (ids + EOS).")
            if any(t < 0 or t >= self.vocab_size for t in row):
                raise RequestError(f"instances[{index}] holds ids outside the vocabulary "
                                   f"(0 <= id < {self.vocab_size}).")
            rows.append(row)
        width = max((len(row) for row in rows), default=0)
        return [row + [self.pad_id] * (width - len(row)) for row in rows] if width else []


def make_server(path, host="127.0.0.1", port=DEFAULT_PORT, name=None,
                max_instances=DEFAULT_MAX_INSTANCES, max_chars=DEFAULT_MAX_CHARS,
                max_body_bytes=DEFAULT_MAX_BODY_BYTES, log=True):
    """A `ThreadingHTTPServer` serving the model at `path` as NAME (default: the
    directory's name). Port 0 picks a free port (`server.server_address`).
    Call `serve_forever()` (or run it in a thread) and `shutdown()`."""
    service = TranslationService(path, max_instances=max_instances, max_chars=max_chars)
    if name is None:  # saved_models/NAME, or saved_models/NAME/VERSION
        base = os.path.normpath(path)
        if os.path.samefile(base, service.version_path) and base.split(os.sep)[-1].isdigit():
            base = os.path.dirname(base)
        name = os.path.basename(os.path.abspath(base))
    prefix = f"/v1/models/{name}"
    version_prefix = f"{prefix}/versions/{service.version}"

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "keras-transformer"
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            if self.path in (prefix, version_prefix):
                self._reply(200, service.status())
            elif self.path in (prefix + "/metadata", version_prefix + "/metadata"):
                self._reply(200, {"model_spec": {"name": name, "version": service.version},
                                  "metadata": service.metadata})
            else:
                self._not_found()

        def do_POST(self):
            if self.path not in (prefix + ":predict", version_prefix + ":predict"):
                self._discard_body()
                return self._not_found()
            try:
                request = self._read_json()
                self._reply(200, service.predict(request))
            except RequestError as error:
                self._reply(error.status, {"error": str(error)})
            except Exception as error:  # a server fault: report it, keep serving
                self._reply(500, {"error": f"{type(error).__name__}: {error}"})

        def _read_json(self):
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self.close_connection = True
                raise RequestError("A predict request needs a Content-Length header.", 411)
            length = int(length)
            if length > max_body_bytes:
                self.close_connection = True  # the unread body stays on this connection
                raise RequestError(f"The request body has {length} bytes; this server takes "
                                   f"at most {max_body_bytes}.", 413)
            body = self.rfile.read(length)
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError("The request body is not UTF-8 text.") from None
            try:
                return json.loads(text)
            except json.JSONDecodeError as error:
                raise RequestError(f"The request body is not valid JSON: {error}.") from None

        def _discard_body(self):
            length = self.headers.get("Content-Length", "")
            if length.isdigit() and int(length) <= max_body_bytes:
                self.rfile.read(int(length))
            else:
                self.close_connection = True

        def _not_found(self):
            self._reply(404, {"error": f"No such endpoint {self.path!r}: this server serves "
                                       f"{prefix} (GET) and {prefix}:predict (POST)."})

        def _reply(self, status, payload):
            body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            if log:
                sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.address_string()} "
                                 f"{format % args}\n")

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.model_name = name
    server.service = service
    return server


def serve(path, host="127.0.0.1", port=DEFAULT_PORT, name=None, **limits):
    """Serves until interrupted (Ctrl-C)."""
    server = make_server(path, host=host, port=port, name=name, **limits)
    address, bound_port = server.server_address[:2]
    print(f"Serving {server.model_name} version {server.service.version} "
          f"({server.service.version_path}) at http://{address}:{bound_port}"
          f"/v1/models/{server.model_name} (POST :predict)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def serve_in_thread(path, **kwargs):
    """Starts a server on a daemon thread; returns it (stop with `shutdown()`)."""
    server = make_server(path, **kwargs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
