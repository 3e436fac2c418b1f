"""Fixtures of the inference tests, each built once per session: a model
trained on the toy reversal task, and one small model exported as a
SavedModel under the current backend (JAX and PyTorch models export through
a TensorFlow-backend subprocess)."""

import types

import keras
import pytest

import keras_transformer as kt
from keras_transformer import run_files
from keras_transformer.inference import Translator
from keras_transformer.inference.export import export_model, export_saved_model
from keras_transformer.tokenizers import SubwordTokenizer
from keras_transformer.training.data import synthetic_translation
from keras_transformer.training.toy_tasks import ToyVocabulary, reverse_task

# Few compiled shapes keep the tests' XLA compilations few: 5 sentences run
# as two chunks of 4.
SHAPES = dict(batch_sizes=(1, 4), lengths=(16, 64))


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """A run directory (model.keras + tokenizer/) built under the current
    backend, exported from memory as version 1 with the §6.1 beam search.

    Also holds the corpus, test sentences (real ones, an empty one, and words
    the vocabulary never saw) and encoder inputs in the tokenizer's ids.
    """
    root = tmp_path_factory.mktemp("export")
    keras.utils.set_random_seed(0)
    corpus = synthetic_translation(300, seed=0)
    tokenizer = SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=320)
    directory = str(root / "run")
    run_files.save_tokenizers(directory, tokenizer)
    config = kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, num_layers=1)
    model = kt.Transformer(config)
    run_files.save_model(model, run_files.path(directory, run_files.MODEL))
    base = str(root / "saved_models" / "tiny")
    beam = export_model(model, tokenizer, tokenizer, base, **SHAPES)
    pad, eos = tokenizer.pad_id, tokenizer.eos_id
    return {
        "run_dir": directory, "base": base, "beam": beam, "corpus": corpus,
        "sentences": corpus.sources[:3] + ["", "xyzzy quux"],
        "source_ids": [[5, 9, 17, eos, pad, pad], [40, eos, pad, pad, pad, pad]],
    }


@pytest.fixture(scope="session")
def exported_greedy(exported):
    """Version 2 of the same model, greedy (beam 1, α 0), from the run directory."""
    greedy = export_saved_model(exported["run_dir"], exported["base"], beam_size=1, alpha=0.0,
                                verbose=False, **SHAPES)
    return dict(exported, greedy=greedy)


@pytest.fixture(scope="session")
def reference_translator(exported):
    """The Python path over the exported run: what the SavedModel must match."""
    model, source_tokenizer, target_tokenizer = run_files.load_translation_model(
        exported["run_dir"])
    return Translator(model, source_tokenizer, target_tokenizer)


class _OneTorchThread:
    """Trains torch on one thread: on a shared 2-core machine, tiny matrices and
    two spinning OpenMP threads make training several times slower."""

    def __enter__(self):
        self._threads = None
        if keras.backend.backend() == "torch":
            import torch

            self._threads = torch.get_num_threads()
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads)


@pytest.fixture(scope="session")
def reversal():
    """A tiny model trained on the toy reversal task (about 10 s on 2 CPU
    cores): non-trivial outputs with clear margins, shared by the session.

    Attributes: `model`; `vocabulary`, the `ToyVocabulary` of its ids (special
    ids, then 6 words); `max_sentence_length` (5); and `held_out(n)`, which
    gives n unseen (batch, S) encoder inputs and the expected outputs (id
    lists, EOS included).
    """
    vocabulary, max_sentence_length = ToyVocabulary(10), 5
    keras.utils.set_random_seed(0)
    config = kt.TransformerConfig.tiny(
        vocab_size=vocabulary.vocab_size, d_model=64, d_ff=128, num_heads=4,
        label_smoothing=0.0, max_length=16,
    )
    model = kt.Transformer(config)
    inputs, labels = reverse_task(2048, vocabulary=vocabulary,
                                  max_sentence_length=max_sentence_length, seed=1)
    steps = 12 * len(labels) // 128
    model.compile(
        optimizer=keras.optimizers.Adam(
            keras.optimizers.schedules.PolynomialDecay(5e-3, steps, 5e-4),
            beta_1=0.9, beta_2=0.98, epsilon=1e-9,
        ),
        loss=kt.LabelSmoothedCrossEntropy(0.0),
    )
    with _OneTorchThread():
        model.fit(inputs, labels, batch_size=128, epochs=12, verbose=0)

    def held_out(num_examples=128):
        inputs, labels = reverse_task(num_examples, vocabulary=vocabulary,
                                      max_sentence_length=max_sentence_length, seed=2)
        expected = [[int(t) for t in row if t != vocabulary.pad_id] for row in labels]
        return inputs["source"], expected

    return types.SimpleNamespace(model=model, vocabulary=vocabulary,
                                 max_sentence_length=max_sentence_length, held_out=held_out)
