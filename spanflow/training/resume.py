"""What a resumed run checks and mends before its first step: that every process resumes from
one checkpoint, that --max-steps and --epochs are not behind it, the line saying where it goes on,
and the report's lines past the checkpoint (which the run reports again)."""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from spanflow.atomic import writing
from spanflow.errors import ConfigError, PeerFailed
from spanflow.training.distributed import Dist, gather
from spanflow.training.options import TrainOptions

if TYPE_CHECKING:
    from spanflow.training.state import LoopState


def check_resume_agrees(r: LoopState, resumed: bool, dist: Dist) -> None:
    """Every process resumes from one checkpoint: each reads OUT/checkpoint where it runs, so a node
    that does not see rank 0's (--out on a local disk) started over beside ranks that resumed, with
    another plan of steps. Rank 0 says which rank found what; the others stop quietly."""
    if not dist.enabled:
        return
    every = gather((resumed, r.st["global_step"]), dist)
    odd = next((k for k, other in enumerate(every) if other != every[0]), None)
    if odd is None:
        return
    if not dist.is_main:
        raise PeerFailed("the processes resume from different checkpoints; rank 0 says how")

    def found(k: int) -> str:
        return f"a checkpoint at step {every[k][1]}" if every[k][0] else "no checkpoint"

    raise ConfigError(f"--resume: rank {odd} finds {found(odd)} in {r.ckpt_dir}, rank 0 {found(0)}: every process "
                      "resumes from one checkpoint (on several machines, an --out on a file system each of them reads)")


def check_steps_left(r: LoopState, opts: TrainOptions, st: dict) -> None:
    """A ConfigError when --max-steps is behind the checkpoint's step: the run could not stop
    there, and would train on to the end. At the checkpoint's step it is the command that
    stopped there, given again with --resume: that trains on to the end (outcome.py says so)."""
    if opts.max_steps and st["global_step"] > opts.max_steps:

        raise ConfigError(f"--max-steps {opts.max_steps}: the checkpoint in {r.ckpt_dir} is at step "
                          f"{st['global_step']} already; give a larger --max-steps, or leave it out to train on "
                          "to the end")


def check_epochs_left(r: LoopState, opts: TrainOptions, st: dict) -> None:
    """A ConfigError when the checkpoint is inside an epoch past --epochs: the run could not stop at
    --epochs (as check_steps_left for --max-steps). A checkpoint at an epoch's end past it is a
    finished run, and resumed_at says so."""
    if st["step_in_epoch"] and st["epoch"] >= opts.epochs:

        at = st["epoch"] + 1  # the epoch the checkpoint is inside of
        raise ConfigError(f"--epochs {opts.epochs}: the checkpoint in {r.ckpt_dir} is at epoch {at} (step "
                          f"{st['global_step']}) already; give --epochs {at} or more")


def resumed_at(st: dict, opts: TrainOptions) -> str:
    """Where a resumed run goes on: its epoch and step, or that its epochs are done."""
    if st["epoch"] < opts.epochs:
        return f"epoch {st['epoch'] + 1}, step {st['global_step']}"
    # --patience is decided again on resume: a run it stopped needs more of it too
    more = "larger --epochs and --patience train" if st["stopped"] else "a larger --epochs trains"
    n = st["epoch"]
    return f"the run finished its {n} epoch{'s' * (n != 1)} (step {st['global_step']}); {more} on"


def trim_report(path: str, st: dict) -> None:
    """Drop train_report.jsonl's lines that the run resumed from checkpoint state `st` reports
    again: those of later steps, and the line of the epoch the checkpoint is inside of (taken at
    that epoch's last step by --save-every or --max-steps, with its end's report written after
    it). Lines that are no report are kept as they are."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    inside = st["epoch"] + 1 if st["step_in_epoch"] else None  # the epoch the resumed run ends and reports
    ended = not lines or lines[-1].endswith("\n")
    if not ended:
        lines.append(lines.pop() + "\n")  # a line torn by a kill is dropped below (no JSON); the next starts anew
    kept = [line for line in lines if not again(line, st["global_step"], inside) and not torn(line)]
    if len(kept) == len(lines) and ended:
        return
    from spanflow.atomic import atomic_open

    with writing("the training report", path), atomic_open(path, "report") as f:
        f.writelines(kept)


def torn(line: str) -> bool:
    """A report line cut short by a kill mid-append: it starts as a record and is no JSON."""

    if not line.lstrip().startswith("{"):
        return False
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


def again(line: str, step: int, inside: int | None) -> bool:

    try:
        rec = json.loads(line)
    except ValueError:
        return False
    if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
        return False
    return rec["step"] > step or (rec["step"] == step and rec.get("epoch") == inside and not rec.get("partial"))
