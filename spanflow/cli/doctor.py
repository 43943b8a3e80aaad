"""`spanflow doctor [--model DIR --data F]`"""
from __future__ import annotations

import argparse

from spanflow.cli.common import add_device_arg, add_precision_arg, add_task_arg
from spanflow.runtime.budget import describe_budget

STEPS = 8  # training updates a probe runs unless --steps says


def add_parser(sub) -> None:
    from spanflow.tasks.registry import names

    p = sub.add_parser("doctor", help="report the machine; with --model and --data, find why training underfeeds it",
                       description="Print the machine: versions, devices and the precisions they run. With "
                                   "--model and --data, run a few training updates and say where the time goes "
                                   "(padding, small batches, preparing data, the optimizer) and what to change.")
    p.add_argument("--model", help="encoder directory, a spanflow model to train further, or 'tiny' [none: the "
                                   "machine report only]")
    p.add_argument("--data", help="training data of --task [none: the machine report only]")
    add_task_arg(p, names(), shown="a spanflow model's own, else the task --data is for (told from its content), else ner")
    p.add_argument("--batch-size", type=int, default=None,
                   help="probe fixed batches of N random texts (your current setup), and compare them with "
                        "token-budget batches [token-budget batches only]")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="padded tokens per batch (longest x count) of the probed token-budget batches "
                        f"[{describe_budget('train')}: the most training takes]")
    p.add_argument("--steps", type=int, default=None, help=f"training updates probed [{STEPS}]")
    add_precision_arg(p)
    add_device_arg(p)


def run(a: argparse.Namespace) -> int:
    from spanflow.errors import ConfigError
    from spanflow.tuning.doctor import doctor

    if not (a.model or a.data):  # the probe's own flags alone would be silently nothing
        given = next((f for f, v in (("--task", a.task), ("--steps", a.steps)) if v is not None), None)
        if given:
            raise ConfigError(f"{given} sets the training probe, which needs --model and --data")
    task, how = (a.task, "--task") if a.task else _task_of(a.model, a.data)
    doctor(model=a.model, data=a.data, task=task, batch_size=a.batch_size,
           max_tokens=a.max_tokens, precision=a.precision, device=a.device,
           steps=STEPS if a.steps is None else a.steps, task_from=how)
    return 0


def _task_of(model: str | None, data: str | None) -> tuple[str, str]:
    """(task, how it was told): the task a spanflow model directory was trained for (it continues
    training as that); for an encoder from elsewhere, the task whose training data --data holds
    (pairs: embed); else ner, the default where neither tells."""
    import os

    from spanflow.data.formats.sniff import sniff
    from spanflow.models.directory import CONFIG
    from spanflow.tasks.registry import get, names, task_of_dir

    if model and os.path.isfile(os.path.join(model, CONFIG)):
        task = task_of_dir(model)
        if task.trains:
            return task.name, "its --model's task"
    found = sniff(data) if data else None
    if found is not None and found.use in names() and get(found.use).trains:
        return found.use, "told from --data"
    return "ner", "the default: neither --model nor --data tells another; --task names one"
