"""Sentence embeddings: sentence-transformers encode(batch_size=32) vs spanflow (fp32, bf16, int8).

Same model and texts (STS-B sentences, both columns), one process. Reports texts/s, real
tokens/s, ratio to sentence-transformers, padding efficiency, min/mean cosine to
sentence-transformers' embeddings and STS-B Spearman.

    python bench/embed_vs_sentence_transformers.py --data ../shared/data/stsb/stsb-en-dev.csv
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, timed, write_results  # noqa: E402
from spanflow.batching.batcher import padding_efficiency  # noqa: E402
from spanflow.tasks.embed import Embedder  # noqa: E402
from spanflow.runtime.policy import cpu_has_bf16  # noqa: E402


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).correlation)


def sts_score(emb: np.ndarray, n_pairs: int, gold) -> float:
    e = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    return spearman((e[:n_pairs] * e[n_pairs:]).sum(1), gold)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="STS-B CSV: s1,s2,score without header")
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", default="fp32,bf16,int8")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    with open(a.data, encoding="utf-8", newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) >= 3]
    s1, s2, gold = [r[0] for r in rows], [r[1] for r in rows], [float(r[2]) for r in rows]
    texts = s1 + s2
    st = SentenceTransformer(a.model, device="cpu")
    st.encode(texts[:64], batch_size=32)
    t_st, ref = timed(lambda: st.encode(texts, batch_size=32, convert_to_numpy=True), a.repeats)
    base = Embedder.load(a.model, precision="fp32", device="cpu")
    ids, _ = base.tokenize(texts)
    lengths = [len(x) for x in ids]
    n_tok = sum(lengths)
    order = np.argsort([-len(t) for t in texts], kind="stable").tolist()  # ST sorts by characters
    st_eff = padding_efficiency([order[i:i + 32] for i in range(0, len(order), 32)], lengths)
    out = [{"run": "sentence_transformers_bs32_fp32", "seconds": t_st, "texts_per_s": len(texts) / t_st,
            "real_tokens_per_s": n_tok / t_st, "ratio": 1.0, "padding_efficiency": st_eff,
            "min_cosine_to_st": 1.0, "mean_cosine_to_st": 1.0, "spearman": sts_score(ref, len(s1), gold)}]
    for prec in a.runs.split(","):
        if prec == "bf16" and not cpu_has_bf16():
            print("skipping bf16: this CPU has no native bf16")
            continue
        emb = Embedder.load(a.model, precision="fp32" if prec == "int8" else prec,  # int8: a quantization
                            quantize="int8" if prec == "int8" else None, device="cpu")
        emb.encode(texts[:64])
        t, got = timed(lambda: emb.encode(texts), a.repeats)
        from spanflow.batching.batcher import token_budget_batches
        from spanflow.runtime.budget import infer_tokens

        eff = padding_efficiency(token_budget_batches(lengths, infer_tokens(emb.policy.device),
                                                      shuffle=False), lengths)
        cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
        out.append({"run": f"spanflow_{prec}", "seconds": t, "texts_per_s": len(texts) / t,
                    "real_tokens_per_s": n_tok / t, "ratio": t_st / t, "padding_efficiency": eff,
                    "min_cosine_to_st": float(cos.min()), "mean_cosine_to_st": float(cos.mean()),
                    "spearman": sts_score(got, len(s1), gold)})
        print(out[-1], flush=True)
    write_results(a.out, "embed_vs_sentence_transformers",
                  {"description": f"{len(texts)} sentences of {a.data} (both columns), model {a.model}, CPU; "
                                  f"medians of {a.repeats}"},
                  out, ["run", "texts_per_s", "real_tokens_per_s", "ratio", "padding_efficiency",
                        "min_cosine_to_st", "mean_cosine_to_st", "spearman"])


if __name__ == "__main__":
    main()
