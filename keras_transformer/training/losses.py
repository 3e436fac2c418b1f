"""§5.4 Regularization: label smoothing, and the masked metrics used in training.

With label smoothing ε_ls the target distribution puts 1 - ε_ls on the reference
token and spreads ε_ls uniformly over the K vocabulary entries:

    q'(k) = (1 - ε_ls) · δ(k, y) + ε_ls / K
    loss  = -Σ_k q'(k) log p(k) = -(1 - ε_ls) log p(y) - (ε_ls / K) Σ_k log p(k)

Padding positions (target id `pad_id`) contribute nothing; the loss is the mean
over the real target tokens of the batch.

With log p(k) = z_k - lse(z) for the logits z, the loss is one pass over them,

    loss = lse(z) - (1 - ε_ls) z_y - ε_ls mean_k(z_k),   ∂loss/∂z = softmax(z) - q',

which the fused form (`fused=True`) computes without a (batch, T, vocab) tensor of
log-probabilities, and differentiates by the formula (`keras.ops.custom_gradient`)
instead of through a log-softmax. The default is the log-softmax written out, the
reference the fused form is tested against. Which of the two trains the Multi30k
recipe's model faster on a 2-core CPU depends on the backend and the CPU
(`benchmarks/cpu_step.py`, docs/performance.md): under eager PyTorch the fused form's
extra element-wise passes cost more than the tensor they save. On a GPU the fused form is
measured by `benchmarks/gpu_all.sh`.
"""

import keras
from keras import ops

from keras_transformer.backend import global_sum
from keras_transformer.validation import check_positive_int


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against label-smoothed targets, ignoring padding.

    Args:
        label_smoothing: ε_ls in [0, 1) (0.1 in the paper); 0 gives the plain
            sparse categorical cross-entropy.
        pad_id: Target id that marks padding.
        fused: Compute it in one pass over the logits with the gradient written
            out (see the module); False (the default) takes the log-softmax. The
            same values and gradients to float32 round-off.
        chunk_size: Positions scored at a time when a `Transformer` trains with
            this loss: the model then hands it the decoder's states, and the
            projection and the loss run chunk by chunk, so the (tokens × vocab)
            logits never exist whole (`keras_transformer.chunked_loss`).
            None (the default): the model gives logits. A call on logits
            computes as without it.
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

    def __init__(self, label_smoothing=0.1, pad_id=0, fused=False, chunk_size=None,
                 name="label_smoothed_cross_entropy"):
        super().__init__(name=name, dtype="float32")
        if not 0 <= label_smoothing < 1:
            raise ValueError(
                f"label_smoothing={label_smoothing!r} must be in [0, 1)."
            )
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id
        self.fused = bool(fused)
        if chunk_size is not None:
            chunk_size = check_positive_int("chunk_size", chunk_size)
        self.chunk_size = chunk_size

    def call(self, y_true, y_pred):
        """Per-token losses, (batch, T) float32, zero at padding positions."""
        y_true = ops.cast(y_true, "int32")
        if self.fused:
            losses = smoothed_cross_entropy(y_true, y_pred, self.label_smoothing)
            return ops.where(ops.not_equal(y_true, self.pad_id), losses, 0.0)
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
        weights, token_count = self.position_weights(y_true, sample_weight)
        return ops.divide_no_nan(ops.sum(losses * weights), token_count)

    def position_weights(self, y_true, sample_weight=None):
        """Each position's weight in the loss, (batch, T) float32 (0 at padding, the
        sample's weight elsewhere), and the count of non-padding tokens the loss's sum
        is divided by: those of the whole global batch, since under a TF
        MirroredStrategy each replica sees a slice and the replicas' gradients are
        summed."""
        weights = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), self.pad_id), "float32")
        token_count = global_sum(ops.sum(weights))
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            if len(sample_weight.shape) == 1:
                sample_weight = sample_weight[:, None]
            weights = weights * sample_weight
        return weights, token_count

    def get_config(self):
        return {
            "label_smoothing": self.label_smoothing,
            "pad_id": self.pad_id,
            "fused": self.fused,
            "chunk_size": self.chunk_size,
            "name": self.name,
        }


def smoothed_cross_entropy(labels, logits, label_smoothing):
    """The label-smoothed cross-entropy of every position in one pass over the logits,
    with its gradient written out (the module's formulas).

    Args:
        labels: (batch, T) int32 target ids.
        logits: (batch, T, vocab), any float dtype (float16 and bfloat16 are
            computed in float32; the gradient comes back in the logits' dtype).
        label_smoothing: ε_ls.

    Returns:
        (batch, T) float32 losses, padding included.
    """
    eps = float(label_smoothing)

    @ops.custom_gradient
    def losses_of(logits):
        z = ops.cast(logits, "float32")
        vocab = ops.shape(z)[-1]
        lse = ops.logsumexp(z, axis=-1)
        label_logit = ops.squeeze(ops.take_along_axis(z, labels[..., None], axis=-1), -1)
        losses = lse - (1.0 - eps) * label_logit
        if eps:
            losses = losses - eps * ops.mean(z, axis=-1)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            target = (1.0 - eps) * ops.one_hot(labels, vocab, dtype="float32")
            if eps:
                target = target + eps / ops.cast(vocab, "float32")
            softmax = ops.exp(z - lse[..., None])
            return ops.cast((softmax - target) * upstream[..., None], logits.dtype)

        return losses, grad

    return losses_of(logits)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedTokenAccuracy(keras.metrics.Mean):
    """Fraction of non-padding target tokens whose argmax prediction is right.

    `y_pred` is (batch, T, vocab) logits, or the (batch, T) predicted ids
    themselves (what a chunked loss gives: `LabelSmoothedCrossEntropy`'s
    `chunk_size`).

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
        if len(y_pred.shape) > len(y_true.shape):
            y_pred = ops.argmax(y_pred, axis=-1)
        predictions = ops.cast(y_pred, "int32")
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
