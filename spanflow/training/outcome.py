"""The one line a training run ends with: where its model is (or, stopped by max_steps, that only
the checkpoint holds this run's weights and how to go on), and the dev score that model has."""
from __future__ import annotations

import json
import os
import shlex
import sys


def outcome_line(summary: dict, out_dir: str, *, metric: str, precision: str, rescored: float | None = None,
                 encoders: tuple[str, str] | None = None) -> str:
    """What `summary` (the training loop's) left in `out_dir`. `rescored`: the dev score of the saved
    model as `spanflow evaluate` runs it, where its encoder loads as another class than training ran
    (`encoders`: the two class names)."""
    model = os.path.join(out_dir, "model")
    best, step, last = summary["best_f1"], summary.get("best_step"), summary["global_step"]
    if not summary["completed"]:
        return _stopped(summary, out_dir, metric)
    if best is None:
        return f"no --dev to pick a best model by: the model of the last epoch (step {last}) is in {model}"
    scored_in = summary.get("best_precision") or precision  # the best's own, where a resume changed it
    score = f"best dev {metric} {best:.4f} ({scored_in}, step {step} of {last})"
    if rescored is not None and encoders and f"{rescored:.4f}" != f"{best:.4f}":
        score = (f"best dev {metric} {rescored:.4f} ({precision}, step {step} of {last}, as spanflow evaluate scores "
                 f"the saved model; training's own evaluation read {best:.4f}: it ran the encoder as {encoders[0]}, "
                 f"the saved model runs it as {encoders[1]}, and the two round differently)")
    if not os.path.isdir(model):  # the best model saved then removed (a finished run resumed): say so, not where
        return (f"{score}: that model is gone from {model} (removed since it was saved); the run's last weights are in "
                f"{os.path.join(out_dir, 'checkpoint', 'model')}")
    return f"{score}: the model is in {model}"


def job_rank() -> int:
    """This process's rank in its torchrun job (the group's, or torchrun's environment before the
    group is joined); 0 outside one, whatever RANK a cluster's pod environment sets."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return 0
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _launched() -> bool:
    """Whether this process was started by torchrun (or by a launcher that sets the variables
    training joins its group by), not merely in an environment that sets WORLD_SIZE or RANK."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(os.environ.get(k) for k in ("RANK", "MASTER_ADDR",
                                                                                   "MASTER_PORT"))


def torchrun_world() -> int:
    """The number of processes of the torchrun job this process is one of; 1 outside one."""
    if not _launched():
        return 1
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def say_once(line: str) -> None:
    """print(line) on rank 0 of a torchrun job, or outside one: a line each rank would repeat."""
    if job_rank() == 0:
        print(line)


def closing(out_dir: str, what: str, command: str) -> str:
    """The run's last lines: `what` its model is, then the command to run it, where the run ran to
    its end and left one; "" otherwise (a run stopped by --max-steps said it has no model yet:
    what the weights in its checkpoint tag is no model's)."""
    after = next_command(out_dir, command)
    return f"{what}{after}" if after else ""


def next_command(out_dir: str, command: str) -> str:
    """"\nnext: COMMAND" with {model} the run's model directory, where the run ran to its end and
    left one; "" otherwise: a run stopped by --max-steps has its weights in the checkpoint, and
    OUT/model may be an earlier run's (the report's last line says whether this run ended)."""
    model = os.path.join(out_dir, "model")
    if not (os.path.isdir(model) and _ran_to_the_end(os.path.join(out_dir, "train_report.jsonl"))):
        return ""
    return f"\nnext: {command.format(model=shlex.quote(model))}"


def _ran_to_the_end(report: str) -> bool:
    """Whether the run whose report this is ended whole, with a model worth running: its last
    period is no --max-steps stop's (an early stop's partial epoch ends the run; a fresh run starts
    a fresh report, training/loop.py), and no dev score it took stayed at 0 or below (a model that
    learned nothing: the run's learning check said what to try, and running it is no next step)."""
    try:
        with open(report, encoding="utf-8") as f:
            periods = [json.loads(x) for x in f.read().strip().splitlines()]
    except (OSError, ValueError):
        return False
    if not periods or (periods[-1].get("partial", False) and not periods[-1].get("early_stop")):
        return False
    scores = [p["dev_f1"] for p in periods if isinstance(p.get("dev_f1"), (int, float)) and p["dev_f1"] == p["dev_f1"]]
    return not scores or max(scores) > 0


def _stopped(summary: dict, out_dir: str, metric: str) -> str:
    model, ckpt = os.path.join(out_dir, "model"), os.path.join(out_dir, "checkpoint", "model")
    best = summary["best_f1"]
    if best is not None and os.path.isdir(model):
        kept = f"the best so far (dev {metric} {best:.4f}, step {summary.get('best_step')}) is in {model}"
    elif os.path.isdir(model):
        kept = f"{model} is an earlier run's"
    else:
        kept = f"no {model} yet"
    return (f"stopped by --max-steps after step {summary['global_step']} (epoch {summary['epoch']}): {kept}; "
            f"this run's last weights are in {ckpt}; the same command with --resume trains on to the end")
