"""End-to-end training with model.fit (§5) on the toy tasks: their vocabulary and
arrays, mixed precision, and a model that learns."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.data.toy_tasks import ToyVocabulary, copy_task, reverse_task
from keras_transformer.tokenizers import SubwordTokenizer


def compile_model(model, learning_rate):
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
        loss=kt.LabelSmoothedCrossEntropy(model.config.label_smoothing),
        metrics=[kt.MaskedTokenAccuracy()],
    )


def test_toy_vocabulary_has_the_special_ids_of_subword_tokenizers():
    vocabulary = ToyVocabulary(12)
    for name in ("pad_id", "unk_id", "bos_id", "eos_id"):
        assert getattr(vocabulary, name) == getattr(SubwordTokenizer, name)
    assert vocabulary.vocab_size == 12


def test_toy_vocabulary_round_trip_skips_special_ids():
    vocabulary = ToyVocabulary(12)
    assert vocabulary.tokenize(["w4 w11", "", "w3 w12 cat w5"]) == [[4, 11], [], [1, 1, 1, 5]]
    assert vocabulary.detokenize([[4, 11], np.array([2, 5, 0, 1, 6, 3, 7, 0])]) == ["w4 w11",
                                                                                    "w5 w6"]
    with pytest.raises(TypeError, match="list of strings"):
        vocabulary.tokenize("w4")
    with pytest.raises(ValueError, match="vocab_size=4 must be above 4"):
        ToyVocabulary(4)


@pytest.mark.parametrize("task, arrange", [(copy_task, lambda words: words),
                                           (reverse_task, lambda words: words[::-1])])
def test_toy_tasks_use_the_ids_of_their_vocabulary(task, arrange):
    vocabulary = ToyVocabulary(9)
    inputs, labels = task(50, min_sentence_length=2, max_sentence_length=5, seed=4,
                          vocabulary=vocabulary)
    assert inputs["source"].shape == inputs["target"].shape == labels.shape == (50, 6)
    sources = vocabulary.detokenize(inputs["source"])
    assert vocabulary.detokenize(labels) == [" ".join(arrange(s.split())) for s in sources]
    assert {len(s.split()) for s in sources} == {2, 3, 4, 5}
    words = inputs["source"][inputs["source"] >= 4]
    assert words.min() == 4 and words.max() == 8
    np.testing.assert_array_equal(inputs["target"][:, 0], vocabulary.bos_id)
    np.testing.assert_array_equal(inputs["target"][:, 1:], np.where(
        labels[:, :-1] == vocabulary.eos_id, vocabulary.pad_id, labels[:, :-1]))
    assert np.all((labels == vocabulary.eos_id).sum(1) == 1)
    assert np.all((inputs["source"] == vocabulary.eos_id).sum(1) == 1)
    # Without a vocabulary, the task makes one of `vocab_size`.
    again, _ = task(50, vocab_size=9, min_sentence_length=2, max_sentence_length=5, seed=4)
    np.testing.assert_array_equal(again["source"], inputs["source"])


def test_bad_toy_task_lengths_are_explained():
    with pytest.raises(ValueError, match="min_sentence_length=3 is above max_sentence_length=2"):
        copy_task(4, min_sentence_length=3, max_sentence_length=2)


@pytest.mark.slow
@pytest.mark.xla  # the library's own choice: XLA under TensorFlow on a CPU
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_fit_gives_finite_decreasing_loss(policy):
    keras.config.set_dtype_policy(policy)
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=16, num_layers=1,
                                                         dropout_rate=0.1))
    compile_model(model, learning_rate=3e-3)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    inputs, labels = reverse_task(64, seed=3)
    history = model.fit(inputs, labels, batch_size=32, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] - 0.2, losses


def test_a_small_model_learns_to_reverse_sequences(reversal):
    """≥ 95% token accuracy, teacher-forced, on sequences the model never saw, after a
    test-sized budget: the `reversal` fixture's 192 steps of `fit` with Adam and a
    polynomial decay (tests/conftest.py), on every backend. Its beam-search outputs are
    tests/inference/test_decoding.py's. (The paper's schedule is checked value by value
    in training/test_schedule.py; the recipes and the distributed runs train with it.)"""
    inputs, labels = reverse_task(1024, vocabulary=reversal.vocabulary,
                                  max_sentence_length=reversal.max_sentence_length, seed=2)
    seen = {tuple(row) for row in reversal.training_set()[0]["source"]}
    unseen = np.array([tuple(row) not in seen for row in inputs["source"]])
    assert unseen.sum() >= 200, unseen.sum()
    inputs = {name: array[unseen] for name, array in inputs.items()}
    logits = reversal.model.predict(inputs, batch_size=128, verbose=0)
    accuracy = kt.MaskedTokenAccuracy(pad_id=reversal.vocabulary.pad_id)
    accuracy.update_state(labels[unseen], logits)
    assert float(accuracy.result()) >= 0.95, float(accuracy.result())


@pytest.fixture(scope="module")
def trained_on_16_ids():
    """One tiny model for the three out-of-range cases: each compiles no new
    step (under TensorFlow an XLA compilation is most of a case's time)."""
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=16, num_layers=1))
    compile_model(model, learning_rate=1e-3)
    inputs, labels = reverse_task(64, seed=5)
    model.fit(inputs, labels, batch_size=16, epochs=1, verbose=0)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("where", ["source", "target", "labels"])
@pytest.mark.backs("docs/troubleshooting.md",
                   "Token ids outside the vocabulary are refused before a compiled step reads them")
def test_out_of_range_ids_in_a_dataset_stop_fit_before_any_update(where, trained_on_16_ids):
    """Inside a compiled step an id past the vocabulary reads NaN (JAX) or is
    clamped (XLA): fit checks each batch first, on every backend."""
    import tensorflow as tf

    model = trained_on_16_ids
    inputs, labels = reverse_task(64, seed=5)
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    if where == "labels":
        labels[3, 1] = 16
    else:
        inputs[where][3, 1] = 16
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(16)
    with pytest.raises(ValueError, match=rf"{where} ids must lie in 0 <= id < 16 \(the "
                                         r"vocabulary of the model\), but a batch holds ids "
                                         r"from 0 to 16\. Tokenize"):
        model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    after = [keras.ops.convert_to_numpy(w) for w in model.weights]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    # NumPy inputs are checked before fit starts; -1 (the last row under JAX) too.
    if where != "labels":
        inputs[where][3, 1] = -1
        with pytest.raises(ValueError, match=rf"{where} holds ids from -1 to"):
            model.fit(inputs, labels, batch_size=16, verbose=0)
    # The model still trains on good data.
    inputs, labels = reverse_task(32, seed=6)
    model.fit(tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(16), verbose=0,
              shuffle=False)
