"""The drawing surface every figure of `keras_transformer_app.plots` uses (not a paper section).

Figures are drawn with matplotlib's Agg renderer on a `Figure` object, without
pyplot, so no window opens and the caller's matplotlib settings stay as they
are.
"""

import os

import numpy as np
from keras import ops

from keras_transformer import saving


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
    """Writes `figure` as a PNG at `path` (its folder made), atomically: a full disk
    leaves no half-drawn file, and its error names `path`. Returns `path`."""
    path = os.fspath(path)
    with saving.atomic_path(path) as partial:
        figure.savefig(partial, format="png", dpi=100)
    return path


def to_numpy(x):
    """A float32 NumPy array of a tensor of any backend."""
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))
