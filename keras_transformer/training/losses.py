"""§5.4 Regularization: label smoothing, and the masked metrics used in training.

With label smoothing ε_ls the target distribution puts 1 - ε_ls on the reference
token and spreads ε_ls uniformly over the K vocabulary entries:

    q'(k) = (1 - ε_ls) · δ(k, y) + ε_ls / K
    loss  = -Σ_k q'(k) log p(k) = -(1 - ε_ls) log p(y) - (ε_ls / K) Σ_k log p(k)

Padding positions (target id `pad_id`) contribute nothing; the loss is the mean
over the real target tokens of the batch.
"""

import keras
from keras import ops

from keras_transformer.backend import global_sum


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against label-smoothed targets, ignoring padding.

    Args:
        label_smoothing: ε_ls in [0, 1) (0.1 in the paper); 0 gives the plain
            sparse categorical cross-entropy.
        pad_id: Target id that marks padding.
        name: Loss name.

    Call arguments:
        y_true: (batch, T) int target ids.
        y_pred: (batch, T, vocab) logits.
        sample_weight: Optional (batch,) or (batch, T) weights.

    Returns:
        The weighted mean of the per-token losses over non-padding tokens, a
        float32 scalar.

    Example:

    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    >>> value = loss(keras.ops.array([[1, 2, 0]]), keras.ops.zeros((1, 3, 5)))
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy"):
        super().__init__(name=name, dtype="float32")
        if not 0 <= label_smoothing < 1:
            raise ValueError(
                f"label_smoothing={label_smoothing!r} must be in [0, 1)."
            )
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        """Per-token losses, (batch, T) float32, zero at padding positions."""
        y_true = ops.cast(y_true, "int32")
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
        true_log_probs = ops.squeeze(
            ops.take_along_axis(log_probs, y_true[..., None], axis=-1), axis=-1
        )
        eps = self.label_smoothing
        losses = -(1.0 - eps) * true_log_probs
        if eps:
            losses = losses - eps * ops.mean(log_probs, axis=-1)
        return ops.where(ops.not_equal(y_true, self.pad_id), losses, 0.0)

    def __call__(self, y_true, y_pred, sample_weight=None):
        losses = self.call(y_true, y_pred)
        weights = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        # The tokens of the whole global batch: under a TF MirroredStrategy each
        # replica sees a slice, and the replicas' gradients are summed.
        token_count = global_sum(ops.sum(weights))
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            if len(sample_weight.shape) == 1:
                sample_weight = sample_weight[:, None]
            weights = weights * sample_weight
        return ops.divide_no_nan(ops.sum(losses * weights), token_count)

    def get_config(self):
        return {
            "label_smoothing": self.label_smoothing,
            "pad_id": self.pad_id,
            "name": self.name,
        }


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedTokenAccuracy(keras.metrics.Mean):
    """Fraction of non-padding target tokens whose argmax prediction is right.

    Args:
        pad_id: Target id that marks padding.
        name: Metric name.

    Example:

    >>> metric = MaskedTokenAccuracy()
    >>> metric.update_state(keras.ops.array([[1, 0]]),
    ...                     keras.ops.array([[[0.0, 1.0], [1.0, 0.0]]]))
    >>> float(metric.result())
    1.0
    """

    def __init__(self, pad_id=0, name="token_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.pad_id = pad_id

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        predictions = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        matches = ops.cast(ops.equal(predictions, y_true), self.dtype)
        weights = ops.cast(ops.not_equal(y_true, self.pad_id), self.dtype)
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, self.dtype)
            if len(sample_weight.shape) == 1:
                sample_weight = sample_weight[:, None]
            weights = weights * sample_weight
        return super().update_state(matches, sample_weight=weights)

    def get_config(self):
        config = super().get_config()
        config["pad_id"] = self.pad_id
        return config
