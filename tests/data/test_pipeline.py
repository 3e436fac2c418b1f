"""Tests of the §5.1 tf.data pipeline: shift, budget, length policy, fit."""

import warnings

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.data.batches import id_table, pair_order
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer.data.pipeline import (
    bucket_plan,
    encode_pairs,
    make_dataset,
)
from keras_transformer.tokenizers import SubwordTokenizer


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory):
    corpus = synthetic_translation(600, seed=0, max_sentence_length=12)
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


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_decoder_input_is_labels_shifted_right(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    dataset, _ = make_dataset(corpus.sources, corpus.targets, tokenizer, max_sentence_length=16,
                              tokens_per_batch=256, shuffle=False, verbose=False)
    bos, eos, pad = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id
    for x, y in batches(dataset):
        assert x["source"].dtype == np.int32 and x["source"].shape == x["target"].shape == y.shape
        assert np.all(x["target"][:, 0] == bos)
        words = (y[:, :-1] != pad) & (y[:, :-1] != eos)
        np.testing.assert_array_equal(x["target"][:, 1:][words], y[:, :-1][words])
        assert np.all(x["target"][:, 1:][y[:, :-1] == eos] == pad)
        assert np.all((y == eos).sum(1) == 1) and np.all((x["source"] == eos).sum(1) == 1)


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_batches_respect_the_token_budget_and_cover_every_pair(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    dataset, stats = make_dataset(corpus.sources, corpus.targets, tokenizer,
                                  max_sentence_length=24, tokens_per_batch=200, verbose=False)
    seen = 0
    produced = batches(dataset)
    for x, y in produced:
        assert x["source"].size <= 200 and x["target"].size <= 200
        assert x["source"].shape[1] in bucket_plan(24, 200)[2]
        seen += len(y)
    assert seen == stats.kept == 600
    assert len(produced) == stats.batches_per_pass


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_overlong_pairs_are_dropped_or_truncated_and_counted(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    long_source = " ".join(corpus.sources[:6])
    sources, targets = corpus.sources[:10] + [long_source], corpus.targets[:10] + ["x ."]
    _, _, dropped = encode_pairs(sources, targets, tokenizer, max_sentence_length=16,
                                 overlong="drop")
    assert dropped.dropped_overlong >= 1 and dropped.kept == 11 - dropped.dropped_overlong
    kept_sources, _, truncated = encode_pairs(sources, targets, tokenizer, max_sentence_length=16,
                                              overlong="truncate")
    assert truncated.truncated == dropped.dropped_overlong and truncated.kept == 11
    assert max(len(s) for s in kept_sources) <= 16 and kept_sources[-1][-1] == tokenizer.eos_id


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_bad_pipeline_arguments(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    with pytest.raises(ValueError, match="overlong='cut' must be one of"):
        encode_pairs(corpus.sources, corpus.targets, tokenizer, overlong="cut")
    with pytest.raises(ValueError, match="max_sentence_length=1 must be at least 2"):
        encode_pairs(corpus.sources, corpus.targets, tokenizer, max_sentence_length=1)
    with pytest.raises(ValueError, match="tokens_per_batch=10 is below max_sentence_length=16"):
        bucket_plan(16, 10)
    with pytest.raises(ValueError, match="batch_multiple=0 must be a positive integer"):
        bucket_plan(16, 100, batch_multiple=0)
    with pytest.raises(ValueError, match="No pair is left"):
        make_dataset(["a b c d e f"], ["x"], tokenizer, max_sentence_length=2, verbose=False)


class WordTokenizer:
    """Whole words, with special ids unlike SubwordTokenizer's, to show that the
    pipeline reads them from the tokenizer it is given."""

    def __init__(self, words, pad_id, bos_id, eos_id):
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        first = max(pad_id, bos_id, eos_id) + 1
        self.ids = {word: first + i for i, word in enumerate(words)}

    def tokenize(self, texts):
        return [[self.ids[word] for word in text.split()] for text in texts]


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_special_ids_and_padding_come_from_the_tokenizers():
    source_tokenizer = WordTokenizer(["a", "b", "c"], pad_id=5, bos_id=6, eos_id=7)
    target_tokenizer = WordTokenizer(["x", "y"], pad_id=9, bos_id=1, eos_id=3)
    sources, targets = ["a b c", "c"], ["x y", "y"]
    encoded_sources, encoded_targets, _ = encode_pairs(sources, targets, source_tokenizer,
                                                       target_tokenizer)
    assert encoded_sources == [[8, 9, 10, 7], [10, 7]]
    assert encoded_targets == [[1, 10, 11, 3], [1, 11, 3]]
    dataset, _ = make_dataset(sources, targets, source_tokenizer, target_tokenizer,
                              max_sentence_length=4, tokens_per_batch=8, bucket_width=4,
                              shuffle=False, verbose=False, batch_multiple=4)
    (x, y), = batches(dataset)
    np.testing.assert_array_equal(x["source"], [[8, 9, 10, 7], [10, 7, 5, 5], [5] * 4, [5] * 4])
    np.testing.assert_array_equal(x["target"], [[1, 10, 11, 9], [1, 11, 9, 9], [9] * 4, [9] * 4])
    np.testing.assert_array_equal(y, [[10, 11, 3, 9], [11, 3, 9, 9], [9] * 4, [9] * 4])


@pytest.mark.slow
def test_pipeline_feeds_model_fit(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    dataset, _ = make_dataset(corpus.sources, corpus.targets, tokenizer, max_sentence_length=16,
                              tokens_per_batch=512, repeat=True, verbose=False)
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size,
                                                      num_layers=1))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=kt.LabelSmoothedCrossEntropy())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(dataset, steps_per_epoch=3, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    # The dataset shuffles itself: fit's default shuffle=True would only warn.
    assert not [w for w in caught if "shuffle" in str(w.message)]


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_a_tokenizer_larger_than_the_model_is_refused_before_tokenizing(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    with pytest.raises(ValueError, match=r"train: the source tokenizer has 320 ids, more "
                                         r"than the model's vocabulary of 300"):
        make_dataset(corpus.sources, corpus.targets, tokenizer, source_vocab_size=300,
                     target_vocab_size=320, name="train", verbose=False)


class OffByOneTokenizer:
    """Says it has `vocab_size` ids but gives one id past them to a word: a
    corpus tokenized with another vocabulary."""

    pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 10

    def tokenize(self, texts):
        return [[10 if word == "bad" else 3 for word in text.split()] for text in texts]


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_an_id_outside_the_model_vocabulary_names_the_split_the_pair_and_the_id():
    sources, targets = ["a b", "c d", "e bad f"], ["x", "y", "z"]
    with pytest.raises(ValueError, match=r"dev.txt: pair 2 \(counting kept pairs from 0\) has "
                                         r"the source id 10, outside the model's vocabulary "
                                         r"\(0 <= id < 10\); 1 ids"):
        make_dataset(sources, targets, OffByOneTokenizer(), source_vocab_size=10,
                     target_vocab_size=10, name="dev.txt", verbose=False)
    # Without the model's sizes the pipeline has nothing to check against.
    make_dataset(sources, targets, OffByOneTokenizer(), verbose=False)


class OneIdPerWordTokenizer:
    """One id (3) per word: lengths are easy to count by hand."""

    pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 4

    def tokenize(self, texts):
        return [[3] * len(text.split()) for text in texts]


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_stats_give_the_padding_share_and_the_bucket_shapes():
    # Pair 1: source 1 word + EOS = 2, decoder input BOS + 1 word = 2 -> bucket 8.
    # Pair 2: source 9 words + EOS = 10, decoder input 2 -> bucket 16.
    # Positions 8 + 16 = 24: source padding 1 - 12/24, target padding 1 - 4/24.
    _, stats = make_dataset(["a", "a b c d e f g h i"], ["x", "y"], OneIdPerWordTokenizer(),
                            max_sentence_length=16, tokens_per_batch=64, verbose=False)
    assert stats.shapes == 2 and stats.batches_per_pass == 2
    assert stats.source_padding == pytest.approx(0.5)
    assert stats.target_padding == pytest.approx(1 - 4 / 24)
    assert "2 bucket shapes, padding 50% of source and 83% of target positions" in \
        stats.summary()


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_each_process_feeds_its_rows_of_every_global_batch(corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    arguments = dict(max_sentence_length=16, tokens_per_batch=128, repeat=True, seed=5,
                     verbose=False, batch_multiple=4)
    whole, _ = make_dataset(corpus.sources, corpus.targets, tokenizer, **arguments)
    halves = [make_dataset(corpus.sources, corpus.targets, tokenizer, shard=(index, 2),
                           **arguments)[0] for index in (0, 1)]
    global_batches = batches(whole.take(40))
    for (x, y), first, second in zip(global_batches, *(batches(h.take(40)) for h in halves)):
        assert first[1].shape[0] == second[1].shape[0] == y.shape[0] // 2
        np.testing.assert_array_equal(np.concatenate([first[1], second[1]]), y)
        np.testing.assert_array_equal(
            np.concatenate([first[0]["source"], second[0]["source"]]), x["source"])
    # Every iterator draws the same batches (every process builds its own).
    for (x, y), (again_x, again_y) in zip(global_batches, batches(whole.take(40))):
        np.testing.assert_array_equal(y, again_y)


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
def test_each_pass_over_the_pairs_comes_in_a_new_order_made_from_the_seed():
    def order(**arguments):
        return [int(i) for i in pair_order(10, **arguments).take(30)]

    passes = order(shuffle=True, repeat=True, seed=5)
    assert [sorted(passes[k:k + 10]) for k in (0, 10, 20)] == [list(range(10))] * 3
    assert len({tuple(passes[k:k + 10]) for k in (0, 10, 20)}) == 3
    assert passes == order(shuffle=True, repeat=True, seed=5)
    assert passes != order(shuffle=True, repeat=True, seed=6)
    assert order(shuffle=False, repeat=True, seed=5) == list(range(10)) * 3
    assert order(shuffle=True, repeat=False, seed=5) == passes[:10]


@pytest.mark.once("torch")  # tf.data and NumPy: the same under every backend
@pytest.mark.parametrize("shard", [(0, 3), (2, 2), (-1, 2)])
def test_a_shard_must_take_a_whole_part_of_every_batch(corpus_and_tokenizer, shard):
    corpus, tokenizer = corpus_and_tokenizer
    with pytest.raises(ValueError, match="shard="):
        make_dataset(corpus.sources, corpus.targets, tokenizer, batch_multiple=4, shard=shard,
                     verbose=False)


@pytest.mark.once("torch")
def test_an_array_mapped_unaligned_is_copied(tmp_path):
    """TensorFlow reads buffers aligned to 64 bytes: a mapping whose data is not is
    copied into one, with the same values."""
    values = np.arange(1, 100, dtype=np.uint16)
    path = tmp_path / "ids.bin"
    values.tofile(path)
    unaligned = np.memmap(path, dtype=np.uint16, mode="r", offset=2)
    assert unaligned.ctypes.data % 64
    table = id_table(unaligned)
    assert not np.shares_memory(np.from_dlpack(table), unaligned)
    np.testing.assert_array_equal(table.numpy(), values[1:])
