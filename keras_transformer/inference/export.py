"""Serving the trained model of §3 with the decoding of §6.1 as a TensorFlow SavedModel.

`export_saved_model` turns a `.keras` model and the tokenizer saved beside it
into a SavedModel in the layout TensorFlow Serving watches,
`saved_models/NAME/VERSION/`, with two signatures:

* `serving_default`: `inputs` (batch,) tf.string source sentences →
  `translations` (batch,) tf.string. Tokenization (the tf-text ops of the
  keras-hub tokenizer), cached beam search and detokenization all run inside
  the graph, so a server needs TensorFlow and tensorflow_text, not this
  library, not Keras.
* `translate_ids`: `source_ids` (batch, S) int32 encoder inputs (ids + EOS,
  padded with 0, as `beam_search` takes them) → `ids` (batch, L) int32
  (up to and including EOS, then padding) and `scores` (batch,) float32
  log P(Y | X) / lp(Y).

Beam size, α and the output length limit are fixed at export. The search
compiles with XLA (`jit_compile=True`) for each input shape it meets; source
widths are padded to multiples of 8 as the Python `Translator` pads them, so
both decode the same matrices and give the same translations.

Only the TensorFlow backend can write a SavedModel (the torch backend needs
torch_xla for it). Under JAX or PyTorch the export runs in a TensorFlow-backend
subprocess that loads the `.keras` file: models trained under any backend
export the same way.

A version is written to a hidden temporary directory beside its final place
and renamed when complete, so a killed export never leaves a half-written
version where a server would load it.

    keras-transformer export runs/quickstart saved_models/quickstart
    python -m keras_transformer.export runs/quickstart saved_models/quickstart --version 1
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

#: The directory TensorFlow Serving reads beside the variables: extra metadata.
METADATA_PATH = os.path.join("assets.extra", "keras_transformer.json")
_WIDTH_MULTIPLE = 8


def export_saved_model(model, export_base, version=None, beam_size=4, alpha=0.6,
                       max_length=None, verbose=True):
    """Exports a trained model with its tokenizer to `export_base/VERSION/`.

    Args:
        model: A `.keras` file with its tokenizer beside it, or a run directory
            (its `model_averaged.keras` if present, else `model.keras`).
        export_base: The model's serving directory, e.g. `saved_models/NAME`.
        version: Positive integer version; None means one above the highest
            present (1 for a new directory). An existing version is never
            overwritten.
        beam_size: Beam size of the exported search (4 in §6.1; 1 is greedy
            when `alpha` is 0).
        alpha: Length penalty α (0.6 in §6.1).
        max_length: Most output tokens per sentence; None means each source's
            length + 50 (§6.1).
        verbose: Whether to print where the SavedModel went.

    Returns:
        The path of the new version directory.
    """
    import keras

    from keras_transformer.inference.decoding import _check_search_options
    from keras_transformer.inference.loading import resolve_model_path

    _check_search_options(beam_size, alpha, max_length)
    model_path = resolve_model_path(model)
    version = _choose_version(export_base, version)
    if keras.backend.backend() == "tensorflow":
        from keras_transformer.inference.loading import load_translation_model

        loaded, source_tokenizer, target_tokenizer = load_translation_model(model_path)
        path = export_model(loaded, source_tokenizer, target_tokenizer, export_base, version,
                            beam_size=beam_size, alpha=alpha, max_length=max_length)
    else:
        path = _export_in_subprocess(model_path, export_base, version, beam_size, alpha,
                                     max_length)
    if verbose:
        print(f"Exported {model_path} to {path} (signatures serving_default, translate_ids)")
    return path


def export_model(model, source_tokenizer, target_tokenizer, export_base, version=None,
                 beam_size=4, alpha=0.6, max_length=None):
    """Exports an in-memory `Transformer` and its tokenizers (any backend).

    Under the TensorFlow backend the model is traced directly; under JAX or
    PyTorch it is saved to a temporary `.keras` file with its tokenizers and
    exported by a TensorFlow-backend subprocess. Arguments as in
    `export_saved_model`; returns the new version directory.
    """
    import keras

    from keras_transformer.inference.decoding import _check_model, _check_search_options

    _check_model(model)
    _check_search_options(beam_size, alpha, max_length)
    version = _choose_version(export_base, version)
    if keras.backend.backend() != "tensorflow":
        with tempfile.TemporaryDirectory(prefix="keras-transformer-export-") as directory:
            model_path = os.path.join(directory, "model.keras")
            model.save(model_path)
            if source_tokenizer is target_tokenizer:
                source_tokenizer.save(os.path.join(directory, "tokenizer"))
            else:
                source_tokenizer.save(os.path.join(directory, "source_tokenizer"))
                target_tokenizer.save(os.path.join(directory, "target_tokenizer"))
            return _export_in_subprocess(model_path, export_base, version, beam_size, alpha,
                                         max_length)

    import tensorflow as tf

    module, metadata = _translation_module(model, source_tokenizer, target_tokenizer,
                                           beam_size, alpha, max_length)
    os.makedirs(export_base, exist_ok=True)
    _remove_abandoned_partials(export_base)
    final = os.path.join(export_base, str(version))
    # A hidden, non-numeric name: TensorFlow Serving ignores it while it is written.
    partial = tempfile.mkdtemp(prefix=f".partial-{version}-{os.getpid()}-", dir=export_base)
    try:
        tf.saved_model.save(
            module, partial,
            signatures={"serving_default": module.translate, "translate_ids": module.translate_ids},
        )
        os.makedirs(os.path.join(partial, "assets.extra"), exist_ok=True)
        with open(os.path.join(partial, METADATA_PATH), "w") as f:
            json.dump(metadata, f, indent=2)
        if os.path.exists(final):
            raise FileExistsError(f"{final} appeared while exporting; nothing was overwritten.")
        os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def versions(export_base):
    """The integer versions under `export_base`, ascending (hidden partial
    exports and other names are ignored, as TensorFlow Serving ignores them)."""
    if not os.path.isdir(export_base):
        return []
    return sorted(int(name) for name in os.listdir(export_base)
                  if name.isdigit() and os.path.isdir(os.path.join(export_base, name)))


def latest_version_path(path):
    """`path` if it is a SavedModel; else the highest version under it."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"No SavedModel directory at {path!r}.")
    found = versions(path)
    if not found:
        raise FileNotFoundError(
            f"{path!r} holds no version directory (1/, 2/, ... with saved_model.pb): export "
            "one with `keras-transformer export MODEL " + path + "`."
        )
    version_path = os.path.join(path, str(found[-1]))
    if not os.path.exists(os.path.join(version_path, "saved_model.pb")):
        raise FileNotFoundError(f"{version_path!r} has no saved_model.pb: export it again.")
    return version_path


def load_saved_model(path):
    """Loads an exported translation SavedModel (the highest version of a
    `saved_models/NAME` directory, or a version directory) with TensorFlow and
    tensorflow_text only. Returns `(loaded, version_path)`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  registers the tokenizer ops the graph uses

    version_path = latest_version_path(path)
    return tf.saved_model.load(version_path), version_path


def _remove_abandoned_partials(export_base):
    """Deletes the temporary directories of exports whose process is gone
    (killed midway); those of running exports stay."""
    for name in os.listdir(export_base):
        parts = name.split("-")
        if not name.startswith(".partial-") or len(parts) < 4 or not parts[2].isdigit():
            continue
        try:
            os.kill(int(parts[2]), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(export_base, name), ignore_errors=True)
        except PermissionError:  # alive, owned by someone else
            pass


def _choose_version(export_base, version):
    if version is None:
        present = versions(export_base)
        return present[-1] + 1 if present else 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version={version!r} must be a positive integer (TF Serving layout).")
    if os.path.exists(os.path.join(export_base, str(version))):
        raise FileExistsError(
            f"{os.path.join(export_base, str(version))} exists: a served version is never "
            "overwritten. Pick another --version or leave it out for the next one."
        )
    return version


def _export_in_subprocess(model_path, export_base, version, beam_size, alpha, max_length):
    command = [sys.executable, "-m", "keras_transformer.export", model_path, export_base,
               "--version", str(version), "--beam-size", str(beam_size), "--alpha", str(alpha),
               "--quiet"]
    if max_length is not None:
        command += ["--max-length", str(max_length)]
    environment = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(command, env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            "Exporting in a TensorFlow-backend process failed "
            f"(exit status {result.returncode}):\n{result.stderr[-3000:]}"
        )
    return os.path.join(export_base, str(version))


def _translation_module(model, source_tokenizer, target_tokenizer, beam_size, alpha,
                        max_length):
    """The tf.Module that is saved (the model's variables, the tokenizers'
    tf-text resources, the two serving functions) and its metadata dict."""
    import tensorflow as tf

    from keras_transformer.inference.decoding import (
        LENGTH_OFFSET,
        _beam_loop,
        _Options,
    )
    from keras import ops

    config = model.config
    pad_id = config.pad_id
    bos_id, eos_id = target_tokenizer.bos_id, target_tokenizer.eos_id
    source_eos_id = source_tokenizer.eos_id
    max_source = config.max_length
    learned = config.position_encoding == "learned"
    special_ids = tf.constant([bos_id, eos_id], tf.int32)
    alpha = float(alpha)

    # keras-hub creates its tf-text ops lazily: create them now, outside
    # any trace, so the saved graph captures (and the SavedModel keeps)
    # the tokenizer resources.
    source_tokenizer.layer.tokenize(tf.constant(["a"]))
    target_tokenizer.layer.detokenize(tf.ragged.constant([[bos_id]], dtype=tf.int32))

    @tf.function(jit_compile=True, reduce_retracing=True)
    def search(source_ids):
        width = ops.shape(source_ids)[1]
        if max_length is None:
            buffer_length = width + LENGTH_OFFSET
        else:
            buffer_length = tf.constant(max_length, tf.int32)
        if learned:
            buffer_length = ops.minimum(buffer_length, max_source)
        lengths = ops.sum(ops.cast(ops.not_equal(source_ids, pad_id), "int32"), axis=1)
        if max_length is None:
            limits = ops.minimum(lengths + LENGTH_OFFSET, buffer_length)
        else:
            limits = ops.minimum(ops.zeros_like(lengths) + max_length, buffer_length)
        options = _Options(int(beam_size), buffer_length)
        return _beam_loop(model, source_ids, limits, special_ids, alpha, options)

    def search_ids(source_ids):
        """ids (batch, L) trimmed to the longest hypothesis, and scores."""
        def run():
            ids, scores = search(source_ids)
            lengths = tf.reduce_sum(tf.cast(ids != pad_id, tf.int32), axis=1)
            return ids[:, : tf.reduce_max(lengths)], tf.cast(scores, tf.float32)

        def empty():
            return tf.zeros([0, 0], tf.int32), tf.zeros([0], tf.float32)

        return tf.cond(tf.shape(source_ids)[0] > 0, run, empty)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")])
    def translate_ids(source_ids):
        tf.debugging.assert_non_negative(
            source_ids, message="source_ids must be token ids >= 0")
        tf.debugging.assert_less(
            source_ids, config.vocab_size,
            message=f"source_ids must be below the vocabulary size {config.vocab_size}")
        tf.debugging.assert_less_equal(
            tf.shape(source_ids)[1], max_source,
            message=f"source_ids is wider than the model's max_length={max_source}")
        ids, scores = search_ids(source_ids)
        return {"ids": ids, "scores": scores}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def translate(inputs):
        tokens = tf.cast(source_tokenizer.layer.tokenize(inputs), tf.int32)
        lengths = tf.cast(tokens.row_lengths(), tf.int32)
        tf.debugging.assert_less_equal(
            lengths + 1, max_source,
            message=f"a sentence is longer than the model accepts: at most "
                    f"{max_source - 1} tokens + EOS (model.config.max_length = "
                    f"{max_source}); split or shorten it")
        eos = tf.fill([tf.shape(inputs)[0], 1], source_eos_id)
        sources = tf.concat([tokens, tf.RaggedTensor.from_tensor(eos)], axis=1)
        longest = tf.reduce_max(tf.concat([lengths, [0]], axis=0)) + 1  # 1 for no sentences
        width = -(-longest // _WIDTH_MULTIPLE) * _WIDTH_MULTIPLE
        width = tf.maximum(longest, tf.minimum(width, max_source))
        dense = sources.to_tensor(default_value=pad_id)
        dense = tf.pad(dense, [[0, 0], [0, width - tf.shape(dense)[1]]],
                       constant_values=pad_id)
        ids, _ = search_ids(dense)
        keep = tf.logical_and(ids != pad_id, ids != eos_id)
        texts = target_tokenizer.layer.detokenize(tf.ragged.boolean_mask(ids, keep))
        if target_tokenizer.kind == "wordpiece":
            texts = _join_punctuation_tf(texts)
        # An empty sentence translates to "", as in Translator.
        return {"translations": tf.where(lengths > 0, texts, "")}

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
    metadata = {
        "config": config.to_dict(),
        "beam_size": int(beam_size),
        "alpha": alpha,
        "max_length": max_length,
        "max_source_tokens": max_source - 1,
        "source_tokenizer": source_tokenizer.kind,
        "target_tokenizer": target_tokenizer.kind,
        "signatures": {
            "serving_default": "inputs: (batch,) string -> translations: (batch,) string",
            "translate_ids": "source_ids: (batch, S) int32 ids + EOS, 0-padded -> "
                             "ids: (batch, L) int32, scores: (batch,) float32",
        },
    }
    return module, metadata


def _join_punctuation_tf(texts):
    """The in-graph twin of tokenizers._join_punctuation (RE2 syntax)."""
    import tensorflow as tf

    word = r"[\pL\pN_]"
    texts = tf.strings.regex_replace(texts, r"\s+([.,!?;:%)\]}»”])", r"\1")
    texts = tf.strings.regex_replace(texts, r"([(\[{«“¿¡])\s+", r"\1")
    texts = tf.strings.regex_replace(texts, f"({word}) ' ({word})", r"\1'\2")
    return tf.strings.regex_replace(texts, f"({word}) - ({word})", r"\1-\2")


def build_parser(parser=None):
    parser = parser or argparse.ArgumentParser(
        prog="python -m keras_transformer.export",
        description="Export a trained model and its tokenizer as a TensorFlow SavedModel.")
    parser.add_argument("model", help="a .keras file with its tokenizer beside it, or a run "
                                      "directory")
    parser.add_argument("export_base", help="serving directory, e.g. saved_models/NAME; the "
                                            "SavedModel goes to EXPORT_BASE/VERSION/")
    parser.add_argument("--version", type=int,
                        help="version number (default: one above the highest present)")
    parser.add_argument("--beam-size", type=int, default=4, help="beam size (§6.1: 4)")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty α (§6.1: 0.6)")
    parser.add_argument("--max-length", type=int,
                        help="most output tokens (default: source length + 50, §6.1)")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    return parser


def main_from_args(args):
    return export_saved_model(args.model, args.export_base, version=args.version,
                              beam_size=args.beam_size, alpha=args.alpha,
                              max_length=args.max_length, verbose=not args.quiet)


if __name__ == "__main__":
    arguments = build_parser().parse_args()
    try:
        main_from_args(arguments)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
