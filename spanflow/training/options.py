"""Run options as one typed dataclass, with defaults right for most users."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass


@dataclass
class TrainOptions:
    """How to train. `max_tokens` counts padded tokens per micro-batch (see the batcher)."""

    epochs: int | None = None  # None: the task's default (training/defaults.py); early stopping ends most runs
    lr: float | None = None  # None: the task's default, scaled to the update size
    head_lr: float | None = None  # None: the task's default for a fresh head (or lr)
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    grad_accum: int = 1
    max_tokens: int | None = None  # None: sized from the data (training/defaults.update_tokens)
    max_length: int | None = None  # None: the encoder's limit
    stride: int = 32
    precision: str = "auto"
    device: str = "auto"
    seed: int = 0
    eval_every: int | None = None  # optimizer steps; None: once per epoch
    patience: int | None = None  # evaluations without a better dev F1 before stopping; None: the task's; 0: never
    save_every: int | None = None  # optimizer steps between mid-epoch checkpoints
    max_steps: int | None = None  # stop (with a checkpoint) after this many optimizer steps
    resume: bool = False
    log_every: int = 50
    lr_scaling: str = "none"  # none | sqrt | linear: lr x sqrt(world) or x world under DDP
    grad_compression: str = "none"  # none | fp16: DDP gradient all-reduce in fp16 (CUDA)
    # recipes (docs/recipes.md has their measured effect)
    label_smoothing: float = 0.0  # share of each target's probability spread over all labels
    class_weights: str | dict | None = None  # NER: None, "auto" (from label frequencies) or {label: weight}
    llrd: float = 1.0  # layer-wise lr decay: each encoder layer takes llrd x the lr of the one above
    pack: float | None = None  # NER: share of training texts joined with their neighbours; None: the task's
    oversample: float = 0.0  # entity-aware sampling strength: rare-type examples drawn (f_max/f)^x as often
    grad_checkpointing: bool = False  # recompute layer activations in backward: less memory, ~30% more compute

    def to_dict(self) -> dict:
        return asdict(self)


LR_SCALINGS = ("none", "sqrt", "linear")


def scaled_options(opts: TrainOptions, *, default_lr: float, world: int) -> TrainOptions:
    """Fill the default learning rate and apply --lr-scaling for `world` processes.

    Each process takes max_tokens per micro-batch, so a step sees world times the tokens of
    one process. `linear` keeps the per-token step size of single-device training (good for
    SGD-like regimes and large data); `sqrt` is the milder rule that tends to suit Adam;
    `none` keeps the learning rate and simply averages over more tokens.
    """
    from spanflow.errors import ConfigError

    if opts.lr_scaling not in LR_SCALINGS:
        raise ConfigError(f"--lr-scaling must be one of {', '.join(LR_SCALINGS)}")
    if not 0.0 <= opts.label_smoothing < 1.0:
        raise ConfigError(f"--label-smoothing must be in [0, 1), got {opts.label_smoothing}")
    if not 0.0 < opts.llrd <= 1.0:
        raise ConfigError(f"--llrd must be in (0, 1], got {opts.llrd}")
    if opts.oversample < 0:
        raise ConfigError(f"--oversample must be >= 0, got {opts.oversample}")
    lr = opts.lr if opts.lr is not None else default_lr
    factor = {"none": 1.0, "sqrt": math.sqrt(world), "linear": float(world)}[opts.lr_scaling]
    head = opts.head_lr * factor if opts.head_lr else None
    return dataclasses.replace(opts, lr=lr * factor, head_lr=head)
