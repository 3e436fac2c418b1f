"""Tests of BLEU evaluation (§6.1 results): scores, hypotheses file, speed figures.

The expected BLEU values follow from the definition (Papineni et al., 2002):
BLEU = BP · (p1 p2 p3 p4)^(1/4), with p_n the clipped n-gram precision summed
over the corpus and BP = exp(1 - r/c) when the hypotheses (c tokens) are
shorter than the references (r tokens), else 1. The cases avoid zero
n-gram counts, where sacreBLEU's smoothing would enter.
"""

import logging

import numpy as np
import pytest
from helpers import CharTokenizer, tiny_model

from keras_transformer import evaluation
from keras_transformer.evaluation import EvaluationResult, bleu_scores, evaluate, group_references
from keras_transformer.inference import Hypothesis, Translation, Translator

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")


class FixedTranslator:
    """Returns given translations, to check the scoring on known text."""

    def __init__(self, translations):
        self.translations = translations
        self.calls = []

    def translate(self, sentences, **kwargs):
        self.calls.append(kwargs)
        return [Translation([Hypothesis(text, 0.0, [7] * (len(text.split()) + 1))])
                for text in (self.translations[s] for s in sentences)]


SOURCES = ["ein Mann", "zwei Hunde", "eine Frau"]
REFERENCES = ["A man is riding a bike .", "Two dogs play in the snow .",
              "A woman sings on a stage ."]


def test_scores_are_cased_and_lowercased_bleu_on_13a_tokens(tmp_path):
    # "bike." is "bike ." after 13a tokenization; only "two" differs, by its case.
    hypotheses = ["A man is riding a bike.", "two dogs play in the snow .",
                  "A woman sings on a stage ."]
    translator = FixedTranslator(dict(zip(SOURCES, hypotheses)))
    path = tmp_path / "out" / "test.hyp"
    result = evaluate(translator, SOURCES, REFERENCES, hypotheses_path=path,
                      beam_size=3, alpha=0.5, batch_size=2, verbose=0)
    assert isinstance(result, EvaluationResult)
    assert result.bleu_lowercase == pytest.approx(100.0)
    # Cased, 3 x 7 tokens: "two" misses 1 of 21 unigrams, and 1 of the 18 bigrams,
    # 15 trigrams and 12 four-grams; same length, so BP = 1.
    expected = 100 * (20 / 21 * 17 / 18 * 14 / 15 * 11 / 12) ** 0.25
    assert result.bleu == pytest.approx(expected, abs=1e-6)
    assert "case:mixed" in result.bleu_signature and "tok:13a" in result.bleu_signature
    assert "case:lc" in result.bleu_lowercase_signature
    assert path.read_text(encoding="utf-8") == "".join(h + "\n" for h in hypotheses)
    assert result.hypotheses == hypotheses and result.hypotheses_path == str(path)
    assert translator.calls == [{"beam_size": 3, "alpha": 0.5, "max_output_length": None,
                                 "batch_size": 2, "verbose": 0}]


def test_speed_counts_sentences_and_output_tokens(monkeypatch):
    translator = FixedTranslator(dict(zip(SOURCES, REFERENCES)))
    # The translation starts at 100 s and ends at 104 s on the clock.
    clock = iter([100.0, 104.0])
    monkeypatch.setattr(evaluation.time, "perf_counter", lambda: next(clock))
    result = evaluate(translator, SOURCES, REFERENCES, verbose=0)
    assert result.bleu == pytest.approx(100.0)
    # 7 + 7 + 7 words, and EOS after each.
    assert (result.num_sentences, result.num_tokens, result.seconds) == (3, 24, 4.0)
    assert (result.sentences_per_second, result.tokens_per_second) == (0.75, 6.0)
    assert result.hypotheses_path is None
    assert "BLEU 100.00" in result.summary()


def test_hypotheses_file_has_one_line_per_sentence(tmp_path):
    translator = FixedTranslator({"a": "two\nlines", "b": "one"})
    path = tmp_path / "hyp.txt"
    result = evaluate(translator, ["a", "b"], ["two lines", "one"], hypotheses_path=path,
                      verbose=0)
    assert path.read_text(encoding="utf-8") == "two lines\none\n"
    assert result.hypotheses == ["two lines", "one"]


@pytest.mark.parametrize("hypothesis, reference, cased_bleu, lowercase_bleu", [
    ("a b c d", "a b c d", 100.0, 100.0),
    ("a b c d", "e f g h", 0.0, 0.0),  # no unigram in common
    ("A B C D", "a b c d", 0.0, 100.0),  # the case counts only cased
    # p1..p4 = 4/5, 3/4, 2/3, 1/2; equal lengths, BP = 1: 100 * (1/5)^(1/4).
    ("a b c d x", "a b c d e", 100 * 0.2 ** 0.25, 100 * 0.2 ** 0.25),
    # Every n-gram matches, but 4 tokens against 6: BP = exp(1 - 6/4).
    ("a b c d", "a b c d e f", 100 * np.exp(-0.5), 100 * np.exp(-0.5)),
])
def test_bleu_scores_of_known_cases(hypothesis, reference, cased_bleu, lowercase_bleu):
    cased, lowercase = bleu_scores([hypothesis], [reference])
    assert cased.score == pytest.approx(cased_bleu, abs=1e-6)
    assert lowercase.score == pytest.approx(lowercase_bleu, abs=1e-6)
    assert "case:mixed" in cased.signature and "case:lc" in lowercase.signature


def test_evaluates_a_real_translator_with_a_progress_bar(tmp_path, capsys):
    tokenizer = CharTokenizer()
    model = tiny_model(tokenizer.vocab_size, num_layers=1)
    translator = Translator(model, tokenizer)
    sources = ["abc", "bad cab", "", "hag"]
    references = ["cba", "bac dab", "", "gah"]
    search = {"beam_size": 2, "max_output_length": 4, "batch_size": 4}
    path = tmp_path / "hyp.txt"
    result = evaluate(translator, sources, references, hypotheses_path=path, **search)
    assert "4/4" in capsys.readouterr().out
    # What the translator gives, written line by line, scored, and its ids counted.
    results = translator.translate(sources, **search)
    texts, ids = [r.text for r in results], [r.ids for r in results]
    assert result.hypotheses == texts and texts[2] == "" and ids[2] == []
    assert path.read_text(encoding="utf-8").split("\n") == texts + [""]
    assert result.num_tokens == sum(len(row) for row in ids)
    assert all(0 < len(row) <= 4 for i, row in enumerate(ids) if i != 2)
    assert result.bleu == bleu_scores(texts, references)[0].score
    assert result.tokens_per_second == pytest.approx(result.num_tokens / result.seconds)

    # A model that always ends at once: empty translations, one EOS each, BLEU 0.
    bias = np.zeros(tokenizer.vocab_size, "float32")
    bias[tokenizer.eos_id] = 1e4
    model.target_embedding.output_bias.assign(bias)
    silent = evaluate(translator, sources, references, verbose=0, **search)
    assert silent.hypotheses == ["", "", "", ""]
    assert silent.num_tokens == 3
    assert silent.bleu == 0.0


def test_mismatched_inputs_are_explained():
    translator = FixedTranslator({})
    with pytest.raises(ValueError, match="3 sources but 2 references"):
        evaluate(translator, SOURCES, REFERENCES[:2])
    with pytest.raises(TypeError, match="references must be a list of strings"):
        evaluate(translator, ["a"], "a")
    with pytest.raises(ValueError, match="sources is empty"):
        evaluate(translator, [], [])
    with pytest.raises(TypeError, match=r"references\[0\] is a dict"):
        evaluate(translator, ["a"], [{"a": "b"}])
    with pytest.raises(ValueError, match=r"references\[1\] is an empty list"):
        evaluate(translator, ["a", "b"], [["a"], []])
    with pytest.raises(TypeError, match=r"references\[0\]\[1\] is a bytes"):
        evaluate(translator, ["a"], [["a", b"b"]])


def test_an_n_gram_counts_when_any_reference_has_it():
    hypotheses = ["a b c d e f", "w x y z"]
    references = [["a b c d", "c d e f"], "w x y z"]
    translator = FixedTranslator(dict(zip(SOURCES, hypotheses)))
    result = evaluate(translator, SOURCES[:2], references, verbose=0)
    assert "nrefs:var" in result.bleu_signature
    # Unigrams to trigrams of "a b c d e f" are each in one of its references; of its
    # four-grams "abcd" and "cdef" are, "bcde" is not. Corpus: p1 = 10/10, p2 = 8/8,
    # p3 = 6/6, p4 = 3/4; c = 10 > r = 8, so BP = 1.
    assert result.bleu == pytest.approx(100 * 0.75 ** 0.25, abs=1e-6)
    # Against the first references alone: p1..p4 = 8/10, 6/8, 4/6, 2/4.
    first_only = bleu_scores(hypotheses, ["a b c d", "w x y z"])[0]
    assert first_only.score == pytest.approx(100 * 0.2 ** 0.25, abs=1e-6)
    same_count = bleu_scores(["a b c d"], [["a b c d", "e f g h"]])[0]
    assert same_count.score == pytest.approx(100.0) and "nrefs:2" in same_count.signature


def test_group_references_merges_repeated_sources_in_order():
    sources = ["Help!", "Run.", "Help!", "Who?", "Help!", "Run."]
    references = ["¡Ayuda!", "Corre.", "¡Auxilio!", "¿Quién?", "¡Ayuda!", "Corred."]
    unique, grouped = group_references(sources, references)
    assert unique == ["Help!", "Run.", "Who?"]
    assert grouped == [["¡Ayuda!", "¡Auxilio!"], ["Corre.", "Corred."], ["¿Quién?"]]
    with pytest.raises(ValueError, match="2 sources but 1 references"):
        group_references(["a", "b"], ["c"])


def test_over_long_sources_are_truncated_and_counted_not_fatal():
    # A test set with one sentence over the limit still gets a score.
    tokenizer = CharTokenizer()
    translator = Translator(tiny_model(tokenizer.vocab_size, seed=0, num_layers=1), tokenizer,
                            max_source_length=4)
    with pytest.warns(UserWarning, match="1 of 2 sentence"):
        result = evaluate(translator, ["ab", "abcdefg"], ["ba", "gfedcba"], verbose=0,
                          beam_size=1, max_output_length=3)
    assert result.num_truncated == 1 and len(result.hypotheses) == 2
    assert "1 source(s) truncated" in result.summary()


@pytest.mark.parametrize("references_end_in_a_period, force, warned", [
    (True, None, False),   # " ." is a word of the data, as in the synthetic task
    (False, None, True),   # tokenized hypotheses against detokenized references
    (False, True, False),
    (True, False, True),   # sacreBLEU's own check
])
def test_the_tokenized_text_warning_shows_only_where_it_applies(
        references_end_in_a_period, force, warned, caplog, monkeypatch):
    # Without the command lines' show-once filter, which an earlier test may have set.
    monkeypatch.setattr(logging.getLogger("sacrebleu"), "filters", [])
    hypotheses = [f"word{i} ." for i in range(120)]
    references = hypotheses if references_end_in_a_period else [f"word{i}." for i in range(120)]
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        bleu_scores(hypotheses, references, force=force)
    assert any("tokenized period" in r.getMessage() for r in caplog.records) is warned
