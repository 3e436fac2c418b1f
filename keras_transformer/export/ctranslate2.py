"""Serving the model of §3 with CTranslate2: a converter onto its `TransformerSpec`.

CTranslate2 (OpenNMT's C++ inference engine) declares each architecture as a
model spec and fills it with one small converter per training framework. This
module is the converter for keras-transformer: it maps the weights of a trained
`Transformer` and the token strings of its tokenizer onto
`ctranslate2.specs.TransformerSpec`. `export_ctranslate2` (and `export_model`,
for a model in memory) writes a version folder, `EXPORT_BASE/VERSION/`, in the
layout of a SavedModel export (`keras_transformer.export.versions`): CTranslate2's
files (`model.bin`, `config.json`, the vocabularies as JSON lists of tokens), the
tokenizer(s), and `keras_transformer.json`, the search it serves (beam size, α,
n-best, length limits) with its warm-up. `keras-transformer translate`,
`evaluate` and `serve` run it through `keras_transformer.inference.ctranslate2`;
`convert_model` writes CTranslate2's files alone, for its own `Translator`.

The mapping itself, and every detail that changes outputs, is
`keras_transformer.export.ctranslate2_spec`.
"""

import json
import os

from keras_transformer import saving, validation
from keras_transformer.export import versions
from keras_transformer.export.ctranslate2_spec import import_ctranslate2, transformer_spec
from keras_transformer.inference.ctranslate2 import SETTINGS_FILE, SETTINGS_FORMAT
from keras_transformer.inference.limits import LENGTH_OFFSET, source_limit

__all__ = ["QUANTIZATIONS", "convert_model", "export_ctranslate2", "export_model",
           "transformer_spec"]

# CTranslate2's weight types (`ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`),
# listed here so that the command line offers them without importing it.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16", "float32")


#: The batch sizes a version's warm-up runs (those up to the server's
#: max_batch_size): CTranslate2 compiles nothing, but its first calls of each
#: size allocate the memory later ones reuse.
WARMUP_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def export_ctranslate2(model, export_base, version=None, quantization=None, beam_size=4,
                       alpha=0.6, max_output_length=None, max_source_length=None, n_best=None,
                       verbose=True):
    """Exports a trained model with its tokenizer to `export_base/VERSION/` for CTranslate2.

    The version folder holds CTranslate2's model (`model.bin`, `config.json`,
    the vocabularies), the tokenizer(s), and `keras_transformer.json`: the
    search the export serves (beam size, α, n-best, length limits) and its
    warm-up, which `keras-transformer translate`, `evaluate` and `serve` read
    (`keras_transformer.inference.ctranslate2.CTranslate2Model`).

    Args:
        model: A `.keras` file with its tokenizer beside it, or a run directory
            (its `model.keras`, see `keras_transformer_app.run_files`).
        export_base: The model's serving directory, e.g. `ct2_models/NAME`
            (or `saved_models/NAME`, beside SavedModel versions).
        version: Positive integer version; None means one above the highest
            present (1 for a new directory). An existing version is never
            overwritten.
        quantization: None for float32 weights, or one of `QUANTIZATIONS`
            (CTranslate2's weight types, e.g. "int8", "int8_float32", "int16",
            "float16").
        beam_size, alpha, max_output_length, n_best: The search served, as in
            `keras_transformer.export.saved_model.export_saved_model`
            (`translate` and `evaluate` take their own).
        max_source_length: The longest input served (ids + EOS), longer ones
            are truncated; None means the model's `config.max_length`.
        verbose: Whether to print where the model went.

    Returns:
        The path of the new version directory.

    docs/serving.md ("CTranslate2") runs it on a model of its own.
    """
    model_path = saving.resolve_model_path(model)
    _check_quantization(quantization)
    options = dict(quantization=quantization, beam_size=beam_size, alpha=alpha,
                   max_output_length=max_output_length, max_source_length=max_source_length,
                   n_best=n_best)
    _check_search(**options)
    version = versions.next_version(export_base, version)
    import_ctranslate2()  # before the model is loaded, to fail fast
    loaded, source_tokenizer, target_tokenizer = saving.load_translation_model(model_path)
    path = export_model(loaded, source_tokenizer, target_tokenizer, export_base, version,
                        **options)
    if verbose:
        print(f"Exported {model_path} to {path} (CTranslate2 TransformerSpec, weights "
              f"{quantization or 'float32'}; beam {beam_size}, alpha {alpha:g})")
    return path


def export_model(model, source_tokenizer, target_tokenizer, export_base, version=None,
                 quantization=None, beam_size=4, alpha=0.6, max_output_length=None,
                 max_source_length=None, n_best=None):
    """Exports an in-memory `Transformer` and its tokenizers (any backend) to
    `export_base/VERSION/`; arguments as in `export_ctranslate2`, whose folder it
    writes. Returns the new version directory.

    >>> import keras_transformer as kt
    >>> from keras_transformer.data.corpora import synthetic_translation
    >>> from keras_transformer.inference import Translator
    >>> from keras_transformer.inference.ctranslate2 import load_ctranslate2
    >>> from keras_transformer.tokenizers import SubwordTokenizer
    >>> pairs = synthetic_translation(200)
    >>> tokenizer = SubwordTokenizer.train(pairs.sources + pairs.targets, vocab_size=120)
    >>> model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size))
    >>> export_model(model, tokenizer, tokenizer, "ct2_models/tiny")
    'ct2_models/tiny/1'
    >>> ct2_model, source, target = load_ctranslate2("ct2_models/tiny")
    >>> ours = Translator(model, tokenizer).translate(["kave tomi"], beam_size=1, alpha=0.0)
    >>> theirs = Translator(ct2_model, source).translate(["kave tomi"], beam_size=1, alpha=0.0)
    >>> theirs[0].ids == ours[0].ids
    True
    """
    from keras_transformer.export.shapes import ServingShapes

    options = dict(quantization=quantization, beam_size=beam_size, alpha=alpha,
                   max_output_length=max_output_length, max_source_length=max_source_length,
                   n_best=n_best)
    _check_search(**options)
    limit = ServingShapes.for_model(model.config, max_source_length).max_source_length
    version = versions.next_version(export_base, version)
    spec = _optimized_spec(model, source_tokenizer, target_tokenizer, quantization)
    settings = _settings(model.config, source_tokenizer, target_tokenizer, **dict(
        options, max_source_length=limit))
    with versions.write_version(export_base, version) as partial:
        spec.save(partial)
        saving.save_tokenizers(partial, source_tokenizer, target_tokenizer)
        _write_settings(partial, settings)
    return os.path.join(export_base, str(version))


def convert_model(model, source_tokenizer, target_tokenizer, output_dir, quantization=None):
    """Converts an in-memory `Transformer` and its tokenizers (any backend) into one
    CTranslate2 model directory, outside the versioned layout (for CTranslate2's own
    `Translator`, or a benchmark); the settings are the default search's.

    Arguments as in `export_ctranslate2`, `output_dir` (absent or empty) instead of
    the export base; `target_tokenizer` is `source_tokenizer` for a shared
    vocabulary. Returns `output_dir`.
    """
    _check_quantization(quantization)
    _check_output_dir(output_dir)
    spec = _optimized_spec(model, source_tokenizer, target_tokenizer, quantization)
    settings = _settings(model.config, source_tokenizer, target_tokenizer, quantization,
                         max_source_length=source_limit(model.config, model.config.max_length))
    # An empty folder at output_dir (checked above) is replaced by the rename.
    with saving.atomic_path(output_dir) as partial:
        os.makedirs(partial)
        spec.save(partial)
        _write_settings(partial, settings)
    return output_dir


def _optimized_spec(model, source_tokenizer, target_tokenizer, quantization):
    spec = transformer_spec(model, source_tokenizer, target_tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    return spec


def _write_settings(folder, settings):
    with open(os.path.join(folder, SETTINGS_FILE), "w", encoding="utf-8") as file:
        json.dump(settings, file, indent=2)


def _settings(config, source_tokenizer, target_tokenizer, quantization, beam_size=4,
              alpha=0.6, max_output_length=None, max_source_length=None, n_best=None):
    """The export's settings: the search it serves, as a SavedModel's metadata
    holds it (`keras_transformer.export.saved_model`), and how CTranslate2 runs it."""
    from keras_transformer.export.saved_model import signature_descriptions

    tokens = max_source_length - 1
    settings = {
        "format": SETTINGS_FORMAT,
        "engine": "ctranslate2",
        "quantization": quantization or "float32",
        "config": config.to_dict(),
        "beam_size": int(beam_size),
        "alpha": float(alpha),
        "max_output_length": max_output_length,
        "max_source_tokens": tokens,
        "pad_id": source_tokenizer.pad_id,
        "source_tokenizer": source_tokenizer.kind,
        "target_tokenizer": target_tokenizer.kind,
        "truncation": (f"a sentence over {tokens} tokens keeps its first {tokens}, then EOS; "
                       "truncated is true for it"),
        "special_ids": {"pad": config.pad_id, "unk": target_tokenizer.unk_id,
                        "bos": target_tokenizer.bos_id, "eos": target_tokenizer.eos_id},
        "translate_batch": {
            "max_decoding_length": f"source tokens + EOS + {LENGTH_OFFSET}, or "
                                   "max_output_length",
            "min_decoding_length": 0,
            "length_penalty": "alpha while the beam runs (|Y|^alpha), then the beam_size "
                              "hypotheses ranked by §6.1's ((5 + |Y|) / 6)^alpha",
        },
        "warmup": {"sentence": _warmup_word(source_tokenizer),
                   "batch_sizes": list(WARMUP_BATCH_SIZES)},
        "signatures": signature_descriptions(n_best),
    }
    if n_best is not None:
        settings["n_best"] = int(n_best)
    return settings


def _warmup_word(tokenizer):
    """A word of the source vocabulary, for the warm-up requests."""
    for token_id in range(tokenizer.vocab_size):
        if token_id not in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id,
                            tokenizer.unk_id):
            word = tokenizer.detokenize([[token_id]])[0].strip()
            if word:
                return word
    return "a"


def _check_search(quantization, beam_size, alpha, max_output_length, max_source_length,
                  n_best):
    from keras_transformer.export.saved_model import check_n_best
    from keras_transformer.inference.search import check_search_options

    _check_quantization(quantization)
    check_search_options(beam_size, alpha, max_output_length)
    check_n_best(n_best, beam_size)
    if max_source_length is not None:
        validation.check_positive_int("max_source_length", max_source_length)


def _check_quantization(quantization):
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization={quantization!r} is not a CTranslate2 weight type: choose one of "
            f"{', '.join(QUANTIZATIONS)}, or None for float32.")


def _check_output_dir(output_dir):
    if os.path.isdir(output_dir):
        if os.listdir(output_dir):
            raise FileExistsError(
                f"{output_dir!r} exists and is not empty: a CTranslate2 export writes a new "
                "model directory. Choose a new path, or remove the old model first.")
    elif os.path.exists(output_dir):
        raise FileExistsError(
            f"{output_dir!r} is a file: a CTranslate2 export writes a new model directory "
            "there. Choose a new path.")
