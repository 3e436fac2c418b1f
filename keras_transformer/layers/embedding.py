"""§3.4 Embeddings and Softmax, §3.5 Positional Encoding.

§3.4: token embeddings are multiplied by √d_model, and one weight matrix is shared
by the source embedding, the target embedding and the pre-softmax linear
transformation. `TokenEmbedding` holds that matrix and runs in both directions:
ids → vectors, and vectors → vocabulary logits (`reverse=True`).

§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
      PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
Table 3 row (E) replaces them with learned position embeddings.
"""

import math

import keras
from keras import ops

from keras_transformer.validation import check_positive_int


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Token embeddings scaled by √d_model, reusable as the output projection.

    Forward: `embeddings[ids] · √d_model`. Reverse: `x · embeddingsᵀ (+ bias)`, the
    pre-softmax linear transformation with the shared weights (§3.4).

    Args:
        vocab_size: Number of token ids.
        d_model: Embedding width.
        scale_embeddings: Whether to multiply looked-up embeddings by √d_model.
        use_output_bias: Whether the reverse projection adds a per-token bias.
        embeddings_initializer: Initializer of the (vocab_size, d_model) matrix;
            defaults to N(0, d_model^-0.5), so that scaled embeddings have unit
            variance like the positional encodings they are added to.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: (batch, T) int token ids, or with `reverse=True` a
            (batch, T, d_model) float tensor.
        reverse: Whether to project vectors to vocabulary logits.
        reverse_kernel: With `reverse`, `reverse_kernel()` made beforehand,
            to multiply by in place of the embeddings transposed at each call
            (a decoding loop makes it once for all its steps).

    Returns:
        (batch, T, d_model) embeddings in the compute dtype, or with
        `reverse=True` (batch, T, vocab_size) float32 logits.

    Example:

    >>> embedding = TokenEmbedding(vocab_size=10, d_model=4)
    >>> vectors = embedding(keras.ops.array([[1, 2, 0]]))
    >>> tuple(embedding(vectors, reverse=True).shape)
    (1, 3, 10)
    """

    def __init__(
        self,
        vocab_size,
        d_model,
        scale_embeddings=True,
        use_output_bias=False,
        embeddings_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._vocab_size = check_positive_int("vocab_size", vocab_size)
        self._d_model = check_positive_int("d_model", d_model)
        self._scale_embeddings = scale_embeddings
        self._use_output_bias = use_output_bias
        self._embeddings_initializer = keras.initializers.get(
            embeddings_initializer
            or keras.initializers.RandomNormal(stddev=self._d_model**-0.5)
        )

    @property
    def vocab_size(self):
        return self._vocab_size

    @property
    def d_model(self):
        return self._d_model

    def build(self, inputs_shape=None):
        # Read in float32 even inside a mixed-precision autocast scope, and cast
        # by `call` only after the lookup: the lookup's gradient is then a
        # scatter-add into a float32 table. Cast before the lookup, thousands
        # of updates to a frequent token's row would be summed in bfloat16 or
        # float16, which is slow on a GPU and loses (or, loss-scaled,
        # overflows) the sum.
        self.embeddings = self.add_weight(
            shape=(self._vocab_size, self._d_model),
            initializer=self._embeddings_initializer,
            name="embeddings",
            autocast=False,
        )
        self.output_bias = None
        if self._use_output_bias:
            # Added to float32 logits: read in float32 too.
            self.output_bias = self.add_weight(
                shape=(self._vocab_size,), initializer="zeros", name="output_bias",
                autocast=False,
            )
        self.built = True

    def reverse_kernel(self):
        """The reverse projection's (d_model, vocab_size) matrix, in the compute
        dtype: the embeddings transposed, laid out as the product reads them.

        A decoding loop makes it once for all its steps: under XLA, a step's
        few rows multiply faster by this contiguous copy than by the
        embeddings transposed inside the product.
        """
        return ops.transpose(ops.cast(self.embeddings, self.compute_dtype))

    def call(self, inputs, reverse=False, reverse_kernel=None):
        if reverse:
            kernel = self.reverse_kernel() if reverse_kernel is None \
                else ops.cast(reverse_kernel, self.compute_dtype)
            logits = ops.matmul(inputs, kernel)
            logits = ops.cast(logits, "float32")
            if self.output_bias is not None:
                logits = logits + ops.cast(self.output_bias, "float32")
            return logits
        # The float32 rows are looked up first, then cast (see `build`).
        outputs = ops.take(self.embeddings, ops.cast(inputs, "int32"), axis=0)
        outputs = ops.cast(outputs, self.compute_dtype)
        if self._scale_embeddings:
            outputs = outputs * ops.cast(math.sqrt(self._d_model), self.compute_dtype)
        return outputs

    def compute_output_spec(self, inputs, reverse=False, reverse_kernel=None):
        if reverse:
            shape = (*inputs.shape[:-1], self._vocab_size)
            return keras.KerasTensor(shape, dtype="float32")
        return keras.KerasTensor((*inputs.shape, self._d_model), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self._vocab_size,
                "d_model": self._d_model,
                "scale_embeddings": self._scale_embeddings,
                "use_output_bias": self._use_output_bias,
                "embeddings_initializer": keras.initializers.serialize(
                    self._embeddings_initializer
                ),
            }
        )
        return config


def sinusoidal_position_encoding(length, d_model, start_index=0, max_wavelength=10000.0):
    """The §3.5 matrix PE, shape (length, d_model), float32.

    Column 2i holds sin(pos / max_wavelength^(2i/d_model)) and column 2i+1 the
    cosine at the same frequency, for pos = start_index, ..., start_index+length-1.
    """
    positions = ops.cast(ops.arange(length) + start_index, "float32")
    dims = ops.arange(d_model)
    even_dims = ops.cast(dims - dims % 2, "float32")
    inverse_frequencies = ops.power(max_wavelength, -even_dims / d_model)
    angles = positions[:, None] * inverse_frequencies[None, :]
    return ops.where(dims % 2 == 0, ops.sin(angles), ops.cos(angles))


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal positional encodings (§3.5); no weights.

    Computed on the fly, so any sequence length works and decoding step t gets
    the encoding of position `start_index + t`.

    Args:
        max_wavelength: The 10000 of §3.5.
        **kwargs: Base layer arguments.

    Call arguments:
        inputs: (batch, T, d_model) embeddings; only the shape is used.
        start_index: Position of `inputs[:, 0]` (int or int scalar tensor).

    Returns:
        (batch, T, d_model) encodings in the compute dtype, to add to `inputs`;
        they carry the Keras mask of `inputs`, if any.

    Example:

    >>> encoding = SinusoidalPositionEncoding()
    >>> tuple(encoding(keras.ops.zeros((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(self, max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        # The encodings carry the Keras mask of `inputs`, so that
        # `keras.layers.Add()([inputs, encodings])` keeps it.
        self.supports_masking = True
        self._max_wavelength = max_wavelength
        self.built = True

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        encoding = sinusoidal_position_encoding(
            shape[1], inputs.shape[-1], start_index, self._max_wavelength
        )
        return ops.broadcast_to(ops.cast(encoding, self.compute_dtype), shape)

    def compute_output_spec(self, inputs, start_index=0):
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config["max_wavelength"] = self._max_wavelength
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionEmbedding(keras.layers.Layer):
    """Learned position embeddings, the alternative of Table 3 row (E).

    Args:
        max_length: Number of positions with an embedding; longer inputs raise.
        initializer: Initializer of the (max_length, d_model) matrix.
        **kwargs: Base layer arguments.

    Call arguments:
        inputs: (batch, T, d_model) embeddings; only the shape is used.
        start_index: Position of `inputs[:, 0]`.

    Returns:
        (batch, T, d_model) position embeddings in the compute dtype, carrying
        the Keras mask of `inputs`, if any.
    """

    def __init__(self, max_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        # As SinusoidalPositionEncoding: the output carries the mask of `inputs`.
        self.supports_masking = True
        self._max_length = check_positive_int("max_length", max_length)
        self._initializer = keras.initializers.get(initializer)

    @property
    def max_length(self):
        return self._max_length

    def build(self, inputs_shape):
        self.position_embeddings = self.add_weight(
            shape=(self._max_length, inputs_shape[-1]),
            initializer=self._initializer,
            name="position_embeddings",
        )
        self.built = True

    def call(self, inputs, start_index=0):
        length = inputs.shape[1]
        if isinstance(length, int) and isinstance(start_index, int) and (
            start_index + length > self._max_length
        ):
            raise ValueError(
                f"Sequence of length {length} starting at position {start_index} is "
                f"longer than max_length={self._max_length} of the learned position "
                "embeddings: truncate the input or build the model with a larger "
                "max_length."
            )
        shape = ops.shape(inputs)
        embeddings = ops.slice(
            ops.cast(self.position_embeddings, self.compute_dtype),
            (start_index, 0),
            (shape[1], shape[2]),
        )
        return ops.broadcast_to(embeddings, shape)

    def compute_output_spec(self, inputs, start_index=0):
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_length": self._max_length,
                "initializer": keras.initializers.serialize(self._initializer),
            }
        )
        return config
