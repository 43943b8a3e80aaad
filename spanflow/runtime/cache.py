"""The cache of measured runtime choices: tune profiles (`--max-tokens auto`) and precision
verdicts (`--precision auto`). Every command reaches a cached file through `cache_path`,
keyed by what the file was measured for: model, device, task, mode, the precision the
model runs in (resolved: never "auto") and its quantization."""
from __future__ import annotations

import hashlib
import os

import torch

KINDS = ("profiles", "verdicts")
RESOLVED = ("fp32", "bf16", "fp16")


def cache_root() -> str:
    """SPANFLOW_CACHE, else ~/.cache/spanflow."""
    return os.environ.get("SPANFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "spanflow"))


def device_name(device: torch.device) -> str:
    """The device as a cache key and in profiles: the GPU's name, or the CPU and its threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


def cache_path(kind: str, *, model: str, device: torch.device, task: str, mode: str, precision: str,
               quantize: str | None = None) -> str:
    """The one cached file of `kind` ("profiles" or "verdicts") for this model, device, task,
    mode, resolved precision and quantization."""
    if kind not in KINDS:
        raise ValueError(f"cache kind {kind!r}; expected one of {KINDS}")
    if precision not in RESOLVED:  # a key made of the asked "auto" is never found by a run that resolved it
        raise ValueError(f"cache keys take a resolved precision ({', '.join(RESOLVED)}), got {precision!r}")
    parts = [os.path.abspath(model) if os.path.exists(model) else model, device_name(device), task, mode, precision,
             quantize or "none"]
    digest = hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]
    return os.path.join(cache_root(), kind, digest + ".json")
