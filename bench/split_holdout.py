"""Hold out a random share of a labelled NER file: measure a model on texts of its training
data's own kind when the data set ships no test split.

    python bench/split_holdout.py --data ../shared/data/wnut17/train.conll --out runs/ho --seed 0

writes `runs/ho/train.conll` (the rest, in file order) and `runs/ho/held.conll`.
"""
from __future__ import annotations

import argparse
import os
import random

from spanflow.data.io import read_ner, write_ner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--share", type=float, default=0.2, help="share of the texts held out [0.2]")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    data = read_ner(a.data)
    order = list(range(len(data)))
    random.Random(a.seed).shuffle(order)
    held = set(order[:round(a.share * len(data))])
    os.makedirs(a.out, exist_ok=True)
    write_ner([e for i, e in enumerate(data) if i not in held], os.path.join(a.out, "train.conll"))
    write_ner([e for i, e in enumerate(data) if i in held], os.path.join(a.out, "held.conll"))
    print(f"{len(data) - len(held)} training texts, {len(held)} held out, in {a.out}")


if __name__ == "__main__":
    main()
