"""Fixtures of the export tests, built once per session: one small model
exported as a SavedModel under the current backend (JAX and PyTorch models
export through a TensorFlow-backend process of the command line, as a training
run does: `export_from_any_backend`)."""

import keras
import pytest

import keras_transformer as kt
from keras_transformer import saving
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer.export.saved_model import export_model
from keras_transformer.inference import Translator
from keras_transformer.tokenizers import SubwordTokenizer
from keras_transformer_app import run_files
from keras_transformer_app.export_process import export_from_any_backend

# Few compiled shapes keep the tests' XLA compilations few: 5 sentences run
# as two chunks of 4.
SHAPES = dict(batch_sizes=(1, 4), lengths=(16, 64))


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """A run directory (model.keras + tokenizer/) built under the current
    backend, exported as version 1 with the §6.1 beam search: from memory under
    TensorFlow, from the run directory in a TensorFlow process otherwise.

    Also holds the corpus, test sentences (real ones, an empty one, and words
    the vocabulary never saw) and encoder inputs in the tokenizer's ids.
    """
    root = tmp_path_factory.mktemp("export")
    keras.utils.set_random_seed(0)
    corpus = synthetic_translation(300, seed=0)
    tokenizer = SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=320)
    directory = str(root / "run")
    saving.save_tokenizers(directory, tokenizer)
    config = kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, num_layers=1)
    model = kt.Transformer(config)
    saving.save_model(model, run_files.path(directory, saving.MODEL))
    base = str(root / "saved_models" / "tiny")
    if keras.backend.backend() == "tensorflow":
        beam = export_model(model, tokenizer, tokenizer, base, **SHAPES)
    else:
        beam = export_from_any_backend(directory, base, verbose=False, **SHAPES)
    pad, eos = tokenizer.pad_id, tokenizer.eos_id
    return {
        "run_dir": directory, "base": base, "beam": beam, "corpus": corpus,
        "sentences": corpus.sources[:3] + ["", "xyzzy quux"],
        "source_ids": [[5, 9, 17, eos, pad, pad], [40, eos, pad, pad, pad, pad]],
    }


@pytest.fixture(scope="session")
def exported_greedy(exported):
    """Version 2 of the same model, greedy (beam 1, α 0), from the run directory."""
    greedy = export_from_any_backend(exported["run_dir"], exported["base"], beam_size=1,
                                     alpha=0.0, verbose=False, **SHAPES)
    return dict(exported, greedy=greedy)


@pytest.fixture(scope="session")
def reference_translator(exported):
    """The Python path over the exported run: what the SavedModel must match."""
    model, source_tokenizer, target_tokenizer = saving.load_translation_model(
        exported["run_dir"])
    return Translator(model, source_tokenizer, target_tokenizer)
