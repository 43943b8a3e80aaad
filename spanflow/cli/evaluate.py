"""`spanflow evaluate --model DIR --data F [--json]`"""
from __future__ import annotations

import argparse
import json

from spanflow.cli.common import add_runtime_args
from spanflow.data.io import read_ner
from spanflow.tasks.metrics import format_table


def add_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="score a model on labelled data")
    p.add_argument("--model", required=True, help="a spanflow model directory")
    p.add_argument("--data", required=True, help="labelled data (CoNLL columns or JSONL)")
    p.add_argument("--format", choices=["conll", "jsonl"])
    p.add_argument("--scheme")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_runtime_args(p, max_tokens=None)


def run(a: argparse.Namespace) -> int:
    from spanflow.ner import NerModel

    model = NerModel.load(a.model, device=a.device, precision=a.precision)
    data = read_ner(a.data, fmt=a.format, scheme=a.scheme)
    m = model.evaluate(data, max_tokens=a.max_tokens)
    print(json.dumps(m) if a.json else format_table(m))
    return 0
