"""Open-loop overload test of `spanflow serve` on loopback.

Measures the server's capacity (closed loop, 32 clients), then offers requests at a fixed
rate in three phases: half the capacity, `--factor` times the capacity for `--seconds`,
then half the capacity again. Reports per phase what was served, what was refused with
429 (and how fast), 5xx, latency of the served requests, the server's peak RSS and queued
tokens, and how long after the overload the first 429-free second came.

    python bench/overload_test.py --model MINILM_DIR --data ../shared/data/stsb/stsb-en-dev.csv
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, write_results  # noqa: E402
from load_test import free_port, level, start_server  # noqa: E402


async def offer(port: int, texts: list[str], phases: list[tuple[str, float, float]], per_request: int,
                server_pid: int) -> tuple[list, list]:
    """Send requests at each phase's rate (requests/s) for its duration, whatever the
    answers; sample the server's RSS and queued tokens every 0.25 s."""
    import aiohttp
    import psutil

    proc, rng = psutil.Process(server_pid), random.Random(0)
    url = f"http://127.0.0.1:{port}/v1/embeddings"
    records, samples, tasks = [], [], []
    t_start = time.perf_counter()

    async def one(session, phase):
        t = time.perf_counter()
        try:
            async with session.post(url, json={"input": [rng.choice(texts) for _ in range(per_request)]}) as r:
                await r.read()
                code = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            code = f"conn:{type(e).__name__}"  # no HTTP answer
        records.append((phase, t - t_start, time.perf_counter() - t, code))

    async def sample(session, stop):
        while not stop.is_set():
            try:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                    m = re.search(r'^spanflow_queue_tokens\{[^}]*\} (\S+)$', await r.text(), re.M)
                queued = float(m.group(1)) if m else None
            except aiohttp.ClientError:
                queued = None
            samples.append((time.perf_counter() - t_start, proc.memory_info().rss, queued))
            await asyncio.sleep(0.25)

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(session, stop))
        for phase, rate, seconds in phases:
            t0, k = time.perf_counter(), 0
            while (now := time.perf_counter()) - t0 < seconds:
                due = t0 + k / rate  # open loop: the schedule does not wait for answers
                if due > now:
                    await asyncio.sleep(due - now)
                tasks.append(asyncio.create_task(one(session, phase)))
                k += 1
        await asyncio.gather(*tasks)
        stop.set()
        await sampler
    return records, samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--data", required=True, help="CSV (first column) or text lines")
    ap.add_argument("--precision", default="auto", help="the server's --precision [%(default)s, as `spanflow serve`]")
    ap.add_argument("--texts-per-request", type=int, default=8)
    ap.add_argument("--factor", type=float, default=3.0, help="offered load during the overload, x capacity")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the overload")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    with open(a.data, encoding="utf-8", newline="") as f:
        texts = [r[0] for r in csv.reader(f) if r] if a.data.endswith(".csv") else f.read().splitlines()
    port = free_port()
    proc = start_server(a.model, port, ["--precision", a.precision])
    try:
        cap = asyncio.run(level(port, texts, 32, 3000 // a.texts_per_request, a.texts_per_request))["texts_per_s"]
        cap_rps = cap / a.texts_per_request
        phases = [("before", 0.5 * cap_rps, 5.0), ("overload", a.factor * cap_rps, a.seconds),
                  ("after", 0.5 * cap_rps, 10.0)]
        print(f"capacity {cap:.0f} texts/s; phases (name, requests/s, s): {phases}", flush=True)
        records, samples = asyncio.run(offer(port, texts, phases, a.texts_per_request, proc.pid))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    bounds, t = {}, 0.0
    for name, _, seconds in phases:
        bounds[name] = (t, t + seconds)
        t += seconds
    rows = []
    for name, rate, seconds in phases:
        rs = [r for r in records if r[0] == name]
        ok = [r[2] for r in rs if r[3] == 200]
        refused = [r[2] for r in rs if r[3] == 429]
        lo, hi = bounds[name]
        span = [s for s in samples if lo <= s[0] < hi or (name == "after" and s[0] >= lo)]
        rows.append({
            "phase": name, "seconds": seconds, "offered_texts_per_s": rate * a.texts_per_request,
            "served_texts_per_s": len(ok) * a.texts_per_request / seconds, "requests": len(rs),
            "ok_200": len(ok), "refused_429": len(refused),
            "errors_5xx": sum(1 for r in rs if isinstance(r[3], int) and r[3] >= 500),
            "errors_other": sum(1 for r in rs if r[3] not in (200, 429) and not (isinstance(r[3], int) and r[3] >= 500)),
            "p50_ms_200": float(np.percentile(ok, 50) * 1e3) if ok else None,
            "p99_ms_200": float(np.percentile(ok, 99) * 1e3) if ok else None,
            "p50_ms_429": float(np.percentile(refused, 50) * 1e3) if refused else None,
            "peak_rss_mib": max(s[1] for s in span) / 2**20 if span else None,
            "peak_queue_tokens": max((s[2] for s in span if s[2] is not None), default=None),
        })
    (o_lo, o_hi), over_end = bounds["overload"], bounds["overload"][1]
    late = [r[1] - over_end for r in records if r[0] == "after" and r[3] == 429]
    after_ok = sorted((r[1] - over_end, r[2]) for r in records if r[0] == "after" and r[3] == 200)
    normal = max(2 * rows[0]["p99_ms_200"] / 1e3, 0.25)  # back to normal: within twice the p99 before
    slow = [t_ for t_, lat in after_ok if lat > normal]
    rss = [(s[0], s[1] / 2**20) for s in samples]
    recovery = {
        "last_429_after_overload_s": round(max(late), 2) if late else None,
        "latency_normal_for_requests_sent_after_s": round(max(slow), 2) if slow else 0.0,
        "rss_mib_before": round(max(m for t_, m in rss if t_ < o_lo), 1),
        "rss_mib_peak_overload_first_half": round(max(m for t_, m in rss if o_lo <= t_ < (o_lo + o_hi) / 2), 1),
        "rss_mib_peak_overload_second_half": round(max(m for t_, m in rss if (o_lo + o_hi) / 2 <= t_ < o_hi), 1),
        "rss_mib_end": round(rss[-1][1], 1),
        # the server's RSS every 5 s (peak of the samples in each)
        "rss_mib_every_5s": [round(max((m for t_, m in rss if k <= t_ < k + 5), default=0.0), 1)
                             for k in range(0, int(rss[-1][0]) + 1, 5)]}
    print(recovery)
    # per-second view around the end of the overload: when did latency come back?
    timeline = []
    for sec in range(int(-3), int(bounds["after"][1] - over_end) + 1):
        rs = [r for r in records if sec <= r[1] - over_end < sec + 1]
        ok = [r[2] for r in rs if r[3] == 200]
        timeline.append({"second_after_overload": sec, "sent": len(rs), "ok": len(ok),
                         "refused": sum(1 for r in rs if r[3] == 429),
                         "p50_ms_200": round(float(np.median(ok)) * 1e3, 1) if ok else None})
        print(timeline[-1])
    recovery["timeline"] = timeline
    recovery["errors_other_codes"] = sorted({str(r[3]) for r in records if r[3] not in (200, 429)})
    write_results(a.out, "overload_test", {
        "description": f"open loop, {a.texts_per_request} texts per request, capacity {cap:.0f} texts/s measured "
                       f"closed-loop at concurrency 32; overload {a.factor}x capacity for {a.seconds:.0f} s between "
                       f"two phases at half capacity; model {a.model}, precision {a.precision}, default limits; "
                       f"loopback, the load generator shares the CPU. Recovery: {recovery}",
        "capacity_texts_per_s": cap, "recovery": recovery}, rows,
        ["phase", "seconds", "offered_texts_per_s", "served_texts_per_s", "requests", "ok_200", "refused_429",
         "errors_5xx", "errors_other", "p50_ms_200", "p99_ms_200", "p50_ms_429", "peak_rss_mib",
         "peak_queue_tokens"])


if __name__ == "__main__":
    main()
