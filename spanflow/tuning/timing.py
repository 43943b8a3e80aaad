"""tune's time budget: `--budget-seconds` holds the whole command, from its start (imports, the
model's load, the sample's tokenization, the precision check) to the profile written.

What is spent before the sweep cannot be cut and is said up front; the sweep's runs share
what is left, and a run that would end past it is left out (tuning/sweep.py). Compiling the
encoder for the backend comparison cannot be cut either: it runs only where the budget leaves
room for it beside the sweep.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

COMPILE_SECONDS = 30.0  # compiling an encoder for the backend comparison takes about this (tens of seconds)
FINISH_SECONDS = 1.5  # writing the profile, its table and its plot, and the interpreter exiting
BACKEND_REPEATS = 2  # runs of each backend in the comparison (inference.backend.compare_backends' repeats)
COMPARE_RUNS = 2 * BACKEND_REPEATS + 1  # of the best point: eager, compiling, then compiled and eager in turn


@dataclass
class TimeBudget:
    """`seconds` from `started`, a reading of `clock`: the command's budget. The sweep's deadline
    is read from the same clock (a test gives its own, one that moves only as it says)."""

    seconds: float
    started: float
    clock: Callable[[], float] = time.perf_counter  # monotonic, and fine-grained where monotonic() is not

    def spent(self) -> float:
        return self.clock() - self.started

    def left(self) -> float:
        return self.seconds - self.spent()


@dataclass
class Plan:
    """How the sweep spends what the budget has left."""

    per_run: float  # seconds of one run of a point
    deadline: float  # the budget's clock() by which the sweep ends
    compare: bool  # whether the backend comparison runs after it


def plan_time(budget: TimeBudget, runs: int, *, compare: bool, log: Callable[[str], None]) -> Plan:
    """Spread what is left of `budget` over the sweep's `runs` (and the backend comparison where
    `compare` and it fits), saying in one line what went before and what each part gets."""
    left = budget.left() - FINISH_SECONDS
    if compare and left < 2 * COMPILE_SECONDS:
        need = 10 * math.ceil((budget.spent() + 2 * COMPILE_SECONDS + FINISH_SECONDS) / 10)
        log(f"backend comparison left out: compiling the encoder takes about {COMPILE_SECONDS:.0f} s, which no "
            f"budget can cut, and {max(0.0, left):.0f} s are left (--budget-seconds {need} compares it)")
        compare = False
    sweep_s = left - (COMPILE_SECONDS if compare else 0.0)
    per_run = max(0.2, sweep_s / (runs + (COMPARE_RUNS if compare else 0)))
    said = (f"time: {budget.spent():.1f} s of --budget-seconds {budget.seconds:g} went to starting, loading the model "
            "and preparing the sample (not cut by the budget); ")
    if sweep_s <= 0:
        log(said + "none is left: each max length is measured once at its smallest budget")
    else:
        log(said + f"up to {runs} runs share the {sweep_s:.0f} s left, at most {per_run:.1f} s each"
            + (f", then about {COMPILE_SECONDS:.0f} s to compile the encoder" if compare else ""))
    sweep_end = sweep_s - (COMPARE_RUNS * per_run if compare else 0.0)
    return Plan(per_run=per_run, deadline=budget.clock() + max(0.0, sweep_end), compare=compare)


def compile_fits(budget: TimeBudget, log: Callable[[str], None]) -> bool:
    """Whether the backend comparison still fits after the sweep (a sweep past its plan: no)."""
    if budget.left() >= COMPILE_SECONDS:
        return True
    log(f"backend comparison left out: {max(0.0, budget.left()):.0f} s of --budget-seconds are left, and compiling "
        f"takes about {COMPILE_SECONDS:.0f} s")
    return False
