"""The server's metrics: Prometheus, at TensorFlow Serving's path `/monitoring/prometheus/metrics`.

Built with `prometheus-client`, in a registry of the server's own.
"""

#: Batch sizes of the batch-size histogram: TensorFlow Serving's usual ones.
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServingMetrics:
    """The server's metrics, in a registry of their own.

    * `keras_transformer_request_count_total{model_name, status}`: requests
      answered, by HTTP status;
    * `keras_transformer_request_latency_seconds{model_name, signature}`:
      predict latency, a histogram;
    * `keras_transformer_batch_size`: instances per signature call, a histogram;
    * `keras_transformer_queue_depth`: instances waiting for a batch;
    * `keras_transformer_warmup_seconds{model_name, version}`: how long each
      loaded version's warm-up took;
    * `keras_transformer_load_attempts_total{model_name, version, outcome}`: tries
      to load a version, by outcome ("success" or "failure");
    * `keras_transformer_load_retry_delay_seconds{model_name, version}`: the wait
      before the next try of a version whose load failed; 0 once it has loaded or
      has no tries left.
    """

    def __init__(self, queue_depth):
        import prometheus_client as prometheus

        self.registry = prometheus.CollectorRegistry()
        self.requests = prometheus.Counter(
            "keras_transformer_request_count", "Requests answered, by HTTP status.",
            ["model_name", "status"], registry=self.registry)
        self.latency = prometheus.Histogram(
            "keras_transformer_request_latency_seconds", "Predict request latency.",
            ["model_name", "signature"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = prometheus.Histogram(
            "keras_transformer_batch_size", "Instances per signature call.",
            buckets=_BATCH_BUCKETS, registry=self.registry)
        depth = prometheus.Gauge(
            "keras_transformer_queue_depth", "Instances waiting for a batch.",
            registry=self.registry)
        depth.set_function(queue_depth)
        self.warmup_seconds = prometheus.Gauge(
            "keras_transformer_warmup_seconds", "Time the warm-up of a version took.",
            ["model_name", "version"], registry=self.registry)
        self.load_attempts = prometheus.Counter(
            "keras_transformer_load_attempts", "Tries to load a version, by outcome.",
            ["model_name", "version", "outcome"], registry=self.registry)
        self.load_retry_delay = prometheus.Gauge(
            "keras_transformer_load_retry_delay_seconds",
            "Wait before the next try of a version whose load failed (0: none due).",
            ["model_name", "version"], registry=self.registry)
        self.content_type = prometheus.CONTENT_TYPE_LATEST

    def exposition(self):
        """The metrics in Prometheus' text format (bytes)."""
        import prometheus_client as prometheus

        return prometheus.generate_latest(self.registry)
