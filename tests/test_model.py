"""Tests of the §3.1 Transformer model: shapes, masking, sizes, saving."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import tiny_model, to_numpy

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.layers import sinusoidal_position_encoding

BACKENDS = ("tensorflow", "jax", "torch")
RNG = np.random.default_rng(0)


def batch(batch_size=2, source_length=6, target_length=5, vocab_size=20):
    source = RNG.integers(3, vocab_size, size=(batch_size, source_length)).astype("int32")
    target = RNG.integers(3, vocab_size, size=(batch_size, target_length)).astype("int32")
    source[1, 4:] = 0
    target[1, 3:] = 0
    return {"source": source, "target": target}


def logits_of(model, inputs):
    return to_numpy(model(inputs, training=False))


def step_by_step_logits(model, inputs):
    """(batch, T, vocab) logits of `inputs["target"]` decoded one position at a
    time with the cache."""
    encoded, source_mask = model.encode(inputs["source"])
    length = inputs["target"].shape[1]
    cache = model.initial_cache(encoded, max_length=length)
    steps = []
    for index in range(length):
        # The cache holds the encoder's keys and values: no encoder output needed.
        logits, cache = model.decode(inputs["target"][:, index : index + 1], None,
                                     source_mask, cache=cache, cache_update_index=index)
        steps.append(to_numpy(logits))
    return np.concatenate(steps, 1)


def test_returns_float32_logits_over_the_target_vocabulary():
    model = tiny_model()
    logits = model(batch())
    assert tuple(logits.shape) == (2, 5, 20)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_logits_are_float32_under_mixed_precision(policy):
    keras.config.set_dtype_policy(policy)
    model = tiny_model()
    assert model.compute_dtype != "float32"
    logits = model(batch())
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in model.weights)


def test_appending_source_padding_changes_nothing():
    model = tiny_model()
    inputs = batch()
    padded = dict(inputs, source=np.pad(inputs["source"], ((0, 0), (0, 4))))
    np.testing.assert_allclose(logits_of(model, padded), logits_of(model, inputs), atol=1e-5)


def test_appending_target_padding_changes_nothing():
    model = tiny_model()
    inputs = batch()
    padded = dict(inputs, target=np.pad(inputs["target"], ((0, 0), (0, 3))))
    np.testing.assert_allclose(logits_of(model, padded)[:, :5], logits_of(model, inputs), atol=1e-5)


def test_logits_at_t_do_not_depend_on_later_target_tokens():
    model = tiny_model()
    inputs = batch()
    reference = logits_of(model, inputs)
    for t in range(4):
        changed = inputs["target"].copy()
        changed[:, t + 1 :] = RNG.integers(3, 20, size=changed[:, t + 1 :].shape)
        np.testing.assert_allclose(
            logits_of(model, dict(inputs, target=changed))[:, : t + 1],
            reference[:, : t + 1], atol=1e-5,
        )


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_all_padding_rows_are_finite(dtype):
    model = Transformer(TransformerConfig.tiny(vocab_size=20), dtype=dtype)
    inputs = batch()
    inputs["source"][0] = 0
    inputs["target"][0] = 0
    assert np.all(np.isfinite(logits_of(model, inputs)))


def test_embedding_dropout_sees_scaled_embedding_plus_positions():
    model = tiny_model(dropout_rate=0.1)
    seen = []
    original = model.embedding_dropout.call

    def spy(inputs, training=None):
        seen.append(to_numpy(inputs))
        return original(inputs, training=training)

    model.embedding_dropout.call = spy
    inputs = batch()
    model.encode(inputs["source"], training=True)
    embedded = to_numpy(model.source_embedding.embeddings)[inputs["source"]] * np.sqrt(32)
    expected = embedded + to_numpy(sinusoidal_position_encoding(6, 32))
    np.testing.assert_allclose(seen[0], expected, atol=1e-5)


def test_dropout_only_in_training():
    model = tiny_model(dropout_rate=0.2)
    inputs = batch()
    np.testing.assert_allclose(logits_of(model, inputs), logits_of(model, inputs))
    assert not np.allclose(to_numpy(model(inputs, training=True)),
                           to_numpy(model(inputs, training=True)))


def test_embeddings_are_shared_by_default():
    model = tiny_model()
    assert model.source_embedding is model.target_embedding
    assert model.output_projection is None
    names = [w.path for w in model.weights if "embedding" in w.path]
    assert len([n for n in names if n.endswith("embeddings")]) == 1


def test_separate_vocabularies_and_untied_output():
    model = Transformer(TransformerConfig.tiny(
        vocab_size=20, target_vocab_size=13, share_embeddings=False, tie_output_embedding=False
    ))
    assert model.source_embedding is not model.target_embedding
    logits = model({"source": np.ones((2, 4), "int32"), "target": np.ones((2, 3), "int32")})
    assert tuple(logits.shape) == (2, 3, 13)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


def test_pre_norm_stacks_end_with_layer_norm():
    model = tiny_model(norm_position="pre")
    assert model.encoder_norm is not None and model.decoder_norm is not None
    assert all(block.norm_position == "pre" for block in model.encoder_blocks)
    encoded, _ = model.encode(batch()["source"])
    np.testing.assert_allclose(to_numpy(encoded).mean(-1), 0, atol=1e-4)
    assert tiny_model().encoder_norm is None


def test_learned_positions():
    model = tiny_model(position_encoding="learned", max_length=8)
    assert tuple(model.source_position.position_embeddings.shape) == (8, 32)
    assert np.all(np.isfinite(logits_of(model, batch())))
    with pytest.raises(ValueError, match="max_length=8"):
        model({"source": np.ones((1, 9), "int32"), "target": np.ones((1, 2), "int32")})


def test_encode_then_decode_equals_call():
    model = tiny_model()
    inputs = batch()
    encoded, source_mask = model.encode(inputs["source"])
    decoded = model.decode(inputs["target"], encoded, source_mask)
    np.testing.assert_allclose(to_numpy(decoded), logits_of(model, inputs), atol=1e-6)


@pytest.fixture
def fused_attention_calls(monkeypatch):
    """Each call of keras.ops.dot_product_attention: (mask given, is_causal)."""
    calls = []
    fused = keras.ops.dot_product_attention

    def spy(query, key, value, mask=None, is_causal=False, **kwargs):
        calls.append((mask is not None, is_causal))
        return fused(query, key, value, mask=mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(keras.ops, "dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_decoder_self_attention_takes_the_causal_kernel_without_a_mask(
        fused_attention_calls, training):
    model = tiny_model()
    model(batch(), training=training)
    layers = model.config.num_layers
    # Per layer: the encoder's and the cross-attention's padding masks, and the
    # decoder's causality alone, as is_causal with no (batch, 1, T, T) tensor.
    assert sorted(fused_attention_calls) == sorted(
        [(True, False)] * 2 * layers + [(False, True)] * layers)


def masked_decoder_logits(model, inputs, training=False):
    """The logits of `inputs` with the target's padding mask given to every
    decoder self-attention (as the model computed them before it took the
    causal kernel)."""
    encoded, source_mask = model.encode(inputs["source"], training=training)
    target = inputs["target"]
    x = model.target_embedding(target)
    x = x + model.target_position(x)
    for block in model.decoder_blocks:
        x = block(x, encoded, decoder_padding_mask=model.padding_mask(target),
                  encoder_padding_mask=source_mask, training=training)
    return to_numpy(model.project_outputs(x))


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("overrides", [{}, {"norm_position": "pre"}], ids=["post", "pre"])
def test_right_padded_targets_give_the_masked_logits_at_every_real_position(
        training, overrides):
    model = tiny_model(**overrides)
    inputs = batch()  # the second target is padded from position 3 on
    real = inputs["target"] != 0
    logits = to_numpy(model(inputs, training=training))
    np.testing.assert_allclose(logits[real], masked_decoder_logits(model, inputs, training)[real],
                               atol=1e-5)


@pytest.mark.parametrize("overrides", [
    {"norm_position": "post"},
    {"norm_position": "pre"},
    {"key_dim": 4, "value_dim": 8},  # Table 3 row (B): d_k halved alone
], ids=["post", "pre", "d_v!=d_k"])
def test_cached_decoding_matches_full(overrides):
    model = tiny_model(**overrides)
    inputs = batch()
    inputs["target"][1, 3:] = 7  # decoding never pads the target
    np.testing.assert_allclose(step_by_step_logits(model, inputs), logits_of(model, inputs),
                               atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("change", ["int8", "lora"])
def test_quantized_and_lora_models_decode_with_the_cache_as_in_the_full_pass(change):
    """A quantized model and one with LoRA weights decode with the cache as in
    the full pass. torch's matmul shortcut for the projections must leave a
    quantized layer to its own call: it would read the int8 kernel as floats.
    (Keras's `kernel` includes the LoRA update, so LoRA is right either way.)
    One block of each stack holds every kind of projection (self-, cross-attention,
    feed-forward) and halves Keras's quantization, most of the test's time."""
    model = tiny_model(num_layers=1)
    inputs = batch()
    inputs["target"][1, 3:] = 7
    model(inputs)
    if change == "int8":
        model.quantize("int8")
    else:
        rng = np.random.default_rng(1)
        for layer in model._flatten_layers():
            if isinstance(layer, keras.layers.EinsumDense):
                layer.enable_lora(2)
                layer.lora_kernel_b.assign(rng.normal(size=layer.lora_kernel_b.shape))
    np.testing.assert_allclose(step_by_step_logits(model, inputs), logits_of(model, inputs),
                               atol=1e-4)


def test_reordered_cache_decodes_as_the_reordered_batch():
    model = tiny_model()
    inputs = batch()
    inputs["source"][1] = inputs["source"][0]  # the rows that swap read one source
    encoded, source_mask = model.encode(inputs["source"])
    cache = model.initial_cache(encoded, max_length=3)
    for index in range(2):
        _, cache = model.decode(inputs["target"][:, index : index + 1], None, source_mask,
                                cache=cache, cache_update_index=index)
    swapped = model.reorder_cache(cache, np.array([1, 0], "int32"))
    logits, _ = model.decode(inputs["target"][::-1, 2:3], None, source_mask, cache=swapped,
                             cache_update_index=2)
    full = logits_of(model, {"source": inputs["source"], "target": inputs["target"][::-1]})
    np.testing.assert_allclose(to_numpy(logits)[:, 0], full[:, 2], atol=1e-5)


def test_beam_cache_shares_each_sentences_cross_attention_rows():
    model = tiny_model()
    inputs = batch()
    encoded, source_mask = model.encode(inputs["source"])
    cache = model.initial_cache(encoded, max_length=5, beam_size=3)
    assert tuple(cache["self"][0][0].shape)[0] == 6  # one row per beam
    assert tuple(cache["cross"][0][0].shape)[0] == 2  # one row per sentence
    # Beams 3b..3b+2 of sentence b decode as sentence b's rows would: the
    # target of every beam is its sentence's.
    targets = np.repeat(inputs["target"], 3, axis=0)
    targets[:, 3:] = 7  # decoding never pads the target
    full = logits_of(model, {"source": np.repeat(inputs["source"], 3, axis=0),
                             "target": targets})
    for index in range(5):
        logits, cache = model.decode(targets[:, index : index + 1], None, source_mask,
                                     cache=cache, cache_update_index=index)
        np.testing.assert_allclose(to_numpy(logits)[:, 0], full[:, index], atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"tie_output_embedding": False}],
                         ids=["tied", "untied"])
def test_the_cache_holds_the_output_kernel_under_xla_and_keeps_it(overrides):
    """Under JAX and TensorFlow the cache carries the tied output projection's
    matrix, made once; the step, the reorder and the growth keep it."""
    model = tiny_model(**overrides)
    inputs = batch()
    encoded, source_mask = model.encode(inputs["source"])
    cache = model.initial_cache(encoded, max_length=3)
    tied = model.output_projection is None
    expected = tied and keras.backend.backend() in ("jax", "tensorflow")
    assert ("reverse_kernel" in cache) == expected
    if expected:
        np.testing.assert_array_equal(to_numpy(cache["reverse_kernel"]),
                                      to_numpy(model.target_embedding.embeddings).T)
    _, stepped = model.decode(inputs["target"][:, :1], None, source_mask, cache=cache,
                              cache_update_index=0)
    for kept in (stepped, model.reorder_cache(stepped, np.array([0, 0], "int32")),
                 model.grow_cache(stepped, 5)):
        assert set(kept) == set(cache)
        if expected:
            assert kept["reverse_kernel"] is cache["reverse_kernel"]


@pytest.mark.parametrize("beam_size", [0, 2.5, "4"])
def test_bad_beam_size_for_the_cache_is_explained(beam_size):
    model = tiny_model()
    encoded, _ = model.encode(batch()["source"])
    with pytest.raises(ValueError, match="beam_size"):
        model.initial_cache(encoded, max_length=5, beam_size=beam_size)


def test_attention_weights_per_block_follow_the_stacks():
    model = tiny_model()
    inputs = batch()
    weights = model.attention_weights(inputs["source"], inputs["target"])
    assert [len(weights[kind]) for kind in ("encoder", "decoder", "cross")] == [2, 2, 2]
    assert tuple(weights["encoder"][0].shape) == (2, 4, 6, 6)
    assert tuple(weights["decoder"][0].shape) == (2, 4, 5, 5)
    assert tuple(weights["cross"][0].shape) == (2, 4, 5, 6)
    assert np.all(to_numpy(weights["cross"][0])[1, :, :, 4:] == 0)  # padding keys
    # The last block's weights are those the block sees in the stacks' forward pass.
    encoded, mask = model.encode(inputs["source"])
    x = model.target_embedding(inputs["target"])
    x = x + model.target_position(x)
    x = model.decoder_blocks[0](x, encoded, decoder_padding_mask=model.padding_mask(
        inputs["target"]), encoder_padding_mask=mask)
    last = model.decoder_blocks[1].attention_weights(
        x, encoded, decoder_padding_mask=model.padding_mask(inputs["target"]),
        encoder_padding_mask=mask)
    np.testing.assert_allclose(to_numpy(weights["cross"][1]), to_numpy(last["cross"]),
                               atol=1e-6)


def test_decode_returns_logits_or_a_pair_with_a_cache():
    model = tiny_model()
    inputs = batch()
    encoded, mask = model.encode(inputs["source"])
    logits = model.decode(inputs["target"], encoded, mask)
    assert not isinstance(logits, tuple) and tuple(logits.shape) == (2, 5, 20)
    cache = model.initial_cache(encoded, max_length=5)
    step = model.decode(inputs["target"][:, :1], None, mask, cache=cache, cache_update_index=0)
    assert isinstance(step, tuple) and len(step) == 2 and tuple(step[0].shape) == (2, 1, 20)


def test_bad_inputs_are_explained():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"missing \['target'\]"):
        model({"source": np.ones((1, 3), "int32")})
    with pytest.raises(TypeError, match="TransformerConfig"):
        Transformer(42)


def test_save_and_load_give_identical_logits(tmp_path):
    model = tiny_model()
    model.compile(optimizer="adam")
    inputs = batch()
    path = tmp_path / "model.keras"
    model.save(path)
    revived = keras.saving.load_model(path)
    assert isinstance(revived, Transformer)
    assert revived.config == model.config
    np.testing.assert_array_equal(logits_of(revived, inputs), logits_of(model, inputs))


@pytest.mark.slow
def test_a_compiled_model_loads_compiled_with_its_optimizer_state(tmp_path):
    import warnings

    import keras_transformer as kt

    model = tiny_model()
    model.compile(optimizer=kt.paper_adam(model.config.d_model, 10),
                  loss=kt.LabelSmoothedCrossEntropy(0.1))
    inputs = batch()
    labels = inputs["target"]
    model.train_on_batch(inputs, labels)
    model.save(tmp_path / "model.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras's "compile() was not called" among others
        revived = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(revived.loss, kt.LabelSmoothedCrossEntropy)
    assert int(keras.ops.convert_to_numpy(revived.optimizer.iterations)) == 1
    for ours, theirs in zip(model.optimizer.variables, revived.optimizer.variables):
        np.testing.assert_array_equal(to_numpy(theirs), to_numpy(ours))
    # Both take the same second step.
    np.testing.assert_allclose(revived.train_on_batch(inputs, labels),
                               model.train_on_batch(inputs, labels), rtol=1e-5)


@pytest.mark.slow
def test_a_model_saved_under_pytorch_trains_on_under_every_backend(tmp_path):
    """Under PyTorch, Keras serializes its Adam as the backend's own class
    (`keras.src.backend.torch.optimizers.torch_adam`); a JAX or TensorFlow process
    rebuilt it as that class, and `fit` failed. The model now loads such a file with
    this backend's own Adam, its state kept."""
    import json
    import zipfile

    import keras_transformer as kt

    model = tiny_model()
    model.compile(optimizer=kt.paper_adam(model.config.d_model, 10),
                  loss=kt.LabelSmoothedCrossEntropy(0.1))
    inputs = batch()
    labels = inputs["target"]
    model.train_on_batch(inputs, labels)
    saved = tmp_path / "saved.keras"
    model.save(saved)
    with zipfile.ZipFile(saved) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(entries["config.json"])
    optimizer = config["compile_config"]["optimizer"]
    optimizer.update(module="keras.src.backend.torch.optimizers.torch_adam",
                     class_name="Adam", registered_name="Adam")  # as Keras 3.15 writes
                                                                 # it under PyTorch
    entries["config.json"] = json.dumps(config).encode()
    as_under_pytorch = tmp_path / "pytorch.keras"
    with zipfile.ZipFile(as_under_pytorch, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    revived = keras.saving.load_model(as_under_pytorch)
    assert type(revived.optimizer) is type(keras.optimizers.Adam())
    assert int(keras.ops.convert_to_numpy(revived.optimizer.iterations)) == 1
    np.testing.assert_allclose(revived.train_on_batch(inputs, labels),
                               model.train_on_batch(inputs, labels), rtol=1e-5)


def test_config_round_trip():
    model = tiny_model(norm_position="pre")
    revived = Transformer.from_config(model.get_config())
    assert revived.config == model.config
    assert revived.get_config() == model.get_config()


LOAD_SCRIPT = """
import sys, numpy as np, keras
import keras_transformer
model = keras.saving.load_model(sys.argv[1])
data = np.load(sys.argv[2])
logits = model({"source": data["source"], "target": data["target"]}, training=False)
np.save(sys.argv[3], keras.ops.convert_to_numpy(logits))
"""


# Each pass saves under its backend and loads under the next one: the three passes
# together save and load under every backend.
NEXT_BACKEND = {"tensorflow": "jax", "jax": "torch", "torch": "tensorflow"}


@pytest.mark.slow
def test_a_saved_file_loads_under_another_backend(tmp_path):
    model = tiny_model(norm_position="pre", position_encoding="learned")
    inputs = batch()
    model_path = tmp_path / "model.keras"
    data_path = tmp_path / "inputs.npz"
    model.save(model_path)
    np.savez(data_path, **inputs)
    expected = logits_of(model, inputs)
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for backend in [NEXT_BACKEND[keras.backend.backend()]]:
        out_path = tmp_path / f"logits_{backend}.npy"
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=repository + os.pathsep + os.environ.get("PYTHONPATH", ""))
        result = subprocess.run(
            [sys.executable, "-c", LOAD_SCRIPT, str(model_path), str(data_path), str(out_path)],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        np.testing.assert_allclose(np.load(out_path), expected, atol=1e-5, err_msg=backend)


@pytest.mark.xla
def test_auto_jit_compile_is_xla_except_on_torch():
    """"auto" is XLA under JAX (Keras's choice) and TensorFlow (ours: Keras
    leaves XLA off on a CPU, where it is slower for this model), eager on torch;
    an explicit choice is kept."""
    model = tiny_model()
    model.compile(optimizer="adam", loss="mse")
    assert model.jit_compile is (keras.backend.backend() != "torch")
    model.compile(optimizer="adam", loss="mse", jit_compile=False)
    assert model.jit_compile is False


@pytest.mark.xla
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.distribute only")
def test_auto_jit_compile_stays_off_under_a_distribution_strategy():
    import tensorflow as tf

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = tiny_model()
        model.compile(optimizer="adam", loss="mse")
        made_in_scope = tiny_model()
    assert model.jit_compile is False
    # Compiled outside the scope, the model still keeps its strategy.
    made_in_scope.compile(optimizer="adam", loss="mse")
    assert made_in_scope.jit_compile is False
    elsewhere = tiny_model()
    elsewhere.compile(optimizer="adam", loss="mse")
    assert elsewhere.jit_compile is True


@pytest.mark.parametrize("side, ids", [("source", [[5, 40]]), ("source", [[-1, 5]]),
                                      ("target", [[1, 99]])])
def test_the_model_rejects_numpy_ids_outside_the_vocabulary(side, ids):
    model = tiny_model(vocab_size=40)
    inputs = {"source": np.array([[5, 6]]), "target": np.array([[1, 7]])}
    inputs[side] = np.array(ids)
    with pytest.raises(ValueError, match=f"{side} holds ids from .* outside the vocabulary"):
        model(inputs)
    with pytest.raises(ValueError, match=f"{side} holds ids from .* outside the vocabulary"):
        model((inputs["source"], inputs["target"]))  # the pair form the model also takes
