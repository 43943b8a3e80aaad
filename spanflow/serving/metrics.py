"""Prometheus metrics of the server, in a registry of its own."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (64, 256, 1024, 4096, 16384, 65536)
_SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ServerMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("spanflow_requests", "HTTP requests", ["route", "status"], registry=r)
        self.queue_depth = Gauge("spanflow_queue_depth", "units (texts or windows) waiting", ["model"], registry=r)
        self.queue_tokens = Gauge("spanflow_queue_tokens", "tokens waiting", ["model"], registry=r)
        self.batch_size = Histogram("spanflow_batch_size", "units per batch", ["model"], buckets=_BATCH_SIZES,
                                    registry=r)
        self.batch_tokens = Histogram("spanflow_batch_tokens", "padded tokens per batch", ["model"],
                                      buckets=_TOKENS, registry=r)
        self.queue_wait = Histogram("spanflow_queue_wait_seconds", "time a unit waited before its batch", ["model"],
                                    buckets=_SECONDS, registry=r)
        self.compute = Histogram("spanflow_compute_seconds", "model time per batch", ["model"], buckets=_SECONDS,
                                 registry=r)
        self.phase = Histogram("spanflow_request_phase_seconds", "a request's time by phase: read (body and JSON), "
                               "tokenize, batch (queue wait and compute), respond (assemble and encode)",
                               ["model", "phase"], buckets=_SECONDS, registry=r)
        self.padding = Gauge("spanflow_padding_efficiency", "real / padded tokens, cumulative", ["model"],
                             registry=r)
        self.gpu_memory = Gauge("spanflow_accelerator_memory_bytes", "CUDA memory allocated", registry=r)
        self.gpu_util = Gauge("spanflow_accelerator_utilization", "NVML GPU utilization, percent", registry=r)
        self._real: dict[str, int] = {}
        self._padded: dict[str, int] = {}

    def batch_observer(self, model: str):
        def observe(lengths: list[int], seconds: float, waits: list[float]) -> None:
            self.batch_size.labels(model).observe(len(lengths))
            padded = max(lengths) * len(lengths)
            self.batch_tokens.labels(model).observe(padded)
            self.compute.labels(model).observe(seconds)
            for w in waits:
                self.queue_wait.labels(model).observe(max(0.0, w))
            self._real[model] = self._real.get(model, 0) + sum(lengths)
            self._padded[model] = self._padded.get(model, 0) + padded
            self.padding.labels(model).set(self._real[model] / self._padded[model])
        return observe

    def render(self) -> bytes:
        return generate_latest(self.registry)
