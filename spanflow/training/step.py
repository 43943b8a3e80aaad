"""One training step, the same for the training loop, `tune` and `doctor`: forward and backward
over a step's micro-batches, then the optimizer step with loss scaling and clipping."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable

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
        batch = {key: v.to(policy.device, non_blocking=True) if torch.is_tensor(v) else v for key, v in b.items()}
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
        clip_grad_norm(model.parameters(), max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()


@torch.no_grad()
def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """nn.utils.clip_grad_norm_ (2-norm) over dense and sparse gradients (a vocabulary table's on
    the CPU, training/optim.py); a sparse one is coalesced in place, as the optimizer reads it."""
    params = [p for p in params if p.grad is not None]
    if not any(p.grad.is_sparse for p in params):
        return nn.utils.clip_grad_norm_(params, max_norm)
    for p in params:
        if p.grad.is_sparse:
            p.grad = p.grad.coalesce()
    grads = [p.grad.values() if p.grad.is_sparse else p.grad for p in params]
    dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    device = grads[0].device
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=dtype).to(device) for g in grads]))
    coef = (max_norm / (total + 1e-6)).clamp_(max=1.0)  # as clip_grad_norm_: no host sync to test it
    for g in grads:
        g.mul_(coef.to(g.device, g.dtype))
    return total
