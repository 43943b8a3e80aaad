"""Run options as one typed dataclass, with defaults right for most users."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TrainOptions:
    """How to train. `max_tokens` counts padded tokens per micro-batch (see the batcher)."""

    epochs: int = 3
    lr: float | None = None  # None: 5e-5 for a pretrained encoder, 2e-3 for `tiny`
    head_lr: float | None = None  # None: same as lr
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    grad_accum: int = 1
    max_tokens: int = 4096
    max_length: int | None = None  # None: the encoder's limit
    stride: int = 32
    precision: str = "auto"
    device: str = "auto"
    seed: int = 0
    eval_every: int | None = None  # optimizer steps; None: once per epoch
    patience: int | None = 3  # evaluations without improvement before stopping; None: never stop
    save_every: int | None = None  # optimizer steps between mid-epoch checkpoints
    max_steps: int | None = None  # stop (with a checkpoint) after this many optimizer steps
    resume: bool = False
    log_every: int = 50

    def to_dict(self) -> dict:
        return asdict(self)
