"""`spanflow train TASK ...`: the common flags here, each task's own from the task registry."""
from __future__ import annotations

import argparse
import dataclasses

from spanflow.cli.common import BUDGET_DEFAULTS, Parser, add_runtime_args
from spanflow.cli.options import add_options, options_from
from spanflow.training.defaults import describe_defaults
from spanflow.training.options import TrainOptions
from spanflow.training.outcome import say_once


def add_parser(sub) -> None:
    from spanflow.tasks.registry import tasks

    trained = [t for t in tasks() if t.trains]
    p = sub.add_parser("train", help="train a model",
                       description="Train a model for one task; the best is saved to OUT/model. "
                                   "'spanflow train TASK --help' lists the task's flags.")
    by_task = p.add_subparsers(dest="task", required=True, metavar="TASK", parser_class=Parser,
                               help=", ".join(t.name for t in trained))
    parsers = {}
    for task in trained:
        tp = by_task.add_parser(task.name, help=task.summary,
                                description=f"Train a model for {task.summary}; the best is saved to OUT/model.")
        _add_common(tp, task, getattr(task, "data_help", None))
        task.add_train_args(tp.add_argument_group(f"{task.name} options"))
        parsers[task.name] = tp
    owners: dict[str, list[str]] = {}  # each flag -> the train commands that take it
    for name, tp in parsers.items():
        for flag in tp._option_string_actions:
            owners.setdefault(flag, []).append(f"spanflow train {name}")
    for tp in parsers.values():  # a flag only other tasks take is told as theirs, not as a misspelling
        tp.elsewhere = {flag: who for flag, who in owners.items() if flag not in tp._option_string_actions}


def _add_common(p: argparse.ArgumentParser, task, data: str | None) -> None:
    """The flags every task's training takes; `task` the registry's entry (its defaults told in --help)."""
    from spanflow.tasks.registry import takes

    tables = getattr(task, "train_defaults", None)
    name = task.name
    p.add_argument("--train", required=True, help=f"training data{f': {data}' if data else ''}")
    p.add_argument("--dev", help=f"development data{f' ({data})' if data else ''}, evaluated every epoch (or "
                                 "--eval-every steps) [none: no evaluation; the final model is saved]")
    p.add_argument("--model", default="tiny", help=f"a local encoder directory, a spanflow {name} model "
                                                  "(to train further), or 'tiny' (a small encoder built "
                                                  "from the training texts) [%(default)s]")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--devices", type=int, default=None,  # None: a 1 given under a launcher of more is told apart
                   help="processes on this node: re-launches itself through torch.distributed.run (torchrun) "
                        "[1; under torchrun, the processes it started]")
    add_options(p, TrainOptions, keep=lambda field: takes(name, field),
                unset=(lambda field: describe_defaults(field, tables)) if tables else None,
                words={"dev_metric": getattr(task, "dev_metric", "F1")})
    add_runtime_args(p, job="train", budget=getattr(task, "train_budget_note", "") + BUDGET_DEFAULTS["train"])


def after_stop(a: argparse.Namespace) -> str | None:
    """Where a stopped run goes on from: the checkpoint it wrote (not an earlier run's), which the
    same command with --resume takes up (docs/training.md)."""
    import os

    import psutil

    from spanflow.training.checkpoint import STATE

    out = getattr(a, "out", None)
    try:
        written = os.stat(os.path.join(out, "checkpoint", STATE)).st_mtime if out else None
    except OSError:  # none, or a checkpoint between its two renames
        return None
    # this run's own, or the one it resumed from: an earlier run's may be refused by a resume
    if written is not None and (getattr(a, "resume", False) or written >= psutil.Process().create_time()):
        return f"; the same command with --resume goes on from {os.path.join(out, 'checkpoint')}{_at(out)}"
    return None


def _at(out: str) -> str:
    """' (step N, in epoch E)' of the checkpoint in `out`: what a resume repeats of the steps since."""
    import json
    import os

    from spanflow.training.checkpoint import STATE

    try:
        with open(os.path.join(out, "checkpoint", STATE), encoding="utf-8") as f:
            st = json.load(f)
        epoch, inside = int(st["epoch"]), int(st.get("step_in_epoch", 0))
        where = f"in epoch {epoch + 1}" if inside else f"the end of epoch {epoch}"
        return f" (step {int(st['global_step'])}, {where}): the steps after it are trained again"
    except (OSError, ValueError, KeyError, TypeError):  # unreadable: the path alone is still the answer
        return ""


def run(a: argparse.Namespace) -> int:
    import os

    if a.devices is not None and a.devices < 1:
        from spanflow.errors import ConfigError

        raise ConfigError(f"--devices must be >= 1 (processes on this node), got {a.devices}")
    # every value but the budget checked here, before ranks are launched or a model loads to measure
    opts = options_from(TrainOptions, a, max_tokens=None)
    from spanflow.training.distributed import env_world

    local = os.environ.get("LOCAL_WORLD_SIZE", "")  # set by torchrun, for one process too
    launched = local.isdigit() or env_world() > 1
    local = int(local) if local.isdigit() else env_world()  # processes on this node, as the launcher started them
    if a.devices is not None and launched and a.devices != local:
        from spanflow.errors import ConfigError

        raise ConfigError(f"--devices {a.devices}: this process is one of the {local} started on this node (torchrun's "
                          "--nproc-per-node); leave --devices out under a launcher")
    if (a.devices or 1) > 1 and env_world() == 1:
        from spanflow.training.distributed import relaunch

        argv = list(a.argv)  # without --devices N (or --devices=N): each rank is one process
        i = next(k for k, x in enumerate(argv) if x == "--devices" or x.startswith("--devices="))
        return relaunch(argv[:i] + argv[i + (1 if "=" in argv[i] else 2):], a.devices, lambda: after_stop(a))
    from spanflow.training.distributed import init_from_env
    from spanflow.training.outdir import claim_out_dir

    # under torchrun, the group is joined before the data is read: a rank that stops on its own
    # data (another machine's copy) is then a peer the others hear of, not one they wait for at
    # the group's start (for gloo's half hour)
    d = init_from_env()
    # --out is held before the data is read or a budget measured; the training's own claim is this one
    with claim_out_dir(a.out, d, command=True):
        return _train(a, opts, d)


def _train(a: argparse.Namespace, opts: TrainOptions, d) -> int:
    """The run of `spanflow train TASK`, with --out held."""
    from spanflow.runtime.resolve import Asked, resolve_runtime
    from spanflow.tasks.registry import get
    from spanflow.training.distributed import broadcast, on_main
    from spanflow.tuning.auto import quick_profile

    task = get(a.task)
    # the device and precision are decided again, and said, by the training set-up on each rank by the
    # same policy; a measured budget (auto, --profile) is said here, with the training log (stdout)
    measured = a.max_tokens == "auto" or a.profile is not None

    def budget() -> int | None:
        return resolve_runtime(task, a.model, Asked.from_args(a), job="train", data=a.train, measure=quick_profile,
                               log=print if measured else (lambda s: None)).max_tokens

    # rank 0 alone measures (or reads the cached profile) and every rank takes its budget: ranks
    # measuring side by side each picked its own, and ranks of other budgets waited on each other for ever
    max_tokens = broadcast(on_main(budget, d), d)
    # a budget measured on a sample is raised to the data's longest item, where a number given is refused
    chosen = measured and a.max_tokens in (None, "auto")
    said = task.train_from_args(a, dataclasses.replace(opts, max_tokens=max_tokens, budget_measured=chosen))
    if said:
        say_once(said)
    return 0
