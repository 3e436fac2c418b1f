"""The GPU benchmark's CPU-checkable parts (benchmarks/gpu.py, issue 21) and the
report writer's rule for keeping hand-written sections (benchmarks/run_all.py)."""

import importlib.util
import json
import os

import keras
import numpy as np
import pytest
from helpers import REPOSITORY


def load_script(name):
    """A benchmarks/ script as a module (the folder is no package)."""
    path = os.path.join(REPOSITORY, "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu():
    return load_script("gpu")


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


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_gpu_script_trains_with_fit_and_reports_on_a_cpu(gpu, capsys, precision):
    gpu.main(["--quick", "--allow-cpu", "--check-attention", "--precision", precision])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["benchmark"] == "gpu" and not result["skipped"]
    assert result["backend"] == keras.backend.backend()
    assert result["precision"] == precision
    assert len(result["window_losses"]) == result["steps"] // result["window"] == 3
    assert result["loss_finite"] and all(np.isfinite(result["window_losses"]))
    # 8 rows of 8 positions, the last row padding: 7 x 8 real target tokens a step.
    assert result["batch_size"] == 8 and result["target_tokens_per_step"] == 56
    assert result["tokens_per_s"] > 0 and result["achieved_tflops"] > 0
    assert result["mfu"] is None and result["peak_tflops"] is None
    scaled = result["optimizer"] == "LossScaleOptimizer"
    assert scaled is (precision == "mixed_float16")  # Keras scales the loss for float16
    attention = result["attention"]
    if keras.backend.backend() == "torch":
        # torch's CPU kernel for scaled_dot_product_attention is a fused one too.
        assert attention["fused"] and any("scaled_dot_product" in name
                                          for name in attention["fused_calls"])
    else:  # no cuDNN on a CPU (JAX); no fused kernel in Keras (TensorFlow)
        assert not attention["fused"] and attention["fused_calls"] == {}


def test_gpu_script_profiles_steps(gpu, capsys):
    gpu.main(["--quick", "--allow-cpu", "--profile", "2"])
    profile = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["profile"]
    assert profile["steps"] == 2
    if keras.backend.backend() == "tensorflow":
        assert profile["tool"] == "none"
        return
    assert profile["wall_ms"] > 0 and not profile["device_planes"]  # a CPU: no GPU timeline
    timelines = profile["timelines"].values()
    assert timelines and all(t["events"] >= len(t["top"]) > 0 for t in timelines)
    for timeline in timelines:
        times = [ms for _, _, ms in timeline["top"]]
        assert times == sorted(times, reverse=True) and all(c >= 1 for _, c, _ in timeline["top"])
    names = set(profile["timelines"])
    if keras.backend.backend() == "torch":
        assert names == {"top-level CPU operators"}
    else:  # JAX: the lines of the host's plane
        assert all(name.startswith("/host:CPU ") for name in names)


def test_gpu_script_refuses_bad_arguments(gpu):
    for argv in (["--steps", "30", "--window", "25"], ["--steps", "25", "--window", "25"],
                 ["--dropout", "1.5"], ["--steps-per-execution", "7"], ["--length", "1"],
                 ["--profile", "-1"]):
        with pytest.raises(SystemExit) as error:
            gpu.main(argv)
        assert error.value.code == 2, argv


@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="the script's flow does not depend on the backend: runs once")
def test_gpu_script_skips_without_a_gpu(gpu, capsys):
    gpu.main(["--quick"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["skipped"] and "No GPU visible" in result["reason"]


def test_run_all_keeps_every_section_it_does_not_write(tmp_path):
    run_all = load_script("run_all")
    report = tmp_path / "RESULTS.md"
    report.write_text(
        "# Benchmark results\n\n- Date: then\n\n"
        "## Targets\n\nold targets\n\n"
        "## GPU\n\n| skipped |\n\n"
        "## Analysis of the targets (written by hand for the run above)\n\nstale\n\n"
        "## GPU: fit on a real GPU (by hand)\n\nkept 1\n\n### a subsection\n\nkept 2\n\n"
        "## Serving (benchmarks/serving.py)\n\nkept 3\n")
    kept = run_all._kept_sections(str(report))
    assert [line for line in kept.splitlines() if line.startswith("## ")] == [
        "## GPU: fit on a real GPU (by hand)", "## Serving (benchmarks/serving.py)"]
    assert "kept 1" in kept and "### a subsection" in kept and "kept 3" in kept
    assert "old targets" not in kept and "stale" not in kept and "skipped" not in kept
    assert run_all._kept_sections(str(tmp_path / "missing.md")) == ""
