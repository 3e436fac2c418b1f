"""The peers of the decoding benchmark (`decoding.py`): CTranslate2 and the
exported SavedModel, decoding the same weights with exactly n new tokens.

CTranslate2 (`--ctranslate2`): the model is converted with
`keras_transformer.export.ctranslate2.convert_model`, in fp32 and
int8, and decoded by `translate_batch` (its own length penalty 0.6 for beam
search, `min_decoding_length = max_decoding_length = n`) in worker processes
that import nothing else and time each call themselves. One process per
quantization, each holding one model, because on a small CPU a second model or
another runtime's threads in the same process make CTranslate2 several times
slower; and since its fastest threading setting depends on the machine, each
quantization is tried in every setting of `CTRANSLATE2_SETTINGS` and keeps the
one that decodes the shortest length fastest, so the peer is measured at its
best.

SavedModel (`--saved-model`): the model exported with `export_saved_model`,
once per search and length, with `max_output_length = n` and the batch's one
shape compiled, and its `translate_ids` signature timed: the path TF Serving
users run. With a fixed `max_output_length` its loop has the cache phases of
the library's search, as the Python path does.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common


class _Vocabulary:
    """Token strings for the benchmark's random ids: what the CTranslate2
    converter needs of a tokenizer."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.pad_id, self.bos_id, self.eos_id = common.PAD_ID, common.BOS_ID, common.EOS_ID
        self.unk_id = common.VOCABULARY.unk_id

    #: What the export's settings record as the tokenizer.
    kind = "random ids (benchmark)"

    def id_to_token(self, token_id):
        return f"t{token_id}"

    def detokenize(self, id_lists):
        return [" ".join(self.id_to_token(i) for i in ids) for ids in id_lists]


# The worker's protocol: one JSON line {"path", "pieces", "threads"}, then one
# line {"n", "beam_size"} per call, answered with {"ids", "seconds"}: the ids
# and the time translate_batch took there.
_CTRANSLATE2_WORKER = """
import json, sys, time
import ctranslate2
setup = json.loads(sys.stdin.readline())
translator = ctranslate2.Translator(setup["path"], device="cpu",
                                    intra_threads=setup["threads"])
for line in sys.stdin:
    call = json.loads(line)
    start = time.perf_counter()
    outputs = translator.translate_batch(
        setup["pieces"], beam_size=call["beam_size"], length_penalty=0.6,
        min_decoding_length=call["n"], max_decoding_length=call["n"])
    seconds = time.perf_counter() - start
    ids = [[int(token[1:]) for token in output.hypotheses[0]] for output in outputs]
    print(json.dumps({"ids": ids, "seconds": seconds}), flush=True)
"""

# The threading settings CTranslate2 is tried in: name -> (environment, intra_threads).
CTRANSLATE2_SETTINGS = {
    "2 threads, MKL": ({}, 2),
    "2 threads, CT2_USE_MKL=0": ({"CT2_USE_MKL": "0"}, 2),
    "1 thread, MKL": ({}, 1),
}


class _CTranslate2Worker:
    """One worker process: one CTranslate2 model in one threading setting."""

    def __init__(self, path, pieces, environment, threads):
        import subprocess

        self.process = subprocess.Popen(
            [sys.executable, "-c", _CTRANSLATE2_WORKER], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env={**os.environ, **environment})
        self._send({"path": path, "pieces": pieces, "threads": threads})

    def _send(self, message):
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def translate(self, n, beam_size):
        self._send({"n": n, "beam_size": beam_size})
        line = self.process.stdout.readline()
        if not line:
            sys.exit("error: a CTranslate2 worker process ended (its error is above).")
        answer = json.loads(line)
        return np.array(answer["ids"]), answer["seconds"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()


class CTranslate2Peer:
    """CTranslate2 decoding the same weights with exactly n new tokens, in
    worker processes; `translate(quantization, n, beam_size)` returns the
    (batch, n) ids and the seconds the worker measured.

    Each quantization decodes in the threading setting of `settings` that
    was fastest at greedy + beam search of `n` tokens (the second of two
    calls each; the first loads and warms up); `calibration` holds those
    times, `chosen` the settings kept. One worker runs at a time while they
    are tried.
    """

    def __init__(self, model, source, directory, n, beam_size, quantizations=("fp32", "int8"),
                 settings=CTRANSLATE2_SETTINGS):
        paths = {quantization: convert_for_ctranslate2(model, directory, quantization)
                 for quantization in quantizations}
        pieces = [[f"t{i}" for i in row] for row in np.asarray(source).tolist()]
        self.calibration = {quantization: {} for quantization in quantizations}
        for quantization, path in paths.items():
            for name, (environment, threads) in settings.items():
                worker = _CTranslate2Worker(path, pieces, environment, threads)
                try:
                    for _ in range(2):
                        seconds = sum(worker.translate(n, k)[1] for k in (1, beam_size))
                finally:
                    worker.close()
                self.calibration[quantization][name] = seconds
        self.chosen = {quantization: min(times, key=times.get)
                       for quantization, times in self.calibration.items()}
        self.workers = {quantization: _CTranslate2Worker(path, pieces,
                                                         *settings[self.chosen[quantization]])
                        for quantization, path in paths.items()}

    def translate(self, quantization, n, beam_size):
        return self.workers[quantization].translate(n, beam_size)

    def close(self):
        for worker in self.workers.values():
            worker.close()


def convert_for_ctranslate2(model, directory, quantization):
    """The model converted to a CTranslate2 directory under `directory`."""
    from keras_transformer.export.ctranslate2 import convert_model

    vocabulary = _Vocabulary(model.config.resolved_target_vocab_size)
    path = os.path.join(directory, quantization)
    convert_model(model, vocabulary, vocabulary, path,
                  quantization=None if quantization == "fp32" else quantization)
    # The benchmark's sources have no EOS (ours decodes them as they are), so
    # CTranslate2 must not append one either.
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["add_source_eos"] = False
    with open(config_path, "w") as f:
        json.dump(config, f)
    return path


def saved_model_peer(model, source, directory, beam_size, alpha):
    """A function n -> (batch, n) ids: the exported SavedModel's `translate_ids`
    signature (the path TF Serving runs) on the same weights, exported once per
    n with `max_output_length=n` and the batch's one shape compiled."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's text signatures use its ops)

    from keras_transformer import saving
    from keras_transformer.tokenizers import WORDPIECE_SPECIAL_TOKENS, SubwordTokenizer
    from keras_transformer_app.export_process import export_from_any_backend

    model_path = os.path.join(directory, "model.keras")
    if not os.path.exists(model_path):
        # The export reads a .keras file with its tokenizer beside it; the
        # signature timed here takes ids, so any vocabulary of the model's size serves.
        vocabulary = WORDPIECE_SPECIAL_TOKENS + [
            f"t{i}" for i in range(len(WORDPIECE_SPECIAL_TOKENS),
                                   model.config.resolved_target_vocab_size)]
        saving.save_tokenizers(directory, SubwordTokenizer("wordpiece", vocabulary))
        saving.save_model(model, model_path)
    source = tf.constant(np.asarray(source, "int32"))
    signatures = {}

    def translate(n):
        if n not in signatures:
            path = export_from_any_backend(
                model_path, os.path.join(directory, f"beam{beam_size}"), version=n,
                beam_size=beam_size, alpha=alpha, max_output_length=n,
                batch_sizes=(int(source.shape[0]),), lengths=(int(source.shape[1]),),
                verbose=False)
            signatures[n] = tf.saved_model.load(path).signatures["translate_ids"]
        return signatures[n](source_ids=source)["ids"].numpy()

    return translate
