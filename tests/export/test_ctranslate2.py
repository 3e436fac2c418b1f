"""Tests of keras_transformer.export.ctranslate2 and the engine it feeds
(keras_transformer.inference.ctranslate2): a CTranslate2 model written from ours
decodes to our ids, and `Translator` and the command line over a CTranslate2 export
answer as over the Keras model.

The conversion only reads weights, so it is the same under every backend: the
tests that train, convert and decode run in the PyTorch pass only, where our own
decoding, which they compare with, runs without compiling.
"""

import json
import os
import sys

import keras
import numpy as np
import pytest
from helpers import require

import keras_transformer as kt
from keras_transformer import saving
from keras_transformer.data.corpora import synthetic_translation
from keras_transformer.data.pipeline import encode_pairs
from keras_transformer.export.ctranslate2 import (
    convert_model,
    export_ctranslate2,
    export_model,
    transformer_spec,
)
from keras_transformer.inference import Sampling, Translator
from keras_transformer.inference.ctranslate2 import UnseededSamplesWarning, load_ctranslate2
from keras_transformer.inference.limits import LENGTH_OFFSET
from keras_transformer.inference.translator import NO_ALIGNMENT
from keras_transformer.tokenizers import SubwordTokenizer
from keras_transformer_app import cli, run_files

ctranslate2 = require("ctranslate2")

# The conversion reads weights only, so it is backend-independent: the heavy tests
# run in one pass, PyTorch's (13 s there, 40 s in the JAX pass).
one_pass_only = pytest.mark.once("torch")

NUM_WORDS = 40


def _matrix(rows):
    matrix = np.zeros((len(rows), max(map(len, rows))), "int32")
    for i, row in enumerate(rows):
        matrix[i, : len(row)] = row
    return matrix


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained for a few seconds on the synthetic task, saved as a
    run directory, with held-out test sentences (and one of unseen words)."""
    keras.utils.set_random_seed(0)
    corpus = synthetic_translation(1200, seed=0, num_words=NUM_WORDS)
    tokenizer = SubwordTokenizer.train(corpus.sources + corpus.targets, vocab_size=200)
    sources, targets, _ = encode_pairs(corpus.sources, corpus.targets, tokenizer,
                                       max_sentence_length=64)
    config = kt.TransformerConfig.tiny(vocab_size=tokenizer.vocab_size)
    model = kt.Transformer(config)
    model.compile(optimizer=keras.optimizers.Adam(3e-3, beta_1=0.9, beta_2=0.98),
                  loss=kt.LabelSmoothedCrossEntropy(0.1))
    model.fit({"source": _matrix(sources), "target": _matrix([t[:-1] for t in targets])},
              _matrix([t[1:] for t in targets]), batch_size=64, epochs=6, verbose=0)
    directory = str(tmp_path_factory.mktemp("ct2") / "run")
    saving.save_tokenizers(directory, tokenizer)
    saving.save_model(model, run_files.path(directory, saving.MODEL))
    sentences = synthetic_translation(100, seed=7, num_words=NUM_WORDS).sources
    return dict(model=model, tokenizer=tokenizer, run_dir=directory,
                sentences=sentences + ["xyzzy quux"],
                translator=Translator(model, tokenizer))


@pytest.fixture(scope="module")
def converted(trained, tmp_path_factory):
    """The trained model in memory, converted with float32 weights."""
    output = str(tmp_path_factory.mktemp("ct2") / "fp32")
    convert_model(trained["model"], trained["tokenizer"], trained["tokenizer"], output)
    return output


def _token_ids(model_dir, side="target"):
    """token string -> id, from the vocabulary the export wrote."""
    name = "shared_vocabulary.json"
    if not os.path.exists(os.path.join(model_dir, name)):
        name = f"{side}_vocabulary.json"
    with open(os.path.join(model_dir, name)) as f:
        return {token: i for i, token in enumerate(json.load(f))}


def ctranslate2_ids(model_dir, tokenizer, sentences, beam_size):
    """CTranslate2's output ids (EOS included) for each sentence, decoded with
    the settings of ours: no minimum length, at most source tokens + EOS + 50
    output tokens (one limit per call, so sentences are grouped by length), and
    α = 0 (`length_penalty=0`)."""
    translator = ctranslate2.Translator(model_dir, device="cpu")
    with open(os.path.join(model_dir, "shared_vocabulary.json")) as f:
        vocabulary = json.load(f)
    to_id = {token: i for i, token in enumerate(vocabulary)}
    sources = [[vocabulary[i] for i in ids] for ids in tokenizer.tokenize(sentences)]
    by_length = {}
    for index, tokens in enumerate(sources):
        by_length.setdefault(len(tokens), []).append(index)
    results = [None] * len(sources)
    for length, rows in by_length.items():
        outputs = translator.translate_batch(
            [sources[row] for row in rows], beam_size=beam_size, length_penalty=0,
            min_decoding_length=0, max_decoding_length=length + 1 + LENGTH_OFFSET,
            return_end_token=True)
        for row, output in zip(rows, outputs):
            results[row] = [to_id[token] for token in output.hypotheses[0]]
    return results


def our_ids(trained, beam_size):
    results = trained["translator"].translate(
        trained["sentences"], beam_size=beam_size, alpha=0.0,
        batch_size=len(trained["sentences"]))
    return [result.ids for result in results]


@one_pass_only
@pytest.mark.backs("docs/serving.md", "greedy search gives the same ids")
def test_greedy_ids_equal_ours_for_every_sentence(trained, converted):
    ours = our_ids(trained, beam_size=1)
    theirs = ctranslate2_ids(converted, trained["tokenizer"], trained["sentences"], 1)
    different = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert not different, f"sentences {different}: ours {ours[different[0]]}, " \
                          f"CTranslate2 {theirs[different[0]]}"
    # A trained model: the hypotheses end in EOS, not at the length limit.
    ended = sum(ids[-1] == trained["tokenizer"].eos_id for ids in ours)
    assert ended >= 0.9 * len(ours)


@pytest.fixture(scope="module")
def without_pad_and_bos(trained, tmp_path_factory):
    """The trained model with padding and BOS made impossible in its output
    bias, converted. Our search removes them after the softmax and
    CTranslate2 before it (the export's docstring), so with the trained
    model's own bias the two rank hypotheses by slightly different scores.
    On a 2-core AMD EPYC, 2 of 101 sentences then parted, at steps where the
    two tokens' log-probabilities were 0.23 and 0.46 apart (not a tie there).
    With a bias of -1e9, which leaves both softmaxes the same tokens, all 101
    agreed."""
    model = kt.Transformer(trained["model"].config)
    model.set_weights(trained["model"].get_weights())
    bias = model.target_embedding.output_bias
    values = np.array(keras.ops.convert_to_numpy(bias))
    values[[trained["tokenizer"].pad_id, trained["tokenizer"].bos_id]] = -1e9
    bias.assign(values)
    output = str(tmp_path_factory.mktemp("ct2") / "no_pad_bos")
    convert_model(model, trained["tokenizer"], trained["tokenizer"], output)
    return dict(trained, model=model, translator=Translator(model, trained["tokenizer"]),
                converted=output)


@one_pass_only
@pytest.mark.backs("docs/serving.md", "beam search at α = 0 the same search: the same ids")
def test_beam_ids_agree_on_at_least_99_percent_of_sentences(without_pad_and_bos):
    """Beam 4 with α = 0 on both sides searches the same ranking (sum of
    log-probabilities, 2·beam candidates per step, the best finished
    hypothesis wins) over the same distribution (`without_pad_and_bos`).
    They may still part where two candidates score within float32 round-off
    of each other (a tie): the two engines sum the matrix products in
    different orders, and ties are broken differently (our `top_k` against
    CTranslate2's partial sort), so a differing sentence or two is allowed,
    not more."""
    model = without_pad_and_bos
    ours = our_ids(model, beam_size=4)
    theirs = ctranslate2_ids(model["converted"], model["tokenizer"], model["sentences"], 4)
    agree = sum(a == b for a, b in zip(ours, theirs))
    assert agree >= 0.99 * len(ours), f"{agree} of {len(ours)} agree"


# Untrained models of every architecture the converter maps: CTranslate2's
# log-probabilities of a given target must be ours, renormalized without
# padding and BOS as the export does.
ARCHITECTURES = {
    "post_norm_sinusoidal_shared": {},
    "pre_norm": dict(norm_position="pre"),
    "learned_positions": dict(position_encoding="learned"),
    "untied_output": dict(tie_output_embedding=False),
    "separate_embeddings": dict(share_embeddings=False),
    "head_dim_not_d_model_over_heads": dict(key_dim=16),
    "model_vocabulary_larger_than_tokenizer": dict(vocab_size=220),
    "other_epsilon": dict(layer_norm_epsilon=1e-3),
}


@one_pass_only
@pytest.mark.parametrize("changes", ARCHITECTURES.values(), ids=ARCHITECTURES.keys())
def test_log_probabilities_equal_ours_for_every_architecture(trained, changes, tmp_path):
    tokenizer = trained["tokenizer"]
    values = dict(vocab_size=tokenizer.vocab_size, num_layers=1)
    values.update(changes)
    model = kt.Transformer(kt.TransformerConfig.tiny(**values))
    output = str(tmp_path / "model")
    convert_model(model, tokenizer, tokenizer, output)

    sentences, references = trained["sentences"][:4], trained["sentences"][4:8]
    sources = [ids + [tokenizer.eos_id] for ids in tokenizer.tokenize(sentences)]
    targets = tokenizer.tokenize(references)
    logits = model({"source": _matrix(sources),
                    "target": _matrix([[tokenizer.bos_id] + ids for ids in targets])})
    logits = np.array(keras.ops.convert_to_numpy(logits), "float64")
    logits[..., [tokenizer.pad_id, tokenizer.bos_id]] = -np.inf
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))

    vocabulary = list(_token_ids(output))
    results = ctranslate2.Translator(output, device="cpu").score_batch(
        [[vocabulary[i] for i in ids] for ids in tokenizer.tokenize(sentences)],
        [[vocabulary[i] for i in ids] for ids in targets])
    for row, (ids, result) in enumerate(zip(targets, results)):
        labels = ids + [tokenizer.eos_id]
        ours = log_probs[row, np.arange(len(labels)), labels]
        np.testing.assert_allclose(result.log_probs, ours, atol=2e-4)


@one_pass_only
def test_int8_export_from_a_run_directory_loads_and_translates(trained, converted, tmp_path):
    base = str(tmp_path / "int8")
    output = export_ctranslate2(trained["run_dir"], base, quantization="int8", verbose=False)
    assert output == os.path.join(base, "1")
    with open(os.path.join(output, "config.json")) as f:
        assert json.load(f)["decoder_start_token"] == "<s>"
    ids = ctranslate2_ids(output, trained["tokenizer"], trained["sentences"][:8], beam_size=4)
    assert all(ids) and all(0 <= i < trained["tokenizer"].vocab_size for row in ids for i in row)
    # int8 matrices take a quarter of float32's bytes (the position table, biases
    # and norms stay float32).
    assert os.path.getsize(os.path.join(output, "model.bin")) < os.path.getsize(
        os.path.join(converted, "model.bin"))


@one_pass_only
@pytest.mark.backs("docs/serving.md", "an existing version is never overwritten")
def test_an_existing_version_is_refused_and_left_alone(trained, tmp_path):
    taken = tmp_path / "base" / "1"
    taken.mkdir(parents=True)
    (taken / "model.bin").write_text("someone else's")
    with pytest.raises(FileExistsError, match="never overwritten"):
        export_ctranslate2(trained["run_dir"], str(tmp_path / "base"), version=1, verbose=False)
    assert (taken / "model.bin").read_text() == "someone else's"
    assert sorted(os.listdir(tmp_path / "base")) == ["1"]  # no partial directory left behind


@one_pass_only
def test_command_line_exports_a_version_that_decodes_to_our_ids(trained, tmp_path, capsys):
    base = str(tmp_path / "cli")
    cli.main(["export", trained["run_dir"], base, "--format", "ctranslate2"])
    output = os.path.join(base, "1")
    assert f"to {output}" in capsys.readouterr().out
    assert sorted(os.listdir(output)) == ["config.json", "keras_transformer.json", "model.bin",
                                          "shared_vocabulary.json", "tokenizer"]
    sentences = trained["sentences"][:6]
    ours = [result.ids for result in trained["translator"].translate(sentences, beam_size=1,
                                                                     alpha=0.0)]
    assert ctranslate2_ids(output, trained["tokenizer"], sentences, 1) == ours

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", trained["run_dir"], base, "--format", "ctranslate2", "--version",
                  "1"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "never overwritten" in error
    assert error.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["--format", "ctranslate2", "--batch-sizes", "2"],
     "--batch-sizes applies only to --format saved_model"),
    (["--format", "ctranslate2", "--lengths", "8", "--batch-sizes", "2"],
     "--batch-sizes, --lengths apply only to --format saved_model"),
    (["--quantization", "int8"], "--quantization only applies to --format ctranslate2"),
])
def test_command_line_refuses_options_of_the_other_format(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["export", str(tmp_path), str(tmp_path / "out"), *argv])
    assert message in capsys.readouterr().err


def test_a_missing_ctranslate2_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=8))
    with pytest.raises(ImportError, match="pip install ctranslate2"):
        transformer_spec(model, None, None)


def test_different_key_and_value_widths_are_refused():
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=8, key_dim=4, value_dim=8))
    with pytest.raises(ValueError, match="key_dim=4 and value_dim=8"):
        transformer_spec(model, None, None)


def test_an_unknown_quantization_is_refused(tmp_path):
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=8))
    with pytest.raises(ValueError, match="int4.*int8_float32"):
        convert_model(model, None, None, str(tmp_path / "out"), quantization="int4")


# The engine under Translator: a CTranslate2 export searched as ours searches.


@pytest.fixture(scope="module")
def engines(trained, without_pad_and_bos, tmp_path_factory):
    """Translators of the trained model and of its CTranslate2 export, and of the
    model without padding and BOS (the same softmax on both sides) and its export."""
    base = tmp_path_factory.mktemp("engines")
    pairs = {}
    for name, source in (("trained", trained), ("same_softmax", without_pad_and_bos)):
        tokenizer = source["tokenizer"]
        export_model(source["model"], tokenizer, tokenizer, str(base / name))
        model, source_tokenizer, _ = load_ctranslate2(str(base / name))
        pairs[name] = (source["translator"], Translator(model, source_tokenizer))
    return dict(pairs, base=base)


@one_pass_only
def test_translator_over_the_export_gives_our_greedy_translations(trained, engines):
    ours, theirs = engines["trained"]
    assert (ours.engine, theirs.engine) == ("keras", "ctranslate2")
    sentences = trained["sentences"] + [""]
    greedy = dict(beam_size=1, alpha=0.0, batch_size=16)
    expected, got = ours.translate(sentences, **greedy), theirs.translate(sentences, **greedy)
    assert [(t.ids, t.text, t.truncated) for t in got] == [
        (t.ids, t.text, t.truncated) for t in expected]
    # The trained model puts little mass on padding and BOS, which our softmax keeps
    # and CTranslate2's does not: scores within 1% (0.4% here on a 2-core Xeon).
    assert [t.score for t in got] == pytest.approx([t.score for t in expected], rel=0.01)


@one_pass_only
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_translator_over_the_export_gives_our_beam_search(trained, engines, alpha):
    """Beam 4 over the same softmax: the same best hypothesis for at least 97% of
    the sentences (ties in float32 aside, see the test of the raw beam above; at
    α > 0 CTranslate2's beam normalizes by |Y|^α while it runs) and, where they
    agree, §6.1's score log P / ((5 + |Y|) / 6)^α, and n-best lists in order."""
    ours, theirs = engines["same_softmax"]
    search = dict(beam_size=4, alpha=alpha, num_return=2, batch_size=32)
    expected = ours.translate(trained["sentences"], **search)
    got = theirs.translate(trained["sentences"], **search)
    same = [(a, b) for a, b in zip(expected, got) if a.ids == b.ids]
    assert len(same) >= 0.97 * len(expected), f"{len(same)} of {len(expected)} agree"
    for a, b in same:
        assert b.score == pytest.approx(a.score, abs=1e-3)
        assert [h.score for h in b.hypotheses] == sorted(
            (h.score for h in b.hypotheses), reverse=True)


@one_pass_only
def test_samples_are_drawn_by_ctranslate2_and_say_the_seed_does_not_hold(trained, engines):
    """CTranslate2 seeds its threads once: samples follow top-k (here 1, the greedy
    translation), and the first sampling call warns that the seed cannot hold."""
    ours, theirs = engines["trained"]
    sentences = trained["sentences"][:6]
    with pytest.warns(UnseededSamplesWarning, match="do not reproduce"):
        samples = theirs.translate(sentences, sampling=Sampling(top_k=1), num_return=2)
    greedy = ours.translate(sentences, beam_size=1, alpha=0.0)
    assert [[h.ids for h in t.hypotheses] for t in samples] == [[t.ids, t.ids] for t in greedy]
    drawn = theirs.translate(sentences, sampling=Sampling(top_k=0, temperature=2.0),
                             num_return=2)
    assert all(len(t.hypotheses) == 2 and t.hypotheses[0].ids for t in drawn)
    assert [t.ids for t in drawn] != [t.ids for t in greedy]


@one_pass_only
@pytest.mark.backs("docs/translation.md", "`--print-alignment` is refused")
def test_what_ctranslate2_cannot_do_is_one_error(trained, engines):
    _, theirs = engines["trained"]
    with pytest.raises(ValueError, match="no alignment"):
        theirs.translate(trained["sentences"][:2], return_alignment=True)


@one_pass_only
def test_compute_types_and_truncation(trained, engines):
    path = str(engines["base"] / "trained")
    model, tokenizer, _ = load_ctranslate2(path, compute_type="int8", intra_threads=1)
    translator = Translator(model, tokenizer, max_source_length=4)
    with pytest.warns(UserWarning, match="truncated"):
        results = translator.translate(trained["sentences"][:4])
    assert all(result.truncated and result.ids for result in results)
    with pytest.raises(ValueError, match="compute_type='int4'"):
        load_ctranslate2(path, compute_type="int4")
    with pytest.raises(FileNotFoundError, match="not a CTranslate2 export"):
        load_ctranslate2(trained["run_dir"])


@one_pass_only
def test_command_line_translates_and_evaluates_an_export(trained, engines, tmp_path, capsys):
    base = str(engines["base"] / "trained")
    sentences = trained["sentences"][:3]
    for model in (trained["run_dir"], base, os.path.join(base, "1")):
        cli.main(["translate", model, *sentences, "--beam-size", "1", "--alpha", "0"])
        lines = capsys.readouterr().out.splitlines()
        if model == trained["run_dir"]:
            expected = lines
        assert lines == expected and len(lines) == 3
    (tmp_path / "test.src").write_text("\n".join(sentences) + "\n")
    (tmp_path / "test.ref").write_text("\n".join(expected) + "\n")
    cli.main(["evaluate", base, "--source", str(tmp_path / "test.src"), "--reference",
              str(tmp_path / "test.ref"), "--beam-size", "1", "--alpha", "0",
              "--compute-type", "float32", "--intra-threads", "1"])
    assert capsys.readouterr().out.startswith("BLEU 100.00")
    for argv, message in (([base, "a", "--print-alignment"], NO_ALIGNMENT),
                          ([trained["run_dir"], "a", "--compute-type", "int8"],
                           "--compute-type applies only to CTranslate2 exports, and "
                           f"{trained['run_dir']!r} is a Keras model.")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["translate", *argv])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == f"error: {message}\n"


@one_pass_only
@pytest.mark.parametrize("weights", ["trained", "untrained"])
def test_a_batch_of_different_lengths_is_one_call_and_answers_as_each_sentence_alone(
        trained, engines, weights, tmp_path, monkeypatch):
    """CTranslate2 takes one output limit per call, and §6.1's is each input's length +
    50: the engine searches a batch of different lengths in one call at the longest
    limit, and searches again alone each row whose hypotheses reach its own limit. The
    trained model's translations end early (one call); an untrained model's run to the
    limit (a call more per row that reached it). Either way each row's hypotheses are
    those it gets alone (scores within float32 rounding: padding changes the sums)."""
    if weights == "trained":
        path = str(engines["base"] / "trained" / "1")
    else:
        keras.utils.set_random_seed(3)
        config = kt.TransformerConfig.tiny(vocab_size=trained["tokenizer"].vocab_size)
        tokenizer = trained["tokenizer"]
        path = export_model(kt.Transformer(config), tokenizer, tokenizer, str(tmp_path))
    model, tokenizer, _ = load_ctranslate2(path)
    sources = [list(ids) for ids in tokenizer.tokenize(trained["sentences"][:8])]
    assert len({len(ids) for ids in sources}) > 1
    specials = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, beam_size=4, alpha=0.6,
                    num_return=4)
    alone = [model.search([ids], **specials)[0] for ids in sources]
    calls = []
    translate_batch = model._translator.translate_batch
    monkeypatch.setattr(model, "_translator", type("Spy", (), {
        "translate_batch": lambda self, tokens, **options: calls.append(
            (len(tokens), options["max_decoding_length"])) or translate_batch(tokens, **options)
    })())
    together = model.search(sources, **specials)
    assert [[ids for ids, _ in row] for row in together] == [
        [ids for ids, _ in row] for row in alone]
    assert [score for row in together for _, score in row] == pytest.approx(
        [score for row in alone for _, score in row], rel=1e-5)
    limits = [len(ids) + LENGTH_OFFSET for ids in sources]
    assert calls[0] == (len(sources), max(limits))
    reached = [row for row, hypotheses in enumerate(alone)
               if max(len(ids) for ids, _ in hypotheses) >= limits[row]
               and limits[row] < max(limits)]
    assert calls[1:] == [(1, limits[row]) for row in reached]
    assert bool(reached) == (weights == "untrained")
