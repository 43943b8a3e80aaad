"""Bursts after a quiet spell: does `spanflow serve` admit what one batch serves?

The server refuses (429) work it estimates could not start within `--max-queue-wait-ms`. Each
round sends a few single requests (a quiet spell, the service time measured on calls of one
text), then a burst of `--burst` concurrent one-text requests, which one batch serves. Counts the
answers by status, for this tree's server and, with `--server-tree`, another checkout's, in
alternating rounds; `--hogs N` busy processes share the CPU (a loaded machine, where single
calls are slow and a rate read from them is far below what a batch achieves).

    python bench/burst_admission.py --model MINILM_DIR --server-tree ../before --hogs 4 --backend eager
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import multiprocessing
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import default_minilm, write_results  # noqa: E402
from load_test import free_port, start_server  # noqa: E402


def _spin() -> None:
    while True:
        pass


def rounds(port: int, n: int, burst: int) -> collections.Counter:
    """`n` rounds of three single requests then `burst` at once; the statuses of the bursts' answers."""
    import httpx

    url = f"http://127.0.0.1:{port}/v1/embeddings"
    statuses: collections.Counter = collections.Counter()
    with httpx.Client(timeout=60) as c, cf.ThreadPoolExecutor(burst) as pool:
        for _ in range(n):
            for _ in range(3):
                c.post(url, json={"input": "a quiet single request"})
            statuses.update(pool.map(lambda k: httpx.post(url, json={"input": f"a short sentence {k}"},
                                                          timeout=60).status_code, range(burst)))
    return statuses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--server-tree", default=None, help="another checkout of spanflow (before/after in one run)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--burst", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="servers started per tree, alternating")
    ap.add_argument("--hogs", type=int, default=0, help="busy processes beside the server")
    ap.add_argument("--backend", default=None, help="--backend for the server [its default]")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="burst_admission")
    a = ap.parse_args()
    extra = ["--backend", a.backend] if a.backend else []
    trees = [("this tree", None)] + ([("other tree", a.server_tree)] if a.server_tree else [])
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(a.hogs)]
    for h in hogs:
        h.start()
    totals = {name: collections.Counter() for name, _ in trees}
    try:
        for _ in range(a.repeats):
            for name, tree in trees:
                port = free_port()
                proc = start_server(a.model, port, extra, tree)
                try:
                    totals[name] += rounds(port, a.rounds, a.burst)
                finally:
                    proc.terminate()
                    proc.wait()
    finally:
        for h in hogs:
            h.terminate()
    rows = [{"server": name, "burst_requests": sum(c.values()), "ok_200": c.get(200, 0), "refused_429": c.get(429, 0),
             "other": sum(v for k, v in c.items() if k not in (200, 429))} for name, c in totals.items()]
    write_results(a.out, a.name, {
        "description": f"{a.repeats} servers per tree, alternating; each {a.rounds} rounds of 3 single requests then "
                       f"{a.burst} concurrent one-text requests (one batch serves them); model {a.model}, "
                       f"backend {a.backend or 'default'}, {a.hogs} busy processes beside it; other tree: "
                       f"{a.server_tree}", "args": vars(a)},
        rows, ["server", "burst_requests", "ok_200", "refused_429", "other"])


if __name__ == "__main__":
    main()
