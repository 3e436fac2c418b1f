"""One test helper for every layer: `run_layer_test`.

It checks what every layer of the package must do (after the keras and
keras-hub test helpers): build and call eagerly, call on symbolic inputs,
serialize → rebuild → give the same output, train for one `fit` step, and run
under the mixed_float16 and mixed_bfloat16 policies with float32 variables.
"""

import keras
import numpy as np
from keras import ops

PRECISION_POLICIES = ("mixed_float16", "mixed_bfloat16")


def to_numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def run_layer_test(
    layer_cls,
    init_kwargs,
    inputs,
    expected_output_shape,
    call_kwargs=None,
    run_training=True,
    run_mixed_precision=True,
):
    """Runs the common layer checks.

    Args:
        layer_cls: The layer class.
        init_kwargs: Constructor arguments.
        inputs: Dict of call-argument name → NumPy array; the first item is the
            first positional argument. Float arrays become model inputs in the
            symbolic and training checks, as do int arrays.
        expected_output_shape: Shape of the (first) output.
        call_kwargs: Non-tensor call arguments (e.g. `use_causal_mask=True`).
        run_training: Whether to run one `fit` step and check the weights move.
        run_mixed_precision: Whether to check the mixed-precision policies.
    """
    call_kwargs = call_kwargs or {}
    names = list(inputs)

    def call(layer, tensors, **extra):
        return layer(tensors[names[0]], **{n: tensors[n] for n in names[1:]},
                     **call_kwargs, **extra)

    # Eager call.
    layer = layer_cls(**init_kwargs)
    outputs = call(layer, inputs)
    first = outputs[0] if isinstance(outputs, tuple) else outputs
    assert tuple(first.shape) == tuple(expected_output_shape)
    assert np.all(np.isfinite(to_numpy(first)))

    # Config round trip, and a rebuilt layer with the same weights gives the same output.
    config = layer.get_config()
    assert layer_cls.from_config(config).get_config() == config
    revived = keras.layers.deserialize(keras.layers.serialize(layer))
    call(revived, inputs)
    revived.set_weights(layer.get_weights())
    revived_outputs = call(revived, inputs)
    revived_first = revived_outputs[0] if isinstance(revived_outputs, tuple) else revived_outputs
    np.testing.assert_allclose(to_numpy(revived_first), to_numpy(first), atol=1e-6)

    # Symbolic call: the output shape is inferred from keras.Input.
    symbolic = {
        name: keras.Input(shape=array.shape[1:], dtype=str(array.dtype), name=name)
        for name, array in inputs.items()
    }
    symbolic_outputs = call(layer_cls(**init_kwargs), symbolic)
    symbolic_first = (
        symbolic_outputs[0] if isinstance(symbolic_outputs, tuple) else symbolic_outputs
    )
    assert tuple(symbolic_first.shape[1:]) == tuple(expected_output_shape[1:])

    if run_training:
        trainable = layer_cls(**init_kwargs)
        model_inputs = {
            name: keras.Input(shape=array.shape[1:], dtype=str(array.dtype), name=name)
            for name, array in inputs.items()
        }
        model_outputs = call(trainable, model_inputs)
        if isinstance(model_outputs, tuple):
            model_outputs = model_outputs[0]
        model = keras.Model(model_inputs, model_outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        before = [to_numpy(w).copy() for w in trainable.trainable_weights]
        target = np.random.default_rng(0).normal(size=expected_output_shape)
        history = model.fit(inputs, target.astype("float32"), epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        after = [to_numpy(w) for w in trainable.trainable_weights]
        assert any(not np.allclose(b, a) for b, a in zip(before, after)), (
            "one fit step changed no weight"
        )

    if run_mixed_precision:
        for policy in PRECISION_POLICIES:
            mixed = layer_cls(**init_kwargs, dtype=policy)
            mixed_outputs = call(mixed, inputs)
            mixed_first = mixed_outputs[0] if isinstance(mixed_outputs, tuple) else mixed_outputs
            assert keras.backend.standardize_dtype(mixed_first.dtype) in (
                mixed.compute_dtype, "float32"
            )
            assert np.all(np.isfinite(to_numpy(mixed_first)))
            for weight in mixed.weights:
                assert keras.backend.standardize_dtype(weight.dtype) == "float32"
    return layer, outputs


class CharTokenizer:
    """A character tokenizer over "abcdefgh " with the tokenizer protocol of
    keras_transformer.inference (pad 0, begin 1, end 2), for decoding tests."""

    pad_id, bos_id, eos_id = 0, 1, 2
    alphabet = "abcdefgh "
    vocab_size = 3 + len(alphabet)

    def tokenize(self, texts):
        return [[3 + self.alphabet.index(c) for c in text] for text in texts]

    def detokenize(self, id_lists):
        return ["".join(self.alphabet[i - 3] for i in ids if i >= 3) for ids in id_lists]
