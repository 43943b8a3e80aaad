"""Optimizer and schedule: AdamW with parameter groups (weight decay, head learning rate,
layer-wise learning-rate decay) and warmup + linear decay."""
from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import nn

from spanflow.training.options import TrainOptions

_LAYER = re.compile(r"\.(?:layer|layers|h|block|blocks)\.(\d+)\.")


def encoder_depth(name: str, n_layers: int) -> int:
    """Depth of an encoder parameter: 0 for embeddings, i + 1 for transformer layer i, and
    n_layers + 1 for what sits above the last layer (final norm, pooler)."""
    m = _LAYER.search(name)
    if m:
        return int(m.group(1)) + 1
    return 0 if "embed" in name else n_layers + 1


def _num_layers(model: nn.Module) -> int:
    cfg = getattr(getattr(model, "encoder", None), "config", None)
    n = getattr(cfg, "num_hidden_layers", None)
    if n is None:
        found = [_LAYER.search(name) for name, _ in model.named_parameters()]
        n = 1 + max((int(m.group(1)) for m in found if m), default=-1)
    return int(n)


def param_lr(name: str, opts: TrainOptions, n_layers: int) -> float:
    """The learning rate of one parameter of an encoder+head model.

    The head takes `head_lr` (or `lr`). With layer-wise decay `llrd` < 1 the top encoder
    layer takes `lr` and each layer below it `llrd` times the one above, the embeddings
    last: lower layers hold general features a small dataset should barely move.
    """
    if name.startswith("head."):
        return opts.head_lr or opts.lr
    if opts.llrd >= 1.0 or not name.startswith("encoder."):
        return opts.lr
    depth = min(encoder_depth(name, n_layers), n_layers)
    return opts.lr * opts.llrd ** (n_layers - depth)


def build_optimizer(model: nn.Module, opts: TrainOptions, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and LayerNorm; head lr and layer-wise decay groups."""
    n_layers = _num_layers(model)
    groups: dict[tuple, list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        wd = 0.0 if p.ndim < 2 else opts.weight_decay
        groups.setdefault((param_lr(name, opts, n_layers), wd), []).append(p)
    param_groups = [{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()]
    try:  # the fused kernel is faster than foreach on CPU too (torch >= 2.4)
        return torch.optim.AdamW(param_groups, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(param_groups)


def warmup_linear(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    warm = max(1, int(total_steps * warmup_ratio))

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total_steps - step) / max(1, total_steps - warm))

    return f
