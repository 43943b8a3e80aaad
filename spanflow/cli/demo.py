"""`spanflow demo`: synthetic data -> train `tiny` -> evaluate -> predict -> report."""
from __future__ import annotations

import argparse
import json
import os
import time

from spanflow.data.synthetic import synthetic_ner, write_demo_data
from spanflow.tasks.metrics import format_table
from spanflow.training.options import TrainOptions
from spanflow.monitor import clock
from spanflow.monitor.report import clock_time


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train a tiny NER model on synthetic data, end to end",
                       description="Generate synthetic NER data, train a 'tiny' model on it with the default "
                                   "flags (but --epochs), evaluate it, tag two sentences and print the report: the "
                                   "whole pipeline on a CPU, with no data or model to download.")
    p.add_argument("--out", default="demo_out", help="output directory [%(default)s]")
    p.add_argument("--train-size", type=int, default=1500,
                   help="synthetic training texts; the dev set is a fifth of it, at least 100 [%(default)s]")
    p.add_argument("--epochs", type=int, default=6,
                   help="most epochs (early stopping on dev may end a run sooner) [%(default)s: 'tiny' runs them "
                        "all, its default --patience never stops early]")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of training [%(default)s]")
    p.add_argument("--write-data", metavar="DIR", default=None,
                   help="only write the synthetic data the documentation's examples read (NER CoNLL, CasRel JSON, "
                        "scored pairs, pairs, triplets, texts.txt; --train-size training records, dev sets a fifth "
                        "of that, at least 100) into DIR, and train nothing [off: run the demo]")


def demo(out: str, *, train_size: int = 1500, epochs: int = 6, seed: int = 0) -> dict:
    """Run the whole NER pipeline on generated data; return dev metrics and timing."""
    from spanflow.tasks.ner import train_ner

    t0 = clock.began(time.perf_counter())  # as the training's time line counts: from the process's start
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
    print(f"demo done in {clock_time(elapsed)}: dev F1 {metrics['f1']:.4f}; model in {os.path.join(out, 'model')}, "
          f"report in {os.path.join(out, 'train_report.jsonl')}")
    return {"f1": metrics["f1"], "seconds": elapsed}


def write_data(out_dir: str, *, train_size: int = 1500, seed: int = 0) -> list[str]:
    """Write the demo data (data/synthetic.write_demo_data) and say what was written; return the file names."""
    names = write_demo_data(out_dir, train_size=train_size, seed=seed)
    print(f"wrote {len(names)} files to {out_dir} ({train_size} training records each): {' '.join(names)}")
    return names


def run(a: argparse.Namespace) -> int:
    from spanflow.errors import ConfigError

    for flag, value in (("--train-size", a.train_size), ("--epochs", a.epochs)):
        if value < 1:  # before any data is made
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if a.write_data is not None:
        write_data(a.write_data, train_size=a.train_size, seed=a.seed)
        return 0
    demo(a.out, train_size=a.train_size, epochs=a.epochs, seed=a.seed)
    return 0
