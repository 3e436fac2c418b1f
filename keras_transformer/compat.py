"""What the project uses of its dependencies beyond their stable public API, in one place (no
paper section).

Each entry says what it reaches for, why no public API serves, and the versions it is tested
on; `tests/test_compat.py` fails when a release changes what it relies on.

- `torch_trace`: `torch.jit.trace`, public but deprecated since torch 2.10 in favour of
  `torch.compile`, which the PyTorch search loops use (`keras_transformer.inference.compiled`):
  eager decoding runs several times slower and `torch.compile` takes minutes to start
  (docs/performance.md, "Decoding under PyTorch: traced loops"). Tested with torch 2.13.0.

- `jax_variable_values`, `refill_jax_variables`: a Keras variable's `_value`, which Keras's
  JAX trainer empties while `fit`, `evaluate` or `predict` runs and fills again when it ends
  (`keras_transformer.id_checks.variables_kept_on_error` puts back what an error before the
  first step left empty; Keras offers no public way to tell an emptied variable). Tested with
  keras 3.15.1 and 3.14.0.
- `name_sentencepiece_resource`: keras-hub's `SentencePieceTokenizer._sentence_piece`, a
  tf-text `SentencepieceTokenizer`, and tf-text's `_SentencepieceModelResource` (its `_model`,
  `_name` and `_create_resource`), to give the model resource a name of its content: unnamed,
  a loaded SavedModel with a source and a target tokenizer made them one
  (`keras_transformer.tokenizers`). Tested with keras-hub 0.32.0 and tensorflow-text 2.21.1.
- `neutral_config`: the module names Keras writes for its optimizers into a saved compile
  config: under PyTorch its backend's own `keras.src.backend.torch.optimizers...`, which
  `Transformer.compile_from_config` reads as `keras.optimizers` (no public API names a class
  by the backend that loads it). `tests/test_model.py` checks a file written so on every
  backend. Tested with keras 3.15.1.

The program's own such use (argparse's list of actions) is `keras_transformer_app.compat`.
"""


def torch_trace(function, inputs):
    """`torch.jit.trace(function, inputs)` without a check run and without its warnings:
    the tracer's, that Python numbers become constants (Keras converts them to tensors
    inside a loop; they are constants), and torch's deprecation of `torch.jit.trace`."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", "`torch.jit.trace` is deprecated", DeprecationWarning)
        return torch.jit.trace(function, inputs, check_trace=False)



def jax_variable_values(variables):
    """`[(variable, value)]`: each Keras variable with the value it holds now (under JAX,
    an immutable array: no copy), or None where Keras's trainer has emptied it."""
    return [(variable, variable._value) for variable in variables]


def refill_jax_variables(values):
    """Puts back the value of each variable of `jax_variable_values` that is empty now."""
    for variable, value in values:
        if variable._value is None:
            variable._value = value


def name_sentencepiece_resource(layer):
    """Names the tf-text model resource of keras-hub's SentencePiece `layer` by its
    sha256, so that two tokenizers' resources in one SavedModel stay two."""
    import hashlib

    from tensorflow_text.python.ops import sentencepiece_tokenizer as tf_text

    class ContentNamedResource(tf_text._SentencepieceModelResource):
        def _create_resource(self):
            name = "sentencepiece_" + hashlib.sha256(self._model).hexdigest()
            return tf_text.gen_sentencepiece_tokenizer.sentencepiece_op(
                model=self._model, shared_name=name)

    unnamed = layer._sentence_piece._model_resource
    layer._sentence_piece._model_resource = ContentNamedResource(unnamed._model, unnamed._name)


def neutral_config(config):
    """`config` (a compile config, or any part of one) with each object of a backend's
    own module named by its public one: under PyTorch, Keras serializes its `Adam` as
    `keras.src.backend.torch.optimizers.torch_adam.Adam`, a class that a JAX or
    TensorFlow process would rebuild as it is, and whose `fit` then fails. As
    `keras.optimizers.Adam` it is rebuilt as each backend's own (a LossScaleOptimizer's
    inner optimizer included)."""
    import keras

    if isinstance(config, list):
        return [neutral_config(item) for item in config]
    if not isinstance(config, dict):
        return config
    config = {key: neutral_config(value) for key, value in config.items()}
    module, name = config.get("module"), config.get("class_name")
    if (isinstance(module, str) and module.startswith("keras.src.backend.")
            and ".optimizers." in module and hasattr(keras.optimizers, str(name))):
        config.update(module="keras.optimizers", registered_name=None)
    return config

