"""`spanflow tune --task TASK --model DIR --data F [--mode train|infer]`"""
from __future__ import annotations

import argparse

from spanflow.cli.common import add_precision_arg, add_quantize_args


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="measure token budgets (and max lengths) and pick the best; writes profile.json")
    from spanflow.tasks.registry import names

    p.add_argument("--task", choices=names(), required=True)
    p.add_argument("--model", required=True, help="encoder directory (train) or trained model directory (infer)")
    p.add_argument("--data", required=True, help="a sample of your real data (labelled for quality in infer mode)")
    p.add_argument("--mode", choices=["train", "infer"], default=None,
                   help="[train; infer for a task that only infers, such as embed]")
    p.add_argument("--max-memory", type=float, default=None, help="GB; points above are not chosen")
    p.add_argument("--latency-slo", type=float, default=None, help="ms at p95; points above are not chosen")
    p.add_argument("--max-lengths", type=_ints, default=None, help="e.g. 128,256,512 (default: the model's)")
    p.add_argument("--budgets", type=_ints, default=None, help="token budgets to try (default: geometric)")
    p.add_argument("--budget-seconds", type=float, default=120, help="time for the whole sweep [%(default)s]")
    p.add_argument("--sample", type=int, default=512, help="texts sampled from --data [%(default)s]")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs of every point, the grid in alternating order; medians and spread reported "
                        "[%(default)s]")
    p.add_argument("--field", default="text")
    p.add_argument("--column", type=int, default=None)
    add_precision_arg(p)
    add_quantize_args(p, gate="built-in sentences")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=".", help="directory for profile.json and profile.png [%(default)s]")
    p.add_argument("--no-backends", action="store_true",
                   help="infer: skip measuring the compiled encoder against eager (compiling takes tens of seconds)")


def run(a: argparse.Namespace) -> int:
    from spanflow.tuning.tune import tune

    prof = tune(task=a.task, model=a.model, data=a.data, mode=a.mode, max_lengths=a.max_lengths, budgets=a.budgets,
                max_memory_gb=a.max_memory, latency_slo_ms=a.latency_slo, budget_seconds=a.budget_seconds,
                sample=a.sample, precision=a.precision, quantize=a.quantize, force=a.force, device=a.device, out=a.out,
                field=a.field, column=a.column,
                repeats=a.repeats, backends=not a.no_backends)
    best = prof["best"]
    print(f"best: max_tokens {best['max_tokens']}, max_length {best['max_length']} "
          f"({best['real_tokens_per_s']:.0f} real tok/s)" if best else "no point met the limits")
    return 0 if best else 1
