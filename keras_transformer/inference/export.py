"""Serving the trained model of §3 with the decoding of §6.1 as a TensorFlow SavedModel.

`export_saved_model` turns a `.keras` model and the tokenizer saved beside it
into a SavedModel version (`saved_models/NAME/VERSION/`, see
`keras_transformer.inference.saved_model`) with two signatures:

* `serving_default`: `inputs` (batch,) tf.string source sentences →
  `translations` (batch,) tf.string. Tokenization (the tf-text ops of the
  keras-hub tokenizer), cached beam search and detokenization all run inside
  the graph, so a server needs TensorFlow and tensorflow_text, not this
  library, not Keras.
* `translate_ids`: `source_ids` (batch, S) int32 encoder inputs (ids + EOS,
  padded with the tokenizer's pad id, as `beam_search` takes them) → `ids`
  (batch, L) int32 (up to and including EOS, then padding) and `scores`
  (batch,) float32 log P(Y | X) / lp(Y).

The graph runs the same code as the Python path: `traced_search` for the
search, `source_width` for the padded width of a batch, and the tokenizer's
own `detokenize_tf`, so both give the same translations. Beam size, α and
the output length limit are fixed at export; the search compiles with XLA
for each input shape it meets.

Only the TensorFlow backend can write a SavedModel (the torch backend needs
torch_xla for it). Under JAX or PyTorch the export runs in a TensorFlow-backend
subprocess (`keras-transformer export`) that loads the `.keras` file: models
trained under any backend export the same way.
"""

import os
import subprocess
import sys
import tempfile

from keras_transformer import run_dir
from keras_transformer.inference import saved_model
from keras_transformer.inference.decoding import check_model, check_search_options
from keras_transformer.inference.search import source_width, traced_search


def export_saved_model(model, export_base, version=None, beam_size=4, alpha=0.6,
                       max_output_length=None, verbose=True):
    """Exports a trained model with its tokenizer to `export_base/VERSION/`.

    Args:
        model: A `.keras` file with its tokenizer beside it, or a run directory
            (its `model.keras`, see `keras_transformer.run_dir`).
        export_base: The model's serving directory, e.g. `saved_models/NAME`.
        version: Positive integer version; None means one above the highest
            present (1 for a new directory). An existing version is never
            overwritten.
        beam_size: Beam size of the exported search (4 in §6.1; 1 is greedy
            when `alpha` is 0).
        alpha: Length penalty α (0.6 in §6.1).
        max_output_length: Most output tokens per sentence; None means each
            source's length + 50 (§6.1).
        verbose: Whether to print where the SavedModel went.

    Returns:
        The path of the new version directory.
    """
    import keras

    check_search_options(beam_size, alpha, max_output_length)
    model_path = run_dir.resolve_model_path(model)
    version = saved_model.next_version(export_base, version)
    if keras.backend.backend() == "tensorflow":
        loaded, source_tokenizer, target_tokenizer = run_dir.load_translation_model(model_path)
        path = export_model(loaded, source_tokenizer, target_tokenizer, export_base, version,
                            beam_size=beam_size, alpha=alpha,
                            max_output_length=max_output_length)
    else:
        path = _export_in_subprocess(model_path, export_base, version, beam_size, alpha,
                                     max_output_length)
    if verbose:
        print(f"Exported {model_path} to {path} (signatures serving_default, translate_ids)")
    return path


def export_model(model, source_tokenizer, target_tokenizer, export_base, version=None,
                 beam_size=4, alpha=0.6, max_output_length=None):
    """Exports an in-memory `Transformer` and its tokenizers (any backend).

    Under the TensorFlow backend the model is traced directly; under JAX or
    PyTorch it is saved to a temporary `.keras` file with its tokenizers and
    exported by a TensorFlow-backend subprocess. Arguments as in
    `export_saved_model`; returns the new version directory.
    """
    import keras

    check_model(model)
    check_search_options(beam_size, alpha, max_output_length)
    version = saved_model.next_version(export_base, version)
    if keras.backend.backend() != "tensorflow":
        with tempfile.TemporaryDirectory(prefix="keras-transformer-export-") as directory:
            model_path = run_dir.path(directory, run_dir.MODEL)
            run_dir.save_model(model, model_path)
            run_dir.save_tokenizers(directory, source_tokenizer, target_tokenizer)
            return _export_in_subprocess(model_path, export_base, version, beam_size, alpha,
                                         max_output_length)

    import tensorflow as tf

    module = _translation_module(model, source_tokenizer, target_tokenizer, beam_size, alpha,
                                 max_output_length)
    metadata = _metadata(model.config, source_tokenizer, target_tokenizer, beam_size, alpha,
                         max_output_length)
    with saved_model.write_version(export_base, version) as partial:
        tf.saved_model.save(
            module, partial,
            signatures={"serving_default": module.translate, "translate_ids": module.translate_ids},
        )
        saved_model.write_metadata(partial, metadata)
    return os.path.join(export_base, str(version))


def _export_in_subprocess(model_path, export_base, version, beam_size, alpha,
                          max_output_length):
    command = [sys.executable, "-m", "keras_transformer.cli", "export", model_path,
               export_base, "--version", str(version), "--beam-size", str(beam_size),
               "--alpha", str(alpha), "--quiet"]
    if max_output_length is not None:
        command += ["--max-output-length", str(max_output_length)]
    environment = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(command, env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            "Exporting in a TensorFlow-backend process failed "
            f"(exit status {result.returncode}):\n{result.stderr[-3000:]}"
        )
    return os.path.join(export_base, str(version))


def _translation_module(model, source_tokenizer, target_tokenizer, beam_size, alpha,
                        max_output_length):
    """The tf.Module that is saved: the model's variables, the tokenizers'
    tf-text resources and the two signature functions."""
    import tensorflow as tf

    # keras-hub creates its tf-text ops lazily: create them now, outside
    # any trace, so the saved graph captures (and the SavedModel keeps)
    # the tokenizer resources.
    source_tokenizer.tokenize_tf(tf.constant(["a"]))
    target_tokenizer.detokenize_tf(
        tf.ragged.constant([[target_tokenizer.bos_id]], dtype=tf.int32))

    search = _search_function(model, target_tokenizer, beam_size, alpha, max_output_length)
    translate_ids = _ids_signature(model.config, search)
    translate = _text_signature(model.config, source_tokenizer, target_tokenizer, search)

    module = tf.Module(name="keras_transformer_translation")
    module.model = model
    # The tf.Variables the traced functions capture, listed on the module as
    # keras.export.ExportArchive lists them: session-based loaders (TensorFlow
    # Serving, `saved_model_cli run`) find a variable only if the object graph
    # holds it itself, not the Keras variable that wraps it.
    captured = {}
    for function in (translate, translate_ids):
        for variable in function.get_concrete_function().variables:
            captured[id(variable)] = variable
    module.captured_variables = list(captured.values())
    module.source_tokenizer = source_tokenizer.layer
    module.target_tokenizer = target_tokenizer.layer
    module.translate = translate
    module.translate_ids = translate_ids
    return module


def _search_function(model, target_tokenizer, beam_size, alpha, max_output_length):
    """source_ids (batch, S) → (ids (batch, L) trimmed to the longest
    hypothesis, scores (batch,)); an empty batch gives empty results."""
    import tensorflow as tf

    pad_id = model.config.pad_id
    special_ids = tf.constant([target_tokenizer.bos_id, target_tokenizer.eos_id], tf.int32)
    alpha = tf.constant(alpha, tf.float32)

    @tf.function(jit_compile=True, reduce_retracing=True)
    def compiled(source_ids):
        return traced_search(model, source_ids, special_ids, alpha, int(beam_size),
                             max_output_length)

    def search(source_ids):
        def run():
            ids, scores = compiled(source_ids)
            lengths = tf.reduce_sum(tf.cast(ids != pad_id, tf.int32), axis=1)
            return ids[:, : tf.reduce_max(lengths)], tf.cast(scores, tf.float32)

        def empty():
            return tf.zeros([0, 0], tf.int32), tf.zeros([0], tf.float32)

        return tf.cond(tf.shape(source_ids)[0] > 0, run, empty)

    return search


def _ids_signature(config, search):
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")])
    def translate_ids(source_ids):
        tf.debugging.assert_non_negative(
            source_ids, message="source_ids must be token ids >= 0")
        tf.debugging.assert_less(
            source_ids, config.vocab_size,
            message=f"source_ids must be below the vocabulary size {config.vocab_size}")
        tf.debugging.assert_less_equal(
            tf.shape(source_ids)[1], config.max_length,
            message=f"source_ids is wider than the model's max_length={config.max_length}")
        ids, scores = search(source_ids)
        return {"ids": ids, "scores": scores}

    return translate_ids


def _text_signature(config, source_tokenizer, target_tokenizer, search):
    import tensorflow as tf

    pad_id, max_source = config.pad_id, config.max_length
    source_eos_id, target_eos_id = source_tokenizer.eos_id, target_tokenizer.eos_id

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def translate(inputs):
        tokens = tf.cast(source_tokenizer.tokenize_tf(inputs), tf.int32)
        lengths = tf.cast(tokens.row_lengths(), tf.int32)
        tf.debugging.assert_less_equal(
            lengths + 1, max_source,
            message=f"a sentence is longer than the model accepts: at most "
                    f"{max_source - 1} tokens + EOS (model.config.max_length = "
                    f"{max_source}); split or shorten it")
        eos = tf.fill([tf.shape(inputs)[0], 1], source_eos_id)
        sources = tf.concat([tokens, tf.RaggedTensor.from_tensor(eos)], axis=1)
        longest = tf.reduce_max(tf.concat([lengths, [0]], axis=0)) + 1  # 1 for no sentences
        width = source_width(longest, max_source)
        dense = sources.to_tensor(default_value=pad_id)
        dense = tf.pad(dense, [[0, 0], [0, width - tf.shape(dense)[1]]],
                       constant_values=pad_id)
        ids, _ = search(dense)
        keep = tf.logical_and(ids != pad_id, ids != target_eos_id)
        texts = target_tokenizer.detokenize_tf(tf.ragged.boolean_mask(ids, keep))
        # An empty sentence translates to "", as in Translator.
        return {"translations": tf.where(lengths > 0, texts, "")}

    return translate


def _metadata(config, source_tokenizer, target_tokenizer, beam_size, alpha, max_output_length):
    return {
        "config": config.to_dict(),
        "beam_size": int(beam_size),
        "alpha": float(alpha),
        "max_output_length": max_output_length,
        "max_source_tokens": config.max_length - 1,
        "pad_id": source_tokenizer.pad_id,
        "source_tokenizer": source_tokenizer.kind,
        "target_tokenizer": target_tokenizer.kind,
        "signatures": {
            "serving_default": "inputs: (batch,) string -> translations: (batch,) string",
            "translate_ids": "source_ids: (batch, S) int32 ids + EOS, padded with pad_id -> "
                             "ids: (batch, L) int32, scores: (batch,) float32",
        },
    }
