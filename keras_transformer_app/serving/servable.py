"""A servable: one loaded version of an exported translation model (§6.1 search, served).

`Servable` loads a version written by `keras_transformer.export.saved_model`,
replays its warm-up requests, and runs its signatures (two, or three for an
export with `--n-best`) on lists of instances. `parse_predict_request` turns
a TensorFlow Serving REST predict body into a `PredictRequest`, checking
every instance: a client's mistake raises `RequestError` (status 4xx) that
names the instance, before anything reaches the model.
"""

import base64
import binascii
import dataclasses
import os

from keras_transformer.export import versions, warmup
from keras_transformer.export.shapes import ServingShapes

#: The signatures every export has.
SIGNATURES = ("serving_default", "translate_ids")
#: The signature of an export with `--n-best N`: N translations per sentence.
N_BEST_SIGNATURE = "translate_n_best"
_INPUT_NAMES = {"serving_default": "inputs", "translate_ids": "source_ids",
                N_BEST_SIGNATURE: "inputs"}


class RequestError(ValueError):
    """A client mistake: answered with `status` and a JSON error message."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class PredictRequest:
    """A checked predict request: the signature, whether it used the
    columnar form (`inputs`), and its instances (str sentences, or lists of
    int ids)."""

    signature: str
    columnar: bool
    instances: list


def parse_predict_request(body, limits):
    """Checks a parsed JSON predict body against TensorFlow Serving's REST API.

    Args:
        body: The parsed JSON value.
        limits: An object with `max_instances`, `max_chars` (characters of a
            sentence, ids of an id list), `vocab_size`, and optionally
            `signatures`, those it serves (default `SIGNATURES`).

    Returns:
        A `PredictRequest`.

    Raises:
        RequestError: naming what is wrong.
    """
    if not isinstance(body, dict):
        raise RequestError('The request must be a JSON object such as {"instances": [...]}.')
    signature = body.get("signature_name", "serving_default")
    served = getattr(limits, "signatures", SIGNATURES)
    if signature == N_BEST_SIGNATURE and signature not in served:
        raise RequestError(f"This model version has no {N_BEST_SIGNATURE} signature: export it "
                           "with `keras-transformer export --n-best N` to serve n-best lists.")
    if signature not in served:
        raise RequestError(f"Unknown signature_name {signature!r}: use one of "
                           f"{', '.join(served)}.")
    unknown = set(body) - {"instances", "inputs", "signature_name"}
    if unknown:
        raise RequestError(f"Unknown request field(s) {sorted(unknown)}: send \"instances\" "
                           "(row format) or \"inputs\" (columnar format).")
    if ("instances" in body) == ("inputs" in body):
        raise RequestError('Send exactly one of "instances" and "inputs".')
    columnar = "inputs" in body
    field = "inputs" if columnar else "instances"
    values = body[field]
    input_name = _INPUT_NAMES[signature]
    if columnar and isinstance(values, dict):
        if set(values) != {input_name}:
            raise RequestError(f'"inputs" must be a list or {{"{input_name}": [...]}}.')
        values = values[input_name]
    if not isinstance(values, list):
        raise RequestError(f'"{field}" must be a list, got {_json_type(values)}.')
    if not values:
        raise RequestError(f'"{field}" is empty: send at least one instance.')
    if len(values) > limits.max_instances:
        raise RequestError(f"{len(values)} instances exceed this server's limit of "
                           f"{limits.max_instances} per request: send several requests.")
    check = _id_list if signature == "translate_ids" else _sentence
    instances = [check(_unwrap(value, input_name, i), i, limits)
                 for i, value in enumerate(values)]
    return PredictRequest(signature, columnar, instances)


def _json_type(value):
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _unwrap(value, input_name, index):
    if isinstance(value, dict) and set(value) != {"b64"}:
        if set(value) != {input_name}:
            raise RequestError(f"instances[{index}] must be a value or "
                               f'{{"{input_name}": value}}, got the keys {sorted(value)}.')
        return value[input_name]
    return value


def _sentence(value, index, limits):
    if isinstance(value, dict):  # {"b64": "..."}: binary input, as TF Serving takes it
        encoded = value["b64"]
        if not isinstance(encoded, str):
            raise RequestError(f"instances[{index}].b64 must be a base64 string.")
        try:
            value = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise RequestError(f"instances[{index}].b64 is not base64 of UTF-8 text.") from None
    if not isinstance(value, str):
        raise RequestError(f"instances[{index}] must be a string (a sentence), got "
                           f"{_json_type(value)}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800"
        raise RequestError(f"instances[{index}] is not valid Unicode text (it holds a lone "
                           "surrogate).") from None
    if len(value) > limits.max_chars:
        raise RequestError(f"instances[{index}] has {len(value)} characters; this server "
                           f"takes at most {limits.max_chars} per sentence.")
    return value


def _id_list(value, index, limits):
    if not isinstance(value, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise RequestError(f"instances[{index}] must be a list of integer token ids (ids + EOS).")
    if len(value) > limits.max_chars:
        raise RequestError(f"instances[{index}] has {len(value)} ids; this server takes at "
                           f"most {limits.max_chars} per instance.")
    if any(t < 0 or t >= limits.vocab_size for t in value):
        raise RequestError(f"instances[{index}] holds ids outside the vocabulary "
                           f"(0 <= id < {limits.vocab_size}).")
    return value


class Servable:
    """One loaded version of an exported model.

    Args:
        version_path: A version folder (`saved_models/NAME/VERSION`).
        max_instances: Most instances per request.
        max_chars: Most characters per sentence (ids per id list).
    """

    engine = "saved_model"

    def __init__(self, version_path, max_instances, max_chars):
        self.loaded, self.version_path = versions.load_saved_model(version_path)
        missing = [s for s in SIGNATURES if s not in self.loaded.signatures]
        if missing:
            raise ValueError(f"{version_path!r} lacks the signature(s) {', '.join(missing)}: "
                             "it was not written by keras-transformer export.")
        self.signatures = SIGNATURES + tuple(
            s for s in (N_BEST_SIGNATURE,) if s in self.loaded.signatures)
        self.version = int(os.path.basename(os.path.normpath(self.version_path)))
        self.metadata = versions.read_metadata(self.version_path)
        self.max_instances = max_instances
        self.max_chars = max_chars
        self.vocab_size = self.metadata["config"]["vocab_size"]
        # Exports before the pad id was written padded with the config's.
        self.pad_id = self.metadata.get("pad_id", self.metadata["config"]["pad_id"])
        shapes = self.metadata.get("shapes")
        self.shapes = ServingShapes.from_dict(shapes) if shapes else None
        self.warmup_seconds = None

    def warm_up(self, threads=1, max_batch_size=None, on_progress=None):
        """Replays the version's warm-up requests (those of at most
        `max_batch_size` instances, when given); returns their number.
        `on_progress(done, total)` follows them."""
        count, self.warmup_seconds = warmup.replay_warmup_requests(
            self.loaded.signatures, self.version_path, threads=threads,
            max_batch_size=max_batch_size, on_progress=on_progress)
        return count

    def run(self, signature, instances):
        """Runs `signature` on a list of checked instances; returns one
        JSON-ready result per instance."""
        import tensorflow as tf

        function = self.loaded.signatures[signature]
        if signature == N_BEST_SIGNATURE:
            outputs = function(inputs=tf.constant(instances, dtype=tf.string))
            truncated = _truncated(outputs, len(instances))
            return [{"translations": [text.decode("utf-8", errors="replace") for text in texts],
                     "scores": [float(score) for score in scores], "truncated": flag}
                    for texts, scores, flag in zip(outputs["translations"].numpy(),
                                                   outputs["scores"].numpy(), truncated)]
        if signature == "serving_default":
            outputs = function(inputs=tf.constant(instances, dtype=tf.string))
            truncated = _truncated(outputs, len(instances))
            return [{"translations": text.decode("utf-8", errors="replace"), "truncated": flag}
                    for text, flag in zip(outputs["translations"].numpy(), truncated)]
        width = max(len(row) for row in instances)
        matrix = [row + [self.pad_id] * (width - len(row)) for row in instances]
        outputs = function(source_ids=tf.constant(matrix, dtype=tf.int32, shape=[len(matrix),
                                                                                 width]))
        truncated = _truncated(outputs, len(instances))
        return [{"ids": [int(t) for t in row if t != self.pad_id], "scores": float(score),
                 "truncated": flag}
                for row, score, flag in zip(outputs["ids"].numpy(), outputs["scores"].numpy(),
                                            truncated)]


def _truncated(outputs, count):
    # Exports before per-sentence truncation had no such output.
    if "truncated" in outputs:
        return [bool(flag) for flag in outputs["truncated"].numpy()]
    return [False] * count


def format_response(request, results):
    """The REST answer to `request`: row form (`predictions`, one object per
    instance) or columnar form (`outputs`, one list per output name)."""
    if not request.columnar:
        return {"predictions": results}
    return {"outputs": {name: [result[name] for result in results] for name in results[0]}}
