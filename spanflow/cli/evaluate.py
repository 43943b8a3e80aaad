"""`spanflow evaluate --model DIR --data F [--json]`"""
from __future__ import annotations

import argparse
import json

from spanflow.cli.common import add_runtime_args, add_window_args


def add_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="score a model on labelled data")
    p.add_argument("--model", required=True, help="a spanflow model directory")
    p.add_argument("--data", required=True, help="labelled data (CoNLL columns or JSONL)")
    p.add_argument("--format", choices=["conll", "jsonl", "docbin"], help="NER data format (detected when omitted)")
    p.add_argument("--scheme")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_runtime_args(p, max_tokens=None)
    add_window_args(p)


def _max_tokens(a: argparse.Namespace, model) -> int | None:
    from spanflow.tuning.auto import resolve_max_tokens

    return resolve_max_tokens(a.max_tokens, profile=a.profile, task=model.task, mode="infer", model=a.model,
                              data=a.data, precision=a.precision, device=a.device)


def run(a: argparse.Namespace) -> int:
    from spanflow.tasks.registry import load_model, task_of_dir

    from spanflow.inference.auto_precision import infer_precision
    from spanflow.inference.heap import settle

    examples = task_of_dir(a.model).read_labelled(a.data, fmt=a.format, scheme=a.scheme)
    a.precision = infer_precision(a.precision, a.model, a.device, [getattr(e, "text", None) for e in examples])
    model = load_model(a.model, device=a.device, precision=a.precision, max_length=a.max_length, stride=a.stride)
    settle()
    m = model.evaluate(examples, max_tokens=_max_tokens(a, model))
    print(json.dumps(m) if a.json else model.format_metrics(m))
    return 0
