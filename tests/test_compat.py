"""keras_transformer/compat.py and keras_transformer_app/compat.py: what the project relies
on beyond its dependencies' stable public API still holds in the versions installed. A release
that changes it fails here, by name, before the server's or the search's own tests fail in its
consequences."""

import keras
import numpy as np
import pytest

from keras_transformer import compat
from keras_transformer_app import compat as program_compat


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's tracer")
def test_torch_trace_records_a_function_and_replays_it_on_new_values():
    import torch

    def body(step, total, weights):
        return step + 1, total + weights * step

    inputs = (torch.tensor(1), torch.zeros(3), torch.ones(3))
    traced = compat.torch_trace(body, inputs)
    step, total = traced(torch.tensor(4), torch.ones(3), torch.full((3,), 2.0))
    assert int(step) == 5
    np.testing.assert_allclose(total.numpy(), [9.0, 9.0, 9.0])


@pytest.mark.once("torch")  # argparse, not the backend
def test_parser_actions_list_options_and_subcommands():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int)
    commands = parser.add_subparsers(dest="command")
    translate = commands.add_parser("translate")
    translate.add_argument("--beam-size", type=int)
    actions = program_compat.parser_actions(parser)
    assert [a.dest for a, sub in actions if sub is None] == ["help", "top"]
    [(_, subparsers)] = [(a, sub) for a, sub in actions if sub is not None]
    assert subparsers == {"translate": translate}
    assert "beam_size" in [a.dest for a, _ in program_compat.parser_actions(translate)]


def test_an_emptied_keras_variable_is_filled_again_and_a_full_one_kept():
    kept, emptied = keras.Variable(np.ones(3)), keras.Variable(np.zeros(2))
    values = compat.jax_variable_values([kept, emptied])
    assert [value is not None for _, value in values] == [True, True]
    emptied._value = None  # as Keras's JAX trainer leaves it while a step holds the value
    kept.assign(np.full(3, 5.0))
    compat.refill_jax_variables(values)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(emptied), np.zeros(2))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(kept), np.full(3, 5.0))


@pytest.mark.once("tensorflow")  # about keras-hub and tf-text, not the backend
def test_the_sentencepiece_resource_is_named_by_its_content():
    from keras_transformer.data.corpora import synthetic_translation
    from keras_transformer.tokenizers import SubwordTokenizer

    pairs = synthetic_translation(200)
    tokenizer = SubwordTokenizer.train(pairs.sources + pairs.targets, vocab_size=100)
    from tensorflow_text.python.ops import sentencepiece_tokenizer as tf_text

    resource = tokenizer.layer._sentence_piece._model_resource
    assert isinstance(resource, tf_text._SentencepieceModelResource)
    assert type(resource).__name__ == "ContentNamedResource"
    assert resource._model == tokenizer.layer.proto and resource.resource_handle is not None
    assert tokenizer.detokenize(tokenizer.tokenize(["kave tomi"])) == ["kave tomi"]
