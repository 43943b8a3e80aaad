"""Prometheus metrics of the server, in a registry of its own."""
from __future__ import annotations

import os
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from spanflow.batching.collate import SERVE_PAD_MULTIPLE, round_up
from spanflow.runtime.threads import ended_cpu

_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (64, 256, 1024, 4096, 16384, 65536)
_SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ServerMetrics:
    def __init__(self, accelerator: bool = True):
        """`accelerator`: a model runs on a GPU, whose memory and utilisation are exported (on a CPU
        server they would read as an idle GPU)."""
        self.registry = r = CollectorRegistry()
        self.requests = Counter("spanflow_requests", "HTTP requests", ["route", "status"], registry=r)
        self.in_flight = Gauge("spanflow_requests_in_flight", "requests to a model's route between their first "
                               "byte and their answer (reading, queued, running or answering)", registry=r)
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
        self.request_seconds = Histogram("spanflow_request_seconds", "an answered request's time, its body's first "
                                         "byte read to its answer made (the sum of its phases)", ["model"],
                                         buckets=_SECONDS, registry=r)
        self.texts = Counter("spanflow_texts", "texts answered", ["model"], registry=r)
        self.real_tokens = Counter("spanflow_real_tokens", "tokens of the texts answered, padding left out (NER: of "
                                   "their windows)", ["model"], registry=r)
        self.padding = Gauge("spanflow_padding_efficiency", "real / padded tokens, cumulative", ["model"],
                             registry=r)
        self.gpu_memory = Gauge("spanflow_accelerator_memory_bytes", "CUDA memory allocated",
                                registry=r) if accelerator else None
        self.gpu_util = Gauge("spanflow_accelerator_utilization", "NVML GPU utilization, percent (0-100)",
                              registry=r) if accelerator else None
        self.backend = Gauge("spanflow_backend", "1 for what runs each model's batches now: eager, compile, or "
                             "compiling (a compile running aside while batches run eager)", ["model", "backend"],
                             registry=r)
        self._real: dict[str, int] = {}
        self._padded: dict[str, int] = {}
        self._phases: dict[tuple[str, str], object] = {}
        self.thread_cpu = Gauge("spanflow_thread_cpu_seconds", "CPU time of the server's threads since start, by "
                                "role: event_loop (HTTP, JSON, small requests' tokenizing), io (large requests'), "
                                "model (the thread that runs batches), compile (a compile aside, at start), native "
                                "(threads Python did not start: the OpenMP workers of the model's ops), other (any "
                                "thread else, such as a library's)", ["thread"], registry=r)

    def phase_of(self, model: str, phase: str):
        """The phase histogram's child for a model and phase, looked up once."""
        key = (model, phase)
        child = self._phases.get(key)
        if child is None:
            child = self._phases[key] = self.phase.labels(model, phase)
        return child

    def served(self, model: str, seconds: float, texts: int, tokens: int) -> None:
        """One answered request of `texts` texts, `tokens` real tokens, `seconds` long."""
        self.request_seconds.labels(model).observe(seconds)
        self.texts.labels(model).inc(texts)
        self.real_tokens.labels(model).inc(tokens)

    def batch_observer(self, model: str):
        def observe(lengths: list[int], seconds: float, waits: list[float]) -> None:
            self.batch_size.labels(model).observe(len(lengths))
            padded = round_up(max(lengths), SERVE_PAD_MULTIPLE) * len(lengths)  # as run_batch pads
            self.batch_tokens.labels(model).observe(padded)
            self.compute.labels(model).observe(seconds)
            for w in waits:
                self.queue_wait.labels(model).observe(max(0.0, w))
            self._real[model] = self._real.get(model, 0) + sum(lengths)
            self._padded[model] = self._padded.get(model, 0) + padded
            self.padding.labels(model).set(self._real[model] / self._padded[model])
        return observe

    def set_backend(self, model: str, backend: str) -> None:
        """Mark `backend` as what runs `model` now (the others it can be at 0)."""
        for b in ("eager", "compile", "compiling"):
            self.backend.labels(model, b).set(1 if b == backend else 0)

    def render(self) -> bytes:
        for role, seconds in thread_cpu().items():
            self.thread_cpu.labels(role).set(round(seconds, 3))
        return generate_latest(self.registry)


_ROLES = (("MainThread", "event_loop"), ("spanflow-io", "io"), ("spanflow-model", "model"),
          ("spanflow-compile", "compile"))


# (native thread id, start time) -> (role, CPU seconds last read): a thread that ended keeps its seconds,
# so a role's total never falls (a compile's read 5.6 s, then 0.1 once its thread was gone)
_SEEN: dict[tuple[int, str], tuple[str, float]] = {}


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads since it started, by role, those that ended included
    (Linux: /proc; elsewhere empty)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    ended = ended_cpu()
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        key = (int(tid), fields[19])  # with its start time: a new thread may take an ended one's id
        name = names.get(key[0]) or ended.get(key[0], (None,))[0]
        # a Python thread that has just ended (or not yet begun) is in /proc unnamed: its named role holds
        role = _SEEN[key][0] if name is None and key in _SEEN else _role(name)
        _SEEN[key] = (role, (int(fields[11]) + int(fields[12])) / tick)  # utime + stime
    out: dict[str, float] = {}
    for (tid, _), (role, seconds) in _SEEN.items():
        said = ended.pop(tid, (None, 0.0))[1]
        out[role] = out.get(role, 0.0) + max(seconds, said)  # what it said as it ended, where more
    for name, seconds in ended.values():  # ended before any scrape saw it
        role = _role(name)
        out[role] = out.get(role, 0.0) + seconds
    return out


def _role(name: str | None) -> str:
    """A thread's role by its name (None: a thread Python did not start)."""
    return "native" if name is None else next((r for p, r in _ROLES if name.startswith(p)), "other")
