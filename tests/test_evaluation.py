"""Tests of BLEU evaluation (§6.1 results): scores, hypotheses file, speed figures."""

import numpy as np
import pytest
import sacrebleu
from helpers import CharTokenizer

import keras_transformer as kt
from keras_transformer.evaluation import (EvaluationResult, bleu_scores, evaluate,
                                         group_references)
from keras_transformer.inference import Translator


class FixedTranslator:
    """Returns given translations, to check the scoring on known text."""

    def __init__(self, translations):
        self.translations = translations
        self.calls = []

    def translate(self, sentences, return_ids=False, **kwargs):
        self.calls.append(kwargs)
        texts = [self.translations[s] for s in sentences]
        ids = [[7] * (len(t.split()) + 1) for t in texts]
        return (texts, ids) if return_ids else texts


SOURCES = ["ein Mann", "zwei Hunde", "eine Frau"]
REFERENCES = ["A man is riding a bike .", "Two dogs play in the snow .",
              "A woman sings on a stage ."]


def test_scores_are_sacrebleu_cased_and_lowercased(tmp_path):
    hypotheses = ["A man rides a bike.", "two dogs play in snow.", "A woman sings on a stage."]
    translator = FixedTranslator(dict(zip(SOURCES, hypotheses)))
    path = tmp_path / "out" / "test.hyp"
    result = evaluate(translator, SOURCES, REFERENCES, hypotheses_path=path,
                      beam_size=3, alpha=0.5, batch_size=2, verbose=0)
    assert isinstance(result, EvaluationResult)
    cased = sacrebleu.corpus_bleu(hypotheses, [REFERENCES])
    lowercase = sacrebleu.corpus_bleu(hypotheses, [REFERENCES], lowercase=True)
    assert result.bleu == pytest.approx(cased.score)
    assert result.bleu_lowercase == pytest.approx(lowercase.score)
    assert result.bleu < result.bleu_lowercase < 100  # "two" vs "Two" counts only cased
    assert "case:mixed" in result.bleu_signature and "tok:13a" in result.bleu_signature
    assert "case:lc" in result.bleu_lowercase_signature
    assert path.read_text(encoding="utf-8") == "".join(h + "\n" for h in hypotheses)
    assert result.hypotheses == hypotheses and result.hypotheses_path == str(path)
    assert translator.calls == [{"beam_size": 3, "alpha": 0.5, "max_length": None, "batch_size": 2,
                                     "verbose": 0}]


def test_speed_counts_sentences_and_output_tokens():
    translator = FixedTranslator(dict(zip(SOURCES, REFERENCES)))
    result = evaluate(translator, SOURCES, REFERENCES, verbose=0)
    assert result.bleu == pytest.approx(100.0)
    assert result.num_sentences == 3
    assert result.num_tokens == sum(len(r.split()) + 1 for r in REFERENCES)
    assert result.seconds > 0
    assert result.sentences_per_second == pytest.approx(3 / result.seconds)
    assert result.tokens_per_second == pytest.approx(result.num_tokens / result.seconds)
    assert result.hypotheses_path is None
    assert "BLEU 100.00" in result.summary()


def test_bleu_scores_of_a_perfect_lowercase_match():
    cased, lowercase = bleu_scores(["A man rides."], ["a man rides ."])
    assert lowercase.score == pytest.approx(100.0)
    assert cased.score < 100.0


def test_evaluates_a_real_translator_with_a_progress_bar(tmp_path, capsys):
    tokenizer = CharTokenizer()
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size))
    sources = ["abc", "bad cab", "", "hag"]
    references = ["cba", "bac dab", "", "gah"]
    path = tmp_path / "hyp.txt"
    result = evaluate(Translator(model, tokenizer), sources, references, hypotheses_path=path,
                      beam_size=2, max_length=4, batch_size=4)
    lines = path.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[-1] == "" and lines[2] == ""
    assert 0.0 <= result.bleu <= 100.0 and np.isfinite(result.tokens_per_second)
    assert 3 <= result.num_tokens <= 12
    assert "4/4" in capsys.readouterr().out


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


def test_several_references_per_sentence_match_sacrebleu_streams():
    hypotheses = ["Help me!", "I run every day.", "Who is it?"]
    references = [["Help!", "Help me!", "Save me!"], "I run daily.", ["Who's that?", "Who is it?"]]
    translator = FixedTranslator(dict(zip(SOURCES, hypotheses)))
    result = evaluate(translator, SOURCES, references, verbose=0)
    streams = [["Help!", "I run daily.", "Who's that?"], ["Help me!", None, "Who is it?"],
               ["Save me!", None, None]]
    assert result.bleu == pytest.approx(sacrebleu.corpus_bleu(hypotheses, streams).score)
    assert "nrefs:var" in result.bleu_signature
    # Any reference counts: scored against only the first of each, BLEU is lower.
    single = sacrebleu.corpus_bleu(hypotheses, [[r if isinstance(r, str) else r[0]
                                                 for r in references]])
    assert result.bleu > single.score
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
