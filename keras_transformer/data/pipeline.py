"""§5.1 Training Data and Batching: the tf.data pipeline that feeds `model.fit`.

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000
source tokens and 25000 target tokens." (§5.1)

`make_dataset` tokenizes, adds the begin/end tokens, drops or truncates pairs
longer than `max_sentence_length` tokens (and counts them), buckets pairs by
length into batches of at most `tokens_per_batch` source and target tokens
(padding included), shifts the decoder input right, and prefetches. Each bucket
pads to a fixed length, so a compiled train step sees a handful of shapes, not
one per batch. The dataset works with `model.fit` on every Keras backend.

The special ids (begin, end, padding) come from the tokenizers it is given
(`bos_id`, `eos_id`, `pad_id`), so any object with those attributes and
`tokenize` works as a tokenizer.

`max_sentence_length` is a property of the data: it is not the model's
`TransformerConfig.max_length` (the positions a model accepts), which must be
at least as large for learned positions.
"""

import dataclasses

import numpy as np

from keras_transformer.validation import check_choice, check_positive_int

OVERLONG_POLICIES = ("drop", "truncate")


@dataclasses.dataclass
class PipelineStats:
    """What the pipeline did with the pairs it was given, and the batches one
    pass over them makes."""

    pairs: int = 0
    kept: int = 0
    dropped_overlong: int = 0
    truncated: int = 0
    dropped_empty: int = 0
    source_tokens: int = 0
    target_tokens: int = 0
    batches_per_pass: int = 0
    # Of the positions the batches hold (each pair padded to its bucket's
    # length), the share that is padding, and the distinct (batch, length)
    # shapes of full batches: what a compiled train step sees.
    source_padding: float = 0.0
    target_padding: float = 0.0
    shapes: int = 0

    def summary(self):
        text = (
            f"{self.kept}/{self.pairs} pairs kept ({self.source_tokens} source and "
            f"{self.target_tokens} target tokens); over-long: {self.dropped_overlong} "
            f"dropped, {self.truncated} truncated; {self.dropped_empty} empty dropped"
        )
        if self.shapes:
            text += (f"; {self.shapes} bucket shapes, padding {self.source_padding:.0%} of "
                     f"source and {self.target_padding:.0%} of target positions")
        return text


# Sentences tokenized per call when a progress bar is shown.
PROGRESS_CHUNK = 8192


def encode_pairs(sources, targets, source_tokenizer, target_tokenizer=None,
                 max_sentence_length=128, overlong="drop", verbose=False):
    """Tokenizes pairs and applies the length policy.

    The source becomes `ids + [source EOS]`; the target `[target BOS] + ids +
    [target EOS]`, from which the decoder input (all but the last) and the
    labels (all but the first) are cut. Both must fit in `max_sentence_length`
    tokens.

    Args:
        sources, targets: Aligned lists of sentences.
        source_tokenizer: Tokenizer of the sources (`tokenize`, `eos_id`).
        target_tokenizer: Tokenizer of the targets (`tokenize`, `bos_id`,
            `eos_id`); None for `source_tokenizer`.
        max_sentence_length: Longest source (with its end token) and decoder
            input in tokens.
        overlong: "drop" or "truncate" pairs longer than that.
        verbose: Show a progress bar (pairs tokenized) for large corpora.

    Returns:
        (source_sequences, target_sequences, PipelineStats): lists of int lists,
        the targets still holding both BOS and EOS.
    """
    check_choice("overlong", overlong, OVERLONG_POLICIES)
    _check_max_sentence_length(max_sentence_length)
    if len(sources) != len(targets):
        raise ValueError(
            f"Got {len(sources)} sources but {len(targets)} targets: pairs must align."
        )
    target_tokenizer = target_tokenizer or source_tokenizer
    source_eos = source_tokenizer.eos_id
    target_bos, target_eos = target_tokenizer.bos_id, target_tokenizer.eos_id
    stats = PipelineStats(pairs=len(sources))
    source_ids, target_ids = _tokenize_pairs(list(sources), list(targets), source_tokenizer,
                                             target_tokenizer, verbose)
    encoded_sources, encoded_targets = [], []
    for source, target in zip(source_ids, target_ids):
        if not source or not target:
            stats.dropped_empty += 1
            continue
        # The limit counts the source with EOS and the decoder input / labels,
        # which are one shorter than [BOS] + target + [EOS].
        too_long = max(len(source), len(target)) + 1 > max_sentence_length
        if too_long and overlong == "drop":
            stats.dropped_overlong += 1
            continue
        if too_long:
            stats.truncated += 1
            limit = max_sentence_length - 1
            source, target = source[:limit], target[:limit]
        encoded_sources.append(source + [source_eos])
        encoded_targets.append([target_bos] + target + [target_eos])
        stats.source_tokens += len(source) + 1
        stats.target_tokens += len(target) + 1
    stats.kept = len(encoded_sources)
    return encoded_sources, encoded_targets, stats


def bucket_plan(max_sentence_length, tokens_per_batch, bucket_width=8, batch_multiple=1):
    """Bucket boundaries and batch sizes for a token budget.

    A pair whose longer side has n tokens goes to the first bucket whose padded
    length L (a multiple of `bucket_width`, at most `max_sentence_length`) is
    >= n; that bucket's batches hold `tokens_per_batch // L` pairs, so every
    batch has at most `tokens_per_batch` source and at most as many target
    tokens.

    With `batch_multiple` > 1 (data parallelism over that many devices) batch
    sizes are rounded down to multiples of it, but never below it.

    Returns:
        (boundaries, batch_sizes, padded_lengths) for
        `tf.data.Dataset.bucket_by_sequence_length`.
    """
    _check_max_sentence_length(max_sentence_length)
    check_positive_int("tokens_per_batch", tokens_per_batch)
    check_positive_int("bucket_width", bucket_width)
    check_positive_int("batch_multiple", batch_multiple,
                       "the number of data-parallel replicas, 1 without data parallelism")
    if tokens_per_batch < max_sentence_length:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} is below max_sentence_length="
            f"{max_sentence_length}: a batch could not hold even one pair; raise "
            "tokens_per_batch or lower max_sentence_length."
        )
    lengths = list(range(bucket_width, max_sentence_length, bucket_width))
    lengths.append(max_sentence_length)
    boundaries = [length + 1 for length in lengths]
    batch_sizes = [max(1, tokens_per_batch // length) for length in lengths] + [1]
    if batch_multiple > 1:
        batch_sizes = [max(batch_multiple, size // batch_multiple * batch_multiple)
                       for size in batch_sizes]
    return boundaries, batch_sizes, lengths


def make_dataset(
    sources,
    targets,
    source_tokenizer,
    target_tokenizer=None,
    max_sentence_length=128,
    tokens_per_batch=4096,
    overlong="drop",
    shuffle=True,
    repeat=False,
    seed=0,
    bucket_width=8,
    verbose=True,
    batch_multiple=1,
    source_vocab_size=None,
    target_vocab_size=None,
    name="data",
    shard=None,
):
    """A `tf.data.Dataset` of `({"source", "target"}, labels)` batches.

    Args:
        sources, targets: Aligned lists of sentences.
        source_tokenizer, target_tokenizer: `SubwordTokenizer`s, or objects with
            `tokenize`, `pad_id`, `bos_id` and `eos_id` (one shared tokenizer
            when `target_tokenizer` is None).
        max_sentence_length: Longest source / decoder sequence in tokens.
        tokens_per_batch: Token budget per batch, per side (padding included).
        overlong: "drop" or "truncate" pairs longer than `max_sentence_length`.
        shuffle: Whether to shuffle pairs (each pass differently, the same way
            in every process).
        repeat: Whether to repeat forever (for step-based training).
        seed: Shuffle seed.
        bucket_width: Length granularity of the buckets.
        verbose: Whether to print the pipeline statistics, with a progress
            bar while a large corpus is tokenized.
        batch_multiple: Make every batch's size a multiple of this (the number
            of data-parallel replicas): bucket sizes are rounded to it, and a
            bucket's last, smaller batch gets all-padding rows, which the loss
            and the metrics ignore.
        source_vocab_size, target_vocab_size: The vocabulary sizes of the
            model that will read the batches (`config.vocab_size`,
            `config.resolved_target_vocab_size`). When given, a tokenizer
            with a larger vocabulary, or any id outside them, is refused
            here, before training, with an error naming `name`, the pair
            and the id. (`Transformer.fit` checks every batch again.)
        name: What the data is, for errors ("train", a file name, ...).
        shard: (index, count): keep row block `index` of `count` of every
            batch, the rows one process of a multi-process JAX run feeds
            (`keras_transformer.training.distribution.Distributed.input_shard`); every
            process builds the same global batches and keeps its own rows.
            `batch_multiple` must be a multiple of `count`.

    Returns:
        (dataset, PipelineStats). Batches hold int32 tensors: source (B, L),
        target (B, L) = [BOS] y_1 ... y_n, labels (B, L) = y_1 ... y_n [EOS],
        padded with the tokenizers' `pad_id`, L the bucket length.
    """
    import tensorflow as tf

    # The plan checks the batching arguments before any tokenization work.
    if shard is not None and (len(shard) != 2 or not 0 <= shard[0] < shard[1]
                              or batch_multiple % shard[1]):
        raise ValueError(f"shard={shard!r} must be (index, count) with 0 <= index < count "
                         f"and batch_multiple={batch_multiple} a multiple of count.")
    boundaries, batch_sizes, lengths = bucket_plan(max_sentence_length, tokens_per_batch,
                                                   bucket_width, batch_multiple)
    target_tokenizer = target_tokenizer or source_tokenizer
    for side, tokenizer, size in (("source", source_tokenizer, source_vocab_size),
                                  ("target", target_tokenizer, target_vocab_size)):
        vocabulary = getattr(tokenizer, "vocab_size", None)
        if size is not None and vocabulary is not None and vocabulary > size:
            raise ValueError(
                f"{name}: the {side} tokenizer has {vocabulary} ids, more than the model's "
                f"vocabulary of {size}: build the model for this tokenizer, or use the "
                "tokenizer the model was built for.")
    encoded_sources, encoded_targets, stats = encode_pairs(
        sources, targets, source_tokenizer, target_tokenizer, max_sentence_length, overlong,
        verbose=verbose,
    )
    if not encoded_sources:
        raise ValueError(
            f"No pair is left after tokenization ({stats.summary()}): check the data "
            "and max_sentence_length."
        )
    _check_ids(encoded_sources, source_vocab_size, name, "source")
    _check_ids(encoded_targets, target_vocab_size, name, "target")
    _count_batches(stats, encoded_sources, encoded_targets, boundaries, batch_sizes, lengths)
    if verbose:
        print(f"Data: {stats.summary()}")
    columns = tuple(tf.ragged.constant(column, dtype=tf.int32) for column in (
        encoded_sources, [t[:-1] for t in encoded_targets], [t[1:] for t in encoded_targets]))
    dataset = _pair_order(len(encoded_sources), shuffle, repeat, seed).map(
        lambda i: tuple(column[i] for column in columns))
    padding_values = tuple(int(tokenizer.pad_id) for tokenizer in
                           (source_tokenizer, target_tokenizer, target_tokenizer))
    dataset = dataset.bucket_by_sequence_length(
        element_length_func=lambda s, t, y: tf.maximum(tf.shape(s)[0], tf.shape(t)[0]),
        bucket_boundaries=boundaries,
        bucket_batch_sizes=batch_sizes,
        padding_values=padding_values,
        pad_to_bucket_boundary=True,
    )
    if batch_multiple > 1:
        def pad_rows(*tensors):
            missing = -tf.shape(tensors[0])[0] % batch_multiple
            return tuple(tf.pad(x, [[0, missing], [0, 0]], constant_values=pad)
                         for x, pad in zip(tensors, padding_values))

        dataset = dataset.map(pad_rows)
    if shard is not None:
        index, count = shard

        def own_rows(*tensors):
            rows = tf.shape(tensors[0])[0] // count
            return tuple(x[index * rows:(index + 1) * rows] for x in tensors)

        dataset = dataset.map(own_rows)
    dataset = dataset.map(
        lambda s, t, y: ({"source": s, "target": t}, y),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    if not shuffle and not repeat:
        # Bucketing hides the length from tf.data; telling Keras spares it a
        # first pass that ends in an "ran out of data" warning.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(stats.batches_per_pass))
    # Under tf.distribute.MultiWorkerMirroredStrategy each worker keeps its part of
    # every global batch (the data's, as nothing here reads files).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE), stats


def _pair_order(pairs, shuffle, repeat, seed):
    """The indices of the pairs in the order they are batched: pass after pass when
    `repeat`, each pass in a new order when `shuffle`. Pass k's order is a function of
    (seed, k) alone (a stateless shuffle), so every process of a cluster, and every
    iterator over the dataset, draws the same batches."""
    import tensorflow as tf

    passes = tf.data.Dataset.range(2**62 if repeat else 1)
    if not shuffle:
        return passes.flat_map(lambda _: tf.data.Dataset.range(pairs))
    return passes.flat_map(lambda k: tf.data.Dataset.from_tensor_slices(
        tf.random.experimental.stateless_shuffle(
            tf.range(pairs, dtype=tf.int64), seed=tf.stack([tf.constant(seed, tf.int64), k]))))


def _tokenize_pairs(sources, targets, source_tokenizer, target_tokenizer, verbose):
    """Both sides tokenized, in chunks under a progress bar when `verbose` and
    there is more than one chunk."""
    if not verbose or len(sources) <= PROGRESS_CHUNK:
        return source_tokenizer.tokenize(sources), target_tokenizer.tokenize(targets)
    import keras

    print(f"Data: tokenizing {len(sources):,} pairs")
    progress = keras.utils.Progbar(len(sources), unit_name="pair")
    source_ids, target_ids = [], []
    for start in range(0, len(sources), PROGRESS_CHUNK):
        end = start + PROGRESS_CHUNK
        source_ids += source_tokenizer.tokenize(sources[start:end])
        target_ids += target_tokenizer.tokenize(targets[start:end])
        progress.update(min(end, len(sources)))
    return source_ids, target_ids


def _check_ids(sequences, vocab_size, name, side):
    """Refuses any id outside 0 <= id < vocab_size, naming the first pair that
    holds one (one NumPy pass over the ids, before training)."""
    if vocab_size is None:
        return
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    ids = np.fromiter((i for s in sequences for i in s), dtype=np.int64, count=lengths.sum())
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        pair = int(np.searchsorted(np.cumsum(lengths), bad[0], side="right"))
        raise ValueError(
            f"{name}: pair {pair} (counting kept pairs from 0) has the {side} id "
            f"{ids[bad[0]]}, outside the model's vocabulary (0 <= id < {vocab_size}); "
            f"{bad.size} ids are outside it in all. Tokenize with the model's tokenizer.")


def _check_max_sentence_length(value):
    # Two tokens is the least a pair needs: one word and the end token.
    if check_positive_int("max_sentence_length", value) < 2:
        raise ValueError(
            f"max_sentence_length={value!r} must be at least 2: one token and the end token."
        )


def _count_batches(stats, encoded_sources, encoded_targets, boundaries, batch_sizes, lengths):
    """Fills in the batches of one pass (each bucket yields ceil(pairs / batch
    size) of them, whatever the order of the pairs), the padding share of each
    side and the number of bucket shapes."""
    source_lengths = np.array([len(s) for s in encoded_sources])
    decoder_lengths = np.array([len(t) - 1 for t in encoded_targets])
    buckets = np.searchsorted(boundaries, np.maximum(source_lengths, decoder_lengths),
                              side="right")
    counts = np.bincount(buckets, minlength=len(batch_sizes))
    stats.batches_per_pass = int(sum(-(-count // size)
                                     for count, size in zip(counts, batch_sizes)))
    positions = float(np.asarray(lengths)[buckets].sum())
    stats.source_padding = 1.0 - source_lengths.sum() / positions
    stats.target_padding = 1.0 - decoder_lengths.sum() / positions
    stats.shapes = int(np.count_nonzero(counts))
