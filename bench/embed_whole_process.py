"""Embedding a file, whole process (start-up included): `spanflow embed` with its default flags
vs a sentence-transformers script (encode, batch_size 32, save .npy), same model and texts, and
each precision against its like: spanflow `--precision fp32` against the script as it is (fp32,
its default), and spanflow's default (bf16 where the CPU runs it natively, as the run records)
against the script under torch.autocast(bf16).

Each size runs `--repeats` times, the tools alternating. spanflow's first run in a fresh cache
also checks `--precision auto` (reported apart); the medians are of the later runs.

    python bench/embed_whole_process.py --data ../shared/data/stsb/stsb-en-dev.csv --scales 1,10
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, median, write_results  # noqa: E402

ST_SCRIPT = """
import contextlib, sys, numpy as np, torch
from sentence_transformers import SentenceTransformer
texts = open(sys.argv[2], encoding="utf-8").read().splitlines()
model = SentenceTransformer(sys.argv[1], device="cpu")
bf16 = sys.argv[4] == "bf16"
with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
    np.save(sys.argv[3], model.encode(texts, batch_size=32, convert_to_numpy=True))
"""


TOOLS = ("spanflow", "st_bf16", "spanflow_fp32", "st")  # the order each repeat runs them in


def run(cmd: list[str], env: dict) -> tuple[float, str]:
    """(whole-process seconds, stdout)."""
    t = time.perf_counter()
    out = subprocess.run(cmd, check=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    return time.perf_counter() - t, out


def precision_of(stdout: str) -> str:
    """The precision `spanflow embed` ran in, from its summary (the last line, JSON)."""
    return json.loads(stdout.strip().splitlines()[-1])["precision"]


def min_cosine(x: np.ndarray, y: np.ndarray) -> float:
    return float(((x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))).min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="STS-B CSV (s1,s2,score): both sentence columns are embedded")
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--scales", default="1,10", help="the file repeated this many times")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="embed_whole_process")
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
        out = {name: os.path.join(work, f"{name}.npy") for name in TOOLS}
        cmds = {"spanflow": [sys.executable, "-m", "spanflow", "embed", "--model", a.model, "--input", src, "--output",
                             out["spanflow"]],
                "spanflow_fp32": [sys.executable, "-m", "spanflow", "embed", "--model", a.model, "--input", src,
                                  "--output", out["spanflow_fp32"], "--precision", "fp32"],
                "st": [sys.executable, "-c", ST_SCRIPT, a.model, src, out["st"], "fp32"],
                "st_bf16": [sys.executable, "-c", ST_SCRIPT, a.model, src, out["st_bf16"], "bf16"]}
        first = run(cmds["spanflow"], env)[0] if scale == int(a.scales.split(",")[0]) else None  # a fresh cache
        times: dict[str, list[float]] = {name: [] for name in TOOLS}
        precision = None
        for _ in range(a.repeats):
            for name in TOOLS:
                seconds, stdout = run(cmds[name], env)
                times[name].append(seconds)
                if name == "spanflow":
                    precision = precision_of(stdout)
        vec = {name: np.load(path) for name, path in out.items()}
        med = {name: median(ts) for name, ts in times.items()}
        like = "st_bf16" if precision == "bf16" else "st"  # the script in spanflow's default precision
        rows.append({"texts": len(texts) * scale, "spanflow_precision": precision,
                     **{f"{name}_s": round(med[name], 2) for name in TOOLS},
                     "x_st_defaults": round(med["st"] / med["spanflow"], 2),
                     "x_st_same_precision": round(med[like] / med["spanflow"], 2),
                     "x_st_fp32_vs_spanflow_fp32": round(med["st"] / med["spanflow_fp32"], 2),
                     "spanflow_first_run_s": round(first, 2) if first else None,
                     "min_cosine_vs_st": round(min_cosine(vec["spanflow"], vec["st"]), 5),
                     "min_cosine_fp32": round(min_cosine(vec["spanflow_fp32"], vec["st"]), 5),
                     "runs": {name: [round(t, 2) for t in ts] for name, ts in times.items()}})
        print(rows[-1], flush=True)
    payload = {"description": "whole-process seconds to embed a file: `spanflow embed` (default flags; "
                              "spanflow_precision: what it ran in) and with --precision fp32, vs a sentence-transformers "
                              "script (batch_size 32) as it is (st: fp32, its default) and under torch.autocast bf16 "
                              "(st_bf16); x_st_defaults: st over spanflow's defaults; x_st_same_precision: the script in "
                              "spanflow's default precision over spanflow's defaults; x_st_fp32_vs_spanflow_fp32: both "
                              "in fp32; medians of the repeats after spanflow's first run, which also checks "
                              "--precision auto", "model": a.model, "data": a.data, "rows": rows}
    print(write_results(a.out, a.name, payload, rows,
                        ["texts", "spanflow_precision", "spanflow_s", "st_bf16_s", "spanflow_fp32_s", "st_s",
                         "x_st_defaults", "x_st_same_precision", "x_st_fp32_vs_spanflow_fp32", "spanflow_first_run_s",
                         "min_cosine_vs_st", "min_cosine_fp32"]))


if __name__ == "__main__":
    main()
