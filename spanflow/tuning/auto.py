"""`--max-tokens auto` and `--profile`: turn a measured profile into a token budget."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable

from spanflow.errors import ConfigError
from spanflow.training.precision import resolve_policy
from spanflow.tuning.profile import cache_path, read_profile


def resolve_max_tokens(value: str | int | None, *, profile: str | None, task: str, mode: str, model: str,
                       data: str, precision: str = "auto", device: str = "auto", field: str = "text",
                       column: int | None = None, log_fn: Callable[[str], None] = print) -> int | None:
    """An explicit number wins; then --profile; `auto` uses the cached profile for this
    model + device + task + mode + precision, measuring a short one (about 30 s) when none exists."""
    if value not in (None, "auto"):
        try:
            n = int(value)
        except ValueError:
            raise ConfigError(f"--max-tokens must be a number or 'auto', got {value!r}") from None
        if n <= 0:
            raise ConfigError("--max-tokens must be positive")
        return n
    if profile:
        best = read_profile(profile, task=task, mode=mode)["best"]
        log_fn(f"max_tokens {best['max_tokens']} from {profile}")
        return int(best["max_tokens"])
    if value is None:
        return None
    policy = resolve_policy("fp32" if precision == "int8" else precision, device)
    cached = cache_path(model, policy.device, task, mode, precision)
    if os.path.exists(cached):
        best = read_profile(cached, task=task, mode=mode)["best"]
        log_fn(f"max_tokens auto: {best['max_tokens']} from the cached profile {cached}")
        return int(best["max_tokens"])
    if not data:  # nothing to measure on (serve): the default, and how to get a measured one
        log_fn(f"max_tokens auto: no cached profile for {model} on this device; using the default (measure one "
               f"with: spanflow tune --task {task} --mode {mode} --model {model} --data YOUR_TEXTS)")
        return None
    from spanflow.tuning.tune import tune

    log_fn("max_tokens auto: no profile for this model and device yet; measuring one (about 30 s)")
    tmp = tempfile.mkdtemp(prefix="spanflow-tune-")
    try:
        prof = tune(task=task, model=model, data=data, mode=mode, budget_seconds=30, sample=256, precision=precision,
                    device=device, out=tmp, field=field, column=column, plot=False, backends=False,
                    log_fn=lambda s: None)
        if not prof["best"]:
            raise ConfigError("max_tokens auto: every measured budget ran out of memory")
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        shutil.move(os.path.join(tmp, "profile.json"), cached)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log_fn(f"max_tokens auto: {prof['best']['max_tokens']} (profile cached at {cached})")
    return int(prof["best"]["max_tokens"])
