"""What a training run tells as it goes: the progress bar, each period's report (the JSONL line,
the printed line, the dashboards' scalars), and the learning check at an epoch that ends at dev F1 0."""
from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING

import torch

from spanflow.atomic import writing
from spanflow.monitor.report import SCALARS, append_jsonl, clock_time, format_report, report_scalars
from spanflow.training.distributed import all_sum, on_main

if TYPE_CHECKING:
    from spanflow.training.state import LoopState


def progress_bar(r: LoopState):
    """A tqdm bar (steps, ETA, loss, tokens/s) when rank 0 prints (log_fn=print, the command line's)
    to a terminal; None otherwise, and the loop logs plain lines: log_fn=None says nothing, and a
    caller's own log_fn (a logger) gets the lines, where a bar beside them would garble both.
    Lines printed while the bar is up go above it."""
    if not (r.dist.is_main and r.opts.log_every and r.log is print and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    bar = tqdm(total=r.last_step, initial=r.st["global_step"], unit="step", dynamic_ncols=True, mininterval=0.5)
    r.log = bar.write
    return bar


def elapsed_left(r: LoopState, step: int) -> str:
    """The time this process has trained (evaluations and saves included) and, at its pace so far,
    about how long the steps left to the plan's end (or --max-steps) take; an early stop ends sooner."""
    start, first = r.clock
    spent = time.perf_counter() - start
    done, left = step - first, max(0, r.last_step - step)
    return f"{clock_time(spent)} elapsed" + (f", about {clock_time(spent / done * left)} left" if done and left else "")


def report_period(r: LoopState, epoch: int, rep: dict, f1: float | None, partial: bool = False,
                  early_stop: bool = False) -> None:
    """A period's report (Meter.report) with its epoch, step and dev score: a line of
    train_report.jsonl, a printed line and the dashboards' scalars, from rank 0. `partial`: the
    epoch did not end (--max-steps; or an early stop inside it, `early_stop`, which ends the run)."""
    if not rep.get("steps", 1):  # no step in the period (a resume at the end of an epoch): nothing was measured
        rep = {k: (None if k in SCALARS or k == "wall_s" else v) for k, v in rep.items()}
    rep = {"epoch": epoch + 1, "step": r.st["global_step"], **rep, "precision": r.policy.name,
           "device": str(r.policy.device), "dev_f1": f1}
    if r.hooks.metric != "F1":
        rep["dev_metric"] = r.hooks.metric  # dev_f1 holds this task's dev score
    if partial:
        rep["partial"] = True
    if early_stop:
        rep["early_stop"] = True
    if r.recent:  # the step lines' loss, averaged over their window: one host sync a period
        rep["loss"] = window_loss(r)
    on_main(lambda: _write(r, rep, epoch), r.dist)


def _write(r: LoopState, rep: dict, epoch: int) -> None:
    with writing("the training report", r.report_path):
        append_jsonl(r.report_path, rep)
    r.log(format_report(rep))
    r.reporters.log_metrics({**report_scalars(rep, "epoch"), "train/epoch": epoch + 1}, r.st["global_step"])


def lr_now(r: LoopState) -> float:
    """--lr as the schedule stands now (groups below the top layer or the head differ by fixed factors)."""
    lr, base = r.scheduler.get_last_lr()[0], r.scheduler.base_lrs[0]
    return r.opts.lr * lr / base if r.opts.lr and base else lr


LOSS_WINDOW = 50  # steps a loss is averaged over when --log-every is 0


def loss_window(log_every: int, first_epoch_steps: int) -> int:
    """Steps the learning check averages the loss over: the step lines' --log-every (LOSS_WINDOW
    when 0), at most half the first epoch, so that its first and its last window differ."""
    return max(1, min(log_every or LOSS_WINDOW, first_epoch_steps // 2))


def mean_loss(losses) -> float:
    """The mean of step losses kept on the device (one host sync)."""
    return float(torch.stack(list(losses)).mean())  # host sync


def window_loss(r: LoopState) -> float:
    """The step lines' loss over the last window: each rank holds its share of a step's loss, the
    sum is the loss. Every rank calls it (a collective under torchrun)."""
    return all_sum([mean_loss(r.recent)], r.dist)[0]


def check_finite(r: LoopState) -> None:
    """A ConfigError when the loss of the last steps or the weights are not finite: training has
    diverged, and no later step brings it back. Called before every checkpoint and evaluation (one
    host sync each); every rank reads the same figures, so all stop together. The weights are
    checked too because the last step's update is in them and in no loss yet. Under fp16's loss
    scaler an overflowing step is skipped, not applied: its loss is no sign."""
    loss = window_loss(r) if r.recent and r.scaler is None else 0.0
    if math.isfinite(loss) and _finite(r.model):
        return
    raise diverged(r, f"the training loss is {loss}" if not math.isfinite(loss) else "the weights are not finite")


def check_logged_loss(r: LoopState, loss: float) -> None:
    """check_finite's error at a step line whose loss (already on the host) is not finite: a run
    stops there, not an epoch later. Under fp16's loss scaler a skipped step's loss is no sign."""
    if not math.isfinite(loss) and r.scaler is None:
        raise diverged(r, f"the training loss is {loss}")


def diverged(r: LoopState, what: str):
    """The ConfigError of a diverged run, quoting the peak learning rate (the schedule's rate at
    the point it is caught may have decayed to 0)."""
    from spanflow.errors import ConfigError

    peak = r.opts.lr or r.scheduler.base_lrs[0]
    return ConfigError(f"{what} by step {r.st['global_step']}: training diverged; lower --lr (its peak is "
                       f"{peak:.2g}){_or_head(r)}, keep --max-grad-norm above 0, or try --precision fp32")


def _or_head(r: LoopState, joined: str = " or ") -> str:
    """' or --head-lr' where the model has a head of its own to give a learning rate (the embedding
    task trains its encoder alone, and has no such flag)."""
    return f"{joined}--head-lr" if any(n.startswith("head.") for n, _ in r.model.named_parameters()) else ""


def _finite(model) -> bool:
    """Whether every floating-point weight is finite (one host sync)."""
    flags = [torch.isfinite(p).all() for p in model.parameters() if p.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


def learning_check(r: LoopState, f1: float | None, left: int, stopped: bool = False) -> None:
    """One line when an epoch ends at dev F1 0: say whether the loss moved and what to try
    (`left`: epochs still to run). Both figures are the loss the step lines print, averaged over
    the same number of steps: the first steps of the run, and the last ones before this check.
    `stopped`: --patience ended the run inside an epoch, so more of it is what would train longer."""
    first, w = r.st.get("first_loss"), r.recent.maxlen
    best = r.st.get("best_f1") or 0.0  # an --eval-every evaluation may have scored above 0 before this one
    if f1 is None or f1 > 0 or best > 0 or not first or len(r.recent) < w:  # the same on every rank: broadcast
        return
    if r.st["global_step"] <= w:  # the first steps would be compared with themselves (a 1-step epoch's)
        return
    loss = window_loss(r)  # host sync, only at an epoch that ended at dev F1 0
    if not r.dist.is_main:
        return
    steps = r.st["global_step"]
    at = "0" if f1 == 0 else f"{f1:.4f}"  # a correlation (Spearman) may fall below 0
    moved = f"{first:.4f} -> {loss:.4f}: the mean step loss of the first {w} steps, then of the last {w}"
    verdict = "rose" if loss > 1.05 * first else "flat" if loss > 0.8 * first else None
    said = f"{verdict}, stopped" if stopped else verdict  # once while it holds; an early stop's advice differs
    if verdict is not None and r.st.get("said_verdict") == said:
        return
    r.st["said_verdict"] = said
    if verdict == "rose":  # a loss that climbs is no slow start: the steps overshoot
        r.log(f"not learning: dev {r.hooks.metric} is {at} and the loss rose ({moved}) in {steps} optimizer steps; "
              f"the steps overshoot: try a lower --lr{_or_head(r, '/')}")
    elif verdict == "flat":
        longer = "a larger --patience" if stopped else "more --epochs"
        r.log(f"not learning: dev {r.hooks.metric} is {at} and the loss barely moved ({moved}) in {steps} optimizer steps; "
              f"give it more updates (a smaller --max-tokens, {longer}) or a higher --lr{_or_head(r, '/')}")
    elif left:  # exact-match F1 often stays 0 for a while after the loss starts falling (CasRel)
        if r.st.get("said_learning"):  # once: a small data set's run said it at every one of its 20 epochs
            return
        r.st["said_learning"] = True
        r.log(f"dev {r.hooks.metric} is {at} so far, but the loss fell ({moved}) in {steps} optimizer steps: "
              f"still learning, {left} epoch{'s' if left > 1 else ''} to go")
    else:
        r.log(f"dev {r.hooks.metric} is still {at} although the loss fell ({moved}) in {steps} optimizer steps: "
              f"train longer ({'a larger --patience' if stopped else '--epochs'}), or check that --dev holds the "
              "labels of --train")
