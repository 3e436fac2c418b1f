"""Importing the library changes nothing in the program that imports it.

Two fresh processes load Keras, the backend and TensorFlow as a program of its own would,
and record the state a library could change: the environment, the import system, warnings
filters, logging, signal handlers, Keras's settings and global state, TensorFlow's and
absl's log levels, the backend's settings, where stderr goes, and TensorFlow's own start-up
lines on stderr. One of them imports `keras_transformer` and every one of its modules
first, before TensorFlow, as a program that uses the library and then TensorFlow does;
the other does not. Their states must be equal, and so must TensorFlow's lines. The only
thing the modules add is what importing them is for: their layers, losses and schedules
registered with Keras's serialization, so that saved models load.

Runs under each backend, in its own pass, as `python -c`; and in one pass under the name
of the project's command line (`keras-transformer`), which the import must not look at.
"""

import glob
import json
import os
import subprocess
import sys

import pytest
from helpers import REPOSITORY

PROGRAM = r'''
import importlib, json, logging, os, pkgutil, signal, sys, warnings

STREAMS = [os.fstat(2).st_ino, os.fstat(1).st_ino]  # where stderr and stdout go at start
if len(sys.argv) > 2:
    sys.argv[0] = sys.argv[2]  # the program's name: the import must not depend on it
modules = []
if sys.argv[1] == "library":
    import keras_transformer
    modules = [name for _, name, _ in pkgutil.walk_packages(keras_transformer.__path__,
                                                             "keras_transformer.")]
    for name in modules:
        importlib.import_module(name)

import absl.logging
import keras
import tensorflow as tf
from keras.src.backend.common import global_state


def backend_settings():
    backend = keras.backend.backend()
    if backend == "jax":
        import jax
        return {name: str(getattr(jax.config, name)) for name in (
            "jax_enable_x64", "jax_default_matmul_precision", "jax_compilation_cache_dir",
            "jax_platforms")}
    if backend == "torch":
        import torch
        return {"threads": torch.get_num_threads(), "grad": torch.is_grad_enabled(),
                "default_dtype": str(torch.get_default_dtype())}
    return {}


def loggers():
    found = {"": logging.root}
    found.update({name: logger for name, logger in logging.Logger.manager.loggerDict.items()
                  if isinstance(logger, logging.Logger)})
    return {name: [logger.level, logger.propagate, logger.disabled,
                   [repr(handler) for handler in logger.handlers],
                   [repr(filter) for filter in logger.filters]]
            for name, logger in found.items()}


def state():
    return {
        "environment": dict(os.environ),
        "meta_path": [repr(type(finder)) for finder in sys.meta_path],
        "path_hooks": [getattr(hook, "__qualname__", repr(type(hook)))
                       for hook in sys.path_hooks],
        "warnings": [repr(entry) for entry in warnings.filters],
        "loggers": loggers(),
        "signals": {name: repr(signal.getsignal(getattr(signal, name)))
                    for name in ("SIGINT", "SIGTERM", "SIGPIPE")},
        "keras": [keras.config.floatx(), keras.config.epsilon(),
                  keras.config.image_data_format(), keras.config.dtype_policy().name,
                  keras.config.is_interactive_logging_enabled(),
                  keras.config.is_traceback_filtering_enabled()],
        "keras_global_state": {key: repr(value) for key, value in
                               vars(global_state.GLOBAL_STATE_TRACKER).items()},
        "tensorflow": [tf.get_logger().level, tf.autograph.experimental.Feature.ALL.value,
                       tf.config.threading.get_inter_op_parallelism_threads(),
                       tf.config.threading.get_intra_op_parallelism_threads()],
        "absl": [absl.logging.get_verbosity(), absl.logging.get_absl_handler().level],
        "backend": backend_settings(),
        "streams_as_at_start": [os.fstat(2).st_ino, os.fstat(1).st_ino] == STREAMS,
    }


print(json.dumps({"modules": len(modules), "state": state()}))
'''


def run(first, program_name=None):
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_TRANSFORMER_NATIVE_LOGS")}
    result = subprocess.run([sys.executable, "-c", PROGRAM, first,
                             *([program_name] if program_name else [])],
                            capture_output=True, text=True, timeout=300, cwd=REPOSITORY,
                            env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # TensorFlow's start-up lines, by the file that writes each (port.cc, ...).
    native = sorted({word for line in result.stderr.splitlines()
                     for word in line.split() if word.endswith("]") and ".cc:" in word})
    return report, [word.split(":")[0] for word in native]


# The name of the project's command line, by which the library once recognised a
# process to set up on import: it no longer looks (the entry points set themselves up,
# keras_transformer_app). One backend's pass, JAX's, where the processes start fastest
# (16 s there, 22 s under PyTorch, AMD EPYC with AVX2): the name does not depend on it.
PROGRAM_NAMES = [pytest.param(None, id="python -c"),
                 pytest.param("keras-transformer", id="keras-transformer",
                              marks=pytest.mark.once("jax"))]


@pytest.mark.parametrize("program_name", PROGRAM_NAMES)
def test_importing_every_module_changes_nothing_in_the_host(program_name):
    with_library, library_lines = run("library", program_name)
    without, lines = run("program alone", program_name)
    library = glob.glob(os.path.join(REPOSITORY, "keras_transformer", "**", "*.py"),
                        recursive=True)
    # every module but the package's own __init__
    assert with_library["modules"] == len(library) - 1 and without["modules"] == 0
    changed = {key: {"program alone": without["state"][key], "with the library":
                     with_library["state"][key]}
               for key in without["state"] if without["state"][key] != with_library["state"][key]}
    assert changed == {}
    assert library_lines == lines and lines, "TensorFlow's start-up lines reach stderr"
