"""Shared fixtures. Every test runs under the backend in KERAS_BACKEND."""

import os

import keras
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with a fixed seed and float32, whatever the last one set."""
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    # No keras.backend.clear_session() here: under TensorFlow it frees the
    # resources of tf-text ops that module-scoped tokenizer fixtures still use.
    keras.config.set_dtype_policy("float32")


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.backend.backend()}"
