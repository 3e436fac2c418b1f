"""Training scripts built on `model.fit`. Run one with `python -m recipes.NAME`."""
