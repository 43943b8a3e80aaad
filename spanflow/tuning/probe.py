"""Timed probes: a few training or inference steps on given batches, measured the same way
as every long run (tokens/s, padding, latency percentiles, peak memory, utilization)."""
from __future__ import annotations

import gc
import time
from collections.abc import Callable

import numpy as np
import torch

from spanflow.inference.heap import release_freed
from spanflow.monitor.device import GpuUtilSampler, RssPeak, reset_peak_memory


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # timing needs the device finished; probes only, never the train loop


def _peak(device: torch.device, rss_peak: int) -> int:
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else rss_peak


def _release_free_memory() -> None:
    """Hand memory the allocator holds but no longer uses back to the OS, so a point's RSS
    shows what it uses, not what earlier points left cached."""
    gc.collect()
    release_freed()


def run_probe(step: Callable[[list], None], batches: list[list], lengths, *, device: torch.device,
              warmup: int = 2, max_steps: int = 10, max_seconds: float = 20.0,
              clock: Callable[[], float] = time.perf_counter, counted=None) -> dict:
    """Run `step(batch)` over batches (cycling), warm-up first; return the measured figures.

    `step` does one unit of work (a training step, or one inference batch) for a list of
    item indices. `max_seconds` counts the warm-up too (tune's time budget holds every second of
    a run), and at least two steps are measured whatever it is. `clock` times the steps and the
    run (tune gives its budget's clock, so that a run and the budget read the same time).
    `counted` (parallel to `lengths`, default `lengths`) gives the tokens each item adds to the
    sample's: real tokens/s is the items' tokens/s times their share of the whole sample's (an
    overlapping window's repeated tokens are work, not speed), a share taken over the whole
    sample, as the batches timed are a part of it (inference's: the longest first).
    """
    own = 1.0 if counted is None else sum(counted) / max(1, sum(lengths))
    batches = [b for b in batches if b]
    if not batches:
        raise ValueError("no batches to probe")
    t_start = clock()
    for k in range(warmup):
        step(batches[k % len(batches)])
    _sync(device)
    if device.type == "cpu":
        _release_free_memory()
    reset_peak_memory(device)
    gpu = GpuUtilSampler(device, interval_s=0.05)
    rss = RssPeak(interval_s=0.005) if device.type == "cpu" else None
    lat, real, padded = [], 0, 0
    k = 0
    try:
        while k < max_steps and (k < 2 or clock() - t_start < max_seconds):
            b = batches[(warmup + k) % len(batches)]
            t = clock()
            step(b)
            _sync(device)
            lat.append(clock() - t)
            ls = [lengths[i] for i in b]
            real += sum(ls)
            padded += max(ls) * len(ls)
            k += 1
    finally:
        util = gpu.take()
        gpu.close()
        rss_peak = rss.close() if rss else 0
    wall = sum(lat)
    return {"real_tokens_per_s": own * real / wall, "padded_tokens_per_s": padded / wall,
            "padding_efficiency": real / padded, "latency_p50_ms": float(np.percentile(lat, 50) * 1e3),
            "latency_p95_ms": float(np.percentile(lat, 95) * 1e3), "peak_memory_bytes": _peak(device, rss_peak),
            "gpu_util": util, "steps": k, "texts_per_step": sum(len(batches[(warmup + j) % len(batches)])
                                                                for j in range(k)) / k}
