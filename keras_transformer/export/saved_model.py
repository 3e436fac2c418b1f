"""Serving the trained model of §3 with the decoding of §6.1 as a TensorFlow SavedModel.

`export_saved_model` turns a `.keras` model and the tokenizer saved beside it
into a SavedModel version (`saved_models/NAME/VERSION/`, see
`keras_transformer.export.versions`) with two signatures:

* `serving_default`: `inputs` (batch,) tf.string source sentences →
  `translations` (batch,) tf.string and `truncated` (batch,) bool.
  Tokenization (the tf-text ops of the keras-hub tokenizer), cached beam
  search and detokenization all run inside the graph, so a server needs
  TensorFlow and tensorflow_text, not this library, not Keras.
* `translate_ids`: `source_ids` (batch, S) int32 encoder inputs (ids + EOS,
  padded with the tokenizer's pad id, as `beam_search` takes them) → `ids`
  (batch, L) int32 (up to and including EOS, then padding), `scores`
  (batch,) float32 log P(Y | X) / lp(Y) and `truncated` (batch,) bool.

With `n_best=N` (`keras-transformer export --n-best N`, 2 <= N <= beam size) a
third signature returns each sentence's N best hypotheses of the beam:

* `translate_n_best`: `inputs` (batch,) tf.string → `translations`
  (batch, N) tf.string, best first, `scores` (batch, N) float32 (as in
  `translate_ids`) and `truncated` (batch,) bool.

Every answer has one result per input. A sentence longer than the export's
longest input (`ServingShapes.max_source_length`, ids + EOS) is cut to it
(its first tokens, then EOS), translated, and flagged in `truncated`; it never
fails the other sentences of its batch. An empty sentence translates to ""
(no ids, score 0).

The graph runs the Python path's own search loops (`greedy_loop`, `beam_loop`)
and the tokenizer's own `detokenize_tf`. It pads every batch to one of the
export's `ServingShapes` (a few batch sizes × a few widths), so XLA compiles a
bounded set of shapes. The search is traced once per width, so that its output
buffer (width + 50 unless `max_output_length` is given) has a known size and the
loop grows its cache in phases (`step.cache_phases`) as the Python path does. It
writes TensorFlow Serving's warm-up file with one request per shape and
signature (`keras_transformer.export.warmup`). Beam size, α,
the output length limit and N are fixed at export.

Only the TensorFlow backend can write a SavedModel (the torch backend needs
torch_xla for it). Under JAX or PyTorch both functions raise
`TensorFlowBackendRequired` once the arguments are checked, before anything is
loaded: the `.keras` file exports the same from a TensorFlow-backend process,
whatever backend trained it. `keras-transformer export` runs itself again under
TensorFlow (`keras_transformer_app`), and a training run exports through that
command in a process of its own (`keras_transformer_app.export_process`).
"""

import os

from keras_transformer import saving
from keras_transformer.export import signatures, versions, warmup
from keras_transformer.export.shapes import ServingShapes
from keras_transformer.inference.search import check_model, check_search_options


class TensorFlowBackendRequired(RuntimeError):
    """A SavedModel is written under the TensorFlow backend, and this process runs
    another (`backend`): export the `.keras` file from a TensorFlow-backend process."""

    def __init__(self, backend):
        super().__init__(
            f"A SavedModel is written under the TensorFlow backend, and this process runs "
            f"{backend}: export the saved .keras file (or its run directory) from a "
            "TensorFlow-backend process, as `KERAS_BACKEND=tensorflow keras-transformer "
            "export MODEL EXPORT_BASE` does (`keras-transformer export` under another "
            "backend runs itself again so).")
        self.backend = backend


def check_tensorflow_backend():
    """Raises `TensorFlowBackendRequired` unless Keras runs on TensorFlow."""
    import keras

    if keras.backend.backend() != "tensorflow":
        raise TensorFlowBackendRequired(keras.backend.backend())


def export_saved_model(model, export_base, version=None, beam_size=4, alpha=0.6,
                       max_output_length=None, max_source_length=None, batch_sizes=None,
                       lengths=None, n_best=None, verbose=True):
    """Exports a trained model with its tokenizer to `export_base/VERSION/`.

    Args:
        model: A `.keras` file with its tokenizer beside it, or a run directory
            (its `model.keras`, see `keras_transformer_app.run_files`).
        export_base: The model's serving directory, e.g. `saved_models/NAME`.
        version: Positive integer version; None means one above the highest
            present (1 for a new directory). An existing version is never
            overwritten.
        beam_size: Beam size of the exported search (4 in §6.1; 1 is greedy
            when `alpha` is 0).
        alpha: Length penalty α (0.6 in §6.1).
        max_output_length: Most output tokens per sentence; None means each
            source's length + 50 (§6.1).
        max_source_length: The longest input served (ids + EOS), longer ones
            are truncated; None means the model's `config.max_length`. Models
            with sinusoidal positions may take more.
        batch_sizes: The batch sizes compiled (`ServingShapes`), default
            1, 2, 4, ..., 64.
        lengths: The source widths compiled, default steps of 16 up to 64,
            then about 1.5× apart, up to `max_source_length`.
        n_best: None, or N from 2 to `beam_size`: also export the
            `translate_n_best` signature (the N best hypotheses per sentence).
        verbose: Whether to show the export's progress and print where the
            SavedModel went.

    Returns:
        The path of the new version directory.

    Raises:
        TensorFlowBackendRequired: Keras runs on another backend.
    """
    check_search_options(beam_size, alpha, max_output_length)
    check_n_best(n_best, beam_size)
    model_path = saving.resolve_model_path(model)
    version = versions.next_version(export_base, version)
    options = dict(beam_size=beam_size, alpha=alpha, max_output_length=max_output_length,
                   max_source_length=max_source_length, batch_sizes=batch_sizes,
                   lengths=lengths, n_best=n_best)
    check_tensorflow_backend()
    loaded, source_tokenizer, target_tokenizer = saving.load_translation_model(model_path)
    path = export_model(loaded, source_tokenizer, target_tokenizer, export_base, version,
                        verbose=verbose, **options)
    if verbose:
        shapes = ServingShapes.from_dict(versions.read_metadata(path)["shapes"])
        print(f"Exported {model_path} to {path} (signatures "
              f"{', '.join(versions.read_metadata(path)['signatures'])}; "
              f"{len(shapes.shapes())} compiled shapes: batch sizes "
              f"{', '.join(map(str, shapes.batch_sizes))} × source widths "
              f"{', '.join(map(str, shapes.lengths))})")
    return path


def export_model(model, source_tokenizer, target_tokenizer, export_base, version=None,
                 beam_size=4, alpha=0.6, max_output_length=None, max_source_length=None,
                 batch_sizes=None, lengths=None, n_best=None, verbose=False):
    """Exports an in-memory `Transformer` and its tokenizers (the TensorFlow backend).

    The model is traced directly. Arguments as in `export_saved_model`
    (`verbose` shows a progress bar of the export's phases); returns the new
    version directory.

    Raises:
        TensorFlowBackendRequired: Keras runs on another backend (save the
            model with `saving.save_model` and its tokenizers beside it,
            and export that file from a TensorFlow-backend process).
    """
    import keras

    check_model(model)
    check_search_options(beam_size, alpha, max_output_length)
    check_n_best(n_best, beam_size)
    shapes = ServingShapes.for_model(model.config, max_source_length, batch_sizes, lengths)
    version = versions.next_version(export_base, version)
    check_tensorflow_backend()

    import tensorflow as tf

    # Phases: trace the signatures, save the SavedModel, write the warm-up
    # requests and the metadata.
    progress = keras.utils.Progbar(3, unit_name="phase") if verbose else None
    module, signatures = _translation_module(model, source_tokenizer, target_tokenizer, shapes,
                                             beam_size, alpha, max_output_length, n_best)
    _advance(progress)
    metadata = _metadata(model.config, source_tokenizer, target_tokenizer, shapes, beam_size,
                         alpha, max_output_length, n_best)
    with versions.write_version(export_base, version) as partial:
        tf.saved_model.save(module, partial, signatures=signatures)
        _advance(progress)
        word = source_tokenizer.detokenize([[_ordinary_id(source_tokenizer)]])[0] or "a"
        warmup.write_warmup_requests(
            partial, shapes, source_tokenizer.eos_id, word,
            model_name=os.path.basename(os.path.normpath(export_base)),
            n_best_sentences=None if n_best is None else warmup.sentences_for_widths(
                source_tokenizer, shapes.lengths, word))
        versions.write_metadata(partial, metadata)
        _advance(progress)
    return os.path.join(export_base, str(version))


def check_n_best(n_best, beam_size):
    """Raises ValueError unless `n_best` is None or an int from 2 to `beam_size`."""
    if n_best is None:
        return
    if isinstance(n_best, bool) or not isinstance(n_best, int) or n_best < 2:
        raise ValueError(f"n_best must be an integer >= 2 (1 is serving_default), got {n_best!r}.")
    if n_best > beam_size:
        raise ValueError(f"n_best {n_best} is more than the beam size {beam_size}: the beam "
                         "holds only beam_size hypotheses.")


def _advance(progress):
    if progress is not None:
        progress.add(1)


def _ordinary_id(tokenizer):
    """The smallest id that is no special token (the warm-up's sentence)."""
    special = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id,
               getattr(tokenizer, "unk_id", None)}
    return next(i for i in range(tokenizer.vocab_size) if i not in special)


def _translation_module(model, source_tokenizer, target_tokenizer, shapes, beam_size, alpha,
                        max_output_length, n_best=None):
    """`(module, signatures)`: the tf.Module that is saved (the model's
    variables, the tokenizers' tf-text resources and the signature functions)
    and {signature name: its concrete function}."""
    import tensorflow as tf

    # keras-hub creates its tf-text ops lazily: create them now, outside
    # any trace, so the saved graph captures (and the SavedModel keeps)
    # the tokenizer resources.
    source_tokenizer.tokenize_tf(tf.constant(["a"]))
    target_tokenizer.detokenize_tf(
        tf.ragged.constant([[target_tokenizer.bos_id]], dtype=tf.int32))

    search = signatures.search_function(model, target_tokenizer, shapes, beam_size, alpha,
                                        max_output_length)
    functions = {
        "serving_default": signatures.text_signature(
            model.config, source_tokenizer, target_tokenizer, shapes, search),
        "translate_ids": signatures.ids_signature(model.config, source_tokenizer, shapes, search),
    }
    if n_best is not None:
        functions["translate_n_best"] = signatures.text_signature(
            model.config, source_tokenizer, target_tokenizer, shapes,
            signatures.search_function(model, target_tokenizer, shapes, beam_size, alpha,
                                       max_output_length, num_return=n_best))

    # Each signature is traced once, here, and saved as this concrete
    # function: given the tf.function itself, tf.saved_model.save traces it
    # again inside its save context (a search of 4 widths traced twice took
    # 50 s for the quickstart's model instead of 30).
    concrete = {name: function.get_concrete_function() for name, function in functions.items()}
    module = tf.Module(name="keras_transformer_translation")
    module.model = model
    # The tf.Variables the traced functions capture, listed on the module as
    # keras.export.ExportArchive lists them: session-based loaders (TensorFlow
    # Serving, `saved_model_cli run`) find a variable only if the object graph
    # holds it itself, not the Keras variable that wraps it.
    captured = {}
    for function in concrete.values():
        for variable in function.variables:
            captured[id(variable)] = variable
    module.captured_variables = list(captured.values())
    module.source_tokenizer = source_tokenizer.layer
    module.target_tokenizer = target_tokenizer.layer
    module.translate = concrete["serving_default"]
    module.translate_ids = concrete["translate_ids"]
    if n_best is not None:
        module.translate_n_best = concrete["translate_n_best"]
    return module, concrete


def _metadata(config, source_tokenizer, target_tokenizer, shapes, beam_size, alpha,
              max_output_length, n_best=None):
    metadata = {
        "config": config.to_dict(),
        "beam_size": int(beam_size),
        "alpha": float(alpha),
        "max_output_length": max_output_length,
        "max_source_tokens": shapes.max_source_length - 1,
        "shapes": shapes.to_dict(),
        "pad_id": source_tokenizer.pad_id,
        "source_tokenizer": source_tokenizer.kind,
        "target_tokenizer": target_tokenizer.kind,
        "truncation": (f"a sentence over {shapes.max_source_length - 1} tokens keeps its first "
                       f"{shapes.max_source_length - 1}, then EOS; truncated is true for it"),
        "signatures": signature_descriptions(n_best),
    }
    if n_best is not None:
        metadata["n_best"] = int(n_best)
    return metadata


def signature_descriptions(n_best=None):
    """{signature: its inputs and outputs in words}, as the metadata of both exports
    (this one's and `export.ctranslate2`'s) describe them."""
    described = {
        "serving_default": "inputs: (batch,) string -> translations: (batch,) string, "
                           "truncated: (batch,) bool",
        "translate_ids": "source_ids: (batch, S) int32 ids + EOS, padded with pad_id -> "
                         "ids: (batch, L) int32, scores: (batch,) float32, "
                         "truncated: (batch,) bool",
    }
    if n_best is not None:
        described["translate_n_best"] = (
            f"inputs: (batch,) string -> translations: (batch, {n_best}) string, best first, "
            f"scores: (batch, {n_best}) float32, truncated: (batch,) bool")
    return described
