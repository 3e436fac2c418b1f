"""Tests of the §5.1 tf.data pipeline: shift, budget, length policy, fit."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.training.data import synthetic_translation
from keras_transformer.training.pipeline import bucket_plan, encode_pairs, make_dataset
from keras_transformer.training.tokenizers import BOS_ID, EOS_ID, SubwordTokenizer


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory):
    corpus = synthetic_translation(600, seed=0, max_length=12)
    directory = str(tmp_path_factory.mktemp("tokenizer"))
    SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=320).save(directory)
    return corpus, directory


@pytest.fixture
def corpus_and_tokenizer(saved_tokenizer):
    """Loaded per test: per-test seeding frees older tf-text resources."""
    corpus, directory = saved_tokenizer
    return corpus, SubwordTokenizer.load(directory)


def batches(dataset):
    return [({k: v.numpy() for k, v in x.items()}, y.numpy()) for x, y in dataset]


def test_decoder_input_is_labels_shifted_right(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    dataset, _ = make_dataset(corpus.sources, corpus.targets, tokenizer, max_length=16,
                              tokens_per_batch=256, shuffle=False, verbose=False)
    for x, y in batches(dataset):
        assert x["source"].dtype == np.int32 and x["source"].shape == x["target"].shape == y.shape
        assert np.all(x["target"][:, 0] == BOS_ID)
        words = (y[:, :-1] != 0) & (y[:, :-1] != EOS_ID)
        np.testing.assert_array_equal(x["target"][:, 1:][words], y[:, :-1][words])
        assert np.all(x["target"][:, 1:][y[:, :-1] == EOS_ID] == 0)
        assert np.all((y == EOS_ID).sum(1) == 1) and np.all((x["source"] == EOS_ID).sum(1) == 1)


def test_batches_respect_the_token_budget_and_cover_every_pair(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    dataset, stats = make_dataset(corpus.sources, corpus.targets, tokenizer, max_length=24,
                                  tokens_per_batch=200, verbose=False)
    seen = 0
    produced = batches(dataset)
    for x, y in produced:
        assert x["source"].size <= 200 and x["target"].size <= 200
        assert x["source"].shape[1] in bucket_plan(24, 200)[2]
        seen += len(y)
    assert seen == stats.kept == 600
    assert len(produced) == stats.batches_per_pass


def test_overlong_pairs_are_dropped_or_truncated_and_counted(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    long_source = " ".join(corpus.sources[:6])
    sources, targets = corpus.sources[:10] + [long_source], corpus.targets[:10] + ["x ."]
    _, _, dropped = encode_pairs(sources, targets, tokenizer, max_length=16, overlong="drop")
    assert dropped.dropped_overlong >= 1 and dropped.kept == 11 - dropped.dropped_overlong
    kept_sources, _, truncated = encode_pairs(sources, targets, tokenizer, max_length=16,
                                              overlong="truncate")
    assert truncated.truncated == dropped.dropped_overlong and truncated.kept == 11
    assert max(len(s) for s in kept_sources) <= 16 and kept_sources[-1][-1] == EOS_ID


def test_bad_pipeline_arguments(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    with pytest.raises(ValueError, match="overlong='cut'"):
        encode_pairs(corpus.sources, corpus.targets, tokenizer, overlong="cut")
    with pytest.raises(ValueError, match="tokens_per_batch=10 is below max_length=16"):
        bucket_plan(16, 10)
    with pytest.raises(ValueError, match="No pair is left"):
        make_dataset(["a b c d e f"], ["x"], tokenizer, max_length=2, verbose=False)


def test_pipeline_feeds_model_fit(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    dataset, _ = make_dataset(corpus.sources, corpus.targets, tokenizer, max_length=16,
                              tokens_per_batch=512, repeat=True, verbose=False)
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=kt.LabelSmoothedCrossEntropy())
    history = model.fit(dataset, steps_per_epoch=3, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
