"""Dropout that is cheap on the CPU.

torch's CPU dropout draws one random number per element, serially (`bernoulli_`): on a
training step of a small encoder that is more time than some of its matrix products. Here
the CPU draws one 64-bit word per four elements and drops an element where its 16 bits fall
below round(p * 2^16), so p is honoured to within 2^-17, and the kept ones are scaled by the
exact inverse of the keep rate. The draws come from torch's default generator, so runs are
reproducible the way torch's dropout makes them: `torch.manual_seed`, the checkpoint's RNG
state and gradient checkpointing's replay give the same masks again (not torch's masks).
Other devices keep torch's fused kernel.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_SPAN = 1 << 16


def _drops(p: float) -> int:
    """How many of the 2^16 lane values drop an element."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return round(p * _SPAN)


def keep_mask(shape: torch.Size | tuple, p: float) -> torch.Tensor:
    """A boolean CPU tensor of `shape`, each element True with probability 1 - p (to 2^-17)."""
    n = math.prod(shape)
    return keep_from_words(torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1), shape, p)


def keep_from_words(words: torch.Tensor, shape: torch.Size | tuple, p: float) -> torch.Tensor:
    """keep_mask's mask from uniform random int64 `words`, at least a quarter as many as elements."""
    # four uniform 16-bit lanes per word; read as int16 they are uniform on [-2^15, 2^15), so
    # "lane >= drops - 2^15" holds with probability 1 - drops / 2^16 (drops < 2^16: no wrap)
    lanes = words.view(torch.int16)[:math.prod(shape)].view(shape)
    return lanes >= min(_drops(p), _SPAN - 1) - _SPAN // 2


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout's contract (zero with probability p, scale the rest by the inverse keep rate)."""
    drops = _drops(p)
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or drops >= _SPAN:
        return F.dropout(x, p, True)
    # the scaled mask in x's dtype: one multiply forward and one backward, nothing else kept;
    # converted from its bytes, which torch converts to a float type faster than bool
    return x * keep_mask(x.shape, p).view(torch.uint8).to(x.dtype).mul_(_SPAN / (_SPAN - drops))


class Dropout(nn.Dropout):
    """nn.Dropout with `dropout` as its forward. A subclass, so code that finds dropout layers
    by type (to set p, or to turn them off) finds these too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
