"""Attention weights of a translated sentence (the paper's Appendix, Figures 3-5).

`plot_attention` draws one sentence's attention weights, one panel per layer
and head: encoder self-attention, decoder self-attention or encoder-decoder
attention (`attention_weights` returns the numbers).
`plot_translation_attention` translates a sentence first and draws all three.
"""

import os

import numpy as np
from keras import ops

from keras_transformer_app.plots import canvas

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

    >>> import keras_transformer as kt
    >>> model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=20))  # N=2, h=4
    >>> weights = attention_weights(model, [5, 6, 7, 3], [8, 9, 3], bos_id=2)
    >>> weights["encoder"].shape, weights["cross"].shape
    ((2, 4, 4, 4), (2, 4, 3, 4))
    """
    source_ids = _as_ids(source_ids, "source_ids")
    output_ids = _as_ids(output_ids, "output_ids")
    if not len(source_ids):
        raise ValueError("source_ids is empty: pass the ids of one sentence, EOS included.")
    # BOS, then every output token but the last: position t predicts output_ids[t].
    decoder_inputs = np.concatenate([[bos_id], output_ids[:-1]]).astype("int32")
    weights = model.attention_weights(source_ids[None], decoder_inputs[None])
    kinds = ("encoder", "decoder", "cross") if len(output_ids) else ("encoder",)
    return {kind: np.stack([canvas.to_numpy(w)[0] for w in weights[kind]]) for kind in kinds}


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

    >>> import numpy as np
    >>> import keras_transformer as kt
    >>> from keras_transformer.inference import beam_search
    >>> model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=20))
    >>> source = np.array([5, 6, 7, 3])
    >>> ids, _ = beam_search(model, source[None], bos_id=2, eos_id=3, max_output_length=5)
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

    docs/translation.md ("Attention plots") draws a translator's sentence.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}.")
    source = translator.source_ids([sentence])[0]
    if not source:
        raise ValueError("The sentence has no tokens, so there is no attention to draw.")
    [translation] = translator.translate([sentence], beam_size=beam_size, alpha=alpha,
                                         max_output_length=max_output_length)
    output = translation.ids
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
    figure = canvas.figure(figsize=(cell * num_columns + 1.2, cell * num_rows + 0.9),
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
    return canvas.save(figure, path)




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
