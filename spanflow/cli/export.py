"""`spanflow export --model DIR --to hf OUT`"""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a trained model in another tool's format (hf: a Hugging Face "
                                      "AutoModelForTokenClassification directory)")
    p.add_argument("--model", required=True, help="a spanflow model directory")
    p.add_argument("--to", required=True, help="the format to write: hf")
    p.add_argument("--lossy", action="store_true",
                   help="export even what the format cannot hold whole (a CRF head: its emission scores only)")
    p.add_argument("out", help="output directory")


def run(a: argparse.Namespace) -> int:
    from spanflow.atomic import writing
    from spanflow.errors import ConfigError
    from spanflow.tasks.registry import task_of_dir

    task = task_of_dir(a.model)
    if a.to not in getattr(task, "exports", ()):
        raise ConfigError(f"a {task.name} model exports to {', '.join(getattr(task, 'exports', ())) or 'nothing'}, "
                          f"not {a.to!r}")
    model = task.load(a.model, device="cpu", precision="fp32")
    with writing("the exported model", a.out):
        print(f"wrote {task.export(model, a.to, a.out, lossy=a.lossy)} ({a.to})")
    return 0
