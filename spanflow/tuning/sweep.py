"""Sweep token budgets (and max lengths), survive out-of-memory, pick the best point."""
from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

log = logging.getLogger("spanflow")


@dataclass
class Point:
    """One measured configuration; names are the profile.json contract."""

    max_tokens: int
    max_length: int
    real_tokens_per_s: float | None = None
    padded_tokens_per_s: float | None = None
    padding_efficiency: float | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    peak_memory_bytes: int | None = None
    gpu_util: float | None = None
    quality: float | None = None
    oom: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def geometric(lo: int, hi: int, factor: float = 2.0) -> list[int]:
    out, b = [], lo
    while b <= hi:
        out.append(int(b))
        b *= factor
    return out


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sweep(measure: Callable[[int, int], dict], budgets: list[int], max_lengths: list[int],
          log_fn: Callable[[str], None] = print) -> list[Point]:
    """Measure every (budget, max length), budgets ascending. An out-of-memory point is
    recorded, memory freed, and the larger budgets at that length are skipped (they would
    fail too); the sweep goes on with the next length."""
    points = []
    for L in max_lengths:
        for b in sorted(budgets):
            if b < L:
                continue  # one full-length sequence must fit in a batch
            try:
                figures = measure(b, L)
                p = Point(b, L, **{k: v for k, v in figures.items() if k in Point.__dataclass_fields__})
            except Exception as e:  # noqa: BLE001 - only OOM is survivable, the rest re-raises
                if not is_oom(e):
                    raise
                _free()
                points.append(Point(b, L, oom=True))
                log_fn(f"max_tokens {b}, max_length {L}: out of memory; skipping larger budgets")
                break
            points.append(p)
            log_fn(f"max_tokens {b:>6}, max_length {L:>4}: {p.real_tokens_per_s:9.0f} real tok/s, "
                   f"p95 {p.latency_p95_ms:7.1f} ms, peak {p.peak_memory_bytes / 2**20:7.0f} MiB"
                   + (f", quality {p.quality:.4f}" if p.quality is not None else ""))
    return points


def pick_best(points: list[Point], *, max_memory_bytes: int | None = None, latency_slo_ms: float | None = None,
              min_quality: float | None = None) -> Point | None:
    """Highest real tokens/s among points within the memory, latency and quality limits."""
    ok = [p for p in points if not p.oom
          and (max_memory_bytes is None or p.peak_memory_bytes <= max_memory_bytes)
          and (latency_slo_ms is None or p.latency_p95_ms <= latency_slo_ms)
          and (min_quality is None or p.quality is None or p.quality >= min_quality)]
    return max(ok, key=lambda p: p.real_tokens_per_s) if ok else None
