"""Closed-loop load test of `spanflow serve` on loopback: dynamic batching vs --no-batching.

Starts one server per mode with the same embedding model, all at once (batching on, --no-batching,
and --server-tree's batching server where given), and for each concurrency level runs a fixed
number of requests (one text each) from that many clients, the runs alternating between them.

    python bench/load_test.py --model MINILM_DIR --data ../shared/data/stsb/stsb-en-dev.csv
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, write_results  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, extra: list[str], tree: str | None = None) -> subprocess.Popen:
    """`spanflow serve` on loopback, ready and its compile done (it runs aside once the server is
    ready: measured before then, a run would time the compile); `tree`: another checkout's server
    (before/after)."""
    import httpx

    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree)) if tree else None
    proc = subprocess.Popen([sys.executable, "-m", "spanflow", "serve", "--model", f"emb={os.path.abspath(model)}",
                             "--port", str(port),
                             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            cwd=os.path.abspath(tree) if tree else None)  # -m imports from the working directory first
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1)
            if r.status_code == 200 and "compiling" not in r.json().get("backends", {}).values():
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode()[-2000:])
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not become ready")


def server_cpu(port: int) -> dict[str, float]:
    """The server's CPU seconds by thread role, from its /metrics (spanflow_thread_cpu_seconds)."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^spanflow_thread_cpu_seconds{thread="([^"]+)"} (\S+)$', text, re.MULTILINE)}


def measured_level(port: int, texts: list[str], concurrency: int, n_requests: int) -> dict:
    """level(), and where the CPU went: milliseconds per text in each of the server's thread
    roles and in this process (the load generator)."""
    before, mine = server_cpu(port), resource.getrusage(resource.RUSAGE_SELF)
    r = asyncio.run(level(port, texts, concurrency, n_requests))
    after, now = server_cpu(port), resource.getrusage(resource.RUSAGE_SELF)
    served = max(1, r["texts"])
    cpu = {k: (after[k] - before.get(k, 0.0)) * 1e3 / served for k in after}
    cpu["client"] = (now.ru_utime + now.ru_stime - mine.ru_utime - mine.ru_stime) * 1e3 / served
    r["cpu_ms_per_text"] = {k: round(v, 3) for k, v in sorted(cpu.items())}
    return r


class Connection:
    """One keep-alive HTTP/1.1 connection that posts JSON and reads whole responses: a load
    generator that costs the shared CPU a fraction of what a general client library does
    (cpu_ms_per_text "client" says how much)."""

    def __init__(self, port: int):
        self.port, self.reader, self.writer = port, None, None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
        if "content-length" not in headers:
            raise RuntimeError(f"a response without Content-Length: {lines[:4]}")
        payload = await self.reader.readexactly(int(headers["content-length"]))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def level(port: int, texts: list[str], concurrency: int, n_requests: int, per_request: int = 1) -> dict:
    """`concurrency` clients, each on its own keep-alive connection, sending its next request
    when the last one returns, until `n_requests` are done."""
    lat, status = [], {}
    todo = iter(range(n_requests))
    rng = random.Random(concurrency)

    async def client():
        conn = Connection(port)
        try:
            for _ in todo:  # the shared iterator bounds the total request count
                body = json.dumps({"input": [rng.choice(texts) for _ in range(per_request)]}).encode()
                t = time.perf_counter()
                try:
                    code, _ = await asyncio.wait_for(conn.post("/v1/embeddings", body), 60)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                        ValueError, RuntimeError):  # counted, and the next request opens a new connection
                    conn.close()
                    code = "conn"
                lat.append(time.perf_counter() - t)
                status[code] = status.get(code, 0) + 1
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(concurrency)])
    wall = time.perf_counter() - t0
    ok = status.get(200, 0)
    return {"concurrency": concurrency, "requests": n_requests, "texts": ok * per_request,
            "texts_per_s": ok * per_request / wall,
            "p50_ms": float(np.percentile(lat, 50) * 1e3), "p95_ms": float(np.percentile(lat, 95) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "errors_5xx": sum(v for k, v in status.items() if isinstance(k, int) and k >= 500),
            "errors_other": sum(v for k, v in status.items() if k != 200 and not (isinstance(k, int) and k >= 500))}


def offline_reference(model: str, texts: list[str], precision: str) -> dict:
    """The same model in this process, no HTTP: texts/s one text per call and in token-budget
    batches (medians of 3). Their ratio bounds what batching can gain on this machine."""
    from spanflow.tasks.embed import Embedder

    emb = Embedder.load(model, precision=precision)
    ids, _ = emb.tokenize(texts[:2000])  # tokenized ahead, as the server does before queueing
    emb._embed_ids(ids[:64], 4096)  # warm-up
    one, full = [], []
    for _ in range(3):
        t = time.perf_counter()
        for i in range(200):
            emb._forward(emb.module, ids, [i], True)  # what --no-batching runs per request
        one.append(200 / (time.perf_counter() - t))
        t = time.perf_counter()
        emb._embed_ids(ids, 4096)  # the server's default budget
        full.append(len(ids) / (time.perf_counter() - t))
    one_s, full_s = float(np.median(one)), float(np.median(full))
    return {"batch_1_texts_per_s": round(one_s, 1), "token_budget_texts_per_s": round(full_s, 1),
            "ceiling_ratio": round(full_s / one_s, 2)}


def first_layers(model: str, layers: int) -> str:
    """A copy of the encoder directory `model` that runs only its first `layers` layers (the
    weights are linked, not copied): a faster model of the same shapes, standing in for MiniLM
    in bf16 on a CPU that has it, where the server's own cost weighs more."""
    out = tempfile.mkdtemp(prefix=f"minilm-{layers}-layers-")
    for name in os.listdir(model):
        if name != "config.json":
            os.symlink(os.path.join(os.path.abspath(model), name), os.path.join(out, name))
    with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump({**config, "num_hidden_layers": layers}, f)
    return out


class Ceiling:
    """The ceiling a batching server has at each concurrency: the same model on the same backend
    as `spanflow serve` runs it (compiled) in this process, no HTTP, batches of `c` texts drawn
    as the clients draw them, run back to back through the server's own batch call. With `c`
    clients sending one text each, no batch can hold more than `c` texts. A reference, not a bound:
    it tokenizes and runs each batch in turn, where the server tokenizes the next requests while
    the model runs, so at low concurrency a server can pass it (1.7x at concurrency 1 in
    load_test_service_time.md). Measured right before each server run, so that the two share
    the machine's state (its speed moves by a third within an hour)."""

    def __init__(self, model: str, texts: list[str], precision: str, n: int = 600):
        from spanflow.inference.backend import use_backend
        from spanflow.runtime.threads import on_model_thread
        from spanflow.tasks.embed import Embedder

        def load():  # one thread loads and runs the model, as in the server
            emb = Embedder.load(model, precision=precision)
            use_backend(emb, "compile", log=lambda line: None)
            return emb, emb.units(random.Random(0).choices(texts, k=n))[0]

        self.emb, self.units = on_model_thread(load)

    def rate(self, c: int) -> float:
        from spanflow.runtime.threads import on_model_thread

        def run() -> float:
            t = time.perf_counter()
            for i in range(0, len(self.units), c):
                self.emb.run_batch(self.units[i:i + c])
            return len(self.units) / (time.perf_counter() - t)

        return on_model_thread(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--data", required=True, help="CSV (first column) or text lines")
    ap.add_argument("--levels", default="1,4,16,32,64")
    ap.add_argument("--requests", type=int, default=300, help="requests per concurrency level")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--max-wait-ms", default="2")
    ap.add_argument("--repeats", type=int, default=3, help="runs per level and mode; medians are reported")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="load_test", help="the results' file name [%(default)s]")
    ap.add_argument("--server-tree", default=None,
                    help="another checkout of spanflow: its batching server joins the alternation "
                         "(dynamic_batching_other_tree), for a before/after comparison in one run")
    ap.add_argument("--layers", type=int, default=None,
                    help="serve the model's first N layers only (a faster model of the same shapes)")
    a = ap.parse_args()
    served = a.model if not a.layers else f"{a.model} (its first {a.layers} layers)"
    if a.layers:
        a.model = first_layers(a.model, a.layers)
    with open(a.data, encoding="utf-8", newline="") as f:
        texts = [r[0] for r in csv.reader(f) if r] if a.data.endswith(".csv") else f.read().splitlines()
    offline = offline_reference(a.model, texts, a.precision)
    levels = list(map(int, a.levels.split(",")))
    ceiling = Ceiling(a.model, texts, a.precision)
    for c in levels:
        ceiling.rate(c)  # compiles its shapes before anything is timed
    print("offline", offline, flush=True)
    modes = {"dynamic_batching": ([], None), "no_batching": (["--no-batching"], None)}
    if a.server_tree:  # the other checkout's batching server, in the same alternation
        modes = {"dynamic_batching_other_tree": ([], a.server_tree), **modes}
    ports, procs = {}, []
    try:
        for mode, (extra, tree) in modes.items():  # all servers up at once; runs alternate between them
            ports[mode] = free_port()
            # closed-loop clients wait for their answers: no admission limit, so that both
            # modes serve every request and only throughput differs
            procs.append(start_server(a.model, ports[mode], extra + ["--precision", a.precision,
                                                                     "--max-wait-ms", a.max_wait_ms,
                                                                     "--max-queue-wait-ms", "600000"], tree))
        runs: dict = {}
        for rep in range(a.repeats):
            for c in levels:
                for mode in list(modes)[::1 if rep % 2 == 0 else -1]:  # the order alternates by repeat
                    batching = mode.startswith("dynamic")
                    top = ceiling.rate(c) if batching else None  # right before the run it bounds
                    r = measured_level(ports[mode], texts, c, a.requests)
                    if batching:
                        r["ceiling_texts_per_s"], r["ratio_vs_in_process_c"] = top, r["texts_per_s"] / top
                    runs.setdefault((mode, c), []).append(r)
                    print(mode, rep, r, flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
    rows = []
    for (mode, c), rs in runs.items():
        row = {"mode": mode, "concurrency": c}
        for k in ("texts_per_s", "p50_ms", "p95_ms", "p99_ms"):
            row[k] = float(np.median([r[k] for r in rs]))
        row["errors_5xx"] = sum(r["errors_5xx"] for r in rs)
        row["errors_other"] = sum(r["errors_other"] for r in rs)
        row["texts_per_s_runs"] = [round(r["texts_per_s"], 1) for r in rs]
        if all("ceiling_texts_per_s" in r for r in rs):
            row["ceiling_texts_per_s_runs"] = [round(r["ceiling_texts_per_s"], 1) for r in rs]
            row["ratio_vs_in_process_c"] = float(np.median([r["ratio_vs_in_process_c"] for r in rs]))
        roles = sorted({k for r in rs for k in r["cpu_ms_per_text"]})
        row["cpu_ms_per_text"] = {k: round(float(np.median([r["cpu_ms_per_text"].get(k, 0.0) for r in rs])), 3)
                                  for k in roles}
        rows.append(row)
    rows.sort(key=lambda r: (r["mode"], r["concurrency"]))
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    for r in rows:
        base = by.get(("no_batching", r["concurrency"]))
        r["ratio_vs_no_batching"] = r["texts_per_s"] / base["texts_per_s"] if base and base["texts_per_s"] else None
    write_results(a.out, a.name, {"description": f"one text per request, {a.requests} requests per level, "
                                                      f"medians of {a.repeats} runs alternating between the modes, "
                                                      f"model {served}, precision {a.precision}, max wait {a.max_wait_ms} ms, "
                                                      "loopback; the load generator shares the CPU. Offline "
                                                      f"reference, same model in-process without HTTP: {offline}; "
                                                      "ratio_vs_in_process_c: dynamic batching over the compiled "
                                                      "model's back-to-back batches of c texts (a reference, not a "
                                                      "bound: it tokenizes and runs each batch in turn, where the "
                                                      "server tokenizes while the model runs), measured in this process right before each "
                                                      "server run, median of the runs' ratios; cpu_ms_per_text: CPU milliseconds per "
                                                      "text served, by the server's thread roles (its /metrics) "
                                                      "and in the load generator (client)",
                                    "offline": offline},
                  rows, ["mode", "concurrency", "texts_per_s", "ratio_vs_no_batching", "ratio_vs_in_process_c",
                         "p50_ms", "p95_ms", "p99_ms",
                         "errors_5xx", "errors_other", "texts_per_s_runs", "ceiling_texts_per_s_runs",
                         "cpu_ms_per_text"])


if __name__ == "__main__":
    main()
