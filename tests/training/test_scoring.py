"""Scoring a run (keras_transformer_app/training/scoring.py): the test split's figures, α
tuning, the validation curve, the training time by step and perplexity."""

import csv
import os

import numpy as np
import pytest
from helpers import CharTokenizer, tiny_model

from keras_transformer import saving
from keras_transformer.data.corpora import ParallelCorpus
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.inference import Hypothesis, Translation, Translator
from keras_transformer_app import run_files
from keras_transformer_app.training import scoring
from keras_transformer_app.training.fit import list_checkpoints

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")


class LookupTranslator:
    """Translates by table: `table[alpha][source]` (or `table[None]` for any α), so
    each figure below is known in advance. Records the α of every call."""

    def __init__(self, table):
        self.table, self.alphas = table, []

    def translate(self, sources, alpha=0.6, **kwargs):
        self.alphas.append(alpha)
        texts = self.table.get(alpha, self.table.get(None))
        return [Translation([Hypothesis(texts[source], 0.0, [4, 5], [])]) for source in sources]


def test_scored_pairs_translate_a_repeated_source_once_against_all_its_references():
    corpus = ParallelCorpus(["a", "b", "a", "c"], ["x", "y", "z", "w"])
    assert scoring.scored_pairs(corpus) == (["a", "b", "c"], [["x", "z"], ["y"], ["w"]])
    assert scoring.scored_pairs(corpus, limit=2) == (["a", "b"], [["x", "z"], ["y"]])


def test_evaluate_split_counts_a_match_with_any_reference_and_scores_pairs(tmp_path):
    market = "the old man walks to the market today"
    park = "dogs run in the green park every day"
    corpus = ParallelCorpus(["a", "a", "b"], ["a young man runs home", market,
                                              "dogs play in the green park every day"])
    translator = LookupTranslator({None: {"a": market, "b": park}})
    figures = scoring.evaluate_split(translator, corpus, beam_size=2, alpha=0.8,
                                     hypotheses_path=tmp_path / "hyp.txt")
    assert translator.alphas == [0.8]
    assert (figures["test_sentences"], figures["test_references"]) == (2, 3)
    assert figures["exact_match"] == 0.5  # "a" matches its second reference, "b" none
    assert (figures["beam_size"], figures["alpha"]) == (2, 0.8)
    assert (tmp_path / "hyp.txt").read_text() == f"{market}\n{park}\n"
    # Pair by pair, "a"'s translation is also scored against its first reference alone.
    assert 0 < figures["per_pair"]["bleu"] < figures["bleu"]
    single = scoring.evaluate_split(translator, ParallelCorpus(["b"], [park]))
    assert "per_pair" not in single and single["exact_match"] == 1.0


def test_tune_alpha_picks_the_alpha_of_highest_lowercased_bleu_first_on_a_tie():
    corpus = ParallelCorpus(["a", "b"], ["The cat sat on the mat", "Dogs run in the park"])
    right = {"a": "the cat sat on the mat", "b": "dogs run in the park"}  # right lower-cased
    wrong = {"a": "a cat", "b": "a dog"}
    translator = LookupTranslator({0.6: wrong, 1.0: right, 1.2: right})
    tuned = scoring.tune_alpha(translator, corpus, (0.6, 1.0, 1.2), beam_size=2)
    assert translator.alphas == [0.6, 1.0, 1.2]
    assert tuned["alpha"] == 1.0  # 1.2 ties with it and comes later
    assert tuned["bleu_lowercase"]["1.0"] == 100.0 > tuned["bleu_lowercase"]["0.6"]
    assert set(tuned["bleu_lowercase"]) == {"0.6", "1.0", "1.2"}


def test_training_seconds_add_up_the_windows_by_step(tmp_path):
    log = tmp_path / "training_log.csv"
    log.write_text("epoch,loss,step,seconds\n1,2.0,20,3.0\n0,3.0,10,5.0\n2,1.5,30,2.04\n")
    assert scoring.training_seconds_by_step(str(log)) == {10: 5.0, 20: 8.0, 30: 10.0}
    old = tmp_path / "old.csv"
    old.write_text("epoch,loss\n0,3.0\n")
    assert scoring.training_seconds_by_step(str(old)) == {}
    assert scoring.training_seconds_by_step(str(tmp_path / "missing.csv")) == {}


@pytest.mark.parametrize("lent", [False, True], ids=["own model", "a translator lent"])
def test_validation_curve_scores_every_checkpoint_at_its_training_time(tmp_path, monkeypatch,
                                                                       lent):
    tokenizer = CharTokenizer()
    run_dir = str(tmp_path)
    checkpoints = run_files.path(run_dir, run_files.CHECKPOINTS)
    os.makedirs(checkpoints)
    for step, seed in ((2, 1), (4, 2)):
        saving.save_model(tiny_model(tokenizer.vocab_size, seed=seed, num_layers=1),
                             os.path.join(checkpoints, f"step-{step:07d}.keras"))
    (tmp_path / "training_log.csv").write_text(
        "epoch,step,seconds\n0,2,1.5\n1,4,2.0\n")
    corpus = ParallelCorpus(["abc", "bad"], ["cab", "dab"])
    translated, used, evaluate = [], [], scoring.evaluation.evaluate

    def evaluate_and_keep_the_texts(translator, sources, *args, **kwargs):
        translated.append([t.text for t in translator.translate(sources, beam_size=1)])
        used.append(translator)
        return evaluate(translator, sources, *args, **kwargs)

    monkeypatch.setattr(scoring.evaluation, "evaluate", evaluate_and_keep_the_texts)
    # A lent translator's model (other weights) takes each checkpoint's weights in turn.
    translator = Translator(tiny_model(tokenizer.vocab_size, seed=9, num_layers=1),
                            tokenizer) if lent else None
    rows = scoring.validation_curve(run_dir, corpus, tokenizer, beam_size=1, alpha=0.0,
                                    translator=translator)
    assert used[0] is used[1] and (not lent or used[0] is translator)
    assert [(row["step"], row["training_seconds"]) for row in rows] == [(2, 1.5), (4, 3.5)]
    # Each checkpoint translates with its own weights (they are loaded into one model).
    assert translated == [
        [t.text for t in Translator(saving.load_model(path), tokenizer).translate(
            ["abc", "bad"], beam_size=1)] for path in list_checkpoints(checkpoints)]
    assert translated[0] != translated[1]
    with open(tmp_path / "validation_curve.csv") as f:
        written = list(csv.DictReader(f))
    assert [int(row["step"]) for row in written] == [2, 4]
    assert [float(row["bleu"]) for row in written] == [row["bleu"] for row in rows]


@pytest.mark.backs("docs/training.md", "so a stopped curve resumes: the same command scores only")
def test_a_stopped_validation_curve_keeps_its_rows_and_a_rerun_scores_only_the_rest(
        tmp_path, monkeypatch):
    tokenizer = CharTokenizer()
    run_dir = str(tmp_path)
    checkpoints = run_files.path(run_dir, run_files.CHECKPOINTS)
    os.makedirs(checkpoints)
    for step in (2, 4, 6):
        saving.save_model(tiny_model(tokenizer.vocab_size, seed=step, num_layers=1),
                             os.path.join(checkpoints, f"step-{step:07d}.keras"))
    corpus = ParallelCorpus(["abc", "bad"], ["cab", "dab"])
    calls, evaluate = [], scoring.evaluation.evaluate

    def evaluate_twice(translator, *args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the curve is stopped at its third checkpoint
        calls.append(translator)
        return evaluate(translator, *args, **kwargs)

    monkeypatch.setattr(scoring.evaluation, "evaluate", evaluate_twice)
    with pytest.raises(KeyboardInterrupt):
        scoring.validation_curve(run_dir, corpus, tokenizer, beam_size=1, alpha=0.0)
    curve = tmp_path / "validation_curve.csv"
    with open(curve) as f:
        kept = list(csv.DictReader(f))
    assert [(row["step"], row["beam_size"], row["alpha"], row["sentences"]) for row in kept] == [
        ("2", "1", "0.0", "2"), ("4", "1", "0.0", "2")]
    # A mark only a reused row can carry: the rerun must not score step 4 again.
    curve.write_text(curve.read_text().replace(f"\n4,,{kept[1]['bleu']},", "\n4,,99.0,"))
    monkeypatch.setattr(scoring.evaluation, "evaluate", evaluate)
    rows = scoring.validation_curve(run_dir, corpus, tokenizer, beam_size=1, alpha=0.0)
    assert [row["step"] for row in rows] == [2, 4, 6]
    assert rows[1]["bleu"] == 99.0
    # Another α is another curve: every checkpoint is scored again.
    rows = scoring.validation_curve(run_dir, corpus, tokenizer, beam_size=1, alpha=0.5)
    assert [row["step"] for row in rows] == [2, 4, 6]
    assert rows[1]["bleu"] != 99.0 and {row["alpha"] for row in rows} == {0.5}


def test_perplexity_of_uniform_predictions_is_the_vocabulary_size():
    tokenizer = CharTokenizer()
    model = tiny_model(tokenizer.vocab_size, num_layers=1, label_smoothing=0.1)
    for weight in model.target_embedding.weights:  # every logit 0: a uniform distribution
        weight.assign(np.zeros(weight.shape, weight.dtype))
    dataset, _ = make_dataset(["abc", "bad", "ha"], ["cab", "dab", "ah"], tokenizer,
                              max_sentence_length=8, tokens_per_batch=32, shuffle=False,
                              verbose=False)
    assert scoring.perplexity(model, dataset, tokenizer.pad_id) == pytest.approx(
        tokenizer.vocab_size, rel=1e-4)
