"""Tests of the figures: attention grids, positional encodings, learning-rate schedule."""

import pathlib
import struct

import numpy as np
import pytest
from helpers import CharTokenizer, tiny_model

from keras_transformer.inference import Translator
from keras_transformer_app import plots
from keras_transformer_app.plots import canvas

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")

TOKENIZER = CharTokenizer()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) of a valid PNG file, after checking its signature."""
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert len(data) > 10_000, f"{path} is only {len(data)} bytes"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plotting functions save, in order, kept for inspection."""
    figures, save = [], canvas.save

    def keep(figure, path):
        figures.append(figure)
        return save(figure, path)

    monkeypatch.setattr(canvas, "save", keep)
    return figures


def ids(text, eos=True):
    """The tokenizer's ids of text, with EOS unless eos=False."""
    return TOKENIZER.tokenize([text])[0] + ([TOKENIZER.eos_id] if eos else [])


@pytest.mark.parametrize("attention", plots.ATTENTION_KINDS)
def test_attention_grid_has_a_panel_per_layer_and_head(tmp_path, attention):
    model = tiny_model(TOKENIZER.vocab_size)
    source, output = ids("abcd"), ids("efg")
    bos_id = TOKENIZER.bos_id
    everything = plots.plot_attention(model, source, output, tmp_path / "all.png",
                                      bos_id=bos_id, attention=attention)
    one_layer = plots.plot_attention(model, source, output, tmp_path / "sub" / "one.png",
                                     bos_id=bos_id, attention=attention, layers=[1],
                                     heads=[0, 3], source_labels=list("abcd") + ["</s>"])
    assert everything == str(tmp_path / "all.png")
    width, height = png_size(tmp_path / "all.png")
    small_width, small_height = png_size(tmp_path / "sub" / "one.png")
    # 2 layers x 4 heads against 1 layer x 2 heads.
    assert width > 1.5 * small_width and height > 1.5 * small_height
    assert one_layer.endswith("one.png")


def test_translation_attention_writes_three_figures(tmp_path):
    model = tiny_model(TOKENIZER.vocab_size)
    bias = np.zeros(TOKENIZER.vocab_size, "float32")
    bias[TOKENIZER.eos_id] = -1e4  # no EOS: a four-token translation
    model.target_embedding.output_bias.assign(bias)
    translator = Translator(model, TOKENIZER)
    search = {"beam_size": 2, "max_output_length": 4}
    [translation] = translator.translate(["bad "], **search)
    output = translation.ids
    assert len(output) == 4 and TOKENIZER.eos_id not in output
    paths = plots.plot_translation_attention(translator, "bad ", tmp_path, prefix="example",
                                             **search)
    assert sorted(paths) == sorted(plots.ATTENTION_KINDS)
    for kind, path in paths.items():
        assert path.endswith(f"example_{kind}.png")
        png_size(tmp_path / f"example_{kind}.png")
    labels = plots.token_labels(TOKENIZER, ids("b ", eos=False) + [TOKENIZER.eos_id,
                                                                   TOKENIZER.bos_id])
    assert labels == ["b", "␣", "</s>", "<s>"]


def test_position_encoding_figure(tmp_path):
    path = plots.plot_position_encoding(tmp_path / "pe.png", length=50, d_model=64)
    width, height = png_size(tmp_path / "pe.png")
    assert path == str(tmp_path / "pe.png") and width > height


def test_learning_rate_figure_draws_eq_3_for_each_schedule(tmp_path, drawn):
    path = plots.plot_learning_rate(tmp_path / "lr.png", d_model=[512, 256],
                                    warmup_steps=4000, num_steps=10000)
    png_size(tmp_path / "lr.png")
    assert path == str(tmp_path / "lr.png")
    [axes] = drawn[0].axes
    curves = [line for line in axes.lines if len(line.get_xdata()) > 1]
    peaks = [line for line in axes.lines if len(line.get_xdata()) == 1]
    step = np.arange(1, 10001)
    for line, d_model in zip(curves, (512, 256)):
        assert f"d_model={d_model}" in line.get_label()
        np.testing.assert_array_equal(line.get_xdata(), step)
        # eq. (3), written out here rather than taken from NoamSchedule.
        expected = d_model ** -0.5 * np.minimum(step ** -0.5, step * 4000 ** -1.5)
        np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-5)
    assert len(curves) == len(peaks) == 2
    # Each curve's peak is marked at the end of its warmup.
    assert [(peak.get_xdata()[0], peak.get_ydata()[0]) for peak in peaks] == [
        pytest.approx((4000, d_model ** -0.5 * 4000 ** -0.5), rel=1e-5) for d_model in (512, 256)]


def test_bad_plot_arguments_are_explained(tmp_path):
    model = tiny_model(TOKENIZER.vocab_size)
    source, output, bos = ids("a"), ids("b"), TOKENIZER.bos_id
    with pytest.raises(ValueError, match="attention='self' must be one of"):
        plots.plot_attention(model, source, output, tmp_path / "x.png", bos, attention="self")
    with pytest.raises(ValueError, match="output_ids is empty"):
        plots.plot_attention(model, source, [], tmp_path / "x.png", bos, attention="cross")
    with pytest.raises(ValueError, match=r"layers=\[2\] must be"):
        plots.plot_attention(model, source, output, tmp_path / "x.png", bos, layers=[2])
    with pytest.raises(ValueError, match="source_labels has 1 labels for 2 ids"):
        plots.plot_attention(model, source, output, tmp_path / "x.png", bos, source_labels=["a"])
    with pytest.raises(ValueError, match="1-D sequence"):
        plots.plot_attention(model, np.ones((2, 2), "int32"), output, tmp_path / "x.png", bos)
    with pytest.raises(ValueError, match=r"dimensions \[64\] are outside"):
        plots.plot_position_encoding(tmp_path / "x.png", d_model=64, dimensions=[64])
    with pytest.raises(ValueError, match="num_steps=0 must be a positive integer"):
        plots.plot_learning_rate(tmp_path / "x.png", num_steps=0)
    assert not (tmp_path / "x.png").exists()


def test_training_curves_from_recipe_logs(tmp_path):
    for name, losses in (("de-en", [5.0, 4.0, 3.5]), ("en-de", [5.5, 4.5, 4.0])):
        run = tmp_path / name
        run.mkdir()
        rows = ["epoch,loss,token_accuracy,val_loss,val_token_accuracy"] + [
            f"{i},{loss},{0.2 * (i + 1)},{loss - 0.3},{0.2 * (i + 1) + 0.05}"
            for i, loss in enumerate(losses)]
        (run / "training_log.csv").write_text("\n".join(rows) + "\n")
    path = plots.plot_training_log(tmp_path / "curves.png", {"de-en": str(tmp_path / "de-en"),
                                   "en-de": str(tmp_path / "en-de")}, steps_per_window=200)
    width, height = png_size(path)
    assert width > height
    with pytest.raises(FileNotFoundError, match="No training log"):
        plots.plot_training_log(tmp_path / "x.png", {"x": str(tmp_path / "missing")})


def test_validation_curves_from_recipe_runs(tmp_path):
    for name, scores in (("final", [20.5, 30.1, 35.2]), ("current", [18.0, 27.3, 33.9])):
        run = tmp_path / name
        run.mkdir()
        rows = ["step,training_seconds,bleu,bleu_lowercase"] + [
            f"{200 * (i + 1)},{300.0 * (i + 1)},{score - 0.4},{score}"
            for i, score in enumerate(scores)]
        (run / "validation_curve.csv").write_text("\n".join(rows) + "\n")
    path = plots.plot_validation_curve(tmp_path / "validation.png",
                                       {"final": str(tmp_path / "final"),
                                        "current": str(tmp_path / "current")})
    width, height = png_size(path)
    assert width > height
    with pytest.raises(FileNotFoundError, match="--validation-curve"):
        plots.plot_validation_curve(tmp_path / "x.png", {"x": str(tmp_path / "missing")})
    (tmp_path / "untimed.csv").write_text("step,training_seconds,bleu,bleu_lowercase\n200,,1,1\n")
    with pytest.raises(ValueError, match="no row with a training seconds: draw it against='steps'"):
        plots.plot_validation_curve(tmp_path / "x.png", {"x": str(tmp_path / "untimed.csv")})
    with pytest.raises(ValueError, match="against='hours'"):
        plots.plot_validation_curve(tmp_path / "x.png", {"x": str(tmp_path / "final")}, "hours")


def test_validation_curves_against_minutes_or_steps(tmp_path, drawn):
    (tmp_path / "curve.csv").write_text("step,training_seconds,bleu,bleu_lowercase\n"
                                        "200,120.0,10.0,10.5\n400,300.0,20.0,20.5\n")
    for against in ("minutes", "steps"):
        plots.plot_validation_curve(tmp_path / f"{against}.png",
                                    {"run": str(tmp_path / "curve.csv")}, against=against)
    [by_minutes], [by_steps] = (figure.axes for figure in drawn)
    lower_cased, cased = by_minutes.get_lines()
    assert list(lower_cased.get_xdata()) == [2.0, 5.0] == list(cased.get_xdata())
    assert list(lower_cased.get_ydata()) == [10.5, 20.5] and list(cased.get_ydata()) == [10.0, 20.0]
    assert by_minutes.get_xlabel() == "training time (minutes)"
    assert [list(line.get_xdata()) for line in by_steps.get_lines()] == [[200, 400]] * 2
    assert by_steps.get_xlabel() == "optimizer step"


def test_variant_bars_show_each_rows_bleu_and_perplexity(tmp_path, drawn):
    rows = [{"variant": "base", "dev_bleu": 30.0, "dev_perplexity": 6.0},
            {"variant": "heads1", "dev_bleu": 28.5, "dev_perplexity": 6.6}]
    png_size(plots.plot_variants(tmp_path / "variants.png", rows))
    bleu_axes, perplexity_axes = drawn[0].axes
    for axes, key in ((bleu_axes, "dev_bleu"), (perplexity_axes, "dev_perplexity")):
        assert [bar.get_width() for bar in axes.patches] == [row[key] for row in rows]
        # The base row's value is a dashed line across its chart.
        [line] = axes.lines
        assert list(line.get_xdata()) == [rows[0][key]] * 2 and line.get_linestyle() == "--"
    assert [label.get_text() for label in bleu_axes.get_yticklabels()] == ["base", "heads1"]
    # The first row is drawn at the top.
    assert bleu_axes.patches[0].get_y() < bleu_axes.patches[1].get_y()
    assert bleu_axes.yaxis_inverted()
