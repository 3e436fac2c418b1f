"""Fixtures of the inference tests, built once per session: a model trained on
the toy reversal task."""

import types

import keras
import pytest
from helpers import built_once

import keras_transformer as kt
from keras_transformer import run_files
from keras_transformer.data.toy_tasks import ToyVocabulary, reverse_task


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
def reversal(tmp_path_factory):
    """A tiny model trained on the toy reversal task (about 10 s on 2 CPU
    cores, once per pass: `built_once`): non-trivial outputs with clear
    margins, shared by the session.

    Attributes: `model`; `vocabulary`, the `ToyVocabulary` of its ids (special
    ids, then 6 words); `max_sentence_length` (5); and `held_out(n)`, which
    gives n unseen (batch, S) encoder inputs and the expected outputs (id
    lists, EOS included).
    """
    vocabulary, max_sentence_length = ToyVocabulary(10), 5

    def train(folder):
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
        run_files.save_model(model, folder / "model.keras")

    folder = built_once(tmp_path_factory, "reversal", train)
    model = run_files.load_model(folder / "model.keras")

    def held_out(num_examples=128):
        inputs, labels = reverse_task(num_examples, vocabulary=vocabulary,
                                      max_sentence_length=max_sentence_length, seed=2)
        expected = [[int(t) for t in row if t != vocabulary.pad_id] for row in labels]
        return inputs["source"], expected

    return types.SimpleNamespace(model=model, vocabulary=vocabulary,
                                 max_sentence_length=max_sentence_length, held_out=held_out)
