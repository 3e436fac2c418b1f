"""§6.1 decoding, explained: each output token's source position, as fairseq's
`--print-alignment` gives it.

A token is aligned to the source position of highest encoder-decoder
attention in the last decoder block, averaged over heads, among the source's
tokens before its last one (EOS, which fairseq leaves out too). The weights
come from one teacher-forced pass of the finished hypotheses
(`Transformer.attention_weights`) after the search: the decoder at position t
sees the prefix alone, so they are the weights the cached step saw when it
chose token t + 1, and the search loops carry nothing for it.
"""

import weakref

import numpy as np
from keras import ops

from keras_transformer.inference.compiled import compile_inference
from keras_transformer.inference.limits import WIDTH_MULTIPLE


def alignment_candidates(source_ids, pad_id):
    """(batch, S) bool: the source positions an output token may be aligned to.

    The real tokens before the last one, which is EOS in every encoder input
    (fairseq's `--print-alignment` leaves EOS out too); a source of one token
    keeps it, so that every row has a candidate.
    """
    real = ops.not_equal(source_ids, pad_id)
    lengths = ops.sum(ops.cast(real, "int32"), axis=1)
    positions = ops.arange(ops.shape(source_ids)[1], dtype="int32")
    before_last = ops.less(positions[None, :], (lengths - 1)[:, None])
    return ops.where(ops.greater(lengths, 1)[:, None], ops.logical_and(real, before_last), real)


def alignment_positions(model, source_ids, decoder_inputs):
    """(batch, T) int32: the source position each decoder input position
    attends to most in the last block's encoder-decoder attention, averaged
    over heads, among `alignment_candidates` (traceable)."""
    cross = model.attention_weights(source_ids, decoder_inputs)["cross"][-1]
    mean = ops.mean(cross, axis=1)
    aligned_to = alignment_candidates(source_ids, model.config.pad_id)
    return ops.cast(ops.argmax(ops.where(aligned_to[:, None, :], mean, -1.0), axis=-1), "int32")


# The compiled `alignment_positions` of each model, reached through a weak reference.
_COMPILED = weakref.WeakKeyDictionary()


def align(model, source_ids, token_ids, bos_id):
    """The alignment of searched hypotheses.

    Args:
        model: The `Transformer` that searched.
        source_ids: (batch, S) int32 encoder inputs.
        token_ids: (batch, L) or (batch, N, L) int32 output ids after BOS (N
            hypotheses per sentence), padded with `pad_id`.
        bos_id: The target's begin-of-sentence id, the first decoder input.

    Returns:
        An int32 array shaped as `token_ids`: the source position of each
        output token (0 under padding).
    """
    shape = token_ids.shape
    flat = token_ids.reshape(-1, shape[-1])
    sources = np.repeat(source_ids, flat.shape[0] // max(len(source_ids), 1), axis=0)
    if not flat.size:
        return np.zeros(shape, "int32")
    # Decoder inputs: BOS, then every output token but the last; padded to a
    # multiple of WIDTH_MULTIPLE, so that few shapes compile.
    width = -(-shape[-1] // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    inputs = np.full((len(flat), width), model.config.pad_id, "int32")
    inputs[:, 0] = bos_id
    inputs[:, 1:shape[-1]] = flat[:, :-1]
    if model not in _COMPILED:
        _COMPILED[model] = compile_inference(weakref.ref(model), alignment_positions)
    positions = ops.convert_to_numpy(_COMPILED[model](sources, inputs)).astype("int32")
    positions = np.where(flat != model.config.pad_id, positions[:, :shape[-1]], 0)
    return positions.reshape(shape)
