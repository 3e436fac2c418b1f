"""The drawing surface every figure of `keras_transformer_app.plots` uses (not a paper section).

Figures are drawn with matplotlib's Agg renderer on a `Figure` object, without
pyplot, so no window opens and the caller's matplotlib settings stay as they
are.
"""

import os

import numpy as np
from keras import ops


def figure(**kwargs):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            "keras_transformer_app.plots needs matplotlib: pip install matplotlib "
            '(or pip install -e ".[text]").'
        ) from None
    return Figure(**kwargs)


def save(figure, path):
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return path


def to_numpy(x):
    """A float32 NumPy array of a tensor of any backend."""
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))
