"""A Linear layer whose CPU low-precision products see few distinct row counts.

On the CPU, a bf16 or fp16 product goes through oneDNN, which builds and keeps a kernel (and
its buffers, about a megabyte) for every row count it meets, up to its cache's capacity of
1024 shapes per kind. A batch of B texts padded to T tokens gives a product of B * T rows,
and token-budget batches give a new B * T for almost every batch: a bulk job's memory grew
with its row count until the cache filled (tests/test_linear.py, docs/architecture.md).
Here the rows are rounded up to one of a few sizes (32 per doubling: at most 1/32 more rows,
1/64 on average), the extra rows zero and dropped from the result, so the sizes a process
ever meets stay a fixed, small set whatever its input (below 256 rows the step is 8). Here
the rounding is fused into the cast autocast would make anyway; the native BERT rounds once per
forward instead (models/bert.py). fp32 (MKL keeps no such kernels), other devices and compiled
graphs (a rounding would pin a dynamic graph to one row count) run nn.Linear as it is.

A bulk loop's token-budget batches are nearly all full: a full batch of texts padded to T
tokens holds more than budget - T token rows. Its rare short batches (a chunk's last, one
closed early for padding) would still meet most of the sizes below that, one by one as the
input grows, a megabyte or two each. Inside `full_batches(budget, longest)` those below
min(3/4 budget, budget - longest) round up to a power of two instead (at most to that bound,
on the fine steps), costing a few padded rows on a small fraction of the batches, and the set
of sizes is complete after the first chunks. Serving's batches are as large as its queue, not
the budget, and keep the fine steps.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

_STEPS = 32  # sizes per doubling of the row count
_SMALLEST = 8  # rows are rounded to at least a multiple of this


_SHORT_BELOW: ContextVar[int] = ContextVar("spanflow_short_below", default=0)  # 0: no bulk loop


@contextmanager
def full_batches(budget: int | None, longest: int) -> Iterator[None]:
    """Inside it, products below min(3/4 budget, budget - longest) rows (a bulk loop's short
    batches, `budget` its tokens per batch and `longest` its longest text in tokens) round up to
    a power of two, at most to that bound on the fine steps; None: the fine steps everywhere."""
    token = _SHORT_BELOW.set(max(0, min(budget * 3 // 4, budget - longest)) if budget else 0)
    try:
        yield
    finally:
        _SHORT_BELOW.reset(token)


def _fine(m: int) -> int:
    step = max(_SMALLEST, (1 << max(m.bit_length() - 1, 0)) // _STEPS)
    return -(-m // step) * step


def rounded_rows(m: int) -> int:
    """`m` rounded up to the next of the fixed sizes: a multiple of 2^(floor(log2 m) - 5), at
    least 8; inside full_batches, below its bound, the next power of two (at most the bound's size)."""
    short = _SHORT_BELOW.get()
    if 0 < m < short:
        return min(max(_SMALLEST, 1 << (m - 1).bit_length()), _fine(short))
    return _fine(m)


def _autocast_dtype() -> torch.dtype | None:
    """The CPU autocast dtype in force, or None (torch before 2.4 names these functions apart)."""
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None


def tracing() -> bool:
    """Whether this code is being traced by torch.compile. Not `is_compiling()`, which is one flag for
    the process: a server compiling aside would turn it on for the eager batches of another thread."""
    asked = getattr(torch.compiler, "is_dynamo_compiling", None) or torch.compiler.is_compiling  # (older torch)
    return asked()


def low_precision(x: torch.Tensor, weight) -> torch.dtype | None:
    """The dtype a CPU product of x and weight runs in, where that is bf16 or fp16; else None.
    None inside torch.compile: a rounding there would pin a dynamic graph to one row count."""
    if x.device.type != "cpu" or not isinstance(weight, torch.Tensor) or tracing():
        return None  # not weight: a quantized layer's packed weight is not oneDNN's bf16 path
    dt = _autocast_dtype() or x.dtype
    return dt if dt in (torch.bfloat16, torch.float16) else None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, its rows rounded up to a fixed size for a CPU low-precision product."""
    dt = low_precision(x, weight)
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    r = rounded_rows(m) if dt is not None and m else m
    if r == m:
        return F.linear(x, weight, bias)
    rows = x.new_empty((r, x.shape[-1]), dtype=dt)
    rows[:m].copy_(x.reshape(m, x.shape[-1]))  # the cast autocast would make, into the rounded rows
    rows[m:].zero_()
    y = F.linear(rows, weight, bias)  # under autocast, its cached cast of the weight
    return y[:m].view(*x.shape[:-1], y.shape[-1])


class Linear(nn.Linear):
    """nn.Linear (same parameters and state dict) running `linear` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
