"""The server's own CPU per request, with the model taken out: the app driven over ASGI in this
process (no sockets, no HTTP client), a model that answers at once, `--concurrency` clients
sending one text each. What is left is what the server spends around the model (routing,
JSON, validation, tokenizing, the batcher, thread hops, the response): on a CPU this time is
taken from the model. Unlike bench/load_test.py it does not move with the machine's load.

    python bench/server_overhead.py [--model ENCODER_DIR] --data ../shared/data/stsb/stsb-en-dev.csv
    PYTHONPATH=OTHER_CHECKOUT python bench/server_overhead.py ...   # the same for another tree
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, write_results  # noqa: E402


def scope(path: str, body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080)}


async def call(app, body: bytes) -> int:
    """One request through the whole ASGI app; its status."""
    given, status = [False], []

    async def receive():
        if not given[0]:
            given[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the request completes

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope("/v1/embeddings", body), receive, send)
    return status[0]


async def measure(app, bodies: list[bytes], concurrency: int, repeats: int) -> list[float]:
    """CPU milliseconds per request (all threads of this process), one figure per repeat."""
    out = []
    async with app.router.lifespan_context(app):
        for _ in range(repeats + 1):  # the first pass warms caches and is not counted
            todo, bad = iter(bodies), []

            async def client():
                for b in todo:
                    if (code := await call(app, b)) != 200:
                        bad.append(code)

            t = time.process_time()
            await asyncio.gather(*[client() for _ in range(concurrency)])
            out.append((time.process_time() - t) * 1e3 / len(bodies))
            if bad:
                raise RuntimeError(f"{len(bad)} requests failed: {bad[:5]}")
    return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_minilm(), help="an encoder directory (its tokenizer is used)")
    ap.add_argument("--data", required=True, help="CSV (first column) or text lines")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="server_overhead")
    ap.add_argument("--label", default="this tree", help="what the row is called (e.g. a commit)")
    a = ap.parse_args()

    from spanflow.serving.app import ServeOptions, create_app
    from spanflow.serving.services import load_service

    with open(a.data, encoding="utf-8", newline="") as f:
        texts = [r[0] for r in csv.reader(f) if r] if a.data.endswith(".csv") else f.read().splitlines()
    svc = load_service(f"emb={a.model}", device="cpu", precision="fp32")
    dim = svc.model.dim
    svc.model.run_batch = lambda units: [np.zeros(dim, np.float32) for _ in units]  # the model, taken out
    app = create_app([svc], ServeOptions(max_wait_ms=2, max_queue_wait_ms=600_000))
    rng = random.Random(0)
    bodies = [json.dumps({"input": [rng.choice(texts)]}).encode() for _ in range(a.requests)]
    try:
        import uvloop  # what `spanflow serve` runs on, with the serve extra
        runs = uvloop.run(measure(app, bodies, a.concurrency, a.repeats))
    except ImportError:
        runs = asyncio.run(measure(app, bodies, a.concurrency, a.repeats))
    row = {"tree": a.label, "concurrency": a.concurrency, "requests": a.requests, "cpu_ms_per_request": float(np.median(runs)),
           "runs": [round(r, 3) for r in runs]}
    print(row)
    write_results(a.out, a.name, {"description": f"the server's own CPU per request (median of {a.repeats}), "
                                                 "the model taken out: the ASGI app driven in-process, one "
                                                 f"text per request, {a.concurrency} clients, uvloop; "
                                                 f"texts from {os.path.basename(a.data)}"},
                  [row], ["tree", "concurrency", "requests", "cpu_ms_per_request", "runs"])


if __name__ == "__main__":
    main()
