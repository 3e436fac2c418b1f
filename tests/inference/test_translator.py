"""Tests of the §6.1 Translator: text in, text out, in order, with defined edge cases."""

import keras
import numpy as np
import pytest
from helpers import CharTokenizer

import keras_transformer as kt
from keras_transformer.inference import Hypothesis, Translation, Translator, beam_search
from keras_transformer.inference.translator import SourceTruncatedWarning


def tiny_translator(alphabet="abcdefghij", max_source_length=None, **overrides):
    tokenizer = CharTokenizer(alphabet)
    config = kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size,
                                       **{"num_layers": 1, **overrides})
    return Translator(kt.Transformer(config), tokenizer, max_source_length=max_source_length)


@pytest.fixture(scope="module")
def translator():
    """An untrained translator shared by the tests that do not change it. They all
    decode with beam_size=2 and max_output_length=6, so JAX and TensorFlow compile one
    search per batch shape for the whole module."""
    keras.utils.set_random_seed(7)
    return tiny_translator()


SEARCH = {"beam_size": 2, "max_output_length": 6}


# The text API's own work (the order of the results, truncation, a second tokenizer)
# does not depend on the backend: it is tested in the torch pass. The search under it
# is tested on every backend (test_decoding.py), and so is the trained model's
# translation below.
text_api_only = pytest.mark.once("torch")


def texts_of(results):
    return [result.text for result in results]


def test_trained_model_translates_text_by_reversing_it(reversal):
    # One character per toy word: the characters take the words' ids.
    vocabulary = reversal.vocabulary
    tokenizer = CharTokenizer("abcdef")
    assert (tokenizer.first_char_id, tokenizer.vocab_size) == (
        vocabulary.first_word_id, vocabulary.vocab_size)
    translator = Translator(reversal.model, tokenizer)
    source, _ = reversal.held_out()
    texts = tokenizer.detokenize(source)
    results = translator.translate(texts)
    translations = texts_of(results)
    exact = np.mean([t == s[::-1] for t, s in zip(translations, texts)])
    assert exact >= 0.85, f"only {exact:.0%} reversed: {list(zip(texts, translations))[:5]}"
    # Text, ids and scores are the beam search's, back in input order.
    search_ids, search_scores = beam_search(translator.model, source, tokenizer.bos_id,
                                            tokenizer.eos_id)
    assert [result.ids for result in results] == [
        [int(t) for t in row if t != tokenizer.pad_id] for row in search_ids]
    np.testing.assert_allclose([result.score for result in results], search_scores, atol=1e-4)
    assert max(len(t) for t in texts) <= reversal.max_sentence_length


@text_api_only
def test_results_come_back_in_input_order_whatever_the_batch_size(translator):
    sentences = ["abc", "j", "hgfedcb", "cab", "jihgfe", "ee"]
    together = translator.translate(sentences, batch_size=6, **SEARCH)
    # Sorted by length, then decoded in batches of 2 with other neighbours.
    in_pairs = translator.translate(sentences, batch_size=2, **SEARCH)
    assert texts_of(in_pairs) == texts_of(together)
    assert [result.ids for result in in_pairs] == [result.ids for result in together]
    together_scores = [result.score for result in together]
    assert len(set(np.round(together_scores, 3))) == len(sentences)
    np.testing.assert_allclose([result.score for result in in_pairs], together_scores,
                               atol=1e-4)


def test_each_result_holds_text_score_and_ids_of_one_hypothesis(translator):
    results = translator.translate(["abc", "defg"], **SEARCH)
    assert all(isinstance(result, Translation) and len(result.hypotheses) == 1
               and not result.truncated and result.alignment is None for result in results)
    scores = [result.score for result in results]
    assert isinstance(scores[0], float) and all(s <= 0 for s in scores)
    pad_id = translator.tokenizer.pad_id
    ids = [result.ids for result in results]
    assert all(0 < len(row) <= 6 and pad_id not in row for row in ids)
    assert texts_of(results) == translator.tokenizer.detokenize(ids)
    assert results[0].hypotheses[0] == Hypothesis(results[0].text, scores[0], ids[0])


def test_empty_sentence_translates_to_empty_text(translator):
    empty, full, _ = results = translator.translate(["", "abc", ""], **SEARCH)
    assert results[0] == results[2] == empty == Translation([Hypothesis("", 0.0, [])])
    assert full.ids
    assert texts_of(translator.translate([""])) == [""]
    assert translator.translate([]) == []


def test_n_best_gives_pairs_best_first_led_by_the_translation(translator):
    sentences = ["abc", "", "hgfedcb"]
    best = translator.translate(sentences, **SEARCH)
    n_best = translator.translate(sentences, num_return=2, **SEARCH)
    assert [result.truncated for result in n_best] == [False] * 3
    assert [len(result.hypotheses) for result in n_best] == [2, 2, 2]
    for row in (0, 2):
        first, second = n_best[row].hypotheses
        assert (first.text, first.ids) == (best[row].text, best[row].ids)
        assert first.score == pytest.approx(best[row].score, abs=1e-5)
        assert first.score >= second.score and first.ids != second.ids
        assert [h.text for h in n_best[row].hypotheses] == translator.tokenizer.detokenize(
            [h.ids for h in n_best[row].hypotheses])
    assert n_best[1].hypotheses == [Hypothesis("", 0.0, [])] * 2
    [alone] = translator.translate(["abc"], num_return=1, **SEARCH)
    assert (alone.text, alone.ids) == (best[0].text, best[0].ids)
    with pytest.raises(ValueError, match="num_return=3 is more than beam_size=2"):
        translator.translate(["abc"], num_return=3, **SEARCH)


@text_api_only
def test_separate_target_tokenizer_decodes_the_output():
    source_tokenizer = CharTokenizer("abcdefghij")
    target_tokenizer = CharTokenizer("XYZ", bos_id=3, eos_id=2)  # other special ids too
    model = kt.Transformer(kt.TransformerConfig.tiny(
        vocab_size=source_tokenizer.vocab_size, target_vocab_size=target_tokenizer.vocab_size,
        share_embeddings=False, num_layers=1,
    ))
    translator = Translator(model, source_tokenizer, target_tokenizer=target_tokenizer)
    assert translator.target_tokenizer is target_tokenizer
    results = translator.translate(["abc", "jjj"], **SEARCH)
    texts, ids = texts_of(results), [result.ids for result in results]
    assert all(set(text) <= set("XYZ") for text in texts)
    bos, eos = target_tokenizer.bos_id, target_tokenizer.eos_id
    assert all(0 < t < target_tokenizer.vocab_size and t != bos for row in ids for t in row)
    assert texts == target_tokenizer.detokenize([[t for t in row if t != eos] for row in ids])
    with pytest.raises(ValueError, match=r"target_tokenizer.vocab_size=14 exceeds the "
                                         r"model's vocabulary \(7 ids\)"):
        Translator(model, source_tokenizer, target_tokenizer=source_tokenizer)


@text_api_only
def test_sentence_over_the_limit_is_truncated_flagged_and_the_others_translated():
    keras.utils.set_random_seed(3)
    translator = tiny_translator(max_length=16, position_encoding="learned")
    assert translator.max_source_length == 16  # the learned table has 16 rows
    assert translator.source_ids(["a" * 15]) == [[4] * 15 + [3]]  # 15 tokens + EOS fit
    with pytest.warns(UserWarning, match=r"1 of 3 sentence\(s\) are longer than "
                                         r"max_source_length=16 .* sentence 1 \(17 tokens"):
        results = translator.translate(["abc", "b" * 15 + "cd", ""], max_output_length=3)
    assert [result.truncated for result in results] == [False, True, False]
    # The truncated sentence translates as its first 15 tokens do, alone.
    [alone] = translator.translate(["b" * 15], max_output_length=3)
    assert results[1].ids == alone.ids and not alone.truncated
    # An n-best list truncates alike.
    with pytest.warns(SourceTruncatedWarning, match="sentence 1"):
        n_best = translator.translate(["abc", "b" * 15 + "cd", ""], max_output_length=3,
                                      num_return=2)
    assert [result.truncated for result in n_best] == [False, True, False]
    assert [len(result.hypotheses) for result in n_best] == [2, 2, 2]
    with pytest.raises(ValueError, match="past the model's learned position table"):
        tiny_translator(max_length=16, position_encoding="learned", max_source_length=17)


def test_sinusoidal_positions_take_sources_longer_than_the_training_length():
    # §3.5: sinusoids extend past the lengths seen in training.
    translator = tiny_translator(max_length=16)
    assert translator.max_source_length == 1024
    ids, truncated = translator.source_ids(["a" * 40], return_truncated=True)
    assert len(ids[0]) == 41 and truncated == [False]
    limited = tiny_translator(max_length=16, max_source_length=8)
    with pytest.warns(UserWarning, match="max_source_length=8"):
        assert limited.source_ids(["a" * 40]) == [[4] * 7 + [3]]
    with pytest.raises(ValueError, match="max_source_length=1 must be an integer >= 2"):
        tiny_translator(max_source_length=1)


def test_progress_bar_when_verbose(translator, capsys):
    translator.translate(["abc", "", "de"], batch_size=1, verbose=1, **SEARCH)
    assert "3/3" in capsys.readouterr().out
    translator.translate(["abc"], **SEARCH)
    assert capsys.readouterr().out == ""


def test_bad_inputs_are_explained(translator):
    with pytest.raises(TypeError, match=r"wrap it in a list"):
        translator.translate("abc")
    with pytest.raises(TypeError, match=r"sentences\[1\] is a list"):
        translator.translate(["abc", [4, 5]])
    with pytest.raises(ValueError, match="batch_size=0 must be a positive integer"):
        translator.translate(["abc"], batch_size=0)
    with pytest.raises(ValueError, match="beam_size=0 must be a positive integer"):
        translator.translate([""], beam_size=0)
    model = translator.model
    with pytest.raises(TypeError, match=r"lacks vocab_size, detokenize\(\)"):
        Translator(model, type("Half", (), {"pad_id": 0, "bos_id": 2, "eos_id": 3,
                                            "tokenize": lambda self, texts: []})())
    with pytest.raises(ValueError, match="tokenizer.pad_id=4 but the model pads with"):
        Translator(model, CharTokenizer("abc", pad_id=4))
    with pytest.raises(ValueError, match="exceeds the model's vocabulary"):
        Translator(model, CharTokenizer("abcdefghijklmnopqrstuvwxyz"))
    with pytest.raises(TypeError, match="needs a keras_transformer.Transformer"):
        Translator(object(), translator.tokenizer)


def test_bytes_instead_of_text_are_rejected(translator):
    with pytest.raises(TypeError, match=r"sentences\[1\] is a bytes, not a str"):
        translator.translate(["abc", b"\xff\xfe"])
