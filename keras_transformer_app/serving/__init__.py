"""Serving exported translation models (§6.1 search) the way TensorFlow Serving does.

The built-in server stands in for TensorFlow Serving, one module per piece
under TF Serving's names:

* `servable.py`: a *servable*, one loaded version, and the predict request's checks;
* `manager.py`: the *manager*, which polls the base path and loads, warms up
  and unloads versions;
* `batching.py`: the *batching scheduler*, with TF Serving's batching parameters;
* `metrics.py`: the Prometheus metrics;
* `options.py`: the model server's options (port, limits, timeouts);
* `protocol.py`: HTTP/1.1 on asyncio and httptools (timeouts, bounds, the write deadline,
  JSON errors);
* `request.py`: one request: its head checked (Host, the target), its body read under the
  body timeout and bound, and its answer's bytes;
* `server.py`: the model server and its REST API.

    keras-transformer serve saved_models/quickstart --port 8501

The package imports none of them, so that the command line's parser reads the
options' defaults (`options.ServerOptions`, `batching.BatchingParameters`) without
loading the server, httptools or Keras: import what you use from its module.
"""
