"""Dropout that is cheap on the CPU.

torch's CPU dropout draws one random number per element, serially (`bernoulli_`): on a
training step of a small encoder that is more time than some of its matrix products. Here
the CPU draws one 64-bit word per four elements and keeps an element where its 16 bits are
at or above p * 2^16, so p is honoured to within 2^-16. The draws come from torch's default
generator, so `torch.manual_seed`, the checkpoint's RNG state and gradient checkpointing's
replay give the same masks as they would with torch's dropout. Other devices keep torch's
fused kernel.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_SPAN = 1 << 16


def keep_mask(shape: torch.Size | tuple, p: float) -> torch.Tensor:
    """A boolean CPU tensor of `shape`, each element True with probability 1 - p."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1)
    # four uniform 16-bit lanes per word, read as signed: lane >= threshold - 2^15 iff unsigned lane >= threshold
    lanes = words.view(torch.int16)[:n].view(shape)
    return lanes >= round(p * _SPAN) - _SPAN // 2


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout's contract (zero with probability p, scale the rest by 1 / (1 - p))."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    # the scaled mask in x's dtype: one multiply forward and one backward, nothing else kept
    return x * keep_mask(x.shape, p).to(x.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """nn.Dropout with `dropout` as its forward. A subclass, so code that finds dropout layers
    by type (to set p, or to turn them off) finds these too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
