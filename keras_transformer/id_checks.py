"""The Transformer's input ids (§3.1), checked where they enter: calls, fit, evaluate, predict.

Inside a compiled step an id outside the vocabulary cannot raise: JAX reads a
NaN row (or, for -1, the last one) and XLA clamps it, so a corpus tokenized
with another vocabulary would train silently on garbage. The model therefore
checks its ids where they enter: NumPy inputs and labels at once
(`check_numpy_ids`, `checked_data`), and every batch of a `tf.data.Dataset`
by a map whose assertion stops the run before that batch's update
(`checked_dataset`), its TensorFlow error turned into a plain ValueError
(`id_errors_explained`). Under JAX an error before the first step has
finished would leave the model's variables empty; `variables_kept_on_error`
puts them back.
"""

import keras
import numpy as np

from keras_transformer import compat


def check_numpy_ids(ids, name, vocab_size):
    """Raises a ValueError for NumPy `ids` that are not integers or lie
    outside `0 <= id < vocab_size`; anything else (tensors, None) passes."""
    if not isinstance(ids, np.ndarray) or not ids.size:
        return
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} ids must be integers, got dtype {ids.dtype}.")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(
            f"{name} holds ids from {ids.min()} to {ids.max()}, outside the vocabulary "
            f"(0 <= id < {vocab_size}): tokenize with the model's tokenizer."
        )


def as_id_matrix(values, name, vocab_size):
    """`values` as a (batch, length) int32 NumPy matrix of ids below
    `vocab_size`: a NumPy array, a nested list or a tensor. Raises a
    ValueError that says what is wrong (a ragged list, one sentence without
    its batch axis, floats, an id outside the vocabulary)."""
    if isinstance(values, (list, tuple)):
        try:
            values = np.asarray(values)
        except ValueError:
            raise ValueError(
                f"{name} is a ragged list; it must be a (batch, length) matrix of int "
                "ids: pad the rows with the padding id first."
            ) from None
    elif not isinstance(values, np.ndarray):
        values = keras.ops.convert_to_numpy(values)
    if values.ndim == 1:
        raise ValueError(
            f"{name} must be a (batch, length) matrix of int ids, got shape "
            f"{values.shape}: add a batch axis for one sentence (ids[None, :])."
        )
    if values.ndim != 2 or not (np.issubdtype(values.dtype, np.integer) or values.size == 0):
        raise ValueError(
            f"{name} must be a (batch, length) matrix of int ids, got shape "
            f"{values.shape} and dtype {values.dtype}."
        )
    check_numpy_ids(values, name, vocab_size)
    return values.astype("int32")


def checked_data(x, y, sizes):
    """`(x, y)` for `fit`, `evaluate` or `predict`, their ids checked against
    `sizes` ({"source", "target", "labels": vocabulary size}): NumPy ids at
    once, a `tf.data.Dataset` batch by batch (`checked_dataset`)."""
    if is_tf_dataset(x):
        return checked_dataset(x, sizes), y
    if isinstance(x, dict):
        for key in ("source", "target"):
            check_numpy_ids(x.get(key), key, sizes[key])
    elif isinstance(x, (list, tuple)) and len(x) == 2:
        for key, ids in zip(("source", "target"), x):
            check_numpy_ids(ids, key, sizes[key])
    check_numpy_ids(y, "labels", sizes["labels"])
    return x, y


def checked_validation_data(data, sizes):
    """`fit`'s `validation_data`, checked as `checked_data` checks `(x, y)`."""
    if is_tf_dataset(data):
        return checked_dataset(data, sizes)
    if isinstance(data, (list, tuple)) and len(data) >= 2:
        x, y = checked_data(data[0], data[1], sizes)
        return (x, y, *data[2:])
    return data


# Marks the assertion of `checked_dataset`, so that its TensorFlow error can be
# told apart from any other and re-raised as a plain ValueError.
_ID_CHECK = "keras_transformer id check:"


def is_tf_dataset(data):
    """Whether `data` is a `tf.data.Dataset`, without importing TensorFlow
    (tf.data is only ever imported by the caller). The model's own inputs, a dict or
    a pair, are answered without walking their class's bases, which `torch.compile`
    cannot trace."""
    if data is None or isinstance(data, (dict, list, tuple)):
        return False
    return any(cls.__module__.startswith("tensorflow") and cls.__name__ == "DatasetV2"
               for cls in type(data).__mro__)


def checked_dataset(dataset, sizes):
    """`dataset` with a check of every batch's ids against `sizes`
    (source, target, labels); elements are `inputs` or `(inputs, labels[,
    sample_weights])`, inputs a {"source", "target"} dict or a pair."""
    import tensorflow as tf

    def assertion(name, ids):
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            return None
        smallest, largest = tf.reduce_min(ids), tf.reduce_max(ids)
        in_range = tf.logical_or(tf.equal(tf.size(ids), 0), tf.logical_and(
            smallest >= 0, largest < tf.cast(sizes[name], ids.dtype)))
        return tf.debugging.Assert(in_range, [
            f"{_ID_CHECK} {name} ids must lie in 0 <= id < {sizes[name]} (the vocabulary "
            "of the model), but a batch holds ids from", smallest, "to", largest])

    def check(*element):
        inputs = element[0]
        if isinstance(inputs, dict):
            named = [(key, inputs[key]) for key in ("source", "target") if key in inputs]
        elif isinstance(inputs, (list, tuple)) and len(inputs) == 2:
            named = list(zip(("source", "target"), inputs))
        else:
            named = []
        if len(element) > 1 and not isinstance(element[1], (dict, list, tuple)):
            named.append(("labels", element[1]))
        assertions = [a for a in (assertion(n, ids) for n, ids in named) if a is not None]
        with tf.control_dependencies(assertions):
            checked = tf.nest.map_structure(tf.identity, element)
        return checked if len(element) > 1 else checked[0]

    return dataset.map(check, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class id_errors_explained:
    """Turns the TensorFlow error of a failed `checked_dataset` assertion
    into a ValueError with its message alone."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or _ID_CHECK not in str(error):
            return False
        message = str(error)
        message = message[message.index(_ID_CHECK) + len(_ID_CHECK):].split("\n")[0]
        message = message.replace("] [", " ").replace("[", "").replace("]", "").strip()
        raise ValueError(
            f"{message}. Tokenize the data with the model's tokenizer (its vocabulary "
            "must not exceed the model's vocab_size)."
        ) from None


class variables_kept_on_error:
    """Under JAX, Keras empties the model's variables while `fit`, `evaluate`
    or `predict` holds their values, and fills them again when it ends. An
    error before the first step has finished (a bad first batch) leaves them
    empty, and the model unusable. This keeps a reference to every value
    (JAX arrays are immutable: no copy) and puts back any that is missing
    after an error."""

    def __init__(self, model):
        self.model = model
        self.values = []

    def __enter__(self):
        if keras.backend.backend() == "jax" and self.model.built:
            optimizer = getattr(self.model, "optimizer", None)
            variables = list(self.model.variables) + list(self.model.metrics_variables)
            if optimizer is not None:
                if not optimizer.built:  # as Keras would, before it empties them
                    optimizer.build(self.model.trainable_variables)
                variables += list(optimizer.variables)
            self.values = compat.jax_variable_values(variables)
        return self

    def __exit__(self, kind, error, traceback):
        if error is not None:
            compat.refill_jax_variables(self.values)
        self.values = []
        return False


class IdCheckedModel:
    """The model's entry points with every id checked where it enters (a
    mixin of `keras_transformer.Transformer`, which gives `_vocab_sizes()`).

    Inside a compiled step an id outside the vocabulary cannot raise, so a
    corpus tokenized with another vocabulary would train silently on garbage.
    NumPy inputs and labels are checked at once, and every batch of a
    `tf.data.Dataset` by a map that stops `fit` with a `ValueError` naming
    the ids and the vocabulary before that batch's update.
    """

    def fit(self, x=None, y=None, *args, validation_data=None, **kwargs):
        """`keras.Model.fit`, with every id checked where it enters."""
        if is_tf_dataset(x):  # a dataset shuffles itself (Keras warns at True)
            kwargs.setdefault("shuffle", False)
        sizes = self._vocab_sizes()
        x, y = checked_data(x, y, sizes)
        if validation_data is not None:
            validation_data = checked_validation_data(validation_data, sizes)
        with id_errors_explained(), variables_kept_on_error(self):
            return super().fit(x, y, *args, validation_data=validation_data, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """`keras.Model.evaluate`, with the ids checked as in `fit`."""
        x, y = checked_data(x, y, self._vocab_sizes())
        with id_errors_explained(), variables_kept_on_error(self):
            return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        """`keras.Model.predict`, with the ids checked as in `fit`."""
        x, _ = checked_data(x, None, self._vocab_sizes())
        with id_errors_explained(), variables_kept_on_error(self):
            return super().predict(x, *args, **kwargs)

    def __call__(self, inputs, *args, **kwargs):
        # Ids given as NumPy arrays (a dict or a pair) are checked here, where
        # their values are known: inside a compiled step an id past the
        # vocabulary cannot raise (under JAX its embedding silently becomes NaN).
        checked_data(inputs, None, self._vocab_sizes())
        return super().__call__(inputs, *args, **kwargs)


def split_inputs(inputs):
    """`(source_ids, target_ids)` of the model's inputs: a {"source",
    "target"} dict or a pair."""
    if isinstance(inputs, dict):
        missing = {"source", "target"} - set(inputs)
        if missing:
            raise ValueError(
                f"Transformer inputs are missing {sorted(missing)}: pass "
                '{"source": (batch, S) ids, "target": (batch, T) ids}; '
                f"got keys {sorted(inputs)}."
            )
        return inputs["source"], inputs["target"]
    if isinstance(inputs, (list, tuple)) and len(inputs) == 2:
        return inputs
    raise ValueError(
        'Transformer expects {"source": (batch, S) ids, "target": (batch, T) ids}, '
        f"got {type(inputs).__name__}."
    )
