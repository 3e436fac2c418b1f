"""The SavedModel's signatures (§6.1 search, served): tokens in, search, text out, in one graph.

`search_function` runs the Python path's own search loops (`greedy_loop`,
`beam_loop`) on every batch, padded to one of the export's compiled shapes
(`keras_transformer.export.shapes`); `ids_signature` (`translate_ids`) and
`text_signature` (`serving_default`, and `translate_n_best` for N > 1
hypotheses) wrap it with the checks, the truncation of over-long sources, and
the tokenizer's own in-graph tokenization and detokenization.
`keras_transformer.export.saved_model` saves them.
"""

from keras_transformer.inference.beam import beam_loop, searched_beam_size
from keras_transformer.inference.greedy import greedy_loop
from keras_transformer.inference.limits import smallest_bucket


def search_function(model, target_tokenizer, shapes, beam_size, alpha, max_output_length,
                     num_return=1):
    """The bucketed search: `search(source_ids, lengths)` with (batch, S)
    encoder inputs no longer than `shapes.max_source_length` and (batch,)
    their lengths (0 for an empty row) → (ids (batch, L) trimmed to the
    longest hypothesis, scores (batch,)); with `num_return` N > 1, the N
    best hypotheses of each row: ids (batch, N, L) and scores (batch, N).
    Empty rows give no ids and score 0; an empty batch gives empty results."""
    import tensorflow as tf

    special_ids = tf.constant([target_tokenizer.bos_id, target_tokenizer.eos_id], tf.int32)
    searched = searched_beam_size(int(beam_size), float(alpha))
    loop_args = (special_ids, tf.constant(alpha, tf.float32), searched, max_output_length,
                 num_return)
    compiled_by_width = [_compiled_for_width(model, width, *loop_args)
                         for width in shapes.lengths]

    def search(source_ids, lengths):
        def empty():
            return tf.zeros([0, num_return, 0], tf.int32), tf.zeros([0, num_return], tf.float32)

        ids, scores = tf.cond(
            tf.shape(source_ids)[0] > 0,
            lambda: _bucketed_search(model.config.pad_id, target_tokenizer.eos_id, shapes,
                                     compiled_by_width, num_return, source_ids, lengths),
            empty)
        if num_return == 1:
            return ids[:, 0], scores[:, 0]
        return ids, scores

    search.num_return = num_return
    return search


def _compiled_for_width(model, width, special_ids, alpha, beam_size, max_output_length,
                        num_return):
    """The search traced for sources of exactly `width` positions: with the
    width known, the output buffer is too (width + 50, §6.1), and the loop
    runs in the cache phases of `cache_phases`. XLA compiles it once per
    chunk size of the shapes. It returns (chunk, N, L) ids and (chunk, N)
    scores for every N: greedy search's loop for a `beam_size` of None
    (`searched_beam_size`), else beam search's."""
    import tensorflow as tf

    # No AutoGraph, as in `keras_transformer.inference.compiled`: the loops are
    # keras.ops.while_loop, the branches tf.cond and tf.switch_case.
    @tf.function(jit_compile=True, autograph=False,
                 input_signature=[tf.TensorSpec([None, width], tf.int32)])
    def compiled(source_ids):
        if beam_size is None:
            ids, scores = greedy_loop(model, source_ids, special_ids, max_output_length)
        else:
            ids, scores = beam_loop(model, source_ids, special_ids, alpha, beam_size,
                                    max_output_length, num_return)
        if num_return == 1:
            ids, scores = ids[:, None], scores[:, None]
        return ids, tf.cast(scores, tf.float32)

    return compiled


def _bucketed_search(pad_id, eos_id, shapes, compiled_by_width, num_return, source_ids,
                     lengths):
    """Runs a non-empty batch at the smallest compiled width that holds its
    longest row, in chunks of the smallest compiled batch size that holds it
    (or the largest); empty rows, and the rows that fill the last chunk,
    decode a lone EOS and give no ids and score 0."""
    import tensorflow as tf

    count = tf.shape(source_ids)[0]
    width = smallest_bucket(tf.maximum(tf.reduce_max(lengths), 1), shapes.lengths)
    chunk = smallest_bucket(count, shapes.batch_sizes)
    chunks = (count + chunk - 1) // chunk
    filler = tf.one_hot(0, width, on_value=eos_id, off_value=pad_id, dtype=tf.int32)
    dense = tf.pad(source_ids, [[0, 0], [0, tf.maximum(width - tf.shape(source_ids)[1], 0)]],
                   constant_values=pad_id)[:, :width]
    dense = tf.where((lengths > 0)[:, None], dense, filler[None, :])
    dense = tf.concat([dense, tf.tile(filler[None, :], [chunks * chunk - count, 1])], axis=0)

    def branch(index):
        def decode():
            ids, scores = tf.map_fn(
                compiled_by_width[index],
                tf.reshape(dense, [chunks, chunk, shapes.lengths[index]]),
                parallel_iterations=1,
                fn_output_signature=(tf.TensorSpec([None, num_return, None], tf.int32),
                                     tf.TensorSpec([None, num_return], tf.float32)))
            return tf.reshape(ids, [chunks * chunk, num_return, -1]), scores

        return decode

    # The index of `width` among the compiled widths.
    index = tf.reduce_sum(tf.cast(tf.constant(shapes.lengths, tf.int32) < width, tf.int32))
    ids, scores = tf.switch_case(index, [branch(i) for i in range(len(shapes.lengths))])
    ids = ids[:count]
    scores = tf.reshape(scores, [chunks * chunk, num_return])[:count]
    ids = tf.where((lengths > 0)[:, None, None], ids, pad_id)
    scores = tf.where((lengths > 0)[:, None], scores, 0.0)
    longest = tf.reduce_max(tf.reduce_sum(tf.cast(ids != pad_id, tf.int32), axis=2))
    return ids[:, :, :longest], scores


def ids_signature(config, source_tokenizer, shapes, search):
    import tensorflow as tf

    pad_id, eos_id, limit = config.pad_id, source_tokenizer.eos_id, shapes.max_source_length

    @tf.function(autograph=False,
                 input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")])
    def translate_ids(source_ids):
        tf.debugging.assert_non_negative(
            source_ids, message="source_ids must be token ids >= 0")
        tf.debugging.assert_less(
            source_ids, config.vocab_size,
            message=f"source_ids must be below the vocabulary size {config.vocab_size}")
        lengths = tf.reduce_sum(tf.cast(source_ids != pad_id, tf.int32), axis=1)
        truncated = lengths > limit
        # An over-long row keeps its first limit - 1 ids and ends in EOS.
        source_ids = source_ids[:, :limit]
        last = tf.range(tf.shape(source_ids)[1]) == limit - 1
        source_ids = tf.where(truncated[:, None] & last[None, :], eos_id, source_ids)
        ids, scores = search(source_ids, tf.minimum(lengths, limit))
        return {"ids": ids, "scores": scores, "truncated": truncated}

    return translate_ids


def text_signature(config, source_tokenizer, target_tokenizer, shapes, search):
    """`serving_default` (one translation per sentence) or, for a search of
    N > 1 hypotheses, `translate_n_best` ((batch, N) translations and scores)."""
    import tensorflow as tf

    pad_id, limit = config.pad_id, shapes.max_source_length
    source_eos_id, target_eos_id = source_tokenizer.eos_id, target_tokenizer.eos_id
    num_return = search.num_return

    @tf.function(autograph=False,
                 input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def translate(inputs):
        tokens = tf.cast(source_tokenizer.tokenize_tf(inputs), tf.int32)
        counts = tf.cast(tokens.row_lengths(), tf.int32)
        truncated = counts + 1 > limit
        # An over-long sentence keeps its first limit - 1 tokens, then EOS.
        tokens = tokens[:, : limit - 1]
        eos = tf.fill([tf.shape(inputs)[0], 1], source_eos_id)
        sources = tf.concat([tokens, tf.RaggedTensor.from_tensor(eos)], axis=1)
        lengths = tf.where(counts > 0, tf.minimum(counts + 1, limit), 0)
        ids, scores = search(sources.to_tensor(default_value=pad_id), lengths)
        if num_return > 1:  # detokenize the (batch × N) hypotheses as rows
            ids = tf.reshape(ids, [-1, tf.shape(ids)[2]])
        keep = tf.logical_and(ids != pad_id, ids != target_eos_id)
        texts = target_tokenizer.detokenize_tf(tf.ragged.boolean_mask(ids, keep))
        if num_return == 1:
            # An empty sentence translates to "", as in Translator.
            return {"translations": tf.where(counts > 0, texts, ""), "truncated": truncated}
        texts = tf.reshape(texts, [-1, num_return])
        return {"translations": tf.where((counts > 0)[:, None], texts, ""), "scores": scores,
                "truncated": truncated}

    return translate
