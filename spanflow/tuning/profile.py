"""profile.json: write, read, and the cache that `--max-tokens auto` uses."""
from __future__ import annotations

import hashlib
import json
import os

import torch

from spanflow.atomic import atomic_open
from spanflow.errors import ConfigError


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


def cache_path(model: str, device: torch.device, task: str, mode: str, precision: str) -> str:
    """One cached profile per model + device + task + mode + precision."""
    root = os.environ.get("SPANFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "spanflow"))
    key = "|".join([os.path.abspath(model) if os.path.exists(model) else model, device_name(device), task, mode,
                    precision])
    return os.path.join(root, "profiles", hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")


def write_profile(path: str, profile: dict) -> None:
    with atomic_open(path) as f:
        json.dump(profile, f, indent=2)


def read_profile(path: str, *, task: str | None = None, mode: str | None = None) -> dict:
    """A profile with a usable best point; a task/mode mismatch is an error."""
    try:
        with open(path, encoding="utf-8") as f:
            prof = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"profile not found: {path}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"profile {path} is unreadable: {e}") from None
    if not isinstance(prof.get("best"), dict) or "max_tokens" not in prof["best"]:
        raise ConfigError(f"profile {path} has no best point (every point ran out of memory or broke a limit)")
    for k, v in (("task", task), ("mode", mode)):
        if v and prof.get(k) and prof[k] != v:
            raise ConfigError(f"profile {path} was measured for {k} {prof[k]!r}, not {v!r}")
    return prof
