"""§3.2 Attention: scaled dot-product attention (eq. 1) and multi-head attention.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V                              (1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Eq. (1) goes through `keras.ops.dot_product_attention`, which dispatches to fused
kernels (cuDNN's flash attention on GPU under JAX and torch;
`scaled_dot_product_attention` in torch; Keras's TensorFlow backend has no fused
kernel), unless the caller asks for the attention weights or attention dropout is
active; then the explicit softmax path beside it runs instead. Causality with no
other mask goes down as `is_causal`, which lets a backend take its causal kernel
(flash attention, torch's `is_causal`) with no (T, T) mask tensor. The attention
weights themselves come from their own method, `attention_weights`, which runs the
explicit path's softmax (for plots and alignments).

The layer also carries the key/value cache used for incremental decoding: a
pair of fixed-size key and value tensors updated in place at an index, so the
decoding loop compiles under `jax.jit` and `tf.function`. One query against a
cache (the decoding step) takes a third path that reads the cache without
transposing it (`keras_transformer.layers.attention_step`).
"""

import functools
import math

import keras
from keras import ops

from keras_transformer import backend, validation
from keras_transformer.layers.attention_step import (
    MASKED_LOGIT,
    project,
    single_query_attention,
)


@functools.lru_cache(maxsize=None)
def _fused_attention_fails_for_float16():
    """Whether the fused kernel rejects float16 here.

    XLA on CPU has no float16 x float16 -> float32 dot_general, which JAX's
    `dot_product_attention` asks for, so JAX on a CPU takes the explicit path in
    float16. Every other backend and device runs the fused kernel.
    """
    if keras.backend.backend() != "jax":
        return False
    devices = keras.distribution.list_devices()
    return all(device.lower().startswith("cpu") for device in devices)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head scaled dot-product attention (§3.2.2).

    Projects queries, keys and values into `num_heads` subspaces, applies eq. (1)
    in each, concatenates the heads and projects back to `output_dim`. Used for
    encoder self-attention, causal decoder self-attention and encoder-decoder
    (cross) attention.

    Args:
        num_heads: h, the number of heads.
        key_dim: d_k, the width of each head's queries and keys.
        value_dim: d_v, the width of each head's values; defaults to `key_dim`.
        output_dim: Width of the output; defaults to the query's last dimension.
        dropout_rate: Dropout on the attention weights (the paper uses none).
        use_bias: Whether the projections have biases.
        kernel_initializer: Initializer of the projection kernels.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: (batch, T, d_query) float tensor.
        value: (batch, S, d_value) float tensor, or None for self-attention.
        key: (batch, S, d_key) float tensor; defaults to `value`.
        key_padding_mask: (batch, S) bool tensor, True for real tokens, False for
            padding keys that must receive zero weight.
        attention_mask: (batch, T, S) bool tensor, True where query t may attend
            to key s. Combined with the other masks by logical AND.
        use_causal_mask: Whether query t may only attend to keys s <= t (with a
            cache: to keys s <= cache_update_index + t). Alone (no other mask,
            no cache) on the fused path, it reaches `dot_product_attention` as
            `is_causal=True` with no mask tensor: the backend's causal kernel.
        cache: A `(keys, values)` pair of (batch, S_max, num_heads * key_dim)
            and (batch, S_max, num_heads * value_dim) tensors, from
            `initial_cache` or `precompute_cache` (heads side by side in the
            last axis: see `initial_cache`). With `cache_update_index`, the keys and
            values of this call's positions are written into it at that index
            (self-attention decoding). Without it, the cache holds precomputed
            keys and values and `key`/`value` are ignored (cross-attention
            decoding); for one query position its batch may then divide the
            query's, each cache row shared by that many consecutive query
            rows (the beams of a sentence, `Transformer.initial_cache`), with
            `key_padding_mask` per cache row.
        cache_update_index: int scalar, the position of `query[:, 0]`.
        training: Whether attention dropout is active.

    Returns:
        (batch, T, output_dim) attention output; with a `cache`, the pair
        `(outputs, cache)`, the cache updated (or, precomputed, as given).
        `attention_weights` gives the weights of eq. (1) instead.

    Example:

    >>> attention = MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = keras.random.normal((3, 5, 8))
    >>> tuple(attention(x, use_causal_mask=True).shape)
    (3, 5, 8)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        dropout_rate=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._num_heads = validation.check_positive_int("num_heads", num_heads)
        self._key_dim = validation.check_positive_int("key_dim", key_dim)
        self._value_dim = (self._key_dim if value_dim is None
                           else validation.check_positive_int("value_dim", value_dim))
        dropout_rate = validation.check_rate("dropout_rate", dropout_rate)
        self._output_dim = output_dim
        self._dropout_rate = dropout_rate
        self._use_bias = use_bias
        self._kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = False

    @property
    def num_heads(self):
        return self._num_heads

    @property
    def key_dim(self):
        return self._key_dim

    @property
    def value_dim(self):
        return self._value_dim

    @property
    def output_dim(self):
        return self._output_dim

    @property
    def dropout_rate(self):
        return self._dropout_rate

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        output_dim = self._output_dim or query_shape[-1]
        heads = self._num_heads

        def projection(name, width):
            return keras.layers.EinsumDense(
                "btd,dnh->btnh",
                output_shape=(None, heads, width),
                bias_axes="nh" if self._use_bias else None,
                kernel_initializer=self._clone_initializer(),
                dtype=self.dtype_policy,
                name=name,
            )

        self.query_dense = projection("query", self._key_dim)
        self.query_dense.build(query_shape)
        self.key_dense = projection("key", self._key_dim)
        self.key_dense.build(key_shape)
        self.value_dense = projection("value", self._value_dim)
        self.value_dense.build(value_shape)
        self.output_dense = keras.layers.EinsumDense(
            "btnh,nhd->btd",
            output_shape=(None, output_dim),
            bias_axes="d" if self._use_bias else None,
            kernel_initializer=self._clone_initializer(),
            dtype=self.dtype_policy,
            name="attention_output",
        )
        self.output_dense.build((query_shape[0], query_shape[1], heads, self._value_dim))
        self.attention_dropout = keras.layers.Dropout(
            self._dropout_rate, dtype=self.dtype_policy, name="attention_dropout"
        )
        self.built = True

    def _clone_initializer(self):
        return self._kernel_initializer.__class__.from_config(
            self._kernel_initializer.get_config()
        )

    def initial_cache(self, batch_size, length):
        """An empty self-attention cache with room for `length` positions.

        The heads lie side by side in the last axis, the layout in which the
        decoding step reads them (`attention_step.single_query_attention`).
        Kept as (batch, length, heads, width), the step's write into the
        cache and its read through a reshape would become two fusions under
        XLA, each with a private copy of the whole cache, and a step's cost
        would grow with the cache.

        Returns:
            `(keys, values)`: (batch_size, length, num_heads * key_dim) and
            (batch_size, length, num_heads * value_dim) zeros in the compute
            dtype.
        """
        heads = self._num_heads
        return (
            ops.zeros((batch_size, length, heads * self._key_dim), self.compute_dtype),
            ops.zeros((batch_size, length, heads * self._value_dim), self.compute_dtype),
        )

    def precompute_cache(self, value, key=None):
        """Projects keys and values once, for a cache that never changes.

        Encoder-decoder attention reads the same source at every decoding step,
        so its keys and values are computed once per sentence.

        Args:
            value: (batch, S, d_value) float tensor.
            key: (batch, S, d_key) float tensor; defaults to `value`.

        Returns:
            `(keys, values)`: (batch, S, num_heads * key_dim) and
            (batch, S, num_heads * value_dim), the `cache` that `call` reads.
        """
        key = value if key is None else key
        return self._flat_heads(self.key_dense(key)), self._flat_heads(self.value_dense(value))

    @staticmethod
    def _flat_heads(x):
        """(batch, S, heads, width) → (batch, S, heads * width), the cache's layout."""
        return ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], -1))

    def _split_heads(self, x):
        """(batch, S, heads * width) → (batch, S, heads, width)."""
        return ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], self._num_heads, -1))

    def call(
        self,
        query,
        value=None,
        key=None,
        key_padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        step = cache is not None and not training
        q, k, v, cache = self._project(query, value, key, cache, cache_update_index, step)
        # Causality alone, over a whole sequence, goes down to the backend's causal
        # kernel (`is_causal`) with no mask tensor; any other mask is built.
        is_causal = (use_causal_mask and cache is None and key_padding_mask is None
                     and attention_mask is None and self._use_fused_attention(training))
        mask = None if is_causal else self._merge_masks(
            q, k, key_padding_mask, attention_mask, use_causal_mask, cache_update_index
        )
        if cache is not None and q.shape[1] == 1 and not (training and self._dropout_rate > 0):
            # The decoding step: one query against the cache, read in its layout.
            attention_output = single_query_attention(
                q, k, v, mask, self._num_heads, self._key_dim, self._value_dim,
                self._shares_cache_rows(q, k, cache_update_index))
        else:
            if cache is not None:
                k, v = self._split_heads(k), self._split_heads(v)
            attention_output = self._compute_attention(q, k, v, mask, training, is_causal)
        outputs = project(self.output_dense, attention_output, step)
        return outputs if cache is None else (outputs, cache)

    def attention_weights(
        self,
        query,
        value=None,
        key=None,
        key_padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
    ):
        """The weights of eq. (1), softmax(QKᵀ/√d_k), of every head.

        The same projections and masks as `call` (without a cache), through the
        explicit softmax path: for attention plots and alignments.

        Args:
            query, value, key, key_padding_mask, attention_mask, use_causal_mask:
                As in `call`.

        Returns:
            (batch, num_heads, T, S) float32 weights; each row sums to 1.
        """
        if not self.built:
            self.build(tuple(query.shape), None if value is None else tuple(value.shape),
                       None if key is None else tuple(key.shape))
        q, k, _, _ = self._project(query, value, key, None, None, False)
        mask = self._merge_masks(q, k, key_padding_mask, attention_mask, use_causal_mask, None)
        return self._softmax_weights(q, k, mask)

    def _project(self, query, value, key, cache, cache_update_index, step):
        """The query, key and value projections: (batch, T, heads, d_k) queries
        and the keys and values, each (batch, S, heads, width), or with a cache
        in its (batch, S, heads · width) layout, read from a precomputed cache
        or written into the cache at `cache_update_index`; and the cache."""
        value = query if value is None else value
        key = value if key is None else key
        q = project(self.query_dense, query, step)
        if cache is not None and cache_update_index is None:
            k, v = cache
            return q, k, v, cache
        k = project(self.key_dense, key, step)
        v = project(self.value_dense, value, step)
        if cache is None:
            return q, k, v, None
        # Keys and values are two tensors, so d_k and d_v may differ, and a
        # loop that carries them updates each one in place.
        key_cache, value_cache = cache
        k = backend.write_cache(key_cache, cache_update_index,
                                ops.cast(self._flat_heads(k), key_cache.dtype))
        v = backend.write_cache(value_cache, cache_update_index,
                                ops.cast(self._flat_heads(v), value_cache.dtype))
        return q, k, v, (k, v)

    @staticmethod
    def _shares_cache_rows(q, k, cache_update_index):
        """Whether each row of a precomputed cache serves a group of query rows
        (the beams of a sentence); equal known batch sizes take the simpler path."""
        known = q.shape[0] is not None and k.shape[0] is not None
        shared = cache_update_index is None and not (known and q.shape[0] == k.shape[0])
        if shared and known and q.shape[0] % k.shape[0]:
            raise ValueError(
                f"The query's batch ({q.shape[0]}) is not a multiple of the "
                f"cross-attention cache's ({k.shape[0]}): a cache row is shared by "
                "a whole group of consecutive query rows (Transformer.initial_cache's "
                "beam_size).")
        return shared

    def _merge_masks(
        self, q, k, key_padding_mask, attention_mask, use_causal_mask, cache_update_index
    ):
        """Combines the masks into one (batch or 1, 1, T, S) bool mask, or None."""
        masks = []
        if key_padding_mask is not None:
            masks.append(ops.cast(key_padding_mask, "bool")[:, None, None, :])
        if attention_mask is not None:
            masks.append(ops.cast(attention_mask, "bool")[:, None, :, :])
        if use_causal_mask:
            query_length, key_length = ops.shape(q)[1], ops.shape(k)[1]
            offset = 0 if cache_update_index is None else cache_update_index
            query_positions = ops.arange(query_length) + offset
            key_positions = ops.arange(key_length)
            causal = ops.less_equal(key_positions[None, :], query_positions[:, None])
            masks.append(causal[None, None, :, :])
        if not masks:
            return None
        mask = masks[0]
        for other in masks[1:]:
            mask = ops.logical_and(mask, other)
        # A query with no key to attend to (a row that is all padding) would give
        # 0/0 in the softmax. Let it attend to every key instead: its output is
        # finite and, being padding itself, never used.
        return ops.logical_or(mask, ops.logical_not(ops.any(mask, axis=-1, keepdims=True)))

    def _use_fused_attention(self, training):
        """Whether eq. (1) may go through the fused `dot_product_attention`."""
        if training and self._dropout_rate > 0:
            return False
        if self.compute_dtype == "float16" and _fused_attention_fails_for_float16():
            return False
        # JAX's kernel needs values as wide as keys (d_v == d_k).
        if self._value_dim != self._key_dim and keras.backend.backend() == "jax":
            return False
        return True

    def _compute_attention(self, query, key, value, mask, training, is_causal=False):
        """Eq. (1) for every head.

        Args:
            query: (batch, T, num_heads, key_dim).
            key: (batch, S, num_heads, key_dim).
            value: (batch, S, num_heads, value_dim).
            mask: (batch or 1, 1, T, S) bool, True where attention is allowed.
            is_causal: Whether query t attends to keys s <= t only, with no
                `mask` (T == S): the fused path's causal kernel (flash
                attention on a GPU, `is_causal` in torch's SDPA).

        Returns:
            (batch, T, num_heads, value_dim) outputs.
        """
        if self._use_fused_attention(training):
            if mask is not None:
                mask = ops.broadcast_to(
                    mask,
                    (ops.shape(query)[0], 1, ops.shape(query)[1], ops.shape(key)[1]),
                )
            scale = 1.0 / math.sqrt(self._key_dim)
            return ops.dot_product_attention(query, key, value, mask=mask, scale=scale,
                                             is_causal=is_causal)
        weights = backend.call_part(self.attention_dropout,
                                    self._softmax_weights(query, key, mask), training=training)
        return ops.einsum("bnts,bsnh->btnh", ops.cast(weights, value.dtype), value)

    def _softmax_weights(self, query, key, mask):
        """The explicit path's softmax(QKᵀ/√d_k): (batch, num_heads, T, S)
        float32, logits and softmax in float32 for stability in mixed precision."""
        query = ops.multiply(query, ops.cast(1.0 / math.sqrt(self._key_dim), query.dtype))
        logits = ops.cast(ops.einsum("btnh,bsnh->bnts", query, key), "float32")
        if mask is not None:
            logits = ops.where(mask, logits, MASKED_LOGIT)
        # softmax, written out: over one key (a one-token source or target)
        # Keras's softmax warns, and the weight is simply 1.
        weights = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
        return weights / ops.sum(weights, axis=-1, keepdims=True)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self._num_heads,
                "key_dim": self._key_dim,
                "value_dim": self._value_dim,
                "output_dim": self._output_dim,
                "dropout_rate": self._dropout_rate,
                "use_bias": self._use_bias,
                "kernel_initializer": keras.initializers.serialize(self._kernel_initializer),
            }
        )
        return config
