"""Training scripts built on `model.fit`. Run one with `python -m recipes.NAME`."""

import sys

try:
    import keras_transformer  # noqa: F401  checks KERAS_BACKEND before Keras loads
except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
