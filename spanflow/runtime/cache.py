"""The cache of measured runtime choices: tune profiles (`--max-tokens auto`) and precision
verdicts (`--precision auto`). Every command reaches a cached file through `cache_path`,
keyed by what the file was measured for: model (its path and its files' sizes and times),
device, task, mode, the precision the model runs in (resolved: never "auto") and its
quantization."""
from __future__ import annotations

import hashlib
import os
import platform

import torch

KINDS = ("profiles", "verdicts")
RESOLVED = ("fp32", "bf16", "fp16")
FINGERPRINT_FILES = 256


def cache_root() -> str:
    """SPANFLOW_CACHE, else ~/.cache/spanflow."""
    return os.environ.get("SPANFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "spanflow"))


def device_name(device: torch.device) -> str:
    """The device as a cache key and in profiles: the GPU's name, or the CPU and its threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


def cpu_description() -> str:
    """This CPU as far as its matmul rate goes: its name, architecture, family and model
    numbers, and whether it runs bf16 natively and has AMX."""
    from spanflow.runtime.policy import cpu_has_bf16

    info = _cpuinfo()
    return " | ".join([info.get("model name") or platform.processor() or platform.machine(), platform.machine(),
                       f"family {info.get('cpu family', '?')} model {info.get('model', '?')}",
                       f"bf16 {cpu_has_bf16()}", f"amx {'amx_bf16' in info.get('flags', '').split()}"])


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo; empty where there is none (not Linux)."""
    out: dict[str, str] = {}
    if not os.path.exists("/proc/cpuinfo"):
        return out
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                break
            name, _, value = line.partition(":")
            out[name.strip()] = value.strip()
    return out


def model_fingerprint(model: str) -> str:
    """The size and modification time of the files of a model directory and of its folders (an
    encoder, a pooling config; no deeper, where a cache or a run's outputs may sit): a model
    retrained or saved over in place is a new model, whose verdicts and profiles are measured again."""
    if not os.path.isdir(model):
        return ""
    stats: list[str] = []
    for folder in [model] + sorted(e.path for e in _entries(model) if _is_dir(e)):
        for entry in _entries(folder):
            try:
                if not entry.is_file():
                    continue
                st = entry.stat()
            except OSError:
                continue
            stats.append(f"{os.path.relpath(entry.path, model)}:{st.st_size}:{st.st_mtime_ns}")
            if len(stats) >= FINGERPRINT_FILES:  # a model has a few dozen; a folder of many is not read whole
                return ";".join(stats)
    return ";".join(stats)


def _entries(folder: str) -> list:
    """The folder's entries by name; none where it cannot be read (a root-only lost+found)."""
    try:
        return sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []


def _is_dir(entry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def cache_path(kind: str, *, model: str, device: torch.device, task: str, mode: str, precision: str,
               quantize: str | None = None, data: str | None = None) -> str:
    """The one cached file of `kind` ("profiles" or "verdicts") for this model, device, task,
    mode, resolved precision and quantization; `data` (its path, size and time) too where given: a
    model built from the data it trains on ('tiny') is another model for other data."""
    if kind not in KINDS:
        raise ValueError(f"cache kind {kind!r}; expected one of {KINDS}")
    if precision not in RESOLVED:  # a key made of the asked "auto" is never found by a run that resolved it
        raise ValueError(f"cache keys take a resolved precision ({', '.join(RESOLVED)}), got {precision!r}")
    parts = [os.path.abspath(model) if os.path.exists(model) else model, model_fingerprint(model), device_name(device),
             task, mode, precision, quantize or "none"] + ([_file_key(data)] if data else [])
    digest = hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]
    return os.path.join(cache_root(), kind, digest + ".json")


def _file_key(path: str) -> str:
    """A file as a cache key part: its real path, size and modification time (a file rewritten is
    other data)."""
    try:
        st = os.stat(path)
    except OSError:
        return os.path.abspath(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"
