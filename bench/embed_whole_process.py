"""Embedding a file, whole process (start-up included): `spanflow embed` with its default flags
vs a sentence-transformers script (encode, batch_size 32, save .npy), same model and texts.

Each size runs `--repeats` times, alternating the two tools. spanflow's first run in a fresh
cache also checks `--precision auto` (reported apart); the medians are of the later runs.

    python bench/embed_whole_process.py --data ../shared/data/stsb/stsb-en-dev.csv --scales 1,10
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, median, write_results  # noqa: E402

ST_SCRIPT = """
import sys, numpy as np
from sentence_transformers import SentenceTransformer
texts = open(sys.argv[2], encoding="utf-8").read().splitlines()
model = SentenceTransformer(sys.argv[1], device="cpu")
np.save(sys.argv[3], model.encode(texts, batch_size=32, convert_to_numpy=True))
"""


def run(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="STS-B CSV (s1,s2,score): both sentence columns are embedded")
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--scales", default="1,10", help="the file repeated this many times")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    with open(a.data, encoding="utf-8", newline="") as f:
        texts = [s for r in csv.reader(f) if len(r) >= 2 for s in r[:2]]
    work = tempfile.mkdtemp(prefix="embed-bench-")
    env = dict(os.environ, SPANFLOW_CACHE=os.path.join(work, "cache"), TOKENIZERS_PARALLELISM="false")
    rows = []
    for scale in (int(x) for x in a.scales.split(",")):
        src = os.path.join(work, f"texts{scale}.txt")
        with open(src, "w", encoding="utf-8") as f:
            f.write("\n".join(texts * scale) + "\n")
        ours = [sys.executable, "-m", "spanflow", "embed", "--model", a.model, "--input", src, "--output",
                os.path.join(work, "ours.npy")]
        theirs = [sys.executable, "-c", ST_SCRIPT, a.model, src, os.path.join(work, "theirs.npy")]
        first = run(ours, env) if scale == int(a.scales.split(",")[0]) else None  # a fresh cache: the check
        times = {"spanflow": [], "sentence_transformers": []}
        for _ in range(a.repeats):
            times["sentence_transformers"].append(run(theirs, env))
            times["spanflow"].append(run(ours, env))
        x, y = np.load(os.path.join(work, "ours.npy")), np.load(os.path.join(work, "theirs.npy"))
        cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        st, sf = median(times["sentence_transformers"]), median(times["spanflow"])
        rows.append({"texts": len(texts) * scale, "sentence_transformers_s": round(st, 2), "spanflow_s": round(sf, 2),
                     "ratio": round(st / sf, 2), "spanflow_first_run_s": round(first, 2) if first else None,
                     "min_cosine": round(float(cos.min()), 5), "runs_st": [round(t, 2) for t in times["sentence_transformers"]],
                     "runs_spanflow": [round(t, 2) for t in times["spanflow"]]})
        print(rows[-1])
    payload = {"description": "whole-process seconds to embed a file: `spanflow embed` (default flags) vs a "
                       "sentence-transformers script (batch_size 32); medians of the repeats after spanflow's "
                       "first run, which also checks --precision auto", "model": a.model, "data": a.data,
               "rows": rows}
    print(write_results(a.out, "embed_whole_process", payload, rows,
                        ["texts", "sentence_transformers_s", "spanflow_s", "ratio", "spanflow_first_run_s",
                         "min_cosine", "runs_st", "runs_spanflow"]))


if __name__ == "__main__":
    main()
