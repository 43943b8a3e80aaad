"""`spanflow serve` against Infinity (infinity-emb), an embedding server, on the same model and machine.

Each server serves one sentence-transformers directory on loopback, alone on the machine: it is
started, timed to ready (and, for spanflow, to its compile done: the load starts then, in the
steady state of both), loaded by the same closed-loop clients (bench/load_test's keep-alive
connections), then stopped; the servers take turns, in reversed order every other repeat.
Every text is sent once per server run (no result cache can answer). Configurations: each
server at its defaults (spanflow: --precision auto; Infinity: its torch engine, fp32 on a CPU,
batch size 32), and both in the other's precision, so that like is compared with like.
Each configuration's vectors are compared with Infinity's fp32 ones (sentence-transformers)
for the same texts: cosine mean and minimum.

Infinity pins numpy<2, so it lives in an environment of its own:

    python -m venv inf && inf/bin/pip install torch==2.13.0 "infinity-emb[server,torch]"
    python bench/embed_server_vs_infinity.py --infinity inf/bin/infinity_emb \\
        --data ../shared/data/stsb/stsb-en-train.csv
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, model_name, write_results  # noqa: E402
from load_test import Connection, free_port  # noqa: E402

# (name, server, its flags): each server's defaults first, then the other precision
CONFIGS = [
    ("spanflow, defaults (--precision auto)", "spanflow", []),
    ("spanflow, --precision fp32", "spanflow", ["--precision", "fp32"]),
    ("infinity, defaults (fp32 on CPU)", "infinity", []),
    ("infinity, --dtype bfloat16", "infinity", ["--dtype", "bfloat16"]),
]
# (clients, texts per request): single texts from many clients, and a few bulk clients
LEVELS = [(1, 1), (8, 1), (32, 1), (4, 32)]


def start(server: str, flags: list[str], model: str, port: int, infinity: str) -> tuple[subprocess.Popen, float, float]:
    """The server, ready: (process, seconds from launch to its first answered readiness probe, and
    to its steady state: spanflow's compile, which runs aside once it is ready, done)."""
    if server == "spanflow":
        cmd = [sys.executable, "-m", "spanflow", "serve", "--model", f"emb={model}", "--port", str(port), *flags]
        probe, env = f"http://127.0.0.1:{port}/ready", None
    else:  # no result cache, so that only the model's work is measured; no telemetry
        cmd = [infinity, "v2", "--model-id", model, "--served-model-name", "emb", "--port", str(port),
               "--host", "127.0.0.1", "--no-vector-disk-cache", *flags]
        probe, env = f"http://127.0.0.1:{port}/health", dict(os.environ, DO_NOT_TRACK="1")
    t = time.perf_counter()
    err = tempfile.TemporaryFile()  # a file, not a pipe: a server that logs much never blocks on it
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    wait_answered(proc, probe, err)
    ready = time.perf_counter() - t
    return proc, ready, steady(server, probe, t) or ready


def wait_answered(proc: subprocess.Popen, probe: str, err, *, poll: float = 0.1, deadline: float = 300.0) -> None:
    """Until `probe` answers 200; the server's stderr (`err`, a file) as the error where it exits
    first, and killed where it does not answer by `deadline` seconds."""
    import httpx

    t = time.perf_counter()
    while time.perf_counter() - t < deadline:
        try:
            if httpx.get(probe, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            err.seek(0)
            raise RuntimeError(err.read().decode()[-2000:])
        time.sleep(poll)
    proc.kill()
    raise RuntimeError(f"{probe} did not answer in {deadline:g} s")


def steady(server: str, probe: str, t: float) -> float | None:
    """Seconds from launch until no model of a spanflow server is "compiling" (its /ready says)."""
    import httpx

    if server != "spanflow":
        return None
    while "compiling" in httpx.get(probe, timeout=5).json().get("backends", {}).values():
        time.sleep(0.1)
    return time.perf_counter() - t


def path_of(server: str) -> str:
    return "/v1/embeddings" if server == "spanflow" else "/embeddings"


async def load(port: int, path: str, texts: list[str], clients: int, per_request: int) -> dict:
    """`clients` keep-alive clients, each sending its next request when the last returns, until
    `texts` are all sent (`per_request` a request)."""
    bodies = iter([json.dumps({"input": texts[i:i + per_request], "model": "emb"}).encode()
                   for i in range(0, len(texts), per_request)])
    lat, bad = [], 0

    async def client():
        nonlocal bad
        conn = Connection(port)
        try:
            for body in bodies:
                t = time.perf_counter()
                code, _ = await asyncio.wait_for(conn.post(path, body), 120)
                lat.append(time.perf_counter() - t)
                bad += code != 200
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(clients)])
    wall = time.perf_counter() - t0
    return {"texts_per_s": len(texts) / wall, "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p95_ms": float(np.percentile(lat, 95) * 1e3), "errors": bad}


def vectors(port: int, path: str, texts: list[str]) -> np.ndarray:
    import httpx

    out = []
    for i in range(0, len(texts), 32):
        r = httpx.post(f"http://127.0.0.1:{port}{path}", json={"input": texts[i:i + 32], "model": "emb"},
                       timeout=120)
        r.raise_for_status()
        out += [d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])]
    v = np.asarray(out, dtype=np.float64)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def peer_versions(infinity: str) -> dict:
    """The versions of Infinity and of what it runs on, asked of its own environment's Python."""
    python = os.path.join(os.path.dirname(infinity), "python")
    code = ("import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
            "('infinity_emb', 'torch', 'transformers', 'sentence-transformers', 'numpy')}))")
    got = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return json.loads(got.stdout) if got.returncode == 0 else {"error": got.stderr.strip()[-200:]}


def read_texts(paths: list[str]) -> list[str]:
    """Distinct texts in file order: a CSV's first two columns (sentence pairs) or text lines."""
    seen: dict[str, None] = {}
    for p in paths:
        with open(p, encoding="utf-8", newline="") as f:
            if p.endswith(".csv"):
                for row in csv.reader(f):
                    for t in row[:2]:
                        seen.setdefault(t.strip(), None)
            else:
                for t in f.read().splitlines():
                    seen.setdefault(t.strip(), None)
    seen.pop("", None)
    return list(seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--infinity", required=True, help="the infinity_emb executable (its own environment)")
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--data", required=True, nargs="+", help="CSV (sentence pairs) or text lines")
    ap.add_argument("--texts", type=int, default=960, help="texts per level and run [%(default)s]")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration; medians are reported")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="embed_server_vs_infinity")
    a = ap.parse_args()
    model = os.path.abspath(a.model)
    texts = read_texts(a.data)
    sample, pool = texts[:256], texts[256:]
    need = a.texts * len(LEVELS)
    if len(pool) < need:
        sys.exit(f"need {need + 256} distinct texts, the data has {len(texts)}")
    rng = np.random.default_rng(0)
    runs: dict = {}
    ref = None
    for rep in range(a.repeats):
        order = CONFIGS if rep % 2 == 0 else CONFIGS[::-1]
        picked = rng.permutation(len(pool))[:need]  # one draw a repeat: every configuration gets the same texts
        for name, server, flags in order:
            port = free_port()
            proc, ready, settled = start(server, flags, model, port, a.infinity)
            try:
                path = path_of(server)
                seen = vectors(port, path, sample)  # also warms the server up
                if rep == 0 and name.startswith("infinity, defaults"):
                    ref = seen
                runs.setdefault((name, "ready"), []).append(ready)
                runs.setdefault((name, "steady"), []).append(settled)
                runs.setdefault((name, "vectors"), []).append(seen)
                for k, (clients, per) in enumerate(LEVELS):
                    chunk = [pool[i] for i in picked[k * a.texts:(k + 1) * a.texts]]
                    r = asyncio.run(load(port, path, chunk, clients, per))
                    runs.setdefault((name, clients, per), []).append(r)
                    print(name, rep, clients, per, {k2: round(v, 1) for k2, v in r.items()}, flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    rows = []
    for name, server, flags in CONFIGS:
        cos = np.sum(runs[(name, "vectors")][0] * ref, axis=1)
        base = {"config": name, "ready_s": float(np.median(runs[(name, "ready")])),
                "steady_s": float(np.median(runs[(name, "steady")])),
                "cosine_vs_fp32_mean": float(cos.mean()), "cosine_vs_fp32_min": float(cos.min())}
        for clients, per in LEVELS:
            rs = runs[(name, clients, per)]
            rows.append({**base, "clients": clients, "texts_per_request": per,
                         **{k: float(np.median([r[k] for r in rs])) for k in ("texts_per_s", "p50_ms", "p95_ms")},
                         "errors": sum(r["errors"] for r in rs),
                         "texts_per_s_runs": [round(r["texts_per_s"], 1) for r in rs]})
    top = {(r["clients"], r["texts_per_request"]): r["texts_per_s"] for r in rows
           if r["config"].startswith("infinity, defaults")}
    for r in rows:
        r["ratio_vs_infinity_defaults"] = r["texts_per_s"] / top[(r["clients"], r["texts_per_request"])]
    write_results(a.out, a.name, {
        "description": f"model {model_name(a.model)}, loopback, {a.texts} distinct texts per level "
                       f"and run, medians of {a.repeats} runs; one server at a time, the order reversed every "
                       "other repeat; ready_s: launch to the first answered readiness probe (spanflow /ready, "
                       "Infinity /health, after its own warm-up); steady_s: launch to spanflow's compile done "
                       "(it runs aside once the server is ready; the load starts then), Infinity's ready_s; cosine_vs_fp32: each configuration's vectors "
                       "for 256 texts against Infinity's fp32 ones; Infinity runs without its vector disk cache; "
                       "the load generator shares the CPU",
        "infinity_environment": peer_versions(a.infinity), "spanflow_version": metadata.version("spanflow")},
        rows, ["config", "clients", "texts_per_request", "texts_per_s", "ratio_vs_infinity_defaults", "p50_ms",
               "p95_ms", "errors", "ready_s", "steady_s", "cosine_vs_fp32_mean", "cosine_vs_fp32_min", "texts_per_s_runs"])


if __name__ == "__main__":
    main()
