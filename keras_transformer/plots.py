"""Figures of the paper as PNG files: attention (Appendix, Figures 3-5), the §3.5
positional encodings and the §5.3 learning-rate schedule (eq. 3).

* `plot_attention` draws one sentence's attention weights, one panel per layer
  and head: encoder self-attention, decoder self-attention or encoder-decoder
  attention (`attention_weights` returns the numbers).
  `plot_translation_attention` translates a sentence first and draws all three.
* `plot_position_encoding` draws the matrix PE(pos, i) of §3.5.
* `plot_learning_rate` draws eq. (3) for one or more (d_model, warmup_steps).

Figures are drawn with matplotlib's Agg renderer on a `Figure` object, without
pyplot, so no window opens and the caller's matplotlib settings stay as they
are. Each plotting function writes PNG files and returns their paths.
"""

import itertools
import os

import numpy as np
from keras import ops

from keras_transformer import validation
from keras_transformer.layers.embedding import sinusoidal_position_encoding
from keras_transformer.training.schedule import NoamSchedule

ATTENTION_KINDS = ("encoder", "decoder", "cross")

_TITLES = {
    "encoder": "Encoder self-attention",
    "decoder": "Decoder self-attention",
    "cross": "Encoder-decoder attention",
}


def attention_weights(model, source_ids, output_ids, bos_id):
    """One sentence's attention weights, per layer and head, as NumPy arrays.

    Runs the encoder on `source_ids` and the decoder on `[bos_id] + output_ids`
    minus the last id (teacher forcing), so that decoder row t is the step
    that predicts `output_ids[t]`.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: 1-D int ids of one source sentence as the encoder sees it
            (EOS included, no padding).
        output_ids: 1-D int ids of its translation (after BOS, EOS included),
            e.g. a row of `beam_search`'s output without padding; may be empty,
            then only "encoder" is returned.
        bos_id: Begin-of-sentence id, the first decoder input.

    Returns:
        A dict of float32 arrays of shape (num_layers, num_heads, rows,
        columns): "encoder" (S × S), and for a non-empty output "decoder"
        (T × T) and "cross" (T × S).

    Example:

    >>> weights = attention_weights(model, [5, 6, 7, 3], [8, 9, 3], bos_id=2)
    >>> weights["cross"].shape
    (6, 8, 3, 4)
    """
    source_ids = _as_ids(source_ids, "source_ids")
    output_ids = _as_ids(output_ids, "output_ids")
    if not len(source_ids):
        raise ValueError("source_ids is empty: pass the ids of one sentence, EOS included.")
    encoded, mask, encoder_weights = model.encode(
        source_ids[None], return_attention_scores=True, training=False
    )
    weights = {"encoder": encoder_weights}
    if len(output_ids):
        decoder_inputs = np.concatenate([[bos_id], output_ids[:-1]]).astype("int32")
        _, decoder_weights = model.decode(
            decoder_inputs[None], encoded, mask, return_attention_scores=True, training=False
        )
        weights["decoder"] = [block["self"] for block in decoder_weights]
        weights["cross"] = [block["cross"] for block in decoder_weights]
    return {kind: np.stack([_to_numpy(w)[0] for w in per_layer])
            for kind, per_layer in weights.items()}


def plot_attention(
    model,
    source_ids,
    output_ids,
    path,
    bos_id,
    attention="cross",
    source_labels=None,
    output_labels=None,
    layers=None,
    heads=None,
):
    """Draws one sentence's attention weights as a grid of layers × heads.

    Each head's weights (see `attention_weights`) are a heat map on one shared
    0-1 colour scale, like the paper's appendix figures:

    * "encoder": rows and columns are source tokens (query → key);
    * "decoder": rows are the output tokens being predicted, columns the
      decoder inputs they attend to (<s>, y_1, ..., y_{T-1});
    * "cross": rows are the output tokens being predicted, columns the source
      tokens.

    Args:
        model: A `keras_transformer.Transformer`.
        source_ids: 1-D int ids of one source sentence (EOS included).
        output_ids: 1-D int ids of its translation (after BOS, EOS included).
            Not used for "encoder".
        path: PNG file to write; parent folders are created.
        bos_id: Begin-of-sentence id, the first decoder input.
        attention: "encoder", "decoder" or "cross".
        source_labels: Strings for the source tokens; defaults to the ids.
        output_labels: Strings for the output tokens; defaults to the ids.
        layers: 0-based layer indices to draw; defaults to all.
        heads: 0-based head indices to draw; defaults to all.

    Returns:
        `path`.

    Example:

    >>> ids, _ = beam_search(model, source[None], bos_id=2, eos_id=3)
    >>> plot_attention(model, source, ids[0][ids[0] != 0], "cross.png", bos_id=2)
    'cross.png'
    """
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention={attention!r} must be one of {ATTENTION_KINDS}.")
    output_ids = _as_ids(output_ids, "output_ids")
    if attention != "encoder" and not len(output_ids):
        raise ValueError(
            f'attention="{attention}" draws decoder rows, but output_ids is empty: '
            "pass the ids of the sentence's translation."
        )
    source_labels = _labels(source_labels, _as_ids(source_ids, "source_ids"), "source_labels")
    output_labels = _labels(output_labels, output_ids, "output_labels")
    weights = attention_weights(
        model, source_ids, output_ids if attention != "encoder" else [], bos_id
    )
    return _plot_weights(weights[attention], attention, source_labels, output_labels,
                         layers, heads, path)


def plot_translation_attention(translator, sentence, directory, beam_size=4, alpha=0.6,
                               max_output_length=None, prefix="attention"):
    """Translates one sentence and draws its three kinds of attention.

    Args:
        translator: A `keras_transformer.inference.Translator`.
        sentence: The source sentence (a str).
        directory: Folder for the PNG files; created if needed.
        beam_size: Beam size of the translation.
        alpha: Length penalty α of the translation.
        max_output_length: Most output tokens; None means source length + 50.
        prefix: File name prefix: files are `{prefix}_encoder.png`,
            `{prefix}_decoder.png` and `{prefix}_cross.png`.

    Returns:
        A dict from "encoder", "decoder", "cross" to the written paths (only
        "encoder" when the translation is empty).

    Example:

    >>> paths = plot_translation_attention(translator, "Ein Hund rennt.", "plots")
    >>> paths["cross"]
    'plots/attention_cross.png'
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}.")
    source = translator.source_ids([sentence])[0]
    if not source:
        raise ValueError("The sentence has no tokens, so there is no attention to draw.")
    _, (output,) = translator.translate([sentence], beam_size=beam_size, alpha=alpha,
                                        max_output_length=max_output_length, return_ids=True)
    target_tokenizer = translator.target_tokenizer
    weights = attention_weights(translator.model, source, output, target_tokenizer.bos_id)
    source_labels = token_labels(translator.tokenizer, source)
    output_labels = token_labels(target_tokenizer, output)
    return {
        kind: _plot_weights(kind_weights, kind, source_labels, output_labels, None, None,
                            os.path.join(directory, f"{prefix}_{kind}.png"))
        for kind, kind_weights in weights.items()
    }


def token_labels(tokenizer, ids):
    """One printable label per id: <s>, </s>, the token's piece when the tokenizer
    has `id_to_token` (subwords show as "▁Mann", "##er"), else its detokenized
    text; ␣ for a blank."""
    special = {tokenizer.bos_id: "<s>", tokenizer.eos_id: "</s>", tokenizer.pad_id: "<pad>"}
    if callable(getattr(tokenizer, "id_to_token", None)):
        texts = [str(tokenizer.id_to_token(i)) for i in ids]
    else:
        texts = tokenizer.detokenize([[i] for i in ids])
    return [special.get(i) or (text.strip() or "␣") for i, text in zip(ids, texts)]


def plot_position_encoding(path, length=100, d_model=512, dimensions=None):
    """Draws the §3.5 sinusoidal positional encodings.

    Left: the (length, d_model) matrix PE as a heat map (position down,
    dimension across). Right: PE(pos, i) against pos for a few dimensions i,
    whose wavelengths 2π · 10000^(2⌊i/2⌋/d_model) grow geometrically from 2π
    to 10000 · 2π along the dimensions.

    Args:
        path: PNG file to write; parent folders are created.
        length: Number of positions.
        d_model: Encoding width.
        dimensions: Dimensions i drawn as curves on the right; defaults to four
            sine dimensions spread over the first half of the width, whose
            wavelengths span short to long.

    Returns:
        `path`.

    Example:

    >>> plot_position_encoding("position_encoding.png", length=100, d_model=512)
    'position_encoding.png'
    """
    for name, value in (("length", length), ("d_model", d_model)):
        validation.check_positive_int(name, value)
    if dimensions is None:
        dimensions = sorted({2 * (d_model * k // 16) for k in range(4)})
    dimensions = [int(d) for d in dimensions]
    bad = [d for d in dimensions if not 0 <= d < d_model]
    if bad:
        raise ValueError(f"dimensions {bad} are outside 0 <= i < d_model={d_model}.")
    encoding = _to_numpy(sinusoidal_position_encoding(length, d_model))

    figure = _figure(figsize=(13, 5.5), constrained_layout=True)
    heat_map, curves = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    image = heat_map.imshow(encoding, cmap="RdBu", vmin=-1, vmax=1, aspect="auto",
                            interpolation="nearest")
    heat_map.set_xlabel("dimension i")
    heat_map.set_ylabel("position pos")
    heat_map.set_title(f"PE for {length} positions, d_model={d_model}")
    figure.colorbar(image, ax=heat_map)
    for d in dimensions:
        kind = "sin" if d % 2 == 0 else "cos"
        wavelength = 2 * np.pi * 10000.0 ** ((d - d % 2) / d_model)
        curves.plot(np.arange(length), encoding[:, d],
                    label=f"i={d} ({kind}, wavelength {wavelength:.0f})")
    curves.set_xlabel("position pos")
    curves.set_ylabel("PE(pos, i)")
    curves.set_title("A few dimensions")
    curves.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8)
    figure.suptitle("§3.5 PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), "
                    "PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))")
    return _save(figure, path)


def plot_learning_rate(path, d_model=512, warmup_steps=4000, num_steps=20000, scale=1.0):
    """Draws the eq. (3) learning rate against the training step.

    lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5):
    a linear rise for `warmup_steps` steps, then inverse-square-root decay.
    `d_model` and `warmup_steps` may each be a list, to compare one curve per
    combination.

    Args:
        path: PNG file to write; parent folders are created.
        d_model: Model width, or a list of widths.
        warmup_steps: Warmup steps, or a list of them.
        num_steps: Steps on the horizontal axis.
        scale: Constant factor of the schedule.

    Returns:
        `path`.

    Example:

    >>> plot_learning_rate("lr.png", d_model=[512, 256], warmup_steps=[4000, 8000])
    'lr.png'
    """
    validation.check_positive_int("num_steps", num_steps)
    widths = [d_model] if isinstance(d_model, int) else list(d_model)
    warmups = [warmup_steps] if isinstance(warmup_steps, int) else list(warmup_steps)
    if not widths or not warmups:
        raise ValueError("d_model and warmup_steps need at least one value each.")

    figure = _figure(figsize=(9, 5))
    axes = figure.subplots()
    steps = np.arange(num_steps)
    for width, warmup in itertools.product(widths, warmups):
        rates = _to_numpy(NoamSchedule(width, warmup, scale)(ops.convert_to_tensor(steps)))
        peak = int(np.argmax(rates))
        axes.plot(steps + 1, rates, label=f"d_model={width}, warmup_steps={warmup} "
                                          f"(peak {rates[peak]:.2e} at step {peak + 1})")
        axes.plot([peak + 1], [rates[peak]], "o", color=axes.lines[-1].get_color())
    axes.set_xlabel("training step")
    axes.set_ylabel("learning rate")
    axes.set_xlim(0, num_steps)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend()
    axes.set_title("§5.3 eq. (3): lrate = d_model^-0.5 · min(step^-0.5, "
                   "step · warmup_steps^-1.5)" + ("" if scale == 1.0 else f" × {scale}"))
    return _save(figure, path)


def plot_training_log(path, runs, steps_per_window=None):
    """Draws training curves from the recipes' `training_log.csv` files.

    One row of a log is one checkpoint window: training loss and token
    accuracy over the window, and validation loss and accuracy at its end.

    Args:
        path: PNG file to write; parent folders are created.
        runs: {label: run directory (or training_log.csv path)}, one curve each.
        steps_per_window: The runs' `--checkpoint-every`, to label the
            horizontal axis in optimizer steps; None counts windows.

    Returns:
        `path`.

    Example:

    >>> plot_training_log("curves.png", {"de-en": "runs/multi30k-de-en"}, steps_per_window=200)
    'curves.png'
    """
    import csv

    if not runs:
        raise ValueError("runs is empty: pass {label: run directory}.")
    figure = _figure(figsize=(12, 4.5))
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    for label, run in runs.items():
        log_path = os.path.join(run, "training_log.csv") if os.path.isdir(run) else run
        if not os.path.exists(log_path):
            raise FileNotFoundError(f"No training log at {log_path!r}: a recipe writes "
                                    "RUN_DIR/training_log.csv.")
        with open(log_path) as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise ValueError(f"{log_path!r} has no rows yet.")
        windows = np.array([int(row["epoch"]) + 1 for row in rows])
        x = windows * steps_per_window if steps_per_window else windows
        for axes, key, name in ((loss_axes, "loss", "loss"),
                                (accuracy_axes, "token_accuracy", "token accuracy")):
            line, = axes.plot(x, [float(row[key]) for row in rows], label=f"{label} train")
            if rows[0].get("val_" + key):
                axes.plot(x, [float(row["val_" + key]) for row in rows], "--",
                          color=line.get_color(), label=f"{label} validation")
            axes.set_ylabel(name)
    for axes in (loss_axes, accuracy_axes):
        axes.set_xlabel("optimizer step" if steps_per_window else "checkpoint window")
        axes.grid(alpha=0.3)
        axes.legend()
    loss_axes.set_title("label-smoothed cross-entropy per target token")
    accuracy_axes.set_title("next-token accuracy (teacher forcing)")
    return _save(figure, path)


def plot_variants(path, rows, title="Table 3 variants"):
    """Bar charts of dev BLEU and perplexity per variant (rows of recipes/table3.py).

    Args:
        path: PNG file to write.
        rows: dicts with "variant", "dev_bleu" and "dev_perplexity"; a row named
            "base" gets a dashed line across both charts.
        title: Figure title.

    Returns:
        `path`.
    """
    if not rows:
        raise ValueError("rows is empty: nothing to draw.")
    figure = _figure(figsize=(10, 0.4 * len(rows) + 1.5))
    bleu_axes, perplexity_axes = figure.subplots(1, 2, sharey=True)
    labels = [row["variant"] for row in rows]
    bleu_axes.barh(labels, [row["dev_bleu"] for row in rows], color="tab:blue")
    bleu_axes.set_xlabel("dev BLEU (13a, cased)")
    perplexity_axes.barh(labels, [row["dev_perplexity"] for row in rows], color="tab:orange")
    perplexity_axes.set_xlabel("dev perplexity per subword token")
    base = next((row for row in rows if row["variant"] == "base"), None)
    if base is not None:  # a dashed line at the base row, to read each variant against it
        bleu_axes.axvline(base["dev_bleu"], color="black", linestyle="--", linewidth=1)
        perplexity_axes.axvline(base["dev_perplexity"], color="black", linestyle="--",
                                linewidth=1)
    bleu_axes.invert_yaxis()
    figure.suptitle(title)
    figure.tight_layout()
    return _save(figure, path)


# Drawing helpers.


def _plot_weights(weights, attention, source_labels, output_labels, layers, heads, path):
    """Draws (layers, heads, rows, columns) weights of one kind of attention."""
    if attention == "encoder":
        row_labels, column_labels = source_labels, source_labels
        axes_names = ("source token (query)", "source token (key)")
    elif attention == "decoder":
        row_labels, column_labels = output_labels, ["<s>", *output_labels[:-1]]
        axes_names = ("predicting", "decoder input")
    else:
        row_labels, column_labels = output_labels, source_labels
        axes_names = ("predicting", "source token")
    layers = _select(layers, weights.shape[0], "layers")
    heads = _select(heads, weights.shape[1], "heads")
    title = f"{_TITLES[attention]}, layers {_span(layers)} × heads {_span(heads)}"
    return _draw_grid(weights[np.ix_(layers, heads)], layers, heads, row_labels,
                      column_labels, axes_names, title, path)


def _draw_grid(weights, layers, heads, row_labels, column_labels, axes_names, title, path):
    num_rows, num_columns = len(layers), len(heads)
    size = max(weights.shape[2], weights.shape[3])
    cell = float(np.clip(0.6 + 0.16 * size, 1.8, 4.5))
    figure = _figure(figsize=(cell * num_columns + 1.2, cell * num_rows + 0.9),
                     constrained_layout=True)
    grid = np.array(figure.subplots(num_rows, num_columns, squeeze=False))
    font = float(np.clip(9 - size / 8, 5, 8))
    image = None
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            axes = grid[r, c]
            image = axes.imshow(weights[r, c], cmap="viridis", vmin=0.0, vmax=1.0,
                                interpolation="nearest", aspect="auto")
            axes.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            axes.set_xticks(range(len(column_labels)))
            axes.set_yticks(range(len(row_labels)))
            axes.set_xticklabels(column_labels if r == num_rows - 1 else [],
                                 rotation=90, fontsize=font)
            axes.set_yticklabels(row_labels if c == 0 else [], fontsize=font)
            if c == 0:
                axes.set_ylabel(axes_names[0], fontsize=8)
            if r == num_rows - 1:
                axes.set_xlabel(axes_names[1], fontsize=8)
    figure.colorbar(image, ax=grid, shrink=0.6, label="attention weight")
    figure.suptitle(title, fontsize=11)
    return _save(figure, path)


def _figure(**kwargs):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "keras_transformer.plots needs matplotlib: pip install matplotlib "
            '(or pip install -e ".[text]").'
        ) from None
    return Figure(**kwargs)


def _save(figure, path):
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return path


def _to_numpy(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def _as_ids(ids, name):
    array = np.asarray(ops.convert_to_numpy(ids) if not isinstance(ids, (list, tuple))
                       else ids)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(
            f"{name} must be a 1-D sequence of int ids of one sentence, got shape "
            f"{array.shape} and dtype {array.dtype}."
        )
    return array.astype("int32")


def _labels(labels, ids, name):
    if labels is None:
        return [str(int(i)) for i in ids]
    labels = [str(label) for label in labels]
    if len(labels) != len(ids):
        raise ValueError(f"{name} has {len(labels)} labels for {len(ids)} ids: give one per id.")
    return labels


def _select(indices, count, name):
    if indices is None:
        return list(range(count))
    indices = [int(i) for i in indices]
    bad = [i for i in indices if not 0 <= i < count]
    if bad or not indices:
        raise ValueError(
            f"{name}={indices} must be a non-empty list of 0-based indices below {count}."
        )
    return indices


def _span(indices):
    numbers = [i + 1 for i in indices]
    if numbers == list(range(numbers[0], numbers[-1] + 1)) and len(numbers) > 1:
        return f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(str(n) for n in numbers)



