"""SavedModel export (§6.1 decoding in the graph): the exported signatures give
the Python path's translations, in a process that has only TensorFlow and
tensorflow_text; versions are written atomically."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from helpers import REPOSITORY

from keras_transformer import saving
from keras_transformer.export.saved_model import TensorFlowBackendRequired, export_saved_model
from keras_transformer.export.versions import (
    latest_version_path,
    load_saved_model,
    read_metadata,
)
from keras_transformer.inference import beam_search
from keras_transformer_app import cli
from keras_transformer_app.export_process import (
    ExportProcessError,
    export_in_tensorflow_process,
)

QUIET = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")

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

# The server, saved_model_cli, a killed export and the versions' layout do not
# depend on the backend a model was trained under: they run once, in the
# TensorFlow-backend pass. Under the other backends an export goes through a
# TensorFlow process of its own: the tests left unmarked check what it wrote.
tensorflow_pass = pytest.mark.once("tensorflow")


@tensorflow_pass
def test_versions_follow_the_tf_serving_layout(exported_greedy):
    exported = exported_greedy
    assert exported["beam"] == os.path.join(exported["base"], "1")
    assert exported["greedy"] == os.path.join(exported["base"], "2")
    assert sorted(os.listdir(exported["base"])) == ["1", "2"], "no temporary directory left"
    assert latest_version_path(exported["base"]) == exported["greedy"]
    for version, settings in (("1", (4, 0.6)), ("2", (1, 0.0))):
        metadata = read_metadata(os.path.join(exported["base"], version))
        assert (metadata["beam_size"], metadata["alpha"]) == settings


def test_fresh_tensorflow_process_translates_like_the_translator(exported,
                                                                 reference_translator):
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, exported["beam"], json.dumps(exported["sentences"]),
         json.dumps(exported["source_ids"])],
        capture_output=True, text=True, env=QUIET, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert not served["imported_keras_transformer"]

    expected = reference_translator
    assert served["translations"] == [
        result.text for result in expected.translate(exported["sentences"])]
    assert served["translations"][3] == ""
    tokenizer = expected.target_tokenizer
    ids, scores = beam_search(expected.model, np.array(exported["source_ids"]),
                              bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    served_ids = np.array(served["ids"])
    assert served_ids.shape == ids.shape
    np.testing.assert_array_equal(served_ids, ids)
    np.testing.assert_allclose(served["scores"], scores, rtol=1e-4, atol=1e-4)


@tensorflow_pass
def test_exported_greedy_version_matches_greedy_translation(exported_greedy,
                                                             reference_translator):
    exported = exported_greedy
    loaded, _ = load_saved_model(exported["greedy"])
    import tensorflow as tf

    served = loaded.signatures["serving_default"](inputs=tf.constant(exported["sentences"]))
    served = [t.decode("utf-8") for t in served["translations"].numpy()]
    assert served == [result.text for result in
                      reference_translator.translate(exported["sentences"], beam_size=1, alpha=0)]


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
def test_saved_model_cli_shows_and_runs_the_signatures(exported, reference_translator):
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
    sentence = exported["corpus"].sources[0]
    ran = _saved_model_cli("run", "--dir", exported["beam"], "--tag_set", "serve",
                           "--signature_def", "serving_default",
                           "--input_exprs", f"inputs={[sentence]!r}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    expected = reference_translator.translate([sentence])[0].text
    assert "Result for output key translations" in ran.stdout
    assert repr(expected.encode("utf-8")) in ran.stdout


@tensorflow_pass
def test_killed_export_leaves_no_version_directory(exported, tmp_path):
    base = tmp_path / "saved_models" / "killed"
    command = [sys.executable, "-m", "keras_transformer_app", "export", exported["run_dir"],
               str(base), "--version", "7", "--quiet"]
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
    saving.remove_partials(str(base))
    assert os.listdir(base) == []


@tensorflow_pass
@pytest.mark.backs("docs/serving.md", "an existing version is never overwritten")
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


@pytest.mark.skipif(keras.backend.backend() == "tensorflow",
                    reason="the TensorFlow backend writes the SavedModel itself")
def test_another_backend_is_told_to_export_from_a_tensorflow_process(exported, tmp_path):
    # The arguments and the file are checked first; then, before anything loads, the
    # library says which backend writes a SavedModel, and starts no process.
    with pytest.raises(ValueError, match="beam_size"):
        export_saved_model(exported["run_dir"], str(tmp_path / "out"), beam_size=0)
    with pytest.raises(TensorFlowBackendRequired, match="KERAS_BACKEND=tensorflow") as error:
        export_saved_model(exported["run_dir"], str(tmp_path / "out"))
    assert error.value.backend == keras.backend.backend()
    assert not (tmp_path / "out").exists()


@pytest.mark.once("torch")
def test_a_failed_export_process_raises_its_status_and_leaves_its_error_on_stderr(
        exported, tmp_path, capfd):
    with pytest.raises(ExportProcessError) as error:
        export_in_tensorflow_process(exported["run_dir"], str(tmp_path / "out"), lengths=(5000,),
                                     verbose=False)
    assert error.value.status == 2
    err = capfd.readouterr().err
    assert "error: " in err and "go past the longest input" in err
    assert not os.path.exists(tmp_path / "out" / "1")


@tensorflow_pass
def test_export_command_reports_mistakes_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", str(tmp_path / "missing"), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(f"error: argument model: {str(tmp_path / 'missing')!r} does not exist")


@tensorflow_pass
def test_over_long_sentence_is_truncated_and_flagged_without_failing_the_others(exported):
    import tensorflow as tf

    loaded, version_path = load_saved_model(exported["beam"])
    shapes = read_metadata(version_path)["shapes"]
    assert shapes == {"batch_sizes": [1, 4], "lengths": [16, 64]}
    sentences = exported["corpus"].sources[:2]
    long_sentence = " ".join(exported["corpus"].sources[:40])  # far over 63 tokens
    together = loaded.signatures["serving_default"](
        inputs=tf.constant([sentences[0], long_sentence, sentences[1]]))
    alone = loaded.signatures["serving_default"](inputs=tf.constant(sentences))
    texts = [t.decode("utf-8") for t in together["translations"].numpy()]
    assert together["truncated"].numpy().tolist() == [False, True, False]
    assert [texts[0], texts[2]] == [t.decode("utf-8") for t in alone["translations"].numpy()]

    # The same rule for ids: a row over 64 keeps 63 ids and EOS.
    eos = 3
    rows = np.array([[5] * 70 + [eos], [5] * 63 + [eos] + [0] * 7], "int32")
    out = loaded.signatures["translate_ids"](source_ids=tf.constant(rows))
    assert out["truncated"].numpy().tolist() == [True, False]
    ids = out["ids"].numpy()
    np.testing.assert_array_equal(ids[0], ids[1])  # both decode 5 × 63 + EOS


@tensorflow_pass
def test_batches_larger_than_the_largest_compiled_size_run_in_chunks(exported):
    import tensorflow as tf

    loaded, _ = load_saved_model(exported["beam"])
    sentences = exported["corpus"].sources[:9]  # chunks of 4: 4 + 4 + 1 (padded to 4)
    together = loaded.signatures["serving_default"](inputs=tf.constant(sentences))
    one_by_one = [loaded.signatures["serving_default"](inputs=tf.constant([s]))
                  ["translations"].numpy()[0] for s in sentences]
    assert together["translations"].numpy().tolist() == one_by_one
    out = loaded.signatures["translate_ids"](source_ids=tf.zeros([2, 0], tf.int32))
    assert out["ids"].shape == (2, 0) and out["scores"].numpy().tolist() == [0.0, 0.0]


@tensorflow_pass
def test_warmup_file_holds_one_request_per_compiled_shape(exported):
    from keras_transformer.export.warmup import WARMUP_PATH, read_warmup_requests

    assert os.path.exists(os.path.join(exported["beam"], WARMUP_PATH))
    requests = read_warmup_requests(exported["beam"])
    ids_shapes = [inputs["source_ids"].shape for signature, inputs in requests
                  if signature == "translate_ids"]
    assert sorted(ids_shapes) == [(1, 16), (1, 64), (4, 16), (4, 64)]
    texts = [inputs["inputs"] for signature, inputs in requests if signature == "serving_default"]
    assert len(texts) == 1 and texts[0].shape == (1,)
    # Every row fills its width (with EOS, no padding), so it runs at that shape.
    for signature, inputs in requests:
        if signature == "translate_ids":
            assert (inputs["source_ids"] == 3).all()


@tensorflow_pass
def test_n_best_signature_returns_the_translators_n_best_lists(exported, reference_translator,
                                                              tmp_path_factory):
    import tensorflow as tf

    from keras_transformer.export.warmup import read_warmup_requests
    from keras_transformer_app.serving.servable import Servable, parse_predict_request

    base = str(tmp_path_factory.mktemp("n_best") / "tiny")
    path = export_saved_model(exported["run_dir"], base, n_best=3, verbose=False,
                              batch_sizes=(1, 4), lengths=(16, 64))
    assert read_metadata(path)["n_best"] == 3
    loaded, _ = load_saved_model(path)
    sentences = exported["sentences"]
    out = loaded.signatures["translate_n_best"](inputs=tf.constant(sentences))
    assert out["translations"].shape == (len(sentences), 3) and out["scores"].shape == (5, 3)
    expected = reference_translator.translate(sentences, num_return=3)
    served = [[t.decode("utf-8") for t in row] for row in out["translations"].numpy()]
    assert served == [[h.text for h in row.hypotheses] for row in expected]
    np.testing.assert_allclose(out["scores"].numpy(),
                               [[h.score for h in row.hypotheses] for row in expected],
                               rtol=1e-4, atol=1e-4)
    assert served[3] == ["", "", ""]  # the empty sentence
    # The best of each list is what serving_default answers.
    best = loaded.signatures["serving_default"](inputs=tf.constant(sentences))
    assert [row[0] for row in served] == [t.decode("utf-8") for t in
                                          best["translations"].numpy()]

    # Warm-up: one n-best request per compiled shape, each at its own width.
    requests = [inputs["inputs"] for signature, inputs in read_warmup_requests(path)
                if signature == "translate_n_best"]
    assert sorted(len(batch) for batch in requests) == [1, 1, 4, 4]
    tokenizer = reference_translator.tokenizer
    widths = sorted(len(tokenizer.tokenize([batch[0].decode("utf-8")])[0]) + 1
                    for batch in requests)
    assert 1 < widths[0] <= widths[1] <= 16 < widths[2] <= widths[3] <= 64

    # The built-in server's servable answers it; a version without it says how to get one.
    servable = Servable(path, max_instances=8, max_chars=1000)
    request = parse_predict_request(
        {"signature_name": "translate_n_best", "instances": sentences[:2]}, servable)
    answer = servable.run(request.signature, request.instances)
    assert [result["translations"] for result in answer] == served[:2]
    plain = Servable(exported["beam"], max_instances=8, max_chars=1000)
    with pytest.raises(ValueError, match="export it with `keras-transformer export --n-best N`"):
        parse_predict_request({"signature_name": "translate_n_best", "instances": ["a"]}, plain)


@tensorflow_pass
@pytest.mark.parametrize("n_best, message", [
    (1, "1 is serving_default"), (5, "more than the beam size 4"), (2.0, "integer")])
def test_n_best_export_options_are_checked(exported, tmp_path, n_best, message):
    with pytest.raises(ValueError, match=message):
        export_saved_model(exported["run_dir"], str(tmp_path / "out"), n_best=n_best)


def test_serving_shapes_are_checked():
    import keras_transformer as kt
    from keras_transformer.export.shapes import ServingShapes

    config = kt.TransformerConfig.tiny(vocab_size=20, max_length=200)
    shapes = ServingShapes.for_model(config)
    assert shapes.lengths == (16, 32, 48, 64, 96, 128, 192, 200)
    assert shapes.batch_sizes == (1, 2, 4, 8, 16, 32, 64)
    assert len(shapes.shapes()) == 56 and shapes.max_source_length == 200
    # Sinusoidal positions may serve past the training length; learned ones may not.
    assert ServingShapes.for_model(config, max_source_length=300).lengths[-1] == 300
    learned = kt.TransformerConfig.tiny(vocab_size=20, position_encoding="learned")
    with pytest.raises(ValueError, match="past the model's learned position table"):
        ServingShapes.for_model(learned, max_source_length=65)
    for bad, message in ((dict(batch_sizes=(4, 2)), "strictly ascending"),
                         (dict(batch_sizes=()), "non-empty"),
                         (dict(lengths=(1, 8)), "at least one token and EOS"),
                         (dict(lengths=(16, 8.5)), "positive integers")):
        with pytest.raises(ValueError, match=message):
            ServingShapes(**bad)
    with pytest.raises(ValueError, match="go past the longest input"):
        ServingShapes.for_model(config, lengths=(16, 400))
    with pytest.raises(ValueError, match="must end at max_source_length=128"):
        ServingShapes.for_model(config, max_source_length=128, lengths=(16, 32))


@tensorflow_pass
def test_separate_vocabularies_detokenize_with_the_target_one(tmp_path):
    """A model with a source and a target vocabulary: the SavedModel reads with the
    source SentencePiece model and writes with the target one (two unnamed tf-text
    resources were one once loaded, and the target ids came out in source pieces)."""
    import keras
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer.data.corpora import synthetic_translation
    from keras_transformer.export.saved_model import export_model
    from keras_transformer.inference import Translator
    from keras_transformer.tokenizers import SubwordTokenizer

    keras.utils.set_random_seed(0)
    corpus = synthetic_translation(300, seed=0)
    source = SubwordTokenizer.train(corpus.sources, vocab_size=150)
    target = SubwordTokenizer.train(corpus.targets, vocab_size=200)
    config = kt.TransformerConfig.tiny(vocab_size=source.vocab_size, num_layers=1,
                                       target_vocab_size=target.vocab_size,
                                       share_embeddings=False)
    model = kt.Transformer(config)
    path = export_model(model, source, target, str(tmp_path / "separate"), beam_size=1,
                        alpha=0.0, batch_sizes=(4,), lengths=(16,))
    loaded, _ = load_saved_model(path)
    sentences = list(corpus.sources[:4])
    served = loaded.signatures["serving_default"](inputs=tf.constant(sentences))
    served = [text.decode("utf-8") for text in served["translations"].numpy()]
    expected = Translator(model, source, target).translate(sentences, beam_size=1, alpha=0)
    assert served == [result.text for result in expected]
