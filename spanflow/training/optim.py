"""Optimizer and schedule: AdamW with parameter groups (weight decay, head learning rate,
layer-wise learning-rate decay) and warmup + linear decay.

On the CPU a vocabulary table (MiniLM's, BERT's vocabulary, is 30522 x 384: half its
parameters) takes sparse gradients: a step touches a few hundred of its rows, but a dense
gradient is a fresh 47 MB tensor filled with zeros every step (page faults and all), then
read by the clip norm and by AdamW over every row (docs/benchmarks.md has the step times).
Its rows are updated lazily instead (`RowAdamW`, training/row_adamw.py): the rows a step
saw, each first given in closed form the updates AdamW would have made on the steps that
missed it. On an accelerator the dense gradient costs little and its sparse one would need
a host sync per step to size it, so tables stay dense there.
"""
from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import nn

from spanflow.training.options import TrainOptions
from spanflow.training.row_adamw import RowAdamW

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


VOCABULARY_ROWS = 4096  # an embedding table this long is a vocabulary, read a few rows a step
# the names vocabularies have: transformers' encoders (BERT, RoBERTa, XLM-R, DeBERTa, ELECTRA,
# MPNet) and the native BERT call theirs word_embeddings, the tiny encoder its tables embeddings
# and bigrams (hashed word pairs); None: any table
VOCABULARY_NAMES: tuple[str, ...] | None = ("word_embeddings", "embeddings", "bigrams")


def sparse_tables(model: nn.Module, device: torch.device, enable: bool = True) -> list[nn.Embedding]:
    """Switch the model's trainable vocabulary tables to sparse gradients on the CPU (`enable`),
    every other table, and every table elsewhere, to dense ones; the sparse tables. Before DDP
    wraps the model: its reducer learns then which gradients come sparse."""
    sparse = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Embedding):
            continue
        m.sparse = (enable and device.type == "cpu" and m.num_embeddings >= VOCABULARY_ROWS
                    and m.weight.requires_grad and m.max_norm is None
                    and (VOCABULARY_NAMES is None or name.rsplit(".", 1)[-1] in VOCABULARY_NAMES))
        if m.sparse:
            sparse.append(m)
    return sparse


def build_optimizer(model: nn.Module, opts: TrainOptions, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (RowAdamW); no weight decay on biases and LayerNorm; head lr and layer-wise decay
    groups. On the CPU it first switches the vocabulary tables to sparse gradients (`sparse_tables`),
    unless DDP is to compress gradients: its communication hooks take no sparse one."""
    sparse_tables(model, device, enable=opts.grad_compression == "none")
    n_layers = _num_layers(model)
    groups: dict[tuple, list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        wd = 0.0 if p.ndim < 2 else opts.weight_decay
        groups.setdefault((param_lr(name, opts, n_layers), wd), []).append(p)
    param_groups = [{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()]
    try:  # the fused kernel is faster than foreach on CPU too (torch >= 2.4)
        return RowAdamW(param_groups, fused=True)
    except (RuntimeError, TypeError):
        return RowAdamW(param_groups)


def warmup_linear(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    warm = max(1, int(total_steps * warmup_ratio))

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total_steps - step) / max(1, total_steps - warm))

    return f
