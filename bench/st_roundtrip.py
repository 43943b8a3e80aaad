"""A spanflow-trained embedding directory read back by sentence-transformers, all on CPU in fp32.

The same texts embedded four ways: sentence-transformers' SentenceTransformer(DIR), spanflow's
Embedder.load(DIR).encode, `spanflow embed` (a whole process writing .npy) and `spanflow serve`
(POST /v1/embeddings, the first 8 texts). Reports the min and mean cosine of each source to the
others and how far their norms differ (a cosine cannot see a Normalize module that one side
skips); a pair passes when its min cosine is at least 0.9999 and its norms agree within 0.1%.
Exits 1 when any pair fails.

    spanflow train embed --train ../shared/data/stsb/stsb-en-train.csv \\
        --dev ../shared/data/stsb/stsb-en-dev.csv --model MINILM --out /tmp/stsb_embed
    python bench/st_roundtrip.py --model /tmp/stsb_embed/model --data ../shared/data/stsb/stsb-en-dev.csv
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import write_results  # noqa: E402

MIN_COSINE = 0.9999
MAX_NORM_DIFF = 1e-3  # relative
SERVE_TEXTS = 8


def read_texts(path: str, n: int) -> list[str]:
    """Up to `n` texts: a pairs file's two columns in turn (a1, b1, a2, ...), else one text a line."""
    if path.endswith((".csv", ".tsv", ".jsonl", ".json")):
        from spanflow.tasks.embed.pairs import read_pairs

        texts = [t for p in read_pairs(path) for t in (p.a, p.b)]
    else:
        with open(path, encoding="utf-8") as f:
            texts = [line.rstrip("\n") for line in f if line.strip()]
    # the CLI reads one text a line: a text holding a newline would split
    return [t for t in texts if "\n" not in t and "\r" not in t][:n]


def cosine_stats(x: np.ndarray, y: np.ndarray) -> dict:
    from spanflow.tasks.embed.metrics import cosines

    cos = cosines(x, y)
    norm_diff = float(np.abs(np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1) - 1).max())
    return {"n": int(cos.size), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
            "max_norm_diff": norm_diff, "max_abs_diff": float(np.abs(x - y).max()),
            "pass": bool(cos.min() >= MIN_COSINE and norm_diff <= MAX_NORM_DIFF)}


def st_vectors(model_dir: str, texts: list[str]) -> tuple[np.ndarray, dict]:
    """sentence-transformers' fp32 embeddings, and the modules it built from the directory."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model_dir, device="cpu")
    vecs = st.encode(texts, convert_to_numpy=True)
    norms = np.linalg.norm(vecs, axis=1)
    return vecs, {"modules": [type(m).__name__ for m in st], "max_seq_length": st.max_seq_length,
                  "pooling": st[1].get_config_dict() if len(st) > 1 else None,
                  "norm_min": float(norms.min()), "norm_max": float(norms.max())}


def api_vectors(model_dir: str, texts: list[str]) -> tuple[np.ndarray, dict]:
    from spanflow.tasks.embed import Embedder

    emb = Embedder.load(model_dir, precision="fp32", device="cpu")
    pool = emb.module.pooling
    return emb.encode(texts), {"pooling": pool.mode, "normalize": pool.normalize, "max_length": emb.max_length}


def cli_vectors(model_dir: str, texts: list[str], work: str) -> np.ndarray:
    """`spanflow embed` on the texts as a text file, a whole process."""
    src, out = os.path.join(work, "texts.txt"), os.path.join(work, "x.npy")
    with open(src, "w", encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
    cmd = [sys.executable, "-m", "spanflow", "embed", "--model", model_dir, "--input", src, "--output", out,
           "--precision", "fp32", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"spanflow embed failed ({done.returncode}):\n{done.stderr[-2000:]}")
    vecs = np.load(out)
    if vecs.shape[0] != len(texts):
        sys.exit(f"spanflow embed wrote {vecs.shape[0]} rows for {len(texts)} texts")
    return vecs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 30.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(base: str, proc: subprocess.Popen, deadline_s: float, log_path: str) -> dict:
    """GET /ready until it answers 200 (models loaded and warmed up); exit on the deadline or
    when the server process ends first."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"spanflow serve exited with {proc.returncode}:\n{_tail(log_path)}")
        try:
            return http(base + "/ready", timeout=5)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)  # a poll interval: not yet listening (a connection made while it loads waits)
    sys.exit(f"spanflow serve not ready within {deadline_s:.0f}s:\n{_tail(log_path)}")


def _tail(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()[-2000:]


def serve_vectors(model_dir: str, texts: list[str], work: str, deadline_s: float,
                  backend: str | None) -> tuple[np.ndarray, dict]:
    """Start `spanflow serve` on a free loopback port, POST /v1/embeddings once, stop it."""
    port = free_port()
    cmd = [sys.executable, "-m", "spanflow", "serve", "--model", model_dir, "--port", str(port),
           "--precision", "fp32", "--device", "cpu"] + (["--backend", backend] if backend else [])
    log_path = os.path.join(work, "serve.log")
    base = f"http://127.0.0.1:{port}"
    t = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = wait_ready(base, proc, deadline_s, log_path)
        ready_s = time.perf_counter() - t
        name = next(iter(ready["models"]))
        resp = http(base + "/v1/embeddings", {"input": texts, "model": name})
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    rows = sorted(resp["data"], key=lambda d: d["index"])
    return np.asarray([d["embedding"] for d in rows], dtype=np.float32), {
        "served_name": name, "response_model": resp.get("model"), "ready_s": round(ready_s, 1),
        "backend": backend or "server default"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a spanflow-trained embedding directory (OUT/model)")
    ap.add_argument("--data", required=True, help="text lines, or a pairs CSV/TSV/JSONL (both columns)")
    ap.add_argument("--n", type=int, default=256, help="texts to embed [256]")
    ap.add_argument("--serve-deadline", type=float, default=300.0, help="seconds to wait for /ready [300]")
    ap.add_argument("--serve-backend", default=None, choices=["auto", "eager", "compile"],
                    help="spanflow serve --backend [its default]")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    texts = read_texts(a.data, a.n)
    if not texts:
        sys.exit(f"no texts in {a.data}")
    vecs, info = {}, {}
    vecs["sentence_transformers"], info["sentence_transformers"] = st_vectors(a.model, texts)
    vecs["spanflow_api"], info["spanflow_api"] = api_vectors(a.model, texts)
    with tempfile.TemporaryDirectory(prefix="st-roundtrip-") as work:
        vecs["spanflow_embed_cli"] = cli_vectors(a.model, texts, work)
        served, info["spanflow_serve"] = serve_vectors(a.model, texts[:SERVE_TEXTS], work, a.serve_deadline,
                                                       a.serve_backend)
    names = ["sentence_transformers", "spanflow_api", "spanflow_embed_cli"]
    rows = [{"a": x, "b": y, **cosine_stats(vecs[x], vecs[y])} for i, x in enumerate(names) for y in names[i + 1:]]
    rows += [{"a": x, "b": "spanflow_serve", **cosine_stats(vecs[x][:SERVE_TEXTS], served)} for x in names]
    print(json.dumps(info, indent=1))
    write_results(a.out, "st_roundtrip",
                  {"description": f"{len(texts)} texts of {os.path.basename(a.data)} ({SERVE_TEXTS} through the "
                                  f"server), model directory {os.path.basename(a.model.rstrip('/'))}, CPU, fp32; "
                                  f"pass: min cosine >= {MIN_COSINE} and norms within "
                                  f"{MAX_NORM_DIFF:.1%}",
                   "sources": info, "args": {**vars(a), "data": os.path.basename(a.data)}},
                  rows, ["a", "b", "n", "min_cosine", "mean_cosine", "max_norm_diff", "max_abs_diff", "pass"])
    if not all(r["pass"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
