"""§5.1 Training Data and Batching: the tf.data pipeline that feeds `model.fit`.

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000
source tokens and 25000 target tokens." (§5.1)

`make_dataset` tokenizes into arrays of ids (`token_cache.TokenizedPairs`), and
`dataset_from_pairs` makes the batches from such arrays, in memory or
memory-mapped from a run's token cache: it drops or truncates pairs longer than
`max_sentence_length` tokens (and counts them), adds the begin/end tokens,
buckets pairs by length into batches of at most `tokens_per_batch` source and
target tokens (padding included), shifts the decoder input right, and
prefetches, without a Python object per pair. Each bucket
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

from keras_transformer.data import batches
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


def encode_pairs(sources, targets, source_tokenizer, target_tokenizer=None,
                 max_sentence_length=128, overlong="drop"):
    """Tokenizes pairs and applies the length policy, as lists (the batches'
    rows, for tests and small tasks; `make_dataset` applies the same policy to
    arrays).

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

    Returns:
        (source_sequences, target_sequences, PipelineStats): lists of int lists,
        the targets still holding both BOS and EOS.
    """
    from keras_transformer.data.corpora import ParallelCorpus
    from keras_transformer.data.token_cache import tokenize_pairs

    check_choice("overlong", overlong, OVERLONG_POLICIES)
    _check_max_sentence_length(max_sentence_length)
    if len(sources) != len(targets):
        raise ValueError(
            f"Got {len(sources)} sources but {len(targets)} targets: pairs must align."
        )
    target_tokenizer = target_tokenizer or source_tokenizer
    pairs = tokenize_pairs(ParallelCorpus(list(sources), list(targets)), source_tokenizer,
                           target_tokenizer)
    kept, stats = _length_policy(pairs, max_sentence_length, overlong)
    rows = zip(kept.rows, kept.source_lengths, kept.target_lengths)
    encoded_sources, encoded_targets = [], []
    for row, source_length, target_length in rows:
        encoded_sources.append(pairs.row("source", row)[:source_length]
                               + [source_tokenizer.eos_id])
        encoded_targets.append([target_tokenizer.bos_id]
                               + pairs.row("target", row)[:target_length]
                               + [target_tokenizer.eos_id])
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


def make_dataset(sources, targets, source_tokenizer, target_tokenizer=None, verbose=True,
                 **options):
    """A `tf.data.Dataset` of `({"source", "target"}, labels)` batches of sentences.

    Tokenizes the pairs (`token_cache.tokenize_pairs`) and batches them with
    `dataset_from_pairs`, which takes the other arguments.

    Args:
        sources, targets: Aligned lists of sentences.
        source_tokenizer, target_tokenizer: `SubwordTokenizer`s, or objects with
            `tokenize`, `pad_id`, `bos_id` and `eos_id` (one shared tokenizer
            when `target_tokenizer` is None).
        verbose: Whether to print the pipeline statistics.
        **options: `dataset_from_pairs`'s.

    Returns:
        (dataset, PipelineStats), as `dataset_from_pairs`.
    """
    from keras_transformer.data.corpora import ParallelCorpus
    from keras_transformer.data.token_cache import tokenize_pairs

    if len(sources) != len(targets):
        raise ValueError(
            f"Got {len(sources)} sources but {len(targets)} targets: pairs must align.")
    target_tokenizer = target_tokenizer or source_tokenizer
    _plan(**{key: value for key, value in options.items() if key in _PLAN_ARGUMENTS})
    _check_tokenizer_sizes(source_tokenizer, target_tokenizer, **{
        key: options.get(key) for key in ("source_vocab_size", "target_vocab_size", "name")})
    pairs = tokenize_pairs(ParallelCorpus(list(sources), list(targets)), source_tokenizer,
                           target_tokenizer)
    return dataset_from_pairs(pairs, source_tokenizer, target_tokenizer, verbose=verbose,
                              **options)


_PLAN_ARGUMENTS = ("max_sentence_length", "tokens_per_batch", "bucket_width",
                   "batch_multiple", "shard")


def dataset_from_pairs(
    pairs,
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
    """A `tf.data.Dataset` of `({"source", "target"}, labels)` batches of tokenized
    pairs, read from their arrays (memory-mapped from a token cache, or in memory)
    without a Python object per pair.

    Args:
        pairs: `keras_transformer.data.token_cache.TokenizedPairs`.
        source_tokenizer, target_tokenizer: Give `pad_id`, `bos_id` and `eos_id`
            (and `vocab_size`, checked against the model's).
        max_sentence_length: Longest source / decoder sequence in tokens.
        tokens_per_batch: Token budget per batch, per side (padding included).
        overlong: "drop" or "truncate" pairs longer than `max_sentence_length`.
        shuffle: Whether to shuffle pairs (each pass differently, the same way
            in every process).
        repeat: Whether to repeat forever (for step-based training).
        seed: Shuffle seed.
        bucket_width: Length granularity of the buckets.
        verbose: Whether to print the pipeline statistics.
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
            (`keras_transformer_app.training.distribution.Distributed.input_shard`); every
            process builds the same global batches and keeps its own rows.
            `batch_multiple` must be a multiple of `count`.

    Returns:
        (dataset, PipelineStats). Batches hold int32 tensors: source (B, L),
        target (B, L) = [BOS] y_1 ... y_n, labels (B, L) = y_1 ... y_n [EOS],
        padded with the tokenizers' `pad_id`, L the bucket length.
    """
    check_choice("overlong", overlong, OVERLONG_POLICIES)
    target_tokenizer = target_tokenizer or source_tokenizer
    plan = _plan(max_sentence_length, tokens_per_batch, bucket_width, batch_multiple, shard)
    _check_tokenizer_sizes(source_tokenizer, target_tokenizer, source_vocab_size,
                           target_vocab_size, name)
    kept, stats = _length_policy(pairs, max_sentence_length, overlong)
    if not stats.kept:
        raise ValueError(
            f"No pair is left after tokenization ({stats.summary()}): check the data "
            "and max_sentence_length."
        )
    _check_pair_ids(pairs, kept, source_vocab_size, target_vocab_size, name,
                    (source_tokenizer, target_tokenizer))
    _count_batches(stats, kept.source_lengths + 1, kept.target_lengths + 1, *plan)
    if verbose:
        print(f"Data: {stats.summary()}")
    specials = (source_tokenizer.eos_id, target_tokenizer.bos_id, target_tokenizer.eos_id)
    dataset = batches.pair_order(stats.kept, shuffle, repeat, seed).map(
        batches.element_function(pairs, kept, specials), num_parallel_calls=_parallel())
    padding = tuple(int(tokenizer.pad_id) for tokenizer in
                    (source_tokenizer, target_tokenizer, target_tokenizer))
    return batches.batched(dataset, plan, padding, batch_multiple, shard,
                    None if shuffle or repeat else stats.batches_per_pass), stats


def _parallel():
    import tensorflow as tf

    return tf.data.AUTOTUNE


def _plan(max_sentence_length=128, tokens_per_batch=4096, bucket_width=8, batch_multiple=1,
          shard=None):
    """`bucket_plan`'s (boundaries, batch sizes, lengths), the shard checked: before
    any tokenization work."""
    if shard is not None and (len(shard) != 2 or not 0 <= shard[0] < shard[1]
                              or batch_multiple % shard[1]):
        raise ValueError(f"shard={shard!r} must be (index, count) with 0 <= index < count "
                         f"and batch_multiple={batch_multiple} a multiple of count.")
    return bucket_plan(max_sentence_length, tokens_per_batch, bucket_width, batch_multiple)


def _check_tokenizer_sizes(source_tokenizer, target_tokenizer, source_vocab_size=None,
                           target_vocab_size=None, name="data"):
    for side, tokenizer, size in (("source", source_tokenizer, source_vocab_size),
                                  ("target", target_tokenizer, target_vocab_size)):
        vocabulary = getattr(tokenizer, "vocab_size", None)
        if size is not None and vocabulary is not None and vocabulary > size:
            raise ValueError(
                f"{name}: the {side} tokenizer has {vocabulary} ids, more than the model's "
                f"vocabulary of {size}: build the model for this tokenizer, or use the "
                "tokenizer the model was built for.")


@dataclasses.dataclass
class _Kept:
    """The pairs the length policy keeps: their rows and their (truncated) lengths
    without BOS or EOS."""

    rows: np.ndarray
    source_lengths: np.ndarray
    target_lengths: np.ndarray


def _length_policy(pairs, max_sentence_length, overlong):
    """`encode_pairs`'s policy on arrays: empty pairs dropped, over-long ones
    dropped or truncated to `max_sentence_length - 1` ids a side."""
    _check_max_sentence_length(max_sentence_length)
    source, target = pairs.lengths("source"), pairs.lengths("target")
    stats = PipelineStats(pairs=len(pairs))
    nonempty = (source > 0) & (target > 0)
    stats.dropped_empty = int(len(pairs) - nonempty.sum())
    # The limit counts the source with EOS and the decoder input / labels, which are
    # one shorter than [BOS] + target + [EOS].
    too_long = nonempty & (np.maximum(source, target) + 1 > max_sentence_length)
    if overlong == "drop":
        stats.dropped_overlong = int(too_long.sum())
        rows = np.flatnonzero(nonempty & ~too_long)
    else:
        stats.truncated = int(too_long.sum())
        rows = np.flatnonzero(nonempty)
    limit = max_sentence_length - 1
    kept = _Kept(rows, np.minimum(source[rows], limit), np.minimum(target[rows], limit))
    stats.kept = len(rows)
    stats.source_tokens = int(kept.source_lengths.sum()) + stats.kept
    stats.target_tokens = int(kept.target_lengths.sum()) + stats.kept
    return kept, stats


def _check_pair_ids(pairs, kept, source_vocab_size, target_vocab_size, name, tokenizers):
    """Refuses any id outside 0 <= id < the model's vocabulary in what the batches
    hold (the kept pairs, as truncated, and the special ids), naming the first pair
    that holds one: a pass of NumPy over the ids, before training."""
    for side, size, tokenizer, specials in (
            ("source", source_vocab_size, tokenizers[0], ("eos_id",)),
            ("target", target_vocab_size, tokenizers[1], ("bos_id", "eos_id"))):
        if size is None:
            continue
        for special in specials:
            value = int(getattr(tokenizer, special))
            if not 0 <= value < size:
                raise ValueError(f"{name}: the {side} tokenizer's {special}={value} is outside "
                                 f"the model's vocabulary (0 <= id < {size}).")
        ids, offsets = getattr(pairs, f"{side}_ids"), getattr(pairs, f"{side}_offsets")
        positions = np.flatnonzero(np.asarray(ids) >= size)
        if not positions.size:
            continue
        rows = np.searchsorted(offsets, positions, side="right") - 1
        at = np.searchsorted(kept.rows, rows)
        held = (at < len(kept.rows)) & (kept.rows[np.minimum(at, len(kept.rows) - 1)] == rows)
        lengths = getattr(kept, f"{side}_lengths")
        held[held] = positions[held] - offsets[rows[held]] < lengths[at[held]]
        if held.any():
            first = np.flatnonzero(held)[0]
            raise ValueError(
                f"{name}: pair {int(at[first])} (counting kept pairs from 0) has the {side} id "
                f"{int(ids[positions[first]])}, outside the model's vocabulary (0 <= id < "
                f"{size}); {int(held.sum())} ids are outside it in all. Tokenize with the "
                "model's tokenizer.")


def _check_max_sentence_length(value):
    # Two tokens is the least a pair needs: one word and the end token.
    if check_positive_int("max_sentence_length", value) < 2:
        raise ValueError(
            f"max_sentence_length={value!r} must be at least 2: one token and the end token."
        )


def _count_batches(stats, source_lengths, decoder_lengths, boundaries, batch_sizes, lengths):
    """Fills in the batches of one pass (each bucket yields ceil(pairs / batch
    size) of them, whatever the order of the pairs), the padding share of each
    side and the number of bucket shapes; the lengths count EOS (and BOS)."""
    buckets = np.searchsorted(boundaries, np.maximum(source_lengths, decoder_lengths),
                              side="right")
    counts = np.bincount(buckets, minlength=len(batch_sizes))
    stats.batches_per_pass = int(sum(-(-count // size)
                                     for count, size in zip(counts, batch_sizes)))
    positions = float(np.asarray(lengths)[buckets].sum())
    stats.source_padding = 1.0 - source_lengths.sum() / positions
    stats.target_padding = 1.0 - decoder_lengths.sum() / positions
    stats.shapes = int(np.count_nonzero(counts))
