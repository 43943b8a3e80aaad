"""`spanflow tune [--task TASK] --model DIR --data F [--mode train|infer]`"""
from __future__ import annotations

import argparse
import sys

from spanflow.cli.common import (add_device_arg, add_precision_arg, add_quantize_args, add_task_arg, add_text_args,
                                 field_as_column)


def _ints(s: str) -> list[int]:
    """N,N: whole numbers (argparse names the flag and the value where one is not)."""
    values = [x.strip() for x in s.split(",") if x.strip()]
    if not values or not all(x.isdigit() for x in values):
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {s!r}")
    return [int(x) for x in values]


def add_parser(sub) -> None:
    from spanflow.tasks.registry import names

    p = sub.add_parser("tune", help="measure token budgets (and max lengths) and pick the best; writes profile.json",
                       description="Measure throughput, latency, memory (and, inferring, quality) at a grid of "
                                   "token budgets and max lengths on a sample of your data, and pick the best "
                                   "point within the limits; writes OUT/profile.json (for --profile) and "
                                   "OUT/profile.png.")
    add_task_arg(p, names(), shown="the task of a trained --model")
    p.add_argument("--model", required=True, help="encoder directory (train) or trained model directory (infer)")
    p.add_argument("--data", required=True, help="a sample of your real data (labelled for quality in infer mode)")
    p.add_argument("--mode", choices=["train", "infer"], default=None,
                   help="train: training steps from --model; infer: the trained model's inference "
                        "[infer for a trained model and for embed; else train]")
    p.add_argument("--max-memory", type=float, default=None, help="GiB (2**30 bytes) of peak memory; points above are not chosen [no limit]")
    p.add_argument("--latency-slo", type=float, default=None, help="ms at p95; points above are not chosen [no limit]")
    p.add_argument("--max-lengths", type=_ints, default=None, metavar="N,N",
                   help="max lengths to try, e.g. 128,256,512 [infer: the length the model reads; train: the "
                        "sample's longest text, at most the encoder's limit]")
    p.add_argument("--budgets", type=_ints, default=None, metavar="N,N",
                   help="token budgets to try, e.g. 1024,4096 [doubling from 256, or the shortest max length, "
                        "up to 16384 on CPU and 262144 on GPU]")
    p.add_argument("--budget-seconds", type=float, default=120, help="seconds for the whole command, start-up and model load included [%(default)s]")
    p.add_argument("--sample", type=int, default=512, help="the first N texts of --data measured [%(default)s]")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of every point, the grid in alternating order; medians and spread reported "
                        "[%(default)s]")
    add_text_args(p)
    add_precision_arg(p)
    add_quantize_args(p, gate="built-in sentences")
    add_device_arg(p)
    p.add_argument("--out", default=".", help="directory for profile.json and profile.png [%(default)s]")
    p.add_argument("--no-backends", action="store_true",
                   help="infer: skip measuring the compiled encoder against eager (compiling takes tens of seconds)")


def run(a: argparse.Namespace) -> int:
    import os
    import time

    import psutil

    from spanflow.atomic import kept_only_if_filled
    from spanflow.tuning.tune import tune

    # --budget-seconds holds the whole command: from the process's start where it was started for it
    started = psutil.Process().create_time() if sys.argv[1:2] == ["tune"] else time.time()
    if getattr(a, "field_given", False) and a.column is not None:
        from spanflow.errors import ConfigError

        raise ConfigError(f"--field {a.field} and --column {a.column} both name the text's column; give one")
    if a.task is None:
        a.task = _task_of(a.model, a.mode)
    if a.data and os.path.isfile(a.data):  # a missing file is tune's own error to say
        field_as_column(a, a.data)
    with kept_only_if_filled(a.out):  # a refused or failed sweep leaves no empty --out
        prof = tune(task=a.task, model=a.model, data=a.data, mode=a.mode, max_lengths=a.max_lengths,
                    budgets=a.budgets, max_memory_gb=a.max_memory, latency_slo_ms=a.latency_slo,
                    budget_seconds=a.budget_seconds, sample=a.sample, precision=a.precision, quantize=a.quantize,
                    force=a.force, device=a.device, out=a.out, field=a.field, column=a.column,
                    repeats=a.repeats, backends=not a.no_backends, started=started)
    best = prof["best"]  # tune refuses a sweep with no best point
    print(f"best: max_tokens {best['max_tokens']}, max_length {best['max_length']} "
          f"({best['real_tokens_per_s']:.0f} real tok/s)")
    return 0


def _task_of(model: str, mode: str | None) -> str:
    """The task of a trained --model, for a tune without --task. An encoder directory runs as it is
    only as embeddings (a sentence-transformers one, as train embed writes it, is one): measured so
    where --mode is not train, and said; training one, or 'tiny', could be measured for any task,
    which is refused with the choices."""
    from spanflow.errors import ConfigError
    from spanflow.tasks.registry import ENCODER_TASK, names
    from spanflow.tuning.tune import trained_task

    task = trained_task(model)  # a path that holds no model: said here
    if task is not None:
        return task
    choices = f"give --task {', '.join(names()[:-1])} or {names()[-1]}"
    if model == "tiny":
        raise ConfigError(f"--task is needed with --model tiny (an encoder built from scratch to train): {choices}")
    if mode != "train":
        print(f"task {ENCODER_TASK}: {model} is an encoder directory, which runs as it is as embeddings (--task "
              f"and --mode train measure training a task from it)", file=sys.stderr)
        return ENCODER_TASK
    raise ConfigError(f"--task is needed: {model} is an encoder directory, which tune measures training a task "
                      f"from: {choices}")
