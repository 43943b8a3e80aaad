"""Training recipes on WNUT-17 (rare entity types): dev F1 with and without each option.

One fixed budget for every run (same encoder, epochs, learning rate, token budget,
precision); each option is switched on alone, for two seeds. Finished runs are cached in
the output directory, so a killed benchmark resumes where it stopped.

    python bench/recipes_wnut17.py --train ../shared/data/wnut17/train.conll \
        --dev ../shared/data/wnut17/dev.conll [--model MINILM_DIR] [--only crf,baseline]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import default_minilm, median, write_results  # noqa: E402

RARE = ("corporation", "creative-work", "product")  # the three least frequent WNUT-17 types

# name -> (TrainOptions overrides, head, training data variant)
CONFIGS = {
    "baseline": ({}, "softmax", "conll"),
    "label_smoothing=0.1": ({"label_smoothing": 0.1}, "softmax", "conll"),
    "class_weights=auto": ({"class_weights": "auto"}, "softmax", "conll"),
    "head_lr=1e-3": ({"head_lr": 1e-3}, "softmax", "conll"),
    "llrd=0.8": ({"llrd": 0.8}, "softmax", "conll"),
    "llrd=0.8+head_lr=1e-3": ({"llrd": 0.8, "head_lr": 1e-3}, "softmax", "conll"),
    "oversample=0.5": ({"oversample": 0.5}, "softmax", "conll"),
    "crf": ({}, "crf", "conll"),
    "grad_checkpointing": ({"grad_checkpointing": True}, "softmax", "conll"),
    "docbin_input": ({}, "softmax", "docbin"),
}


def load_train(path: str, variant: str, work: str):
    from spanflow.data.io import read_ner

    if variant == "conll":
        return read_ner(path)
    # a DocBin made by spaCy's own converter, then read by spanflow. spaCy splits sentences
    # on empty lines only, so the file's whitespace-only break lines are emptied first
    import subprocess

    clean = os.path.join(work, "train.conll")
    with open(path, encoding="utf-8") as src, open(clean, "w", encoding="utf-8") as dst:
        dst.writelines("\n" if not line.strip() else line for line in src)
    subprocess.run([sys.executable, "-m", "spacy", "convert", clean, work, "--converter", "ner", "-n", "1"],
                   check=True, capture_output=True)
    return read_ner(os.path.join(work, "train.spacy"))


def run_one(name: str, seed: int, a) -> dict:
    import torch

    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import train_ner
    from spanflow.training.options import TrainOptions

    overrides, head, variant = CONFIGS[name]
    work = os.path.join(a.work, f"{name}_s{seed}".replace("=", "-").replace("+", "_"))
    os.makedirs(work, exist_ok=True)
    train, dev = load_train(a.train, variant, work), read_ner(a.dev)
    opts = TrainOptions(epochs=a.epochs, lr=a.lr, seed=seed, precision=a.precision, max_tokens=a.max_tokens,
                        patience=0, log_every=0, **overrides)
    torch.manual_seed(seed)
    t = time.perf_counter()
    model = train_ner(train, dev, model=a.model, out_dir=work, options=opts, head=head, log_fn=lambda s: None)
    wall = time.perf_counter() - t
    m = model.evaluate(dev)
    t = time.perf_counter()
    model.predict([e.text for e in dev])
    predict_s = time.perf_counter() - t
    reps = [json.loads(x) for x in open(os.path.join(work, "train_report.jsonl"))]
    by = m.get("per_label", {})
    return {"config": name, "seed": seed, "dev_f1": m["f1"], "precision": m["precision"], "recall": m["recall"],
            "rare_f1": sum(by.get(k, {}).get("f1", 0.0) for k in RARE) / len(RARE),
            "train_s": wall, "predict_s": predict_s,
            "tokens_per_s": median([r["real_tokens_per_s"] for r in reps])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--only", default=None, help="comma-separated config names (default: all)")
    ap.add_argument("--work", default="/tmp/sf_recipes")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args()
    if not a.model:
        sys.exit("no --model given and the offline MiniLM package is not installed")
    names = a.only.split(",") if a.only else list(CONFIGS)
    cache_path = os.path.join(a.work, "runs.json")
    os.makedirs(a.work, exist_ok=True)
    cache = json.load(open(cache_path)) if os.path.exists(cache_path) else {}
    for name in names:
        for seed in (int(s) for s in a.seeds.split(",")):
            key = f"{name}|{seed}"
            if key not in cache:
                cache[key] = run_one(name, seed, a)
                with open(cache_path + ".tmp", "w") as f:
                    json.dump(cache, f, indent=1)
                os.replace(cache_path + ".tmp", cache_path)
            r = cache[key]
            print(f"{name:28s} seed {seed}: dev F1 {r['dev_f1']:.4f} rare F1 {r['rare_f1']:.4f} "
                  f"({r['train_s']:.0f} s)", flush=True)
    rows = []
    base = {int(k.split("|")[1]): v["dev_f1"] for k, v in cache.items() if k.startswith("baseline|")}
    for name in CONFIGS:
        runs = [v for k, v in cache.items() if k.split("|")[0] == name]
        if not runs:
            continue
        row = {"config": name}
        for r in sorted(runs, key=lambda r: r["seed"]):
            row[f"F1 seed {r['seed']}"] = round(r["dev_f1"], 4)
            if r["seed"] in base:
                row[f"delta seed {r['seed']}"] = round(r["dev_f1"] - base[r["seed"]], 4)
        row["mean F1"] = round(sum(r["dev_f1"] for r in runs) / len(runs), 4)
        row["rare-type F1"] = round(sum(r["rare_f1"] for r in runs) / len(runs), 4)
        row["train s"] = round(median([r["train_s"] for r in runs]), 1)
        row["dev predict s"] = round(median([r["predict_s"] for r in runs]), 2)
        rows.append(row)
    seeds = sorted({r["seed"] for r in cache.values()})
    cols = ["config"] + [c for s in seeds for c in (f"F1 seed {s}", f"delta seed {s}")] + [
        "mean F1", "rare-type F1", "train s", "dev predict s"]
    write_results(a.out, "recipes_wnut17", {
        "description": f"WNUT-17 dev, exact-span F1 of the best epoch; {a.epochs} epochs, lr {a.lr}, "
                       f"max_tokens {a.max_tokens}, {a.precision}, model {a.model}; "
                       f"rare-type F1 = mean over {', '.join(RARE)}; each option alone against the baseline. "
                       "Times are wall seconds of one process on the shared machine (noisy; the F1 figures "
                       "are deterministic for a seed)",
        "runs": cache}, rows, cols)


if __name__ == "__main__":
    main()
