"""The parts of a `measure(max_tokens, max_length, seconds) -> figures` function that tasks share:
training steps or forward passes over token-budget batches, timed by the probe."""
from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

from spanflow.batching.batcher import token_budget_batches
from spanflow.training.optim import build_optimizer
from spanflow.tasks.registry import Workload
from spanflow.training.options import TrainOptions
from spanflow.training.step import one_step
from spanflow.tuning.probe import run_probe


def _train_step(module, items, collate, loss_fn, policy, optimizer, scaler):
    def step(batch):
        one_step(module, collate([items[i] for i in batch]), loss_fn, policy, optimizer, scaler)
    return step


def measure_of(w: Workload, *, mode: str, policy, seed: int = 0, clock: Callable[[], float] = time.perf_counter):
    """measure(budget, max_length, seconds) over a task's workload: the training loop's steps
    (loss scaling and clipping included) or forward passes, timed by the probe on `clock`."""
    module = w.module
    items_at = functools.lru_cache(maxsize=None)(w.items_at)  # once per length, not once per budget
    opt = build_optimizer(module, TrainOptions(lr=1e-5), policy.device) if mode == "train" else None
    scaler = torch.amp.GradScaler("cuda") if policy.use_scaler else None

    def measure(b, L, seconds=5.0):
        items = items_at(L)
        lengths = [len(w) for w in items]
        counted = w.counts(items) if w.counts else lengths
        if mode == "train":
            module.train()
            step = _train_step(module, items, w.collate, w.loss_fn, policy, opt, scaler)
            batches = token_budget_batches(lengths, b, seed=seed)
        else:
            module.eval()

            def step(batch):
                t = w.collate([items[i] for i in batch])
                with torch.inference_mode(), policy.autocast():
                    module(t["input_ids"].to(policy.device), t["attention_mask"].to(policy.device))
            batches = token_budget_batches(lengths, b, shuffle=False)
        out = run_probe(step, batches, lengths, counted=counted, device=policy.device, max_seconds=seconds,
                        clock=clock)
        out["quality"] = w.quality(L) if mode == "infer" and w.quality else None
        return out

    return measure
