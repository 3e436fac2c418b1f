"""TensorFlow Serving's warm-up records for an exported model (§6.1 search, served).

The exported search compiles with XLA once per input shape
(`keras_transformer.export.shapes`). TensorFlow Serving replays the
requests in a version's `assets.extra/tf_serving_warmup_requests` (a TFRecord
file of `PredictionLog` protos) when it loads the version, before it reports
it AVAILABLE, so no client ever waits for a compilation. `write_warmup_requests`
writes one `translate_ids` request per compiled shape, then one
`serving_default` request (its tokenizer ops start up on the first call),
and, for an export with `translate_n_best` (whose N-best search compiles
apart), one request of that signature per shape, with sentences whose token
count falls in each width (`sentences_for_widths`), with the protos of
`tensorflow-serving-api`; the built-in server replays the same file with `replay_warmup_requests`.
"""

import concurrent.futures
import os
import threading
import time

import numpy as np

#: Where TensorFlow Serving looks for warm-up requests in a version folder.
WARMUP_PATH = os.path.join("assets.extra", "tf_serving_warmup_requests")
#: TensorFlow Serving reads at most this many warm-up records.
MAX_WARMUP_RECORDS = 1000


def warmup_inputs(batch_size, width, eos_id):
    """(batch_size, width) int32 encoder inputs that fill the width with EOS.

    Every row is `width` ids long, so the request runs at exactly that
    compiled shape; a trained model answers an input of nothing but EOS with
    a short output, so the replay costs little beyond the compilation,
    where a repeated word would decode a long one.
    """
    return np.full((batch_size, width), eos_id, "int32")


def sentences_for_widths(tokenizer, widths, word):
    """{width: sentence} for each compiled source width: `word` repeated so
    that the sentence's ids + EOS are more than the next smaller width and at
    most this one, so the text signature runs it at exactly this width. A
    width no repetition reaches is left out (its shapes then compile on first
    use)."""
    sentences, lower = {}, 0
    for width in sorted(widths):
        for copies in range(width - 1, 0, -1):
            sentence = " ".join([word] * copies)
            count = len(tokenizer.tokenize([sentence])[0])
            if lower < count + 1 <= width:
                sentences[width] = sentence
                break
            if count + 1 <= lower:
                break
        lower = width
    return sentences


def write_warmup_requests(version_path, shapes, eos_id, sentence, model_name="",
                          n_best_sentences=None):
    """Writes one `translate_ids` predict request per shape of `shapes` (a
    `ServingShapes`) and one `serving_default` request with `sentence` to
    `version_path/WARMUP_PATH`, then, with `n_best_sentences`, one
    `translate_n_best` request per shape whose width it holds; returns the
    file's path.

    Args:
        version_path: The version folder being written.
        shapes: The export's `ServingShapes`.
        eos_id: The source side's end-of-sentence id.
        sentence: A short source sentence for the text signature.
        model_name: The model name written in the requests' `model_spec`.
        n_best_sentences: None, or {width: sentence} (`sentences_for_widths`)
            for the `translate_n_best` signature.
    """
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    pairs = shapes.shapes()
    requests = [("translate_ids", "source_ids", warmup_inputs(batch, width, eos_id))
                for batch, width in pairs]
    requests.append(("serving_default", "inputs", np.asarray([sentence], dtype=object)))
    requests += [("translate_n_best", "inputs",
                  np.asarray([n_best_sentences[width]] * batch, dtype=object))
                 for batch, width in pairs if width in (n_best_sentences or {})]
    if len(requests) > MAX_WARMUP_RECORDS:
        raise ValueError(f"{len(requests)} warm-up requests ({len(pairs)} compiled shapes): "
                         f"TensorFlow Serving replays at most {MAX_WARMUP_RECORDS} warm-up "
                         "records; use fewer batch sizes or lengths.")
    path = os.path.join(version_path, WARMUP_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for signature, name, value in requests:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.model_spec.signature_name = signature
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def read_warmup_requests(version_path):
    """The predict requests of a version's warm-up file, as a list of
    `(signature_name, {input_name: np.ndarray})`; [] when it has none."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = os.path.join(version_path, WARMUP_PATH)
    if not os.path.exists(path):
        return []
    requests = []
    for record in tf.data.TFRecordDataset(path).take(MAX_WARMUP_RECORDS):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        if log.WhichOneof("log_type") != "predict_log":
            raise ValueError(f"{path}: only predict warm-up records are supported, got "
                             f"{log.WhichOneof('log_type')!r}.")
        request = log.predict_log.request
        inputs = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
        requests.append((request.model_spec.signature_name or "serving_default", inputs))
    return requests


def replay_warmup_requests(signatures, version_path, threads=1, max_batch_size=None,
                           on_progress=None):
    """Runs every warm-up request of a version, as TensorFlow Serving does
    at load.

    Args:
        signatures: The loaded SavedModel's `signatures`.
        version_path: The version folder.
        threads: Requests run at once (XLA compiles one shape per thread).
        max_batch_size: When given, requests of more instances are skipped: a
            server that never runs larger batches need not compile them.
        on_progress: Optional `on_progress(done, total)`, called after each
            request (from the thread that ran it).

    Returns:
        `(number of requests, seconds)`.
    """
    import tensorflow as tf

    requests = read_warmup_requests(version_path)
    if max_batch_size is not None:
        requests = [request for request in requests
                    if all(len(value) <= max_batch_size for value in request[1].values())]
    start = time.perf_counter()

    done, lock = [0], threading.Lock()

    def run(request):
        signature, inputs = request
        signatures[signature](**{name: tf.constant(value) for name, value in inputs.items()})
        if on_progress is not None:
            with lock:
                done[0] += 1
                on_progress(done[0], len(requests))

    # Largest shapes first: they take longest, so the threads finish together.
    requests.sort(key=lambda request: -max(value.size for value in request[1].values()))
    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        for _ in pool.map(run, requests):
            pass
    return len(requests), time.perf_counter() - start
