"""Curves and charts: the §3.5 positional encodings, the §5.3 learning-rate
schedule (eq. 3), training logs and validation BLEU curves of the recipes, and
the Table 3 (§6.2) chart.
"""

import itertools
import os

import numpy as np
from keras import ops

from keras_transformer import validation
from keras_transformer.layers.embedding import sinusoidal_position_encoding
from keras_transformer.training.schedule import NoamSchedule
from keras_transformer_app import run_files
from keras_transformer_app.plots import canvas


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
    encoding = canvas.to_numpy(sinusoidal_position_encoding(length, d_model))

    figure = canvas.figure(figsize=(13, 5.5), constrained_layout=True)
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
    return canvas.save(figure, path)


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

    figure = canvas.figure(figsize=(9, 5))
    axes = figure.subplots()
    steps = np.arange(num_steps)
    for width, warmup in itertools.product(widths, warmups):
        rates = canvas.to_numpy(NoamSchedule(width, warmup, scale)(ops.convert_to_tensor(steps)))
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
    return canvas.save(figure, path)


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

    docs/training.md ("Plots of a run") draws the log of a run of its own.
    """
    import csv

    if not runs:
        raise ValueError("runs is empty: pass {label: run directory}.")
    figure = canvas.figure(figsize=(12, 4.5))
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    for label, run in runs.items():
        log_path = run_files.path(run, run_files.TRAINING_LOG) if os.path.isdir(run) else run
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
    return canvas.save(figure, path)


def plot_validation_curve(path, runs, against="minutes"):
    """Draws validation BLEU against training time or optimizer steps, one line per
    run, from the `validation_curve.csv` that a recipe's `--validation-curve` writes
    (one row per checkpoint: step, training_seconds, bleu, bleu_lowercase).

    Lower-cased BLEU is drawn solid, cased BLEU dashed, against the training
    minutes up to each checkpoint (compilation and validation passes included;
    evaluation after training is not) or against the checkpoint's step. Steps
    compare runs whose minutes do not: runs on other backends or machines, or a
    run trained in several sittings beside other work.

    Args:
        path: PNG file to write; parent folders are created.
        runs: {label: run directory (or validation_curve.csv path)}.
        against: "minutes" or "steps", the x axis.

    Returns:
        `path`.

    `python -m recipes.NAME --validation-curve` writes the curve of a run
    (docs/results.md shows the Multi30k runs' curves).
    """
    import csv

    if against not in _VALIDATION_AXES:
        raise ValueError(f"against={against!r}: use one of {sorted(_VALIDATION_AXES)}.")
    if not runs:
        raise ValueError("runs is empty: pass {label: run directory}.")
    column, scale, axis_label = _VALIDATION_AXES[against]
    figure = canvas.figure(figsize=(7.5, 4.5))
    axes = figure.subplots()
    for label, run in runs.items():
        curve_path = run_files.path(run, run_files.VALIDATION_CURVE) if os.path.isdir(run) else run
        if not os.path.exists(curve_path):
            raise FileNotFoundError(
                f"No validation curve at {curve_path!r}: train the run with a recipe's "
                "--validation-curve, which writes RUN_DIR/validation_curve.csv.")
        with open(curve_path) as f:
            rows = [row for row in csv.DictReader(f) if row.get(column)]
        if not rows:
            raise ValueError(f"{curve_path!r} has no row with a {column.replace('_', ' ')}"
                             + (": draw it against='steps'" if against == "minutes" else "."))
        x = [float(row[column]) / scale for row in rows]
        line, = axes.plot(x, [float(row["bleu_lowercase"]) for row in rows], "o-",
                          markersize=3, label=f"{label} lower-cased")
        axes.plot(x, [float(row["bleu"]) for row in rows], "--", color=line.get_color(),
                  label=f"{label} cased")
    axes.set_xlabel(axis_label)
    axes.set_ylabel("validation BLEU")
    axes.set_title("validation BLEU of each checkpoint")
    axes.grid(alpha=0.3)
    axes.legend()
    return canvas.save(figure, path)


# `against`: (the column of validation_curve.csv, its unit per x unit, the axis label).
_VALIDATION_AXES = {"minutes": ("training_seconds", 60, "training time (minutes)"),
                    "steps": ("step", 1, "optimizer step")}


def plot_variants(path, rows, title="Table 3 variants"):
    """Bar charts of dev BLEU and perplexity per variant (rows of
    `keras_transformer_app.training.variants.train_and_measure`).

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
    figure = canvas.figure(figsize=(10, 0.4 * len(rows) + 1.5))
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
    return canvas.save(figure, path)


# Drawing helpers.
