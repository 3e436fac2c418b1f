"""§3.3 Position-wise Feed-Forward Networks.

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                                    (2)

The same two linear transformations are applied at every position; the inner
width is d_ff (2048 in the base model).
"""

import keras

from keras_transformer import backend
from keras_transformer.validation import check_positive_int, check_rate


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """Two linear maps with a ReLU between them, applied at every position (eq. 2).

    Args:
        d_ff: Inner width (2048 for the base model, 4096 for big).
        output_dim: Width of the output; defaults to the input's last dimension
            (d_model).
        activation: Inner activation; the paper uses "relu".
        activation_dropout_rate: Dropout on the inner activations (not in the
            paper; default 0).
        kernel_initializer: Initializer of both kernels.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: (batch, T, d_model) float tensor.
        training: Whether dropout is active.

    Returns:
        (batch, T, output_dim) tensor.

    Example:

    >>> ffn = PositionwiseFeedForward(d_ff=32)
    >>> tuple(ffn(keras.ops.ones((2, 3, 8))).shape)
    (2, 3, 8)
    """

    def __init__(
        self,
        d_ff,
        output_dim=None,
        activation="relu",
        activation_dropout_rate=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._d_ff = check_positive_int("d_ff", d_ff)
        self._output_dim = None if output_dim is None else check_positive_int(
            "output_dim", output_dim, "pass None for the input's width"
        )
        self._activation = keras.activations.get(activation)
        self._activation_dropout_rate = check_rate(
            "activation_dropout_rate", activation_dropout_rate
        )
        self._kernel_initializer = keras.initializers.get(kernel_initializer)

    @property
    def d_ff(self):
        return self._d_ff

    def build(self, inputs_shape):
        output_dim = self._output_dim or inputs_shape[-1]
        self.inner_dense = keras.layers.Dense(
            self._d_ff,
            activation=self._activation,
            kernel_initializer=self._kernel_initializer.__class__.from_config(
                self._kernel_initializer.get_config()
            ),
            dtype=self.dtype_policy,
            name="inner_dense",
        )
        self.inner_dense.build(inputs_shape)
        self.activation_dropout = keras.layers.Dropout(
            self._activation_dropout_rate, dtype=self.dtype_policy, name="activation_dropout"
        )
        self.output_dense = keras.layers.Dense(
            output_dim,
            kernel_initializer=self._kernel_initializer.__class__.from_config(
                self._kernel_initializer.get_config()
            ),
            dtype=self.dtype_policy,
            name="output_dense",
        )
        self.output_dense.build((*inputs_shape[:-1], self._d_ff))
        self.built = True

    def call(self, inputs, training=None):
        hidden = backend.call_part(self.inner_dense, inputs)
        if self._activation_dropout_rate:
            hidden = backend.call_part(self.activation_dropout, hidden, training=training)
        return backend.call_part(self.output_dense, hidden)

    def compute_output_spec(self, inputs, training=None):
        # Stated rather than traced: the torch backend traces the sublayers in
        # float32 under a mixed policy, where eager calls return the compute dtype.
        output_dim = self._output_dim or inputs.shape[-1]
        return keras.KerasTensor((*inputs.shape[:-1], output_dim), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_ff": self._d_ff,
                "output_dim": self._output_dim,
                "activation": keras.activations.serialize(self._activation),
                "activation_dropout_rate": self._activation_dropout_rate,
                "kernel_initializer": keras.initializers.serialize(self._kernel_initializer),
            }
        )
        return config
