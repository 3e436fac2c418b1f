"""Deployment: a trained model written out for engines that serve it (§6.1 search, served).

- `saved_model.py`: a TensorFlow SavedModel with tokenization, search and
  detokenization inside the graph (`export_saved_model`, `export_model`);
- `versions.py`: the `NAME/VERSION/` folders of TensorFlow Serving's layout,
  written atomically, and loading a version;
- `shapes.py`: the batch sizes and widths a SavedModel compiles;
- `warmup.py`: TensorFlow Serving's warm-up records;
- `ctranslate2.py`: a converter onto CTranslate2's `TransformerSpec`.

The server that serves these is `keras_transformer_app.serving`.
"""
