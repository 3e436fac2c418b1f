"""§3.2 Attention in the decoding step of §6.1: the fast paths of one cached query.

`MultiHeadAttention` computes eq. (1) the general way for training and for a
whole target. A decoding step asks for one query position against a key/value
cache; the layer then calls these functions instead:

* `single_query_attention`: eq. (1) for that one query, reading the cache in
  its (batch, S, heads·width) layout without transposing it, so that a step
  costs one pass over the cache;
* `project`: the query, key, value and output projections, as one `matmul`
  under PyTorch.

Both compute what the general path computes; the tests compare them with it.
"""

import math

import keras
from keras import ops

from keras_transformer import backend

# Added to the float32 logits of masked positions on the explicit paths. Any
# value far below real logits works; this one stays finite in float32.
MASKED_LOGIT = -1e9


def single_query_attention(query, key, value, mask, num_heads, key_dim, value_dim,
                           shared=False):
    """Eq. (1) for one query position against a cache: the decoding step.

    The general path's einsums put the heads outside before multiplying,
    which copies all S cached keys and values into that order at every
    step, so the per-token cost would grow with the cache. Here keys and
    values are read in their (batch, S, heads·width) layout, without
    transposes. The logits are one batched matrix product against a
    block-diagonal operand: the query spread so that column n holds head
    n's query in head n's rows (`heads` times the multiply-adds of the
    matrix-vector products, on data read once). The output is each head's
    weighted sum of its values, a product and a sum over S that XLA fuses
    into one pass over the cache, faster than a matrix product against the
    block-diagonal weights.

    With `shared`, a cache row serves the group of consecutive query rows
    that reads it, and its logits are one product for the whole group.

    Args:
        query: (batch, 1, num_heads, key_dim).
        key: (batch, S, num_heads * key_dim), the cache's layout.
        value: (batch, S, num_heads * value_dim).
        mask: (batch or 1, 1, 1, S) bool, True where attention is allowed.
        num_heads, key_dim, value_dim: The layer's h, d_k and d_v.
        shared: Whether the cache's batch may divide the query's (then
            `batch` above is the cache's, and the query has a multiple).

    Returns:
        (query batch, 1, num_heads, value_dim) outputs.
    """
    rows, length = ops.shape(key)[0], ops.shape(key)[1]
    heads = num_heads
    dtype = key.dtype
    query = ops.cast(query, dtype) * ops.cast(1.0 / math.sqrt(key_dim), dtype)
    if shared:  # (rows, heads, key_dim, groups): the queries of each cache row
        query = ops.transpose(ops.reshape(query, (rows, -1, heads, key_dim)), (0, 2, 3, 1))
    else:
        query = query[:, 0, :, :, None]
    blocks = ops.eye(heads, dtype=dtype)
    # (rows, heads·key_dim, groups·heads): query g of head n in rows
    # n·key_dim + h of column g·heads + n, zeros elsewhere.
    spread = ops.reshape(query[..., None] * blocks[None, :, None, None, :],
                         (rows, heads * key_dim, -1))
    logits = ops.cast(ops.matmul(key, spread), "float32")  # (rows, S, groups·heads)
    if mask is not None:
        logits = ops.where(mask[:, 0, 0, :, None], logits, MASKED_LOGIT)
    weights = ops.softmax(logits, axis=1)
    # Summed in float32, as a matrix product accumulates in mixed precision.
    values = ops.cast(value, "float32")
    if shared:
        weights = ops.reshape(weights, (rows, length, -1, heads))
        values = ops.reshape(values, (rows, length, 1, heads, value_dim))
        output = ops.sum(values * weights[..., None], axis=1)  # (rows, groups, heads, d_v)
    else:
        # Without the groups axis: XLA's fusion of the 5-axis sum is several
        # times slower than this one for the self-attention cache.
        values = ops.reshape(values, (rows, length, heads, value_dim))
        output = ops.sum(values * weights[..., None], axis=1)  # (rows, heads, d_v)
    return ops.reshape(ops.cast(output, value.dtype), (-1, 1, heads, value_dim))


def project(dense, inputs, step):
    """`dense(inputs)`, one of the four projections (`EinsumDense`), called
    as a part (`backend.call_part`).

    In a decoding `step` under torch, a plain layer (not quantized, no
    LoRA) runs as one `matmul` against its kernel seen as a matrix, because
    torch runs the layer's einsum as permutes around a batched product,
    which is slower. The layer stays a Keras `EinsumDense`, so `quantize`
    and LoRA still apply to it.

    Args:
        dense: `query_dense`, `key_dense` or `value_dense`, taking
            (batch, T, d) to (batch, T, num_heads, width), or
            `output_dense`, taking (batch, T, num_heads, width) to
            (batch, T, d_out).
        inputs: Its input.
        step: Whether this is a cached decoding step (no training).
    """
    if not step or keras.backend.backend() != "torch" or dense.lora_enabled \
            or dense.quantization_mode is not None:
        return backend.call_part(dense, inputs)
    kernel = dense.kernel
    batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
    if len(inputs.shape) == 4:  # output_dense, its kernel (n, h, d)
        outputs = ops.matmul(ops.reshape(inputs, (batch, length, -1)),
                             ops.reshape(kernel, (-1, kernel.shape[-1])))
    else:  # query, key, value: kernel (d, n, h)
        outputs = ops.reshape(
            ops.matmul(inputs, ops.reshape(kernel, (kernel.shape[0], -1))),
            (batch, length, *kernel.shape[1:]))
    return outputs if dense.bias is None else outputs + dense.bias
