"""Padding efficiency of the token-budget batcher vs random batches of 32 (HF Trainer default).

    python bench/batcher_padding.py --data ../shared/data/wnut17/train.conll
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from common import default_minilm, median, write_results  # noqa: E402
from spanflow.batching.align import encode_texts  # noqa: E402
from spanflow.batching.batcher import padding_efficiency, token_budget_batches  # noqa: E402
from spanflow.data.io import read_ner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--budgets", default="512,1024,2048,4096,8192")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    ex = read_ner(a.data)
    lengths = [len(e.ids) + 2 for e in encode_texts(tok, [e.text for e in ex])]
    rows = []
    rand = []
    for seed in range(5):
        perm = np.random.default_rng(seed).permutation(len(lengths)).tolist()
        rand.append(padding_efficiency([perm[i:i + 32] for i in range(0, len(perm), 32)], lengths))
    rows.append({"batching": "random, 32 per batch (HF Trainer default)", "padding_efficiency": median(rand),
                 "batches": -(-len(lengths) // 32)})
    for b in map(int, a.budgets.split(",")):
        effs = [padding_efficiency(token_budget_batches(lengths, b, seed=s), lengths) for s in range(5)]
        n = len(token_budget_batches(lengths, b, seed=0))
        rows.append({"batching": f"spanflow max_tokens={b}", "padding_efficiency": median(effs), "batches": n,
                     "mean_texts_per_batch": len(lengths) / n})
    write_results(a.out, "batcher_padding",
                  {"description": f"{a.data}: {len(lengths)} texts, mean {np.mean(lengths):.1f} tokens "
                                  f"(max {max(lengths)}), tokenizer {a.model}; medians over 5 seeds"},
                  rows, ["batching", "padding_efficiency", "batches", "mean_texts_per_batch"])


if __name__ == "__main__":
    main()
