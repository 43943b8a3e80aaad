"""What the training loop and a task share (TaskHooks), and what one run carries between its
steps, epochs, evaluations and checkpoints (LoopState)."""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from spanflow.monitor.report import Meter
from spanflow.runtime.policy import Policy
from spanflow.training.distributed import Dist
from spanflow.training.options import TrainOptions
from spanflow.training.report_to import Reporters


@dataclass
class TaskHooks:
    """What a task gives the loop. Batches are dicts of CPU tensors plus host-side counts
    `n_targets`, `real_tokens`, `padded_tokens` (so the loop never syncs to learn them);
    `loss_fn` gets the tensors on the device and the host values as they are."""

    collate: Callable[[list], dict]
    loss_fn: Callable[[nn.Module, dict], torch.Tensor]  # summed loss over the batch's targets
    evaluate: Callable[[nn.Module], dict] | None  # returns at least {"f1": ...}
    save_model: Callable[[str], None]  # writes a self-contained model directory
    targets: Callable[[object], int] | None = None  # loss targets of one item: global step normalisation
    metric: str = "F1"  # what evaluate's "f1" is, in the lines printed (embeddings: Spearman)
    # a step's forward and backward over its micro-batches, (model, micro, policy, scaler, meter, world)
    # -> this rank's share of the step's loss (the ranks' sum is the loss, as the lines print it);
    # None: forward_backward with loss_fn, each micro-batch's loss on its own
    step: Callable[..., torch.Tensor] | None = None
    # what else sets the run's course (the task's loss and its settings), compared on --resume
    course: dict | None = None
    min_update: int = 1  # items an update needs to teach anything (Plan.min_update)
    option_fields: frozenset[str] | None = None  # the task's own TrainOptions fields (Plan.option_fields)


@dataclass
class LoopState:
    """What one training run carries between its steps, epochs, evaluations and checkpoints."""

    model: nn.Module
    ddp: nn.Module  # the model, DDP-wrapped under torchrun
    items: list
    hooks: TaskHooks
    opts: TrainOptions
    policy: Policy
    dist: Dist
    log: Callable[[str], None]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: object
    meter: Meter | None  # set last, so its clock starts when training does
    st: dict  # epoch, step_in_epoch, global_step, best_f1, bad_evals, stopped: what a checkpoint keeps
    out_dir: str
    total_steps: int
    running: torch.Tensor  # loss summed on device: read only at log points
    n_running: int = 0
    recent: deque | None = None  # the last loss_window() steps' losses, on device: read only when dev F1 is 0
    bar: object = None  # a progress bar on a terminal (progress_bar), else None and plain log lines
    bar_tokens: int = 0
    reporters: Reporters | None = None  # TensorBoard / MLflow (--report-to), rank 0 only
    clock: tuple[float, int] = (0.0, 0)  # (perf_counter, global step) where this process began its steps
    spent: dict = field(default_factory=lambda: {"evaluation": 0.0, "saving": 0.0})  # seconds, this process

    @property
    def last_step(self) -> int:
        """The step this run ends at unless an early stop comes first: the plan's last, or --max-steps
        (a resume at or past it trains on to the end)."""
        stop = self.opts.max_steps
        return min(self.total_steps, stop) if stop and stop > self.clock[1] else self.total_steps

    @property
    def ckpt_dir(self) -> str:
        return os.path.join(self.out_dir, "checkpoint")

    @property
    def report_path(self) -> str:
        return os.path.join(self.out_dir, "train_report.jsonl")
