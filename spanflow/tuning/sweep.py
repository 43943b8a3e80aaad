"""Sweep token budgets (and max lengths), survive out-of-memory, pick the best point."""
from __future__ import annotations

import gc
import logging
import statistics
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
    real_tokens_per_s_runs: list[float] | None = None  # one per repeat; the figures above are medians
    spread: float | None = None  # (max - min) / median of the runs' real tokens/s

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
          log_fn: Callable[[str], None] = print, repeats: int = 2) -> list[Point]:
    """Measure every (budget, max length) `repeats` times, the grid in alternating order (forward,
    backward, ...): a point measured late in one pass is measured early in the next, so with an
    even number of repeats a steady drift (caches warming, the machine's load) favours no point.
    Each point reports medians and the spread of its runs. An out-of-memory point is
    recorded, memory freed, and the larger budgets at that length are skipped."""
    grid = [(b, L) for L in max_lengths for b in sorted(budgets) if b >= L]  # one full sequence must fit
    runs: dict[tuple[int, int], list[dict]] = {g: [] for g in grid}
    oom: set[tuple[int, int]] = set()
    for r in range(max(1, repeats)):
        for b, L in (grid if r % 2 == 0 else grid[::-1]):
            if any(L == L2 and b >= b2 for b2, L2 in oom):
                continue
            try:
                runs[(b, L)].append(measure(b, L))
            except Exception as e:  # noqa: BLE001 - only OOM is survivable, the rest re-raises
                if not is_oom(e):
                    raise
                _free()
                oom.add((b, L))
                log_fn(f"max_tokens {b}, max_length {L}: out of memory; skipping larger budgets")
    points = []
    for b, L in grid:
        if (b, L) in oom or not runs[(b, L)]:
            if (b, L) in oom:
                points.append(Point(b, L, oom=True))
            continue
        p = _median_point(b, L, runs[(b, L)])
        points.append(p)
        log_fn(f"max_tokens {b:>6}, max_length {L:>4}: {p.real_tokens_per_s:9.0f} real tok/s "
               f"(spread {p.spread:.0%} over {len(p.real_tokens_per_s_runs)} runs), p95 {p.latency_p95_ms:7.1f} ms, "
               f"peak {p.peak_memory_bytes / 2**20:7.0f} MiB"
               + (f", quality {p.quality:.4f}" if p.quality is not None else ""))
    return points


def _median_point(b: int, L: int, runs: list[dict]) -> Point:
    """One point from its runs: medians of speed and latency, the largest memory peak."""
    def med(key):
        vals = [r[key] for r in runs if r.get(key) is not None]
        return float(statistics.median(vals)) if vals else None

    speeds = [r["real_tokens_per_s"] for r in runs]
    mid = statistics.median(speeds)
    return Point(b, L, real_tokens_per_s=mid, padded_tokens_per_s=med("padded_tokens_per_s"),
                 padding_efficiency=med("padding_efficiency"), latency_p50_ms=med("latency_p50_ms"),
                 latency_p95_ms=med("latency_p95_ms"),
                 peak_memory_bytes=max(r["peak_memory_bytes"] for r in runs), gpu_util=med("gpu_util"),
                 quality=runs[-1].get("quality"), real_tokens_per_s_runs=[round(s, 1) for s in speeds],
                 spread=(max(speeds) - min(speeds)) / mid if mid else 0.0)


QUALITY_TOLERANCE = 0.005  # a shorter max length may be picked for speed if it costs at most this much quality


def quality_floor(points: list[Point]) -> float | None:
    """The least quality the best point may have: the best measured, less QUALITY_TOLERANCE (None
    when no point measured quality, as in training)."""
    measured = [p.quality for p in points if p.quality is not None and not p.oom]
    return max(measured) - QUALITY_TOLERANCE if measured else None


def pick_best(points: list[Point], *, max_memory_bytes: int | None = None, latency_slo_ms: float | None = None,
              min_quality: float | None = None) -> Point | None:
    """Highest real tokens/s among points within the memory, latency and quality limits."""
    ok = [p for p in points if not p.oom
          and (max_memory_bytes is None or p.peak_memory_bytes <= max_memory_bytes)
          and (latency_slo_ms is None or p.latency_p95_ms <= latency_slo_ms)
          and (min_quality is None or p.quality is None or p.quality >= min_quality)]
    return max(ok, key=lambda p: p.real_tokens_per_s) if ok else None
