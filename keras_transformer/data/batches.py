"""§5.1 batching on the `tf.data` side: pairs cut from arrays of ids in the graph,
ordered by a stateless shuffle, bucketed by length and padded.

What `keras_transformer.data.pipeline.dataset_from_pairs` assembles: `pair_order`
draws the indices of the kept pairs, pass after pass; `element_function` cuts each
pair from the flat id arrays (in memory, or memory-mapped from a token cache, whose
pages the graph reads in place: `id_table`) and adds BOS and EOS; `batched` buckets,
pads, rounds the batches to the data-parallel replicas, keeps a process's rows
(`row_block`, which also gives each replica its rows under one process's strategy)
and prefetches.
"""

import mmap

import numpy as np


def element_function(pairs, kept, specials):
    """Kept pair k -> (source + [EOS], [BOS] + target, target + [EOS]), int32, cut
    from the flat id arrays in the graph."""
    import tensorflow as tf

    eos, bos, target_eos = (tf.constant([int(i)], tf.int32) for i in specials)
    tables = {name: id_table(values) for name, values in (
        ("source_ids", pairs.source_ids), ("target_ids", pairs.target_ids),
        ("source_starts", _compact(pairs.source_offsets[kept.rows])),
        ("target_starts", _compact(pairs.target_offsets[kept.rows])),
        ("source_lengths", _compact(kept.source_lengths)),
        ("target_lengths", _compact(kept.target_lengths)))}

    @tf.autograph.experimental.do_not_convert  # plain graph code: nothing to convert
    def element(index):
        def ids(side):
            start = tf.cast(tables[f"{side}_starts"][index], tf.int64)
            length = tf.cast(tables[f"{side}_lengths"][index], tf.int64)
            return tf.cast(tables[f"{side}_ids"][start:start + length], tf.int32)

        source, target = ids("source"), ids("target")
        return (tf.concat([source, eos], 0), tf.concat([bos, target], 0),
                tf.concat([target, target_eos], 0))

    return element


def id_table(values):
    """A constant tensor of `values` for the graph to read. An array memory-mapped
    whole from a file (a token cache's ids, `np.load(..., mmap_mode="r")`) is not
    copied: the tensor reads a private mapping of the same file, whose pages the
    kernel keeps in its page cache and may drop. Anything else is copied.

    The private mapping is copy-on-write and held by the tensor alone, so nothing
    can write into what TensorFlow reads as a constant, and the file is never
    written."""
    import tensorflow as tf

    if isinstance(values, np.memmap) and isinstance(values.base, mmap.mmap) and values.size:
        private = np.memmap(values.filename, values.dtype, "c", values.offset, values.shape)
        # TensorFlow needs its buffers aligned to 64 bytes (Eigen's widest vectors); a
        # .npy file's data starts at a multiple of 64 in a page-aligned mapping.
        if private.ctypes.data % 64 == 0:
            return tf.experimental.dlpack.from_dlpack(private.__dlpack__())
    return tf.constant(np.ascontiguousarray(values))


def _compact(values):
    """Non-negative int64 `values` as int32 when they fit: half the memory."""
    if not values.size or values.max() < 2**31:
        return values.astype(np.int32)
    return values


def batched(dataset, plan, padding, batch_multiple, shard, cardinality):
    """§5.1 batches: bucketed by length, padded to the bucket, rounded to
    `batch_multiple`, this process's rows of `shard`, as `({"source", "target"},
    labels)`, prefetched."""
    import tensorflow as tf

    boundaries, batch_sizes, _ = plan
    dataset = dataset.bucket_by_sequence_length(
        element_length_func=lambda s, t, y: tf.maximum(tf.shape(s)[0], tf.shape(t)[0]),
        bucket_boundaries=boundaries, bucket_batch_sizes=batch_sizes,
        padding_values=padding, pad_to_bucket_boundary=True)
    if batch_multiple > 1:
        def pad_rows(*tensors):
            missing = -tf.shape(tensors[0])[0] % batch_multiple
            return tuple(tf.pad(x, [[0, missing], [0, 0]], constant_values=pad)
                         for x, pad in zip(tensors, padding))

        dataset = dataset.map(pad_rows, num_parallel_calls=tf.data.AUTOTUNE)
    if shard is not None:
        dataset = dataset.map(row_block(*shard), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.map(lambda s, t, y: ({"source": s, "target": t}, y),
                          num_parallel_calls=tf.data.AUTOTUNE)
    if cardinality is not None:
        # Bucketing hides the length from tf.data; telling Keras spares it a
        # first pass that ends in an "ran out of data" warning.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(cardinality))
    # Under tf.distribute.MultiWorkerMirroredStrategy each worker keeps its part of
    # every global batch (the data's, as nothing here reads files).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    # tf.data's default graph rewrites serialize the pipeline, and with it the id
    # tables it captures, into a copy: as much memory again as the token cache. The
    # pipeline asks for its parallel maps and its prefetch itself. (Under
    # MultiWorkerMirroredStrategy's several workers, rebatching and auto-sharding
    # still serialize it: one copy there.)
    options.experimental_optimization.apply_default_optimizations = False
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def row_block(index, count):
    """A `Dataset.map` function that keeps block `index` of `count` equal row blocks of
    every tensor of an element (any structure): rows [index·b, (index+1)·b), b = rows //
    count. The split tf.distribute makes: block i goes to replica or process i."""
    import tensorflow as tf

    def block(*element):
        def rows(tensor):
            size = tf.shape(tensor)[0] // count
            return tensor[index * size:(index + 1) * size]

        return tf.nest.map_structure(rows, element if len(element) > 1 else element[0])

    return block


def pair_order(pairs, shuffle, repeat, seed):
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
