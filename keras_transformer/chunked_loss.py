"""§3.4 the pre-softmax projection and §5.4 the label-smoothed loss, in chunks of positions.

A training step's logits are (tokens × vocabulary) float32: at the paper's 37,000
subwords and 4,096 tokens a side, 0.6 GB, and the step holds several such tensors (the
log-probabilities, their gradient, the logits' gradient). Here the decoder's last states
h (N positions × d_model) are projected and scored `chunk_size` positions at a time; each
chunk's gradient is made at once, by the formula of `keras_transformer.training.losses`,

    ∂loss/∂z = w · (softmax(z) - q'),   ∂loss/∂h = ∂loss/∂z · Wᵀ,   ∂loss/∂W = hᵀ · ∂loss/∂z,

and folded into the (N × d_model) and (d_model × vocabulary) gradients before the next
chunk is scored. So no more than one chunk's logits exists at a time, and the backward pass
only scales what the forward pass made: the step does the projection's three products
once each, as the unchunked step does. A step whose positions fit in one chunk (a number
known when it is traced) skips the loop and its gradient bookkeeping: it is scored as a
whole and differentiated by the backend. The loss is the weighted sum over positions (the
weights carry padding and sample weights; the caller divides by the token count), so its
upstream gradient is one scalar.

`ChunkedLossModel` trains a model this way under `fit` and `evaluate`: compiled with a
`LabelSmoothedCrossEntropy(chunk_size=...)`, the model's train and test steps take its
decoder states instead of logits, and the token accuracy is counted from each chunk's
argmax. Calls, `predict` and decoding still give logits.
"""

import contextlib

from keras import ops


def projected_loss(hidden, kernel, bias, labels, weights, label_smoothing, chunk_size,
                   with_gradient=True):
    """The label-smoothed cross-entropy of the projected states, chunk by chunk.

    Args:
        hidden: (N, d_model) states in the compute dtype.
        kernel: (d_model, vocab) projection in the compute dtype.
        bias: (vocab,) float32 bias added to the float32 logits, or None.
        labels: (N,) int32 target ids.
        weights: (N,) float32 weight of each position's loss (0 at padding).
        label_smoothing: ε_ls.
        chunk_size: Most positions scored at a time. Where N is known when the
            step is traced, the N positions are cut into ceil(N / chunk_size)
            chunks of about equal size (padding less than one position a chunk);
            N ≤ chunk_size is one chunk, scored without the loop and
            differentiated by the backend.
        with_gradient: Make the gradients in the forward pass (for training);
            False scores only (for evaluation).

    Returns:
        The float32 scalar Σ_n weights_n · loss_n, and the (N,) int32 argmax ids.
    """
    eps = float(label_smoothing)
    labels = ops.cast(labels, "int32")
    weights = ops.cast(weights, "float32")
    count = ops.shape(hidden)[0]
    if isinstance(count, int) and count <= chunk_size:
        # One chunk is the whole: scored without the loop, differentiated as usual.
        losses, _, ids = _scored(hidden, kernel, bias, labels, eps)
        return ops.sum(losses * weights), ops.stop_gradient(ids)
    if isinstance(count, int):  # a static shape: as many chunks, of about equal size
        chunk_size = -(-count // max(1, -(-count // chunk_size)))
    pad = (-count) % chunk_size
    h_chunks, y_chunks, w_chunks = _chunked(labels, weights, pad, chunk_size)

    def forward(hidden, kernel, *bias):
        vocab = ops.shape(kernel)[1]
        hidden_chunks = h_chunks(hidden)
        flat_kernel = ops.transpose(kernel) if with_gradient else None

        def chunk(i, carry):
            h, y, w = hidden_chunks[i], y_chunks[i], w_chunks[i]
            losses, log_probs, ids = _scored(h, kernel, bias[0] if bias else None, y, eps)
            carry = {**carry, "total": carry["total"] + ops.sum(losses * w),
                     "ids": ops.slice_update(carry["ids"], (i, 0), ids[None])}
            if not with_gradient:
                return carry
            return _add_gradients(carry, i, h, y, w, ops.exp(log_probs), flat_kernel)

        carry = ops.fori_loop(0, ops.shape(y_chunks)[0], chunk,
                              _initial_carry(hidden_chunks, y_chunks, kernel, with_gradient))
        predictions = ops.reshape(carry["ids"], (-1,))[:count]
        # One output (PyTorch's custom gradients take one): the sum, then the ids.
        result = ops.concatenate([carry["total"][None], ops.cast(predictions, "float32")])
        if not with_gradient:
            return result
        gradients = _gradients(carry, count, kernel, eps, vocab, ops.sum(weights), labels,
                               weights)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            scale = upstream[0]
            d_hidden, d_kernel, d_bias = gradients
            return (d_hidden * ops.cast(scale, d_hidden.dtype),
                    ops.cast(d_kernel * scale, kernel.dtype),
                    *[ops.cast(d_bias * scale, "float32") for _ in bias])

        return result, grad

    hidden, kernel = ops.convert_to_tensor(hidden), ops.convert_to_tensor(kernel)
    bias = () if bias is None else (ops.convert_to_tensor(bias),)
    scored = (ops.custom_gradient(forward) if with_gradient else forward)(hidden, kernel, *bias)
    # Ids below 2^24 are exact in float32.
    return scored[0], ops.cast(ops.stop_gradient(scored[1:]), "int32")


def _scored(hidden, kernel, bias, labels, eps):
    """Each position's label-smoothed cross-entropy (float32), the log-probabilities
    it came from and the argmax ids (int32) of the projected states."""
    z = ops.cast(ops.matmul(hidden, kernel), "float32")
    if bias is not None:
        z = z + bias
    log_probs = ops.log_softmax(z, axis=-1)
    losses = -(1.0 - eps) * ops.squeeze(
        ops.take_along_axis(log_probs, labels[:, None], axis=-1), -1)
    if eps:
        losses = losses - eps * ops.mean(log_probs, axis=-1)
    return losses, log_probs, ops.cast(ops.argmax(z, axis=-1), "int32")


def _initial_carry(hidden_chunks, y_chunks, kernel, with_gradient):
    """The loop's sums at zero: the loss and the ids, and with the gradient its parts."""
    carry = {"total": ops.zeros((), "float32"), "ids": ops.zeros(ops.shape(y_chunks), "int32")}
    if with_gradient:
        d_model, vocab = ops.shape(kernel)
        carry.update(d_hidden=ops.zeros(ops.shape(hidden_chunks), hidden_chunks.dtype),
                     d_kernel=ops.zeros(ops.shape(kernel), "float32"),
                     d_label_rows=ops.zeros((vocab, d_model), "float32"),
                     weighted_hidden=ops.zeros((d_model,), "float32"),
                     d_bias=ops.zeros((vocab,), "float32"))
    return carry


def _add_gradients(carry, i, h, y, w, probs, flat_kernel):
    """A chunk's part of the gradients that needs its (chunk × vocab) probabilities.

    With dz = w · (p - ε/V - (1 - ε)·onehot(y)), only p is a full (chunk × vocab)
    term: the rows' weights scale the (chunk × d_model) products instead, and the
    uniform and label terms are low-rank (`_gradients` adds them)."""
    compute_dtype = flat_kernel.dtype
    probs_compute = ops.cast(probs, compute_dtype)
    d_h = ops.matmul(probs_compute, flat_kernel) * ops.cast(w[:, None], compute_dtype)
    weighted = ops.cast(h, "float32") * w[:, None]
    return {**carry,
            "d_hidden": ops.slice_update(carry["d_hidden"], (i, 0, 0), d_h[None]),
            "d_kernel": carry["d_kernel"] + ops.cast(
                ops.matmul(ops.transpose(ops.cast(weighted, compute_dtype)), probs_compute),
                "float32"),
            "d_label_rows": carry["d_label_rows"] + ops.segment_sum(
                weighted, y, num_segments=ops.shape(probs)[1]),
            "weighted_hidden": carry["weighted_hidden"] + ops.sum(weighted, axis=0),
            "d_bias": carry["d_bias"] + ops.matmul(w[None], probs)[0]}


def _gradients(carry, count, kernel, eps, vocab, weight_sum, labels, weights):
    """∂(Σ w·loss) with respect to the states, the kernel and the bias, from the chunks'
    sums and the low-rank terms: -ε/V·w for every entry, -(1 - ε)·w at the label."""
    flat_kernel = ops.cast(ops.transpose(kernel), "float32")
    uniform = eps / ops.cast(vocab, "float32")
    d_model = ops.shape(kernel)[0]
    d_hidden = ops.reshape(carry["d_hidden"], (-1, d_model))[:count]
    label_rows = ops.take(flat_kernel, labels, axis=0)
    d_hidden = d_hidden - ops.cast(
        weights[:, None] * ((1.0 - eps) * label_rows
                            + uniform * ops.sum(flat_kernel, axis=0)[None]),
        d_hidden.dtype)
    d_kernel = (carry["d_kernel"] - (1.0 - eps) * ops.transpose(carry["d_label_rows"])
                - uniform * carry["weighted_hidden"][:, None])
    d_bias = (carry["d_bias"] - uniform * weight_sum
              - (1.0 - eps) * ops.segment_sum(weights, labels, num_segments=vocab))
    return d_hidden, d_kernel, d_bias


def _chunked(labels, weights, pad, chunk_size):
    """The positions padded to whole chunks (with weight 0), as (chunks, chunk_size, ...),
    and a function that does the same to the states."""
    def states(hidden):
        d_model = ops.shape(hidden)[1]
        hidden = ops.concatenate([hidden, ops.zeros((pad, d_model), hidden.dtype)])
        return ops.reshape(hidden, (-1, chunk_size, d_model))

    labels = ops.concatenate([labels, ops.zeros((pad,), "int32")])
    weights = ops.concatenate([weights, ops.zeros((pad,), "float32")])
    return (states, ops.reshape(labels, (-1, chunk_size)),
            ops.reshape(weights, (-1, chunk_size)))


class ChunkedLossModel:
    """Mixin of a `keras.Model` whose loss takes its decoder states in `fit` and `evaluate`.

    Compiled with a `LabelSmoothedCrossEntropy` that has a `chunk_size`, the model's
    train and test steps run its `call` with `states_for_loss()` true, and the call
    returns the states the projection would take instead of logits; the loss projects
    them with the model's `output_projection_weights()` in chunks (`projected_loss`),
    and the compiled metrics get the argmax ids (`MaskedTokenAccuracy` takes ids).
    The steps are Keras's own: the mixin overrides only the public `train_step`,
    `test_step`, `compute_loss` and `compute_metrics` around them.
    """

    def states_for_loss(self):
        """Whether a train or test step of a chunked loss is running (the model's call
        then returns the states the projection would take)."""
        return bool(self._steps_on_states())

    def _steps_on_states(self):
        """The steps of a chunked loss running now, one entry each: a list, not a flag,
        as a `MirroredStrategy` traces its replicas' steps in threads of their own at
        the same time (appending and popping are atomic). Kept in the instance's
        `__dict__`, out of Keras's attribute tracking."""
        return self.__dict__.setdefault("_chunked_loss_steps", [])

    def loss_chunk_size(self):
        """The compiled loss's `chunk_size`, or None."""
        return getattr(getattr(self, "loss", None), "chunk_size", None)

    @contextlib.contextmanager
    def _step_on_states(self):
        if not self.loss_chunk_size():
            yield
            return
        steps = self._steps_on_states()
        steps.append(None)
        try:
            yield
        finally:
            steps.pop()

    def train_step(self, *args, **kwargs):
        with self._step_on_states():
            return super().train_step(*args, **kwargs)

    def test_step(self, *args, **kwargs):
        with self._step_on_states():
            return super().test_step(*args, **kwargs)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if not self.states_for_loss():
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        loss = self.loss
        labels = ops.cast(y, "int32")
        weights, token_count = loss.position_weights(labels, sample_weight)
        kernel, bias = self.output_projection_weights()
        d_model = ops.shape(y_pred)[-1]
        total, predictions = projected_loss(
            ops.reshape(y_pred, (-1, d_model)), kernel, bias, ops.reshape(labels, (-1,)),
            ops.reshape(weights, (-1,)), loss.label_smoothing, loss.chunk_size,
            with_gradient=bool(training))
        super().compute_metrics(x, y, ops.reshape(predictions, ops.shape(labels)),
                                sample_weight)
        value = ops.divide_no_nan(total, token_count)
        for extra in self.losses:
            value = value + ops.sum(ops.cast(extra, "float32"))
        return value

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if not self.states_for_loss():
            return super().compute_metrics(x, y, y_pred, sample_weight)
        return self.get_metrics_result()  # updated by compute_loss, from the ids
