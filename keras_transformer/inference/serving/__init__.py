"""Serving exported translation models (§6.1 search) the way TensorFlow Serving does.

The built-in server is a stand-in for TensorFlow Serving with its concepts
and names: a *servable* per loaded version (`servable.py`), a *manager* that
polls the base path and loads, warms up and unloads versions (`manager.py`),
a *batching scheduler* with TF Serving's batching parameters
(`batching.py`), Prometheus metrics (`metrics.py`), and TF Serving's REST API
on uvicorn (`server.py`).

    keras-transformer serve saved_models/quickstart --port 8501
"""

from keras_transformer.inference.serving.batching import BatchingParameters, BatchScheduler
from keras_transformer.inference.serving.servable import RequestError, Servable
from keras_transformer.inference.serving.server import (
    DEFAULT_PORT,
    ServerOptions,
    TranslationServer,
    serve,
)

__all__ = ["DEFAULT_PORT", "BatchScheduler", "BatchingParameters", "RequestError", "Servable",
           "ServerOptions", "TranslationServer", "serve"]
