"""What clients see in a server's first seconds: `spanflow serve` with `--backend auto` (ready
once eager, the compile aside) against `--backend eager`, under load from the first ready.

Each run launches one server on loopback, alone on the machine, and polls /ready; from its
first answer, closed-loop clients (one text a request, bench/load_test's keep-alive
connections) send distinct texts until `--seconds` after launch, while /ready is polled for the
compile's end. Reported per backend, medians over the runs (the two backends take turns, the
order reversed every other repeat): seconds to ready and to compiled, texts answered by 10 s
and by `--seconds` s after launch (answered_by_end), texts/s and p50 latency while the compile runs (auto) or over
the same seconds (eager), and after it.

    python bench/serve_startup.py --data ../shared/data/stsb/stsb-en-train.csv ../shared/data/stsb/stsb-en-dev.csv
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, median, model_name, write_results  # noqa: E402
from embed_server_vs_infinity import read_texts, wait_answered  # noqa: E402
from load_test import Connection, free_port  # noqa: E402

BACKENDS = ("auto", "eager")


def launch(model: str, backend: str, port: int) -> tuple[subprocess.Popen, float, object]:
    """The server and the perf_counter() of its launch (its stderr kept in a file)."""
    err = tempfile.TemporaryFile()
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "spanflow", "serve", "--model", f"emb={model}", "--port", str(port),
                             "--backend", backend], stdout=subprocess.DEVNULL, stderr=err)
    return proc, t, err


async def run_load(port: int, texts, clients: int, launched: float, until: float) -> tuple[list, float | None]:
    """Closed-loop clients until `until` s after launch; ([(answered at, latency)], compiled at), both
    in seconds after launch (compiled: when /ready first named no model "compiling"; None: never)."""
    done: list[tuple[float, float]] = []
    compiled: list[float] = []
    feed = iter(texts)

    async def client():
        conn = Connection(port)
        try:
            for text in feed:
                if time.perf_counter() - launched >= until:
                    return
                t = time.perf_counter()
                code, _ = await conn.post("/v1/embeddings", json.dumps({"input": [text], "model": "emb"}).encode())
                if code != 200:
                    raise RuntimeError(f"status {code}")
                done.append((time.perf_counter() - launched, time.perf_counter() - t))
        finally:
            conn.close()

    async def watch():
        import httpx

        url = f"http://127.0.0.1:{port}/ready"
        while time.perf_counter() - launched < until:
            body = (await asyncio.to_thread(httpx.get, url, timeout=5)).json()
            if "compiling" not in body.get("backends", {}).values():
                compiled.append(time.perf_counter() - launched)
                return
            await asyncio.sleep(0.1)

    await asyncio.gather(watch(), *[client() for _ in range(clients)])
    return done, compiled[0] if compiled else None


def summarise(done: list, ready: float, window_end: float, until: float) -> dict:
    """Texts answered by 10 s and by `until`; texts/s and p50 from ready to `window_end`, and after."""
    at = np.array([a for a, _ in done])
    lat = np.array([x for _, x in done])
    window = (at >= ready) & (at < window_end)
    after = at >= window_end
    return {"ready_s": ready, "answered_by_10s": int((at < 10).sum()), "answered_by_end": len(done),
            "texts_per_s_window": float(window.sum() / max(1e-9, window_end - ready)),
            "p50_ms_window": float(np.median(lat[window]) * 1e3) if window.any() else None,
            "texts_per_s_after": float(after.sum() / max(1e-9, until - window_end)),
            "p50_ms_after": float(np.median(lat[after]) * 1e3) if after.any() else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--data", required=True, nargs="+", help="CSV (sentence pairs) or text lines")
    ap.add_argument("--clients", type=int, default=8, help="closed-loop clients, one text a request [%(default)s]")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds after launch the load runs to [%(default)s]")
    ap.add_argument("--repeats", type=int, default=3, help="runs per backend; medians are reported [%(default)s]")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="the backends to run [%(default)s]")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="serve_startup")
    a = ap.parse_args()
    model = os.path.abspath(a.model)
    texts = read_texts(a.data)
    backends = tuple(b for b in BACKENDS if b in a.backends.split(","))
    runs: dict[str, list[dict]] = {b: [] for b in backends}
    eager_window: list[tuple[float, float]] = []  # the auto runs' compile windows, for eager's like seconds
    for rep in range(a.repeats):
        for backend in (backends if rep % 2 == 0 else backends[::-1]):
            port = free_port()
            proc, launched, err = launch(model, backend, port)
            try:
                wait_answered(proc, f"http://127.0.0.1:{port}/ready", err, poll=0.02)
                ready = time.perf_counter() - launched
                # the same texts for both backends, as many times over as the load takes (no server caches)
                order = np.random.default_rng(rep).permutation(len(texts))
                feed = (texts[i] for _ in itertools.count() for i in order)
                done, compiled = asyncio.run(run_load(port, feed, a.clients, launched, a.seconds))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            runs[backend].append({"done": done, "ready": ready, "compiled": compiled})
            print(backend, rep, f"ready {ready:.1f} s", f"compiled {compiled}", f"{len(done)} texts", flush=True)
            if backend == "auto" and compiled is not None:
                eager_window.append((ready, compiled))
    # eager has no compile: its "window" is the auto runs' median one, so the seconds compared are alike
    window_end = median([c for _, c in eager_window]) if eager_window else a.seconds / 2
    rows = []
    for backend in backends:
        ends = [r["compiled"] if backend == "auto" and r["compiled"] is not None else window_end for r in runs[backend]]
        each = [summarise(r["done"], r["ready"], max(end, r["ready"] + 1e-3), a.seconds)
                for r, end in zip(runs[backend], ends)]
        row = {"backend": backend, "compiled_s": median([r["compiled"] for r in runs[backend]
                                                         if r["compiled"] is not None]) if backend == "auto" else None}
        for k in each[0]:
            vals = [e[k] for e in each if e[k] is not None]
            row[k] = float(median(vals)) if vals else None
        row["texts_per_s_window_runs"] = [round(e["texts_per_s_window"], 1) for e in each]
        rows.append(row)
    write_results(a.out, a.name, {
        "description": f"model {model_name(a.model)}, loopback, {a.clients} closed-loop clients of one text a "
                       f"request from the first ready /ready until {a.seconds:g} s after launch, medians of "
                       f"{a.repeats} runs per backend, the order reversed every other repeat; window: from ready "
                       "to the compile's end (auto; for eager the same seconds, up to auto's median compile end), "
                       "after: from then to the end; the load generator shares the CPU"},
        rows, ["backend", "ready_s", "compiled_s", "answered_by_10s", "answered_by_end", "texts_per_s_window",
               "p50_ms_window", "texts_per_s_after", "p50_ms_after", "texts_per_s_window_runs"])


if __name__ == "__main__":
    main()
