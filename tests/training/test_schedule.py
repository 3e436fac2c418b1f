"""Tests of §5.3: the learning-rate schedule of eq. (3) and the paper's Adam."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import NoamSchedule, paper_adam
from keras_transformer.training.schedule import DenseGradientAdam


def paper_rate(step_num, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup**-1.5)


@pytest.mark.parametrize("iteration", [0, 1, 99, 3998, 3999, 4000, 10000, 99999])
def test_matches_equation_3_with_one_based_steps(iteration):
    schedule = NoamSchedule(d_model=512, warmup_steps=4000)
    np.testing.assert_allclose(
        float(ops.convert_to_numpy(schedule(iteration))), paper_rate(iteration + 1), rtol=1e-5
    )


def test_peaks_at_warmup_and_scales():
    schedule = NoamSchedule(d_model=256, warmup_steps=100, scale=2.0)
    rates = np.array([float(ops.convert_to_numpy(schedule(i))) for i in range(300)])
    assert rates.argmax() == 99
    np.testing.assert_allclose(rates.max(), 2.0 * 256**-0.5 * 100**-0.5, rtol=1e-5)
    assert np.all(np.diff(rates[:100]) > 0) and np.all(np.diff(rates[100:]) < 0)


def test_cooldown_falls_linearly_to_the_last_step_and_leaves_the_rest_as_eq_3():
    total, cooldown = 300, 100
    schedule = NoamSchedule(d_model=256, warmup_steps=50, scale=0.5, total_steps=total,
                            cooldown_steps=cooldown)
    rates = np.array([float(ops.convert_to_numpy(schedule(i))) for i in range(total)])
    paper = np.array([0.5 * paper_rate(i + 1, 256, 50) for i in range(total)])
    np.testing.assert_allclose(rates[:total - cooldown + 1], paper[:total - cooldown + 1],
                               rtol=1e-5)
    factors = rates[total - cooldown:] / paper[total - cooldown:]
    np.testing.assert_allclose(factors, np.arange(cooldown, 0, -1) / cooldown, rtol=1e-4)
    assert rates[-1] > 0  # the last step still trains


@pytest.mark.once("jax")  # the arguments' checks and the config, not the backend
def test_serialization_round_trip():
    schedule = NoamSchedule(d_model=64, warmup_steps=10, scale=0.5, total_steps=100,
                            cooldown_steps=20)
    revived = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert isinstance(revived, NoamSchedule)
    assert revived.get_config() == schedule.get_config()


def test_paper_adam_hyperparameters():
    optimizer = paper_adam(d_model=512, warmup_steps=4000, clipnorm=1.0)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(optimizer._learning_rate, NoamSchedule)
    assert optimizer.clipnorm == 1.0
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(revived) is type(optimizer)
    assert isinstance(revived._learning_rate, NoamSchedule)


def test_paper_adam_is_dense_gradient_adam_under_tensorflow_and_keras_adam_elsewhere():
    """Under PyTorch Keras swaps `keras.optimizers.Adam` itself, not a subclass, for its
    multi-tensor Adam: a subclass there would update the variables one by one."""
    optimizer = paper_adam(d_model=512)
    if keras.backend.backend() == "tensorflow":
        assert isinstance(optimizer, DenseGradientAdam)
    else:
        assert not isinstance(optimizer, DenseGradientAdam)
        assert isinstance(optimizer, keras.optimizers.Adam)
    if keras.backend.backend() == "torch":  # swapped by Keras for its torch Adam
        assert type(optimizer) is not keras.optimizers.Adam


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.backs("docs/results.md", "squared an embedding's sparse gradient slice by slice")
@pytest.mark.backs("docs/library.md", "Adam squares an embedding's sparse gradient slice by slice")
def test_adams_moments_of_a_repeated_token_are_those_of_its_summed_gradient(jit_compile):
    """Token 1 three times in the batch: its row's gradient is 3 in each component,
    so one step gives m = 0.1 · 3 and v = 0.02 · 3². Keras's own Adam under
    TensorFlow gave v = 0.02 · (1 + 1 + 1), squaring the sparse gradient's three
    slices one by one."""
    model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(5, 2),
                              keras.layers.Lambda(lambda x: ops.sum(x, axis=(1, 2)))])
    model.compile(optimizer=paper_adam(d_model=2, warmup_steps=10),
                  loss=lambda _, predicted: ops.mean(predicted), jit_compile=jit_compile)
    model.train_on_batch(np.array([[1, 1, 1, 3]]), np.zeros((1,)))
    m, v = (ops.convert_to_numpy(moments[0]) for moments in (
        model.optimizer._momentums, model.optimizer._velocities))
    np.testing.assert_allclose(m[[1, 3]], [[0.3, 0.3], [0.1, 0.1]], rtol=1e-5)
    np.testing.assert_allclose(v[[1, 3]], [[0.18, 0.18], [0.02, 0.02]], rtol=1e-5)
    np.testing.assert_array_equal(v[[0, 2, 4]], 0.0)


@pytest.mark.once("jax")  # the arguments' checks and the config, not the backend
@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=0), "d_model=0 must be a positive integer"),
    (dict(d_model=512.0), "d_model=512.0 must be a positive integer"),
    (dict(d_model=512, warmup_steps=0), "warmup_steps=0 must be a positive integer"),
    (dict(d_model=512, warmup_steps=True), "warmup_steps=True must be a positive integer"),
    (dict(d_model=512, scale=0), "scale=0 must be a number > 0"),
    (dict(d_model=512, scale=float("nan")), "scale=nan must be a number > 0"),
    (dict(d_model=512, cooldown_steps=10), "needs total_steps"),
    (dict(d_model=512, total_steps=10, cooldown_steps=20), "more than total_steps=10"),
    (dict(d_model=512, total_steps=10, cooldown_steps=-1), "cooldown_steps=-1 must be a"),
    (dict(d_model=512, total_steps=0), "total_steps=0 must be a positive integer"),
])
def test_bad_arguments_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NoamSchedule(**kwargs)


@pytest.mark.slow
@pytest.mark.backs("docs/library.md", "builds the optimizer before that")
def test_compile_model_builds_the_optimizer_before_the_first_step():
    import keras_transformer as kt
    from keras_transformer.training.compile import compile_model

    config = kt.TransformerConfig.tiny(vocab_size=32, d_model=16, d_ff=32, num_heads=2,
                                       num_layers=1)
    model = kt.Transformer(config)
    compile_model(model, config)
    assert model.optimizer.built  # not inside the first trace of the train step
    slots = [id(variable) for variable in model.optimizer.variables]
    assert len(slots) > 2 * len(model.trainable_variables)  # Adam's two moments each
    ids = np.random.default_rng(0).integers(4, 32, (2, 6)).astype("int32")
    model.fit({"source": ids, "target": ids}, ids, epochs=1, verbose=0)
    assert [id(variable) for variable in model.optimizer.variables] == slots
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 1
