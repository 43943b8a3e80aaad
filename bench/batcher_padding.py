"""Padding efficiency of the token-budget batcher vs the Hugging Face Trainer's batches: random
batches of 8 (its default batch size) and 32, and `group_by_length` (its LengthGroupedSampler:
random megabatches of up to 50 batches, each sorted by length) at 8 and 32.

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


def chunks(order: list[int], size: int) -> list[list[int]]:
    return [order[i:i + size] for i in range(0, len(order), size)]


def grouped_order(lengths: list[int], size: int, seed: int) -> list[int]:
    """The order the Trainer's `group_by_length` draws texts in (transformers' own sampler)."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    return list(LengthGroupedSampler(size, lengths=lengths, generator=torch.Generator().manual_seed(seed)))


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
    for size in (8, 32):
        rand = []
        for seed in range(5):
            perm = np.random.default_rng(seed).permutation(len(lengths)).tolist()
            rand.append(padding_efficiency(chunks(perm, size), lengths))
        rows.append({"batching": f"HF Trainer, random batches of {size}" + (" (its default)" if size == 8 else ""),
                     "padding_efficiency": median(rand), "batches": -(-len(lengths) // size),
                     "mean_texts_per_batch": len(lengths) / -(-len(lengths) // size)})
        grouped = [padding_efficiency(chunks(grouped_order(lengths, size, s), size), lengths) for s in range(5)]
        rows.append({"batching": f"HF Trainer, group_by_length, batches of {size}",
                     "padding_efficiency": median(grouped), "batches": -(-len(lengths) // size),
                     "mean_texts_per_batch": len(lengths) / -(-len(lengths) // size)})
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
