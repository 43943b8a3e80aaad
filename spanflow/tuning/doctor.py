"""`spanflow doctor`: what this machine can do, and why a training setup underfeeds it."""
from __future__ import annotations

import importlib
import os
import platform
import time
from collections.abc import Callable

import numpy as np
import torch

from spanflow.batching.batcher import token_budget_batches
from spanflow.monitor.report import device_peak, measure_peak, mfu_precision, train_flops_per_token
from spanflow.training.optim import build_optimizer
from spanflow.training.options import TrainOptions
from spanflow.runtime.budget import default_budget
from spanflow.runtime.cache import cpu_description
from spanflow.runtime.policy import cpu_has_bf16, resolve_policy
from spanflow.training.step import as_micro, forward_backward, optimizer_step


def environment() -> dict:
    """Device, precision support, NVML, threads, versions."""
    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "cuda_available": torch.cuda.is_available(), "cpu_threads": torch.get_num_threads(),
           "cpu_count": os.cpu_count(), "cpu_bf16": cpu_has_bf16(),
           "mps_available": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())}
    for lib in ("transformers", "tokenizers", "safetensors", "numpy"):
        try:
            env[lib] = importlib.import_module(lib).__version__
        except ImportError:
            env[lib] = None
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        env.update(gpu=torch.cuda.get_device_name(), gpu_count=torch.cuda.device_count(),
                   gpu_bf16=torch.cuda.is_bf16_supported(), gpu_tf32=cap >= (8, 0), gpu_fp16=True,
                   gpu_memory_gb=torch.cuda.get_device_properties(0).total_memory / 2**30)
    try:
        import pynvml

        pynvml.nvmlInit()
        env["nvml"] = f"available ({pynvml.nvmlDeviceGetCount()} devices)"
    except Exception:  # nvidia-ml-py absent or no driver
        env["nvml"] = "not available (pip install 'spanflow[gpu]' on GPU machines)"
    return env


def _probe(w, items, batches, policy, steps: int) -> dict:
    """A few of the training loop's steps with the phases timed apart: data (collate), compute (copy,
    forward, backward), optimizer (clipping and step)."""
    opt = build_optimizer(w.module, TrainOptions(lr=1e-5), policy.device)
    scaler = torch.amp.GradScaler("cuda") if policy.use_scaler else None
    w.module.train()
    times = {"data": 0.0, "compute": 0.0, "optimizer": 0.0}
    real = padded = texts = 0
    sync = torch.cuda.synchronize if policy.device.type == "cuda" else (lambda: None)
    for k in range(steps + 1):  # a small sample's batches come round again
        b = batches[k % len(batches)]
        t0 = time.perf_counter()
        t = w.collate([items[i] for i in b])
        sync()
        t1 = time.perf_counter()
        forward_backward(w.module, [as_micro(t)], w.loss_fn, policy, scaler)
        sync()
        t2 = time.perf_counter()
        optimizer_step(w.module, opt, None, scaler)
        sync()
        t3 = time.perf_counter()
        if k == 0:
            continue  # warm-up
        times["data"] += t1 - t0
        times["compute"] += t2 - t1
        times["optimizer"] += t3 - t2
        lens = [len(items[i]) for i in b]
        # the batch's own counts where its collate gives them, as training's report reads them (a pair's
        # sides are padded apart: its len() is twice its longer side)
        real += int(t.get("real_tokens", sum(lens)))
        padded += int(t.get("padded_tokens", max(lens) * len(lens)))
        texts += len(b)
    wall = sum(times.values())
    # MFU as the training report computes it (6N + attention per padded token, over the device's peak)
    basis = mfu_precision(w.module, policy.device, policy.name)
    peak, kind = device_peak(policy.device, basis)
    flops = train_flops_per_token(w.module, real / max(1, texts)) * padded
    return {"real_tokens_per_s": real / wall, "padding_efficiency": real / padded, "texts_per_update": texts / steps,
            "real_tokens": real, "items": texts,
            "data_frac": times["data"] / wall, "compute_frac": times["compute"] / wall,
            "optimizer_frac": times["optimizer"] / wall, "mfu": flops / wall / peak if peak else None, "steps": steps,
            "peak_flops": peak, "peak": f"{'measured' if kind == 'measured_matmul' else 'datasheet'} {basis} peak"
            + (f": the model's matmuls run in {basis} under {policy.name}" if basis != policy.name else "")}


SLOWER = 2.0  # how many times as fast the token-budget probe ran for a finding: above a short probe's noise


def diagnose(r: dict, healthy: dict | None = None, *, own: bool = False, asked: bool = True) -> list[str]:
    """The losses of utilization in a probe, biggest first, each with its fix. `own`: the probe
    ran spanflow's own batches, whose padding is the spread of lengths left inside a bucket (a
    pair's two sides, each padded apart, for embeddings): not a loss it can name a fix for; and
    `asked` False, at training's own budget for the device, whose few long texts an update are
    no underfeeding either. `healthy`: the same data in spanflow's batches, for the losses
    those batches would share."""
    found = []
    # the fix named is token-budget batches: a loss they share (the `healthy` probe's) is none it fixes
    fixed = healthy["padding_efficiency"] - 0.05 if healthy else 0.85
    if r["padding_efficiency"] < min(0.85, fixed) and not own:
        found.append((1 - r["padding_efficiency"],
                      f"padding efficiency {r['padding_efficiency']:.2f}: {1 - r['padding_efficiency']:.0%} of compute "
                      "is spent on padding; batch by token budget over length-sorted buckets (spanflow train does"
                      + (f": {healthy['padding_efficiency']:.2f} on this data)" if healthy else ")")))
    if r["texts_per_update"] < 8 and not (own and not asked):  # training's own budget is sized to the device
        loss = 1 - r["real_tokens_per_s"] / healthy["real_tokens_per_s"] if healthy else 0.5
        fix = "raise --max-tokens, or leave it unset" if own else "batch by token budget"
        found.append((loss, f"batch of {r['texts_per_update']:.0f} text(s) per update: the device is underfed and "
                            f"the optimizer runs after every few examples; {fix} (spanflow train sizes it to the "
                            "data: docs/defaults.md)"))
    elif healthy and not own and healthy["real_tokens_per_s"] >= SLOWER * r["real_tokens_per_s"]:
        # more texts an update, still far slower than token-budget batches measured on the same data (4.7x
        # at --batch-size 8 was "no loss found"): the measured ratio is the finding
        times = healthy["real_tokens_per_s"] / max(r["real_tokens_per_s"], 1e-9)
        found.append((1 - 1 / times, f"token-budget batches ran this data {times:.1f}x as fast as batches of "
                                     f"{r['texts_per_update']:.0f} texts: batch by token budget (spanflow train "
                                     "sizes it to the data: docs/defaults.md)"))
    if r["data_frac"] > 0.2:
        found.append((r["data_frac"], f"{r['data_frac']:.0%} of step time goes to preparing data: pre-tokenize, "
                                      "and collate in a background thread (spanflow's loop prefetches)"))
    if r["optimizer_frac"] > 0.2:
        found.append((r["optimizer_frac"], f"{r['optimizer_frac']:.0%} of step time in the optimizer: updates are "
                                           "too small for the model; raise --max-tokens or --grad-accum"))
    found.sort(key=lambda x: -x[0])
    return [msg for _, msg in found]


def doctor(*, model: str | None = None, data: str | None = None, task: str = "ner", batch_size: int | None = None,
           max_tokens: int | None = None, precision: str = "auto", device: str = "auto", steps: int = 8,
           task_from: str = "--task", log_fn: Callable[[str], None] = print) -> dict:
    """Print the environment; with model and data, probe training and name the biggest losses.
    `max_tokens` None: training's default budget for the device (runtime/budget.py); `task_from`:
    where the task came from, as the probe's line says it."""
    from spanflow.errors import ConfigError, DataError

    if steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    for flag, v in (("--batch-size", batch_size), ("--max-tokens", max_tokens)):
        if v is not None and v < 1:
            raise ConfigError(f"{flag} must be >= 1, got {v}")
    if bool(model) != bool(data):  # half a probe: say so, rather than print the machine report alone
        raise ConfigError(f"{'--model' if model else '--data'} without {'--data' if model else '--model'}: the probe "
                          "trains --model on --data; give both, or neither for the machine report")
    if not model:
        given = next((f for f, v in (("--batch-size", batch_size), ("--max-tokens", max_tokens)) if v is not None),
                     None)
        if given:
            raise ConfigError(f"{given} sets the training probe, which needs --model and --data")
    if model:  # a path that cannot be probed is the whole answer: said before the machine report
        from spanflow.tasks.registry import check_model_for

        check_model_for(model, task, start=True)
        if not os.path.exists(data):
            raise DataError("file not found", path=data)
    policy = resolve_policy(precision, device, cpu_bf16=True)  # the precision training runs in (a device it
    env = environment()                                          # lacks is refused with the machine report too)
    env["cpu"] = cpu_description()
    for k, v in env.items():
        log_fn(f"{k:>15}: {v}")
    log_fn(f"{'training runs':>15}: {policy.describe(training=True)}")
    if not (model and data):
        return {"environment": env}
    from spanflow.tasks.registry import get

    log_fn(f"probing `spanflow train {task}` ({task_from}), {policy.describe()}")
    asked = max_tokens is not None
    max_tokens = max_tokens or default_budget("train", policy.device)
    w = get(task).workload(model, data, mode="train", policy=policy, precision=precision, sample=2000)
    windows = w.items_at(w.limit)
    lengths = [len(w) for w in windows]
    if asked and max_tokens < max(lengths):  # as `spanflow train` refuses it: no batch could keep to it
        raise ConfigError(f"--max-tokens {max_tokens} is below the longest training item of the sample, "
                          f"{max(lengths)} tokens: one must fit in a batch (give --max-tokens {max(lengths)} or more)")
    healthy_batches = token_budget_batches(lengths, max(max_tokens, max(lengths)), seed=0)
    ups = f"{steps} update{'' if steps == 1 else 's'}"
    if batch_size:  # the setup under test: fixed-count batches in random order, as naive loops do
        perm = np.random.default_rng(0).permutation(len(windows)).tolist()
        batches = [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]
        log_fn(f"probe: {ups} of {batch_size} random text(s)" if batch_size < len(windows) else
               f"probe: {ups} of all {len(windows)} text(s) read (--batch-size {batch_size} holds them all)")
    else:
        batches = healthy_batches
        log_fn(f"probe: {ups} of token-budget batches, max_tokens {max_tokens}"
               + ("" if asked else " (the most `spanflow train` takes on this device; it takes fewer where the data "
                                   "is small: about 100 updates an epoch)"))
    measure_peak(policy.device, mfu_precision(w.module, policy.device, policy.name))  # before the probe, as training
    r = _probe(w, windows, batches, policy, steps)
    # token-budget batches that hold the same texts as the setup's (all of a small data set in one) are
    # no other setup: timed apart, their noise alone would read as a finding
    same = batch_size and sorted(map(sorted, batches)) == sorted(map(sorted, healthy_batches))
    healthy = _probe(w, windows, healthy_batches, policy, min(steps, 4)) if batch_size and not same else None
    mfu = (f", MFU {r['mfu']:.1%} of {r['peak_flops'] / 1e12:.2f} TFLOP/s ({r['peak']})" if r["mfu"] is not None
           else "")
    log_fn(f"measured: {r['real_tokens_per_s']:.0f} real tok/s{mfu}, padding efficiency {r['padding_efficiency']:.2f}, "
           f"{r['texts_per_update']:.1f} texts/update; time: data {r['data_frac']:.0%}, compute "
           f"{r['compute_frac']:.0%}, optimizer {r['optimizer_frac']:.0%}")
    findings = diagnose(r, healthy, own=not batch_size, asked=asked)
    if healthy:
        log_fn(f"with token-budget batches (max_tokens {max_tokens}): {healthy['real_tokens_per_s']:.0f} real "
               f"tok/s, {healthy['real_tokens_per_s'] / r['real_tokens_per_s']:.1f}x")
    log_fn("findings:" if findings else "no loss of utilization found in this probe"
           + ("" if batch_size else ": its batches, data and optimizer are as spanflow's training runs them"))
    for i, f in enumerate(findings, 1):
        log_fn(f"  {i}. {f}")
    return {"environment": env, "probe": r, "healthy": healthy, "findings": findings}
