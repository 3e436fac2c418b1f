"""§3.1 Encoder and Decoder Stacks: one encoder block and one decoder block.

Each sublayer is wrapped in a residual connection followed by layer
normalization, with dropout on the sublayer output before the add (§5.4):

    post-norm (the paper):  LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm (option):      x + Dropout(Sublayer(LayerNorm(x)))

The encoder block has two sublayers (self-attention, feed-forward); the decoder
block inserts encoder-decoder attention between its causal self-attention and
its feed-forward network.
"""

import keras
from keras import ops

from keras_transformer import validation
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import PositionwiseFeedForward


class _Block(keras.layers.Layer):
    """Arguments, checks and the residual connection shared by both blocks."""

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

    def _residual(self, x, sublayer, norm, dropout, training):
        """Applies `sublayer` inside the residual connection of §3.1 / §5.4.

        `sublayer` maps a tensor to a tuple whose first item is its output; the
        rest (a cache, attention weights) is passed through.
        """
        if self._norm_position == "pre":
            output, *extras = sublayer(norm(x))
            return (x + dropout(output, training=training), *extras)
        output, *extras = sublayer(x)
        return (norm(x + dropout(output, training=training)), *extras)

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
        return_attention_scores: Whether to also return the self-attention
            weights, (batch, num_heads, S, S) float32.
        training: Whether dropout is active.

    Returns:
        (batch, S, d_model) tensor, plus the attention weights when asked for.

    Example:

    >>> block = EncoderBlock(num_heads=2, d_ff=16)
    >>> block(keras.ops.ones((2, 5, 8))).shape
    (2, 5, 8)
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

    def call(self, inputs, padding_mask=None, return_attention_scores=False, training=None):
        def self_attend(x):
            outputs = self.self_attention(
                x,
                key_padding_mask=padding_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            return outputs if return_attention_scores else (outputs,)

        x, *scores = self._residual(
            inputs, self_attend, self.self_attention_norm, self.self_attention_dropout,
            training,
        )
        x, = self._residual(
            x, lambda y: (self.feed_forward(y, training=training),),
            self.feed_forward_norm, self.feed_forward_dropout, training,
        )
        return (x, scores[0]) if return_attention_scores else x


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
        decoder_padding_mask: (batch, T) bool, True for real target tokens.
        encoder_padding_mask: (batch, S) bool, True for real source tokens.
        self_attention_cache: The self-attention's `(keys, values)` cache,
            (batch, T_max, num_heads * key_dim) and (batch, T_max, num_heads *
            value_dim), from `initial_cache` or the previous step.
        cache_update_index: int scalar, the position of `inputs[:, 0]`.
        cross_attention_cache: The precomputed `(keys, values)` of
            `encoder_outputs`, (batch, S, num_heads * key_dim) and (batch, S,
            num_heads * value_dim), from `initial_cache`; `encoder_outputs` is
            then not read.
        return_attention_scores: Whether to also return a dict with the
            self-attention ("self") and cross-attention ("cross") weights.
        training: Whether dropout is active.

    Returns:
        (batch, T, d_model) tensor; with a self-attention cache, a tuple
        `(outputs, updated_cache)`; with `return_attention_scores`, the dict of
        weights is appended to the tuple.

    Example:

    >>> block = DecoderBlock(num_heads=2, d_ff=16)
    >>> block(keras.ops.ones((2, 3, 8)), keras.ops.ones((2, 5, 8))).shape
    (2, 3, 8)
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
        return_attention_scores=False,
        training=None,
    ):
        if self_attention_cache is not None and cache_update_index is None:
            raise ValueError(
                "self_attention_cache needs cache_update_index, the position of "
                "inputs[:, 0] in the target sequence."
            )

        def as_tuple(outputs):
            return outputs if isinstance(outputs, tuple) else (outputs,)

        def self_attend(x):
            return as_tuple(self.self_attention(
                x,
                key_padding_mask=decoder_padding_mask,
                use_causal_mask=True,
                cache=self_attention_cache,
                cache_update_index=cache_update_index,
                return_attention_scores=return_attention_scores,
                training=training,
            ))

        def cross_attend(x):
            return as_tuple(self.cross_attention(
                x,
                encoder_outputs,
                key_padding_mask=encoder_padding_mask,
                cache=cross_attention_cache,
                return_attention_scores=return_attention_scores,
                training=training,
            ))

        x, *self_extras = self._residual(
            inputs, self_attend, self.self_attention_norm, self.self_attention_dropout,
            training,
        )
        x, *cross_extras = self._residual(
            x, cross_attend, self.cross_attention_norm, self.cross_attention_dropout,
            training,
        )
        x, = self._residual(
            x, lambda y: (self.feed_forward(y, training=training),),
            self.feed_forward_norm, self.feed_forward_dropout, training,
        )

        outputs = [x]
        if self_attention_cache is not None:
            outputs.append(self_extras.pop(0))
        if cross_attention_cache is not None:
            cross_extras.pop(0)
        if return_attention_scores:
            outputs.append({"self": self_extras[0], "cross": cross_extras[0]})
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
