"""Sweep token budgets (and max lengths), survive out-of-memory, pick the best point."""
from __future__ import annotations

import gc
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from spanflow.errors import counted

log = logging.getLogger("spanflow")


@dataclass
class Point:
    """One measured configuration; names are the profile.json contract."""

    max_tokens: int
    max_length: int
    real_tokens_per_s: float | None = None  # the sample's tokens, each once however many windows hold it
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


STEPS_AT_LEAST = 4  # the steps of the shortest run of a point: the probe's warm-up and its least measured steps


def sweep(measure: Callable[[int, int], dict], budgets: list[int], max_lengths: list[int],
          log_fn: Callable[[str], None] = print, repeats: int = 2, deadline: float | None = None,
          per_run: float = 0.0, clock: Callable[[], float] = time.monotonic) -> list[Point]:
    """Measure every (budget, max length) `repeats` times, the grid in alternating order (forward,
    backward, ...): a point measured late in one pass is measured early in the next, so with an
    even number of repeats a steady drift (caches warming, the machine's load) favours no point.
    Each point reports medians and the spread of its runs. An out-of-memory point is
    recorded, memory freed, and the larger budgets at that length are skipped.

    With a `deadline` (a `clock()` time), a run whose steps would end past it is left out, said in
    one line: a run takes `per_run` seconds or its STEPS_AT_LEAST steps, whichever is longer, a
    step as long as measured before at that point or, scaled by the budget, at a smaller one. The
    smallest budget of each length is measured once whatever the time, so there is a profile."""
    grid = [(b, L) for L in max_lengths for b in sorted(budgets) if b >= L]  # one full sequence must fit
    runs: dict[tuple[int, int], list[dict]] = {g: [] for g in grid}
    oom: set[tuple[int, int]] = set()
    late: set[tuple[int, int]] = set()  # not measured in the first pass for want of time
    for r in range(max(1, repeats)):
        for b, L in (grid if r % 2 == 0 else grid[::-1]):
            if any(L == L2 and b >= b2 for b2, L2 in oom | late):
                continue
            if deadline is not None and not _fits(b, L, runs, deadline, per_run, clock):
                if r == 0:
                    late.add((b, L))
                continue
            try:
                runs[(b, L)].append(measure(b, L))
            except Exception as e:  # noqa: BLE001 - only OOM is survivable, the rest re-raises
                if not is_oom(e):
                    raise
                _free()
                oom.add((b, L))
                log_fn(f"max_tokens {b}, max_length {L}: out of memory; skipping larger budgets")
    if deadline is not None:
        _say_left_out(grid, runs, oom, max(1, repeats), log_fn)
    return _points(grid, runs, oom, log_fn)


def _fits(b: int, L: int, runs: dict, deadline: float, per_run: float, clock: Callable[[], float]) -> bool:
    """Whether a run of (b, L) ends before `deadline`; always for the first run at a length."""
    done = [(b2, r) for (b2, L2), rs in runs.items() if L2 == L and b2 <= b for r in rs]
    if not done:
        return True
    b2, last = max(done, key=lambda x: x[0])  # this point's own earlier run, else the largest smaller budget
    step_s = (last.get("latency_p50_ms") or 0.0) / 1e3 * b / b2
    return clock() + max(per_run, STEPS_AT_LEAST * step_s) <= deadline


def _say_left_out(grid: list, runs: dict, oom: set, repeats: int, log_fn: Callable[[str], None]) -> None:
    """One line naming the points the time budget left unmeasured, and how many ran fewer repeats."""
    lengths = {L for _, L in grid}
    never = [f"{b}" if len(lengths) == 1 else f"{b} at max_length {L}" for b, L in grid
             if not runs[(b, L)] and not any(L == L2 and b >= b2 for b2, L2 in oom)]
    fewer = sum(0 < len(runs[g]) < repeats for g in grid)
    if not never and not fewer:
        return
    said = [f"max_tokens {', '.join(never)} not measured"] if never else []
    said += [f"{fewer} point{'s' if fewer > 1 else ''} measured fewer than {repeats} times"] if fewer else []
    log_fn(f"out of --budget-seconds: {'; '.join(said)} (a larger --budget-seconds measures them)")


def _points(grid: list, runs: dict, oom: set, log_fn: Callable[[str], None]) -> list[Point]:
    points = []
    for b, L in grid:
        if (b, L) in oom or not runs[(b, L)]:
            if (b, L) in oom:
                points.append(Point(b, L, oom=True))
            continue
        p = _median_point(b, L, runs[(b, L)])
        points.append(p)
        log_fn(f"max_tokens {b:>6}, max_length {L:>4}: {p.real_tokens_per_s:9.0f} real tok/s "
               + (f"(spread {p.spread:.0%} over {counted(len(p.real_tokens_per_s_runs), 'run')})" if p.spread is not None
                  else "(1 run: no spread)") + f", p95 {p.latency_p95_ms:7.1f} ms, "
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
                 spread=((max(speeds) - min(speeds)) / mid if mid else 0.0) if len(speeds) > 1 else None)


QUALITY_TOLERANCE = 0.005  # a shorter max length may be picked for speed if it costs at most this much quality


def quality_floor(points: list[Point]) -> float | None:
    """The least quality the best point may have: the best measured, less QUALITY_TOLERANCE (None
    when no point measured quality, as in training)."""
    measured = [p.quality for p in points if p.quality is not None and not p.oom]
    return max(measured) - QUALITY_TOLERANCE if measured else None


def eligible(points: list[Point], *, max_memory_bytes: int | None = None, latency_slo_ms: float | None = None,
             min_quality: float | None = None) -> list[Point]:
    """The points within the memory, latency and quality limits."""
    return [p for p in points if not p.oom
            and (max_memory_bytes is None or p.peak_memory_bytes <= max_memory_bytes)
            and (latency_slo_ms is None or p.latency_p95_ms <= latency_slo_ms)
            and (min_quality is None or p.quality is None or p.quality >= min_quality)]


def pick_best(points: list[Point], *, max_memory_bytes: int | None = None, latency_slo_ms: float | None = None,
              min_quality: float | None = None) -> Point | None:
    """Highest real tokens/s among points within the memory, latency and quality limits."""
    ok = eligible(points, max_memory_bytes=max_memory_bytes, latency_slo_ms=latency_slo_ms, min_quality=min_quality)
    return max(ok, key=lambda p: p.real_tokens_per_s) if ok else None


def within_noise(best: Point, points: list[Point]) -> list[Point]:
    """The other points a sweep with these figures does not tell from the best: where both were run
    more than once, those whose fastest run reaches the best's slowest (a spread alone named a point
    of runs 16765 and 9329 tokens/s beside a best of 27297 and 23755: a spread of 57% reached it);
    else those within the spread of their runs or the best's."""
    def runs(p: Point) -> list[float]:
        return p.real_tokens_per_s_runs if p.real_tokens_per_s_runs and len(p.real_tokens_per_s_runs) > 1 else []

    def near(p: Point) -> bool:
        if runs(p) and runs(best):
            return max(runs(p)) >= min(runs(best))
        return p.real_tokens_per_s >= best.real_tokens_per_s * (1 - max(best.spread or 0.0, p.spread or 0.0))

    return [p for p in points if p is not best and p.real_tokens_per_s is not None and near(p)]
