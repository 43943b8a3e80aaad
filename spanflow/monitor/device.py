"""Memory and utilization readings: CUDA allocator, NVML when installed, process RSS on CPU."""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import resource
import threading
import time
from collections.abc import Callable

import psutil
import torch

from spanflow.runtime.cache import cpu_description

log = logging.getLogger("spanflow")


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA max allocated since the last reset, or the process RSS high-water mark on CPU (its whole
    life: a CPU period's own peak is RssPeak's)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


class RssPeak:
    """The process's highest resident memory since the last reset, sampled in a thread every
    `interval_s` (None: no thread; `sample()` by hand). A CPU period's own peak: the kernel's
    high-water mark covers the whole process, and resetting it (/proc/self/clear_refs) would also
    reset what an outside measure reads (`time -v`, a parent's getrusage)."""

    def __init__(self, interval_s: float | None = 0.02, read: Callable[[], int] | None = None):
        proc = psutil.Process()
        self._read = read or (lambda: proc.memory_info().rss)
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._peak = self._read()
        self._thread = None
        if interval_s is not None:
            self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
            self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.sample()

    def sample(self) -> None:
        """Read resident memory now into the peak (under the lock: a reading taken before a reset
        and stored after it would carry the last period's peak into the next)."""
        with self._lock:
            self._peak = max(self._peak, self._read())

    def peek(self) -> int:
        """The peak since the last reset, now included."""
        self.sample()
        return self._peak

    def reset(self) -> None:
        """Start the next peak from resident memory now."""
        with self._lock:
            self._peak = self._read()

    def close(self) -> int:
        """Stop sampling; the peak since the last reset."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peek()


class GpuUtilSampler:
    """Samples NVML GPU utilization in a background thread; mean() is None without NVML."""

    def __init__(self, device: torch.device, interval_s: float = 0.1):
        self._handle, self._samples, self._stop, self.paused = None, [], threading.Event(), False
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # nvidia-ml-py absent or no driver: utilization stays unknown
            self._handle = None
            return
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            if self.paused:  # work not to be counted (a training run's evaluation)
                continue
            try:
                self._samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            except Exception:
                return

    def take(self) -> float | None:
        """Mean utilization (0-100) since the last take, or None when unknown."""
        if self._handle is None or not self._samples:
            return None
        s, self._samples = self._samples, []
        return sum(s) / len(s)

    def close(self) -> None:
        self._stop.set()


# Dense bf16 tensor-core peaks (TFLOP/s) from vendor datasheets, for MFU on known GPUs.
_GPU_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
                    "A10": 125.0, "4090": 165.0, "3090": 71.0, "V100": 125.0, "T4": 65.0}


def _native_bf16() -> bool:
    from spanflow.runtime.policy import cpu_has_bf16

    return cpu_has_bf16()


def peak_flops(device_type: str, device_name: str, dtype_name: str) -> tuple[float | None, str]:
    """(peak FLOP/s, basis). GPUs: datasheet table. CPU: the best matmul rate measured on this
    machine (this CPU model, thread count and precision) by this or any earlier run, because
    CPU datasheet peaks are rarely reachable and vary with clocks and core counts, and a
    measurement beside other work reads low: a peak is the best rate the machine has shown,
    so the MFU figures of different runs on it compare."""
    if device_type == "cuda":
        for key, tf in _GPU_PEAK_TFLOPS.items():
            if key in device_name:
                scale = 0.5 if dtype_name == "fp32" else 1.0  # TF32 runs at about half the bf16 rate
                return tf * 1e12 * scale, "datasheet"
        return None, "unknown"
    if device_type != "cpu":
        return None, "unknown"
    return _cpu_peak(dtype_name, torch.get_num_threads()), "measured_matmul"


@functools.lru_cache(maxsize=8)
def _cpu_peak(dtype_name: str, threads: int) -> float:
    """The CPU peak, measured once per process for each precision and thread count (`threads`
    is the cache's key: a process that changes torch's threads measures again)."""
    return _best_seen(_peak_key(dtype_name), _matmul_rate(dtype_name))


def _matmul_rate(dtype_name: str) -> float:
    """FLOP/s of the fastest of a few square matmuls in `dtype_name` on this CPU, now."""
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)  # a private generator: never disturb the training RNG
    rate = 0.0
    # 1024^3 alone reads well below AMX's bf16 peak: take 2048 too where bf16 is native (where it is
    # emulated, 2048^3 in bf16 would take seconds)
    for n in (1024, 2048) if dtype_name != "bf16" or _native_bf16() else (1024,):
        a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
        for _ in range(2):  # warm-up: the kernel's first calls build and cache its plan
            a @ b
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
        rate = max(rate, 2 * n**3 / best)
    return rate


def _peak_key(dtype_name: str) -> str:
    """What a CPU's matmul rate depends on: the CPU (its name, and family and model numbers:
    a cloud VM's name can be as vague as "AMD EPYC"), its bf16 and AMX support, the threads,
    torch and the precision measured (fp16 runs the fp32 measurement)."""
    dtype = "bf16" if dtype_name == "bf16" else "fp32"
    return " | ".join([cpu_description(), f"{torch.get_num_threads()} threads", f"torch {torch.__version__}", dtype])


def _best_seen(key: str, measured: float) -> float:
    """The higher of `measured` and the best rate recorded for `key` (one small file per key in
    SPANFLOW_CACHE/peaks; removing it forgets them), recording `measured` when it is higher. A
    cache that cannot be read or written changes nothing but the memory of earlier runs."""
    from spanflow.atomic import atomic_open
    from spanflow.runtime.cache import cache_root

    path = os.path.join(cache_root(), "peaks", hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")
    best = _recorded(path, key)
    if best is not None and best >= measured:
        return best
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_open(path, "peak") as f:
            json.dump({"key": key, "flops": measured}, f)
    except OSError as e:  # the run goes on: its MFU is against this measurement alone
        log.warning("could not record this CPU's matmul peak in %s (%s): MFU is against this run's "
                    "measurement only", path, e.strerror or e)
    return measured


def _recorded(path: str, key: str) -> float | None:
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        value = rec["flops"] if isinstance(rec, dict) and rec.get("key") == key else None
    except (OSError, ValueError, KeyError):
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None
