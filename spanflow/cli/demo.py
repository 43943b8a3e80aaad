"""`spanflow demo`: synthetic data -> train `tiny` -> evaluate -> predict -> report."""
from __future__ import annotations

import argparse
import json
import os
import time

from spanflow.data.synthetic import synthetic_ner
from spanflow.tasks.metrics import format_table
from spanflow.training.options import TrainOptions


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train a tiny NER model on synthetic data, end to end")
    p.add_argument("--out", default="demo_out", help="output directory [%(default)s]")
    p.add_argument("--train-size", type=int, default=1500)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)


def demo(out: str, *, train_size: int = 1500, epochs: int = 6, seed: int = 0) -> dict:
    """Run the whole NER pipeline on generated data; return dev metrics and timing."""
    from spanflow.tasks.ner import train_ner

    t0 = time.perf_counter()
    train = synthetic_ner(train_size, seed=seed)
    dev = synthetic_ner(max(100, train_size // 5), seed=seed + 1)
    print(f"synthetic data: {len(train)} train / {len(dev)} dev texts, "
          f"labels {sorted({lab for e in train for *_, lab in e.spans})}")
    opts = TrainOptions(epochs=epochs, seed=seed)  # everything else: the defaults a user gets
    model = train_ner(train, dev, model="tiny", out_dir=out, options=opts)
    metrics = model.evaluate(dev)
    print(format_table(metrics))
    samples = ["Grace Hopper flew from Oslo to Lima on Monday .",
               "Hooli announced the Pixel 8 at an event in Seoul , as expected ."]
    for text, spans in zip(samples, model.predict(samples)):
        print(json.dumps(model.output_record(text, spans), ensure_ascii=False))  # what predict writes
    elapsed = time.perf_counter() - t0
    print(f"demo done in {elapsed:.0f}s: dev F1 {metrics['f1']:.4f}; model in {os.path.join(out, 'model')}, "
          f"report in {os.path.join(out, 'train_report.jsonl')}")
    return {"f1": metrics["f1"], "seconds": elapsed}


def run(a: argparse.Namespace) -> int:
    demo(a.out, train_size=a.train_size, epochs=a.epochs, seed=a.seed)
    return 0
