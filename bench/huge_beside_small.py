"""A huge request beside small ones: are the small ones served while it runs?

One client sends a request of `--huge` long texts (seconds of model work, inside every default
limit); while it runs, another sends `--small` one-text requests one after another. Counts the
small requests' answers by status and their latency, for this tree's server and, with
`--server-tree`, another checkout's, in alternating rounds. Round robin serves a small request
after one batch of the huge one; an admission that counts all of the huge request's work as the
wait refuses them (429) until it ends.

    python bench/huge_beside_small.py --model MINILM_DIR --server-tree ../before
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import default_minilm, write_results  # noqa: E402
from load_test import free_port, start_server  # noqa: E402

LONG = " ".join(f"word{k % 97}" for k in range(400))  # cut at the model's max length: a full window


def one_round(port: int, huge: int, small: int) -> tuple[collections.Counter, list[float], float, int]:
    """(statuses of the small requests, their seconds, the huge request's seconds and status)."""
    import httpx

    url = f"http://127.0.0.1:{port}/v1/embeddings"
    took: dict[str, float] = {}

    def send_huge() -> None:
        t = time.perf_counter()
        took["status"] = httpx.post(url, json={"input": [LONG] * huge}, timeout=120).status_code
        took["huge"] = time.perf_counter() - t

    sender = threading.Thread(target=send_huge)
    sender.start()
    statuses: collections.Counter = collections.Counter()
    seconds: list[float] = []
    with httpx.Client(timeout=120) as c:
        time.sleep(0.5)  # the huge request is queued and running
        for k in range(small):
            t = time.perf_counter()
            statuses[c.post(url, json={"input": f"a short sentence {k}"}).status_code] += 1
            seconds.append(time.perf_counter() - t)
    sender.join()
    return statuses, seconds, took["huge"], took["status"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--server-tree", default=None, help="another checkout of spanflow (before/after in one run)")
    ap.add_argument("--huge", type=int, default=256, help="long texts in the huge request")
    ap.add_argument("--small", type=int, default=16, help="one-text requests sent while it runs")
    ap.add_argument("--repeats", type=int, default=2, help="servers started per tree, alternating")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="huge_beside_small")
    a = ap.parse_args()
    trees = [("this tree", None)] + ([("other tree", a.server_tree)] if a.server_tree else [])
    totals = {name: collections.Counter() for name, _ in trees}
    smalls: dict[str, list[float]] = {name: [] for name, _ in trees}
    huges: dict[str, list[float]] = {name: [] for name, _ in trees}
    huge_ok = collections.Counter()
    for _ in range(a.repeats):
        for name, tree in trees:
            port = free_port()
            proc = start_server(a.model, port, [], tree)
            try:
                statuses, seconds, huge_s, huge_status = one_round(port, a.huge, a.small)
            finally:
                proc.terminate()
                proc.wait()
            totals[name] += statuses
            smalls[name] += seconds
            huges[name].append(huge_s)
            huge_ok[name] += huge_status == 200  # the huge request served too: the comparison is of both
    rows = [{"server": name, "small_requests": sum(c.values()), "ok_200": c.get(200, 0), "refused_429": c.get(429, 0),
             "other": sum(v for k, v in c.items() if k not in (200, 429)),
             "small_median_s": round(statistics.median(smalls[name]), 3), "huge_ok_200": huge_ok[name],
             "huge_median_s": round(statistics.median(huges[name]), 2)} for name, c in totals.items()]
    write_results(a.out, a.name, {
        "description": f"{a.repeats} servers per tree, alternating; each: one request of {a.huge} texts of a full "
                       f"window, and meanwhile {a.small} one-text requests one after another; model {a.model}, "
                       f"default flags; other tree: {a.server_tree}", "args": vars(a)},
        rows, ["server", "small_requests", "ok_200", "refused_429", "other", "small_median_s", "huge_ok_200",
               "huge_median_s"])


if __name__ == "__main__":
    main()
