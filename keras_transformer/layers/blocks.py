"""§3.1 Encoder and Decoder Stacks: one encoder block and one decoder block.

Each sublayer is wrapped in a residual connection followed by layer
normalization, with dropout on the sublayer output before the add (§5.4):

    post-norm (the paper):  LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm (option):      x + Dropout(Sublayer(LayerNorm(x)))

The encoder block has two sublayers (self-attention, feed-forward); the decoder
block inserts encoder-decoder attention between its causal self-attention and
its feed-forward network. Each `call` writes its sublayers out one after the
other, the LayerNorm after the residual add (post-norm), or before the
sublayer in the visible `if` of pre-norm. `attention_weights` gives the
blocks' attention weights, for plots.

Both blocks take Keras's implicit mask (`keras.layers.Embedding(mask_zero=True)`,
`keras.layers.Masking`) as their padding mask where none is passed explicitly,
and hand the mask of `inputs` on to the next layer.
"""

import keras
from keras import ops

from keras_transformer import backend, validation
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import PositionwiseFeedForward


def _without_keras_mask(tensor):
    """`tensor` as a new tensor, without the Keras mask that rides on the old one.

    The block has taken the mask as its padding mask. Its sublayers would find
    it again on the tensor, and the attention's projections, which take no
    mask, would warn that they drop it. The blocks call this only when Keras
    hands them a mask: a call without one copies nothing.
    """
    return ops.copy(tensor)


class _Block(keras.layers.Layer):
    """Arguments, checks and the sublayers' construction shared by both blocks."""

    def __init__(
        self,
        num_heads,
        d_ff,
        key_dim=None,
        value_dim=None,
        dropout_rate=0.1,
        attention_dropout_rate=0.0,
        activation_dropout_rate=0.0,
        norm_position="post",
        layer_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # The output keeps the mask of `inputs` (Layer.compute_mask's default).
        self.supports_masking = True
        validation.check_choice("norm_position", norm_position, validation.NORM_POSITIONS)
        validation.check_rate("dropout_rate", dropout_rate)
        self._num_heads = num_heads
        self._d_ff = d_ff
        self._key_dim = key_dim
        self._value_dim = value_dim
        self._dropout_rate = dropout_rate
        self._attention_dropout_rate = attention_dropout_rate
        self._activation_dropout_rate = activation_dropout_rate
        self._norm_position = norm_position
        self._layer_norm_epsilon = layer_norm_epsilon

    @property
    def norm_position(self):
        return self._norm_position

    def _attention(self, name, d_model):
        key_dim, value_dim = validation.head_dims(
            d_model, self._num_heads, self._key_dim, self._value_dim)
        return MultiHeadAttention(
            num_heads=self._num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            dropout_rate=self._attention_dropout_rate,
            dtype=self.dtype_policy,
            name=name,
        )

    def _norm(self, name, d_model):
        norm = keras.layers.LayerNormalization(
            epsilon=self._layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        norm.build((None, None, d_model))
        return norm

    def _dropout(self, name):
        return keras.layers.Dropout(self._dropout_rate, dtype=self.dtype_policy, name=name)

    def _feed_forward(self, d_model):
        feed_forward = PositionwiseFeedForward(
            self._d_ff,
            activation_dropout_rate=self._activation_dropout_rate,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        feed_forward.build((None, None, d_model))
        return feed_forward

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self._num_heads,
                "d_ff": self._d_ff,
                "key_dim": self._key_dim,
                "value_dim": self._value_dim,
                "dropout_rate": self._dropout_rate,
                "attention_dropout_rate": self._attention_dropout_rate,
                "activation_dropout_rate": self._activation_dropout_rate,
                "norm_position": self._norm_position,
                "layer_norm_epsilon": self._layer_norm_epsilon,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderBlock(_Block):
    """One of the N encoder blocks (§3.1): self-attention, then feed-forward.

    Args:
        num_heads: h, the number of attention heads.
        d_ff: Inner width of the feed-forward network.
        key_dim: d_k per head; defaults to d_model // num_heads.
        value_dim: d_v per head; defaults to key_dim.
        dropout_rate: P_drop on each sublayer output before the residual add.
        attention_dropout_rate: Dropout on the attention weights.
        activation_dropout_rate: Dropout inside the feed-forward network.
        norm_position: "post" (the paper) or "pre".
        layer_norm_epsilon: Epsilon of the LayerNorms.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: (batch, S, d_model) float tensor.
        padding_mask: (batch, S) bool, True for real tokens.
        training: Whether dropout is active.
        mask: (batch, S) bool, the Keras mask of `inputs`, which Keras passes
            itself when `inputs` carries one (after
            `keras.layers.Embedding(mask_zero=True)`, say). It is the padding
            mask when `padding_mask` is None; an explicit `padding_mask` wins.
        inputs_mask: The same mask, under the name Keras passes it by when
            `padding_mask` is a tensor too (and so wins over it).

    Returns:
        (batch, S, d_model) tensor, carrying the Keras mask of `inputs`.

    Example:

    >>> import keras
    >>> block = EncoderBlock(num_heads=2, d_ff=16)
    >>> tuple(block(keras.ops.ones((2, 5, 8))).shape)
    (2, 5, 8)
    >>> tuple(block.attention_weights(keras.ops.ones((2, 5, 8))).shape)  # (batch, h, S, S)
    (2, 2, 5, 5)
    """

    def build(self, inputs_shape):
        d_model = inputs_shape[-1]
        self.self_attention = self._attention("self_attention", d_model)
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm", d_model)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.feed_forward = self._feed_forward(d_model)
        self.feed_forward_norm = self._norm("feed_forward_norm", d_model)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.built = True

    def call(self, inputs, padding_mask=None, training=None, mask=None, inputs_mask=None):
        # Keras passes the mask of `inputs` as `mask` when `inputs` is the only
        # tensor argument, as `inputs_mask` beside a tensor `padding_mask`.
        mask = inputs_mask if mask is None else mask
        if mask is not None:
            inputs = _without_keras_mask(inputs)
            if padding_mask is None:
                padding_mask = mask
        pre_norm = self._norm_position == "pre"

        # Multi-head self-attention (§3.2.2).
        residual = inputs
        x = backend.call_part(self.self_attention_norm, inputs) if pre_norm else inputs
        x = backend.call_part(self.self_attention, x, key_padding_mask=padding_mask,
                              training=training)
        x = backend.call_part(self.self_attention_dropout, x, training=training)
        x = x + residual
        if not pre_norm:
            x = backend.call_part(self.self_attention_norm, x)

        # Position-wise feed-forward network (§3.3).
        residual = x
        x = backend.call_part(self.feed_forward_norm, x) if pre_norm else x
        x = backend.call_part(self.feed_forward, x, training=training)
        x = backend.call_part(self.feed_forward_dropout, x, training=training)
        x = x + residual
        if not pre_norm:
            x = backend.call_part(self.feed_forward_norm, x)
        return x

    def attention_weights(self, inputs, padding_mask=None):
        """The self-attention weights of eq. (1): (batch, num_heads, S, S) float32."""
        if not self.built:
            self.build(tuple(inputs.shape))
        pre_norm = self._norm_position == "pre"
        x = backend.call_part(self.self_attention_norm, inputs) if pre_norm else inputs
        return self.self_attention.attention_weights(x, key_padding_mask=padding_mask)


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderBlock(_Block):
    """One of the N decoder blocks (§3.1).

    Causal self-attention, encoder-decoder attention over the encoder output,
    then feed-forward, each in a residual connection with LayerNorm. With a
    `self_attention_cache` it decodes incrementally: the keys and values of the
    new positions are written into the cache at `cache_update_index`, and the
    output equals that of a full recomputation.

    Args:
        num_heads, d_ff, key_dim, value_dim, dropout_rate, attention_dropout_rate,
        activation_dropout_rate, norm_position, layer_norm_epsilon: As in
            `EncoderBlock`.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: (batch, T, d_model) decoder input.
        encoder_outputs: (batch, S, d_model) output of the encoder stack.
        decoder_padding_mask: (batch, T) bool, True for real target tokens;
            needed only where padding stands before a real token. Right padding
            needs none: causality alone keeps every real position from the
            padding after it, and without a mask the self-attention takes the
            backend's causal kernel (`is_causal`). `Transformer` passes none.
        encoder_padding_mask: (batch, S) bool, True for real source tokens.
        self_attention_cache: The self-attention's `(keys, values)` cache,
            (batch, T_max, num_heads * key_dim) and (batch, T_max, num_heads *
            value_dim), from `initial_cache` or the previous step.
        cache_update_index: int scalar, the position of `inputs[:, 0]`.
        cross_attention_cache: The precomputed `(keys, values)` of
            `encoder_outputs`, (batch, S, num_heads * key_dim) and (batch, S,
            num_heads * value_dim), from `initial_cache`; `encoder_outputs` is
            then not read.
        training: Whether dropout is active.
        inputs_mask: (batch, T) bool, the Keras mask of `inputs`, which Keras
            passes itself when `inputs` carries one; it is the decoder padding
            mask when `decoder_padding_mask` is None (and there is no
            `self_attention_cache`, whose keys it would not cover).
        encoder_outputs_mask: (batch, S) bool, the Keras mask of
            `encoder_outputs`, passed by Keras likewise; it is the encoder
            padding mask when `encoder_padding_mask` is None.

    Returns:
        (batch, T, d_model) tensor, carrying the Keras mask of `inputs`; with a
        `self_attention_cache`, the pair `(outputs, updated_cache)`.

    Example:

    >>> import keras
    >>> block = DecoderBlock(num_heads=2, d_ff=16)
    >>> tuple(block(keras.ops.ones((2, 3, 8)), keras.ops.ones((2, 5, 8))).shape)
    (2, 3, 8)
    >>> cache = block.initial_cache(keras.ops.ones((2, 5, 8)), length=3)
    >>> outputs, self_cache = block(keras.ops.ones((2, 1, 8)), None,
    ...                             self_attention_cache=cache["self"], cache_update_index=0,
    ...                             cross_attention_cache=cache["cross"])
    >>> tuple(outputs.shape), tuple(self_cache[0].shape)  # one position; keys of all 3
    ((2, 1, 8), (2, 3, 8))
    """

    def build(self, inputs_shape, encoder_outputs_shape=None):
        d_model = inputs_shape[-1]
        encoder_outputs_shape = encoder_outputs_shape or inputs_shape
        self.self_attention = self._attention("self_attention", d_model)
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm", d_model)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.cross_attention = self._attention("cross_attention", d_model)
        self.cross_attention.build(inputs_shape, encoder_outputs_shape)
        self.cross_attention_norm = self._norm("cross_attention_norm", d_model)
        self.cross_attention_dropout = self._dropout("cross_attention_dropout")
        self.feed_forward = self._feed_forward(d_model)
        self.feed_forward_norm = self._norm("feed_forward_norm", d_model)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.built = True

    def initial_cache(self, encoder_outputs, length, beam_size=1):
        """The caches of incremental decoding for this block.

        Args:
            encoder_outputs: (batch, S, d_model) output of the encoder stack.
            length: Positions the self-attention cache has room for.
            beam_size: Decoder rows per row of `encoder_outputs`: the
                self-attention cache has `beam_size` times as many rows, and
                consecutive groups of them share a cross-attention row.

        Returns:
            A dict: "self", the empty self-attention `(keys, values)`, and
            "cross", the encoder-decoder attention's keys and values of
            `encoder_outputs`, projected once for every decoding step.
        """
        beam_size = validation.check_positive_int("beam_size", beam_size, "1 for greedy search")
        batch_size = ops.shape(encoder_outputs)[0] * beam_size
        return {
            "self": self.self_attention.initial_cache(batch_size, length),
            "cross": self.cross_attention.precompute_cache(encoder_outputs),
        }

    def call(
        self,
        inputs,
        encoder_outputs,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        cache_update_index=None,
        cross_attention_cache=None,
        training=None,
        inputs_mask=None,
        encoder_outputs_mask=None,
    ):
        # Keras passes the mask each tensor argument carries as `<argument>_mask`;
        # an explicit padding mask wins over it.
        if inputs_mask is not None:
            inputs = _without_keras_mask(inputs)
            if decoder_padding_mask is None and self_attention_cache is None:
                decoder_padding_mask = inputs_mask
        if encoder_outputs_mask is not None:
            encoder_outputs = _without_keras_mask(encoder_outputs)
            if encoder_padding_mask is None:
                encoder_padding_mask = encoder_outputs_mask
        if self_attention_cache is not None and cache_update_index is None:
            raise ValueError(
                "self_attention_cache needs cache_update_index, the position of "
                "inputs[:, 0] in the target sequence."
            )
        pre_norm = self._norm_position == "pre"

        # Masked multi-head self-attention (§3.2.3): position t sees positions <= t.
        residual = inputs
        x = backend.call_part(self.self_attention_norm, inputs) if pre_norm else inputs
        x = backend.call_part(
            self.self_attention, x, key_padding_mask=decoder_padding_mask, use_causal_mask=True,
            cache=self_attention_cache, cache_update_index=cache_update_index,
            training=training)
        if self_attention_cache is not None:
            x, self_attention_cache = x
        x = backend.call_part(self.self_attention_dropout, x, training=training)
        x = x + residual
        if not pre_norm:
            x = backend.call_part(self.self_attention_norm, x)

        # Encoder-decoder attention (§3.2.3): every position attends over the source.
        residual = x
        x = backend.call_part(self.cross_attention_norm, x) if pre_norm else x
        if cross_attention_cache is None:
            x = backend.call_part(self.cross_attention, x, encoder_outputs,
                                  key_padding_mask=encoder_padding_mask, training=training)
        else:
            x, _ = backend.call_part(self.cross_attention, x,
                                     key_padding_mask=encoder_padding_mask,
                                     cache=cross_attention_cache, training=training)
        x = backend.call_part(self.cross_attention_dropout, x, training=training)
        x = x + residual
        if not pre_norm:
            x = backend.call_part(self.cross_attention_norm, x)

        # Position-wise feed-forward network (§3.3).
        residual = x
        x = backend.call_part(self.feed_forward_norm, x) if pre_norm else x
        x = backend.call_part(self.feed_forward, x, training=training)
        x = backend.call_part(self.feed_forward_dropout, x, training=training)
        x = x + residual
        if not pre_norm:
            x = backend.call_part(self.feed_forward_norm, x)
        return x if self_attention_cache is None else (x, self_attention_cache)

    def attention_weights(self, inputs, encoder_outputs, decoder_padding_mask=None,
                          encoder_padding_mask=None):
        """The attention weights of eq. (1) over a whole target, for plots and
        alignments: the first sublayer runs as in `call` (without dropout), so
        that the encoder-decoder attention sees what it sees there.

        Returns:
            A dict: "self", (batch, num_heads, T, T), and "cross", (batch,
            num_heads, T, S), float32.
        """
        inputs = ops.convert_to_tensor(inputs, self.compute_dtype)
        if not self.built:
            self.build(tuple(inputs.shape), tuple(encoder_outputs.shape))
        pre_norm = self._norm_position == "pre"
        x = backend.call_part(self.self_attention_norm, inputs) if pre_norm else inputs
        weights = {"self": self.self_attention.attention_weights(
            x, key_padding_mask=decoder_padding_mask, use_causal_mask=True)}
        x = inputs + self.self_attention(x, key_padding_mask=decoder_padding_mask,
                                         use_causal_mask=True)
        x = x if pre_norm else backend.call_part(self.self_attention_norm, x)
        x = backend.call_part(self.cross_attention_norm, x) if pre_norm else x
        weights["cross"] = self.cross_attention.attention_weights(
            x, encoder_outputs, key_padding_mask=encoder_padding_mask)
        return weights
