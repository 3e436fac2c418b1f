"""The server's options: TensorFlow Serving's model-server flags, for the built-in server.

`ServerOptions` holds what `tensorflow_model_server` takes as flags (the REST
port, `--file_system_poll_wait_seconds`, the load retries, the batching parameters) together
with the limits and timeouts a server facing the network needs: each is
checked when the options are made, so a bad value fails before the port is
bound.
"""

import dataclasses

from keras_transformer_app.serving.batching import BatchingParameters

#: The REST port of TensorFlow Serving's Docker image and examples.
DEFAULT_PORT = 8501


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Limits and timeouts of the server (defaults suit one CPU host).

    Attributes:
        host: Address to bind; 127.0.0.1 keeps the server on this machine.
        port: Port; 0 picks a free one.
        name: Model name in the URLs; None means the base path's folder name.
        max_instances: Most instances per request.
        max_chars: Most characters per sentence (ids per id list).
        max_body_bytes: Largest request body.
        max_connections: Open connections at once (more get 503).
        max_concurrent_requests: Predict requests in flight at once (more get 503).
        backlog: The listen backlog.
        header_timeout: Seconds for a client to send a request's headers.
        body_timeout: Seconds for a client to send a request's body.
        keep_alive_timeout: Seconds an idle keep-alive connection stays open.
        write_timeout: Seconds for a connection's answers to drain once its buffers
            are full, or once it closes: a client that does not read is cut off then.
        graceful_shutdown_seconds: Longest wait for requests in flight on SIGTERM.
        file_system_poll_wait_seconds: Seconds between polls for new versions
            (TensorFlow Serving's flag); 0 disables polling.
        max_num_load_retries: Tries after a failed load of a version
            (TensorFlow Serving's flag and default); 0 tries each version once.
        load_retry_interval_micros: Microseconds between those tries
            (TensorFlow Serving's flag and default, 1 minute).
        warmup_threads: Warm-up requests replayed at once.
        batching: `BatchingParameters`.
        compute_type: CTranslate2's compute type for a CTranslate2 export
            (`keras_transformer.inference.ctranslate2.COMPUTE_TYPES`; "default"
            keeps the type its weights were exported in).
        intra_threads: CTranslate2's threads per batch; 0 shares the cores
            among the `num_batch_threads` batches run at once.

    Raises:
        ValueError: naming the option that is out of range.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    name: str = None
    max_instances: int = 64
    max_chars: int = 2000
    max_body_bytes: int = 1 << 20
    max_connections: int = 1000
    max_concurrent_requests: int = 256
    backlog: int = 2048
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 30.0
    write_timeout: float = 30.0
    graceful_shutdown_seconds: float = 30.0
    file_system_poll_wait_seconds: float = 1.0
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000
    warmup_threads: int = 2
    batching: BatchingParameters = dataclasses.field(default_factory=BatchingParameters)
    compute_type: str = "default"
    intra_threads: int = 0

    def __post_init__(self):
        # Imported here, when options are made: the command line's parser reads the
        # defaults above without loading the library (and Keras with it).
        from keras_transformer import validation
        from keras_transformer.inference.ctranslate2 import COMPUTE_TYPES

        validation.check_choice("compute_type", self.compute_type, COMPUTE_TYPES)
        for name in ("intra_threads", "max_num_load_retries", "load_retry_interval_micros"):
            validation.check_non_negative_int(name, getattr(self, name))
        for name in ("max_instances", "max_chars", "max_body_bytes", "max_connections",
                     "max_concurrent_requests", "backlog", "warmup_threads"):
            validation.check_positive_int(name, getattr(self, name))
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout", "write_timeout",
                     "graceful_shutdown_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive number "
                                 "of seconds.")
        validation.check_non_negative_number("file_system_poll_wait_seconds",
                                             self.file_system_poll_wait_seconds)
        capacity = self.batching.max_enqueued_batches * self.batching.max_batch_size
        if self.max_instances > capacity:
            raise ValueError(
                f"max_instances={self.max_instances} exceeds the batch queue "
                f"(max_enqueued_batches × max_batch_size = {capacity}): no such request could "
                "ever be queued.")
