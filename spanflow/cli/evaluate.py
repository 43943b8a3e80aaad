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


def run(a: argparse.Namespace) -> int:
    from spanflow.inference.heap import settle
    from spanflow.runtime.loads import Loads
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tasks.registry import task_of_dir
    from spanflow.tuning.auto import quick_profile

    task = task_of_dir(a.model)
    examples = task.read_labelled(a.data, fmt=a.format, scheme=a.scheme)
    loads = Loads(task, a.model)
    rt = resolve_runtime(task, a.model, Asked.from_args(a), texts=[getattr(e, "text", None) for e in examples],
                         data=a.data, loads=loads, measure=quick_profile)
    model = loads.take(rt)
    model.set_max_length(a.max_length, a.stride)  # None, None: as trained
    settle()
    m = model.evaluate(examples, max_tokens=rt.max_tokens)
    print(json.dumps(m) if a.json else model.format_metrics(m))
    return 0
