"""`spanflow doctor [--model DIR --data F]`"""
from __future__ import annotations

import argparse

from spanflow.cli.common import add_precision_arg
from spanflow.runtime.budget import describe_budget


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="report the machine; with --model and --data, find why training underfeeds it")
    p.add_argument("--model", help="encoder directory or 'tiny'")
    p.add_argument("--data", help="training data of --task")
    p.add_argument("--task", default="ner", help="the task whose training is probed [%(default)s]")
    p.add_argument("--batch-size", type=int, default=None,
                   help="probe fixed batches of N random texts (your current setup), else token-budget batches")
    p.add_argument("--max-tokens", type=int, default=None,
                   help=f"padded tokens per probed token-budget batch [training's: {describe_budget('train')}]")
    p.add_argument("--steps", type=int, default=8)
    add_precision_arg(p)
    p.add_argument("--device", default="auto")


def run(a: argparse.Namespace) -> int:
    from spanflow.tuning.doctor import doctor

    doctor(model=a.model, data=a.data, task=a.task, batch_size=a.batch_size, max_tokens=a.max_tokens, precision=a.precision,
           device=a.device, steps=a.steps)
    return 0
