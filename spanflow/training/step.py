"""One training step, the same for the training loop, `tune` and `doctor`: forward and backward
over a step's micro-batches, then the optimizer step with loss scaling and clipping."""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from spanflow.monitor.report import Meter
from spanflow.runtime.policy import Policy


def one_step(model: nn.Module, batch: dict, loss_fn, policy: Policy, optimizer, scaler=None,
             max_grad_norm: float = 1.0) -> torch.Tensor:
    """A whole update on one collated batch (tune and doctor): forward_backward + optimizer_step."""
    loss = forward_backward(model, [as_micro(batch)], loss_fn, policy, scaler)
    optimizer_step(model, optimizer, None, scaler, max_grad_norm)
    return loss


def as_micro(batch: dict) -> dict:
    """A collated batch as the only micro-batch of its step."""
    return {**batch, "weight": 1.0, "n_global": None}


def forward_backward(model: nn.Module, micro: list[dict], loss_fn, policy: Policy, scaler=None,
                     meter: Meter | None = None, world: int = 1) -> torch.Tensor:
    """Forward/backward over one step's micro-batches. The loss is normalised by the step's
    target count over all ranks, and scaled by the world size because DDP averages the
    ranks' gradients, so the update equals one process training on the whole global batch.
    Gradients are all-reduced on the last micro-batch only (no_sync before it)."""
    local = sum(b["n_targets"] for b in micro if b["weight"])
    n_targets = max(1, micro[0]["n_global"] if micro[0]["n_global"] is not None else local)
    total = None
    for k, b in enumerate(micro):
        if b["weight"] and meter is not None:
            meter.add_tokens(b["real_tokens"], b["padded_tokens"])
        batch = {key: v.to(policy.device, non_blocking=True) for key, v in b.items() if torch.is_tensor(v)}
        sync = k == len(micro) - 1 or not hasattr(model, "no_sync")
        with (contextlib.nullcontext() if sync else model.no_sync()), policy.autocast():
            loss = loss_fn(model, batch) * (b["weight"] * world / n_targets)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total / world


def optimizer_step(model: nn.Module, optimizer, scheduler=None, scaler=None, max_grad_norm: float = 1.0) -> None:
    """Unscale, clip, step (through the loss scaler when there is one), zero, advance the schedule."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if max_grad_norm:
        nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
