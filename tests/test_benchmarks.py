"""The GPU benchmark's CPU-checkable parts: benchmarks/gpu.py (model.fit in mixed
precision), its torch.nn.Transformer peer (gpu_peer.py) and the real-corpus id
frequencies it can draw from (id_frequencies.py); and the torch backend's host-overhead
benchmark (torch_overhead.py)."""

import json

import keras
import numpy as np
import pytest
from helpers import benchmark_module


@pytest.fixture(scope="module")
def gpu():
    return benchmark_module("gpu")


def test_copy_batches_are_a_copy_task_with_one_padding_row_per_batch(gpu):
    inputs, labels = gpu.copy_batches(3, 5, 7, 50, seed=1)
    source, target = inputs["source"], inputs["target"]
    assert source.shape == target.shape == labels.shape == (15, 7)
    assert source.dtype == target.dtype == labels.dtype == np.int32
    padding = np.zeros(15, bool)
    padding[4::5] = True  # the last row of each batch of 5
    assert (source[padding] == gpu.common.PAD_ID).all()
    assert (target[padding] == gpu.common.PAD_ID).all()
    assert (labels[padding] == gpu.common.PAD_ID).all()
    real = ~padding
    assert (source[real] >= 4).all() and (source[real] < 50).all()  # no special ids
    np.testing.assert_array_equal(labels[real], source[real])
    assert (target[real, 0] == gpu.common.BOS_ID).all()
    np.testing.assert_array_equal(target[real, 1:], labels[real, :-1])
    # Zipf-distributed: the lowest word id is by far the most frequent.
    counts = np.bincount(source[real].ravel(), minlength=50)
    assert counts.argmax() == 4


def matmul_flops(batch, length, config):
    """Training FLOPs of one step (source and target of `length` tokens),
    counted product by product: 2 FLOPs per multiply-add of every matmul of
    the forward pass, times 3 (the forward pass and the backward's two
    products). Attention over all heads multiplies like one (S, d) x (d, S)
    product for the logits and one (S, S) x (S, d) for the values."""
    B, S, d, f, V = batch, length, config.d_model, config.d_ff, config.vocab_size
    attention = [(B * S, d, d)] * 4 + [(B * S, d, S), (B * S, S, d)]  # Q, K, V, O; eq. (1)
    feed_forward = [(B * S, d, f), (B * S, f, d)]
    products = config.num_layers * (attention + feed_forward  # an encoder block
                                    + attention + attention + feed_forward)  # a decoder block
    products.append((B * S, d, V))  # the tied output projection
    return 3 * sum(2 * m * k * n for m, k, n in products)


def test_copy_batches_draw_real_ids_by_their_counts(gpu):
    counts = np.zeros(50, "int64")
    counts[[3, 7, 9]] = [1000, 800, 0]  # EOS (3) is special: never drawn
    counts[20:30] = 10
    inputs, labels = gpu.copy_batches(4, 50, 16, 50, seed=2, frequencies=counts)
    drawn = np.bincount(inputs["source"][inputs["source"] != gpu.common.PAD_ID], minlength=50)
    assert set(np.flatnonzero(drawn)) <= {7, *range(20, 30)}
    share = drawn[7] / drawn.sum()  # 800 of the 900 counts above the special ids
    assert share == pytest.approx(800 / 900, abs=0.03)


@pytest.mark.once("jax")  # tokenization does not depend on the backend
def test_id_frequencies_counts_the_ids_of_a_tokenized_corpus(tmp_path, capsys):
    from keras_transformer.tokenizers import SubwordTokenizer

    sentences = {"de": ["ein hund rennt", "zwei hunde spielen", "ein mann liest"] * 20,
                 "en": ["a dog runs", "two dogs play", "a man reads"] * 20}
    for split in ("train", "val", "test_2016_flickr"):
        for language, lines in sentences.items():
            (tmp_path / f"{split}.{language}").write_text("\n".join(lines) + "\n")
    output = tmp_path / "ids.npy"
    benchmark_module("id_frequencies").main(["--data-dir", str(tmp_path), "--vocab-size", "40",
                                        "--output", str(output)])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    counts = np.load(output)
    assert len(counts) == result["vocab_size"] == 40 and counts.sum() == result["tokens"]
    assert counts[:4].sum() == 0  # no padding, unknown, begin or end of sentence
    # The same vocabulary learned again counts the same pieces.
    texts = sentences["de"] + sentences["en"]
    tokenizer = SubwordTokenizer.train(texts, 40)
    expected = np.bincount(np.concatenate(tokenizer.tokenize(texts)), minlength=40)
    np.testing.assert_array_equal(counts, expected)


# The GPU script's CPU run: once, in the JAX pass, in float16 with loss scaling; the torch
# pass runs it in bfloat16 with its peer (test_the_peer_trains_the_same_model_on_the_same_batches).
PRECISION = "mixed_float16"


@pytest.mark.once("jax")
def test_gpu_script_trains_with_fit_and_reports_on_a_cpu(gpu, capsys):
    import keras_transformer as kt

    gpu.main(["--quick", "--allow-cpu", "--check-attention", "--precision", PRECISION])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["benchmark"] == "gpu" and not result["skipped"]
    assert result["backend"] == "jax" and result["precision"] == PRECISION
    assert len(result["window_losses"]) == result["steps"] // result["window"] == 3
    # The copy task is learnable: the loss falls over the six steps.
    assert result["loss_finite"] and result["loss_decreased"]
    # 8 rows of 8 positions, the last row padding: 7 x 8 real target tokens a step.
    assert result["batch_size"] == 8 and result["target_tokens_per_step"] == 56
    flops = matmul_flops(8, 8, kt.TransformerConfig.tiny(200))
    assert result["achieved_tflops"] * 1e12 * result["median_step_s"] == pytest.approx(flops)
    assert result["mfu"] is None and result["peak_tflops"] is None
    scaled = result["optimizer"] == "LossScaleOptimizer"
    assert scaled is (PRECISION == "mixed_float16")  # Keras scales the loss for float16
    assert result["skipped_steps"] == 0  # no gradient of this run overflows
    attention = result["attention"]
    assert not attention["fused"] and attention["fused_calls"] == {}  # no cuDNN on a CPU


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="the peer is plain PyTorch: runs in the torch pass")
def test_the_peer_trains_the_same_model_on_the_same_batches(gpu, capsys):
    gpu.main(["--quick", "--allow-cpu", "--peers", "eager", "--check-attention",
              "--profile", "2"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # torch's CPU kernel for scaled_dot_product_attention is a fused one too.
    attention = result["attention"]
    assert attention["fused"] and any("scaled_dot_product" in name
                                      for name in attention["fused_calls"])
    assert set(result["profile"]["timelines"]) == {"top-level CPU operators"}
    peer = result["peers"]["eager"]
    assert peer["benchmark"] == "gpu_peer" and peer["mode"] == "eager" and not peer["skipped"]
    for key in ("batch_size", "length", "target_tokens_per_step", "steps", "window",
                "vocab_size", "precision"):
        assert peer[key] == result[key], key
    # torch.nn.Transformer adds a final LayerNorm to each stack: 2 x (scale, offset).
    assert peer["params"] == result["params"] + 4 * 32
    assert peer["loss_finite"] and peer["loss_decreased"]
    assert peer["ours_over_peer"] == pytest.approx(result["tokens_per_s"] / peer["tokens_per_s"])


@pytest.mark.once("jax")
def test_gpu_script_profiles_steps(gpu, capsys):
    gpu.main(["--quick", "--allow-cpu", "--profile", "2"])
    profile = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["profile"]
    assert profile["steps"] == 2
    assert profile["wall_ms"] > 0 and not profile["device_planes"]  # a CPU: no GPU timeline
    timelines = profile["timelines"].values()
    assert timelines and all(t["events"] >= len(t["top"]) > 0 for t in timelines)
    for timeline in timelines:
        times = [ms for _, _, ms in timeline["top"]]
        assert times == sorted(times, reverse=True) and all(c >= 1 for _, c, _ in timeline["top"])
    # JAX: the lines of the host's plane.
    assert all(name.startswith("/host:CPU ") for name in profile["timelines"])


def test_gpu_script_refuses_bad_arguments(gpu):
    for argv in (["--steps", "30", "--window", "25"], ["--steps", "25", "--window", "25"],
                 ["--dropout", "1.5"], ["--steps-per-execution", "7"], ["--length", "1"],
                 ["--profile", "-1"], ["--peers", "eager,jit"]):
        with pytest.raises(SystemExit) as error:
            gpu.main(argv)
        assert error.value.code == 2, argv


@pytest.mark.once("jax")  # the script's flow does not depend on the backend
def test_gpu_script_skips_without_a_gpu(gpu, capsys):
    gpu.main(["--quick"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["skipped"] and "No GPU visible" in result["reason"]


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="measures the torch backend")
def test_torch_overhead_times_fit_steps_and_splits_their_profile():
    overhead = benchmark_module("torch_overhead")
    config = overhead.config()
    ids = overhead.batch(config.vocab_size)
    for model, ours in ((overhead.keras_model(config), False),
                        (overhead.our_model(config, 1024, False), True)):
        times = overhead.fit_step_times(model, ids, warmup=1, steps=2)
        assert len(times) == 2 and all(seconds > 0 for seconds in times)
        profile = overhead.where_time_goes(model, ids, steps=2)
        assert profile["torch kernels (C++)"] > 0 and profile["autograd (C++)"] > 0
        assert profile["layer __call__ machinery"] > 0 and profile["optimizer"] > 0
        assert (profile.get("our library's Python", 0) > 0) == ours


def test_torch_overhead_sorts_a_function_by_its_file():
    area_of = benchmark_module("torch_overhead").area_of
    site = "/usr/lib/python3/site-packages/"
    assert area_of(site + "keras/src/layers/layer.py", "__call__") == "layer __call__ machinery"
    assert area_of(site + "keras/src/ops/numpy.py", "add") == "op wrappers and conversion"
    assert area_of(site + "keras/src/optimizers/adam.py", "update_step") == "optimizer"
    assert area_of("/work/keras_transformer/losses.py", "call") == "loss"
    assert area_of("/work/keras_transformer/model.py", "decode") == "our library's Python"
    assert area_of(site + "numpy/core/fromnumeric.py", "sum") == "other Python"
