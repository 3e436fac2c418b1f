"""§5.1 Training Data and Batching: the corpora, and the batches `model.fit` reads.

- `corpora.py`: the parallel corpora (Multi30k, Tatoeba/Anki, WMT14, a synthetic
  task made by code) as `ParallelCorpus` objects;
- `downloads.py`: the recipes' downloads, checked against pinned sha256 sums;
- `pipeline.py`: token-budget batches by length, the `tf.data.Dataset` of `fit`;
- `toy_tasks.py`: small tasks made by code, for tests and demos.

The subword vocabularies are `keras_transformer.tokenizers`.
"""
