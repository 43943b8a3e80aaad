"""The throughput report every long run prints and writes the same way."""
from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from spanflow.monitor.device import GpuUtilSampler, RssPeak, peak_flops, peak_memory_bytes, reset_peak_memory
from spanflow.monitor.spans import StreamSpans


def train_flops_per_token(model: torch.nn.Module, seq_len: float) -> float:
    """6N per token for the dense weights plus, for attention encoders, the score/value matmuls.

    N counts trained parameters outside embedding tables (a lookup does no matmul work; a frozen
    pooler kept only to be saved back runs once a sequence, not a token).
    """
    lookup = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    n = sum(p.numel() for p in model.parameters() if id(p) not in lookup and p.requires_grad)
    cfg = getattr(getattr(model, "encoder", None), "config", None)
    if not getattr(cfg, "num_attention_heads", None):
        return 6 * n
    layers, hidden = getattr(cfg, "num_hidden_layers", 0), getattr(cfg, "hidden_size", 0)
    return 6 * n + 12 * layers * hidden * seq_len


def mfu_precision(model: torch.nn.Module, device: torch.device, precision: str) -> str:
    """The precision whose peak a training MFU is taken against: the run's, unless its encoder keeps
    its main matmuls in another under autocast (`matmul_precision`, the tiny model's fp32 recurrence
    on a CPU), whose peak is far lower."""
    own = getattr(getattr(model, "encoder", None), "matmul_precision", None)
    return own(device.type, precision) if own is not None else precision


@dataclass
class Meter:
    """Accumulates one reporting period: tokens, phase times, steps."""

    device: torch.device
    precision: str
    flops_per_token: float = 0.0  # set by the loop: training or inference cost per padded token
    real: int = 0
    padded: int = 0
    steps: int = 0
    held_peak: int = 0  # the period's memory peak before an excluded evaluation
    # "save": the checkpoints inside the period (--save-every, --max-steps); a best model's save is its evaluation's
    times: dict = field(default_factory=lambda: {"data_wait": 0.0, "compute": 0.0, "optimizer": 0.0, "save": 0.0})
    started: float = field(init=False)  # set once the peak is measured (__post_init__)

    def __post_init__(self):
        self.gpu = GpuUtilSampler(self.device)
        # on a GPU, compute and optimizer are timed on the stream (monitor/spans.py), not by the host
        self.spans = StreamSpans(self.device) if self.device.type == "cuda" else None
        # a CPU period's memory peak is sampled: the process's high-water mark would carry every
        # earlier period's (and evaluation's) peak into this one
        self.rss = RssPeak() if self.device.type == "cpu" else None
        self._reset_peak()
        # the peak now, before the run's threads start (measured beside them it reads low) and
        # outside the first period's clock (a CPU training run measures it first, its ranks in turn)
        measure_peak(self.device, self.precision)
        self.started = time.perf_counter()

    def add_tokens(self, real: int, padded: int) -> None:
        self.real += real
        self.padded += padded

    def add_time(self, phase: str, seconds: float) -> None:
        self.times[phase] += seconds

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Count the host's time inside toward `phase`."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add_time(phase, time.perf_counter() - t)

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Leave what runs inside (an evaluation) out of the period: its wall time, its GPU
        utilisation samples and its memory peak."""
        cuda = self.device.type == "cuda"
        if cuda:  # the steps queued before it are the period's work: their time and their peak
            torch.cuda.synchronize(self.device)
        self.held_peak = max(self.held_peak, self._peak())
        t = time.perf_counter()
        self.gpu.paused = True
        try:
            yield
        finally:
            self.gpu.paused = False
            if cuda:
                torch.cuda.synchronize(self.device)
            self._reset_peak()
            self.started += time.perf_counter() - t

    def begin_step(self) -> None:
        """The step's device work starts here (a CUDA event; nothing on a CPU)."""
        if self.spans is not None:
            self.spans.begin()

    def end_phase(self, phase: str) -> None:
        """`phase` of the step's device work ends here (a CUDA event; nothing on a CPU)."""
        if self.spans is not None:
            self.spans.end(phase)

    def report(self, devices: int = 1) -> dict:
        """Close the period and return its figures (names are a stable contract). `devices`: how
        many devices ran the tokens counted (the ranks of a distributed run): MFU is over all their peaks."""
        if self.spans is not None:
            self.times.update(self.spans.take())  # waits for the period's last work: before the wall clock
        wall = max(time.perf_counter() - self.started, 1e-9)
        # shares of the period's wall time, the rest "other" (log points, reporters, the loop itself);
        # on a GPU the stream's phase times and the host's data wait can overlap and sum past it
        whole = max(wall, sum(self.times.values()))
        peak, basis = device_peak(self.device, self.precision)
        if peak and self.device.type == "cpu":  # ranks that share this machine's cores share its peak too
            peak *= cpu_share(devices)
        achieved = self.flops_per_token * self.padded / wall
        out = {
            "real_tokens_per_s": self.real / wall,
            "padded_tokens_per_s": self.padded / wall,
            "padding_efficiency": self.real / self.padded if self.padded else 1.0,
            "data_wait_frac": self.times["data_wait"] / whole,
            "compute_frac": self.times["compute"] / whole,
            "optimizer_frac": self.times["optimizer"] / whole,
            "save_frac": self.times["save"] / whole,
            "other_frac": 1 - sum(self.times.values()) / whole,
            "peak_memory_bytes": max(self.held_peak, self._peak()),
            "mfu": achieved / (peak * devices) if peak and self.flops_per_token else None,
            "mfu_basis": basis,
            "mfu_precision": self.precision,
            "peak_flops": peak * devices if peak else None,  # what the MFU is of: every device's peak together
            "gpu_util": self.gpu.take(),
            "wall_s": wall,
            "steps": self.steps,
        }
        self.real = self.padded = self.steps = self.held_peak = 0
        self.times = {k: 0.0 for k in self.times}
        self.started = time.perf_counter()
        self._reset_peak()
        return out

    def _peak(self) -> int:
        """The memory peak since the last reset: the CUDA allocator's, or the sampled resident set."""
        return self.rss.peek() if self.rss is not None else peak_memory_bytes(self.device)

    def _reset_peak(self) -> None:
        if self.rss is not None:
            self.rss.reset()
        else:
            reset_peak_memory(self.device)

    def close(self) -> None:
        self.gpu.close()
        if self.rss is not None:
            self.rss.close()


def measure_peak(device: torch.device, precision: str) -> None:
    """Measure this device's peak in `precision` now, once per process (monitor.device.peak_flops)."""
    device_peak(device, precision)


def device_peak(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(peak FLOP/s, basis) of `device` in `precision`, as every MFU figure takes it."""
    return peak_flops(device.type, _device_name(device), precision)


def cpu_share(devices: int) -> float:
    """The share of a CPU rank's own peak that is its own in a job of `devices` ranks. Each rank
    measures the peak with its threads and the machine to itself; ranks of one node whose threads
    together outnumber its cores (OMP_NUM_THREADS=2 on each of 2 ranks of 2 cores) share those
    cores, and the job's peak is then the node's, not the sum of theirs."""
    import os

    local = int(os.environ.get("LOCAL_WORLD_SIZE", devices)) if devices > 1 else 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if local > 1 and cores < (os.cpu_count() or cores):  # pinned to cores of its own (--cpu-bind, taskset,
        return 1.0  # NUMA binding): its peak was measured on them alone, and the ranks' peaks add up
    # a rank's threads beyond the cores add nothing to its own measured peak
    return min(1.0, cores / max(1, min(torch.get_num_threads(), cores) * local))


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


SCALARS = ("real_tokens_per_s", "padded_tokens_per_s", "padding_efficiency", "data_wait_frac", "compute_frac",
           "optimizer_frac", "save_frac", "other_frac", "peak_memory_bytes", "mfu", "gpu_util", "wall_s",
           "loss")  # what dashboards chart of each report


def report_scalars(r: dict, prefix: str) -> dict:
    """The report's chartable figures as `prefix/name` scalars (those not measured are left out)."""
    return {f"{prefix}/{k}": float(r[k]) for k in SCALARS if r.get(k) is not None}


# {p}: the precision the peak is of, where it is not the run's (the model's matmuls ran in another)
PEAK_BASIS = {"measured_matmul": "of the measured {p}matmul peak", "datasheet": "of the datasheet {p}peak"}


def rate_text(x: float) -> str:
    """A rate to the unit, or below 10 to two significant digits (in plain digits): a slow job's is
    not rounded to 0."""
    if x >= 10 or x == 0:
        return f"{x:.0f}"
    said = f"{x:.2g}"
    return f"{float(said):.12f}".rstrip("0") if "e" in said else said


def clock_time(seconds: float) -> str:
    """How every command writes a duration: 0.04 s, 4.2 s, 12 s, 3m 05s, 1h 02m."""
    if round(seconds, 2) < 1:  # each bound as the figure rounds: 9.96 is "10 s", not "10.0 s"
        return f"{seconds:.2f} s"
    if round(seconds, 1) < 10:
        return f"{seconds:.1f} s"
    if round(seconds) < 60:
        return f"{seconds:.0f} s"
    m, s = divmod(round(seconds), 60)
    return f"{m}m {s:02d}s" if m < 60 else f"{m // 60}h {m % 60:02d}m"


def _split(r: dict) -> str:
    """Where the period's time went; save and other only where they took a share (a report of an
    earlier version has neither)."""
    parts = [f"data {r['data_wait_frac']:.0%}", f"compute {r['compute_frac']:.0%}", f"optim {r['optimizer_frac']:.0%}"]
    parts += [f"{name} {r[k]:.0%}" for name, k in (("save", "save_frac"), ("other", "other_frac"))
              if (r.get(k) or 0) >= 0.005]
    return " ".join(parts)


def _percent(x: float) -> str:
    """A share as a percentage with two significant digits below 1% (0.0% said nothing)."""
    return f"{x * 100:.1f}%" if x >= 0.01 or x == 0 else f"{x * 100:.2g}%"


def _training_seconds(x: float) -> str:
    """A period's seconds: one decimal below 10, two significant digits below 0.1 (a tiny
    model's epoch of 0.04 s was `0.0 s`)."""
    return f"{x:.2g}" if 0 < x < 0.1 else f"{x:.{1 if x < 10 else 0}f}"


def format_report(r: dict) -> str:
    """One human line per report: the period's training seconds, loss, throughput and where its
    time went, MFU against the peak it names, and the dev score."""
    other = r.get("mfu_precision") and r.get("precision") and r["mfu_precision"] != r["precision"]
    basis = PEAK_BASIS.get(r.get("mfu_basis"), "").format(p=f"{r['mfu_precision']} " if other else "")
    mfu = f"{_percent(r['mfu'])} {basis}".rstrip() if r.get("mfu") is not None else "n/a"
    head = f"epoch {r.get('epoch', '-')}{' (partial)' if r.get('partial') else ''} step {r.get('step', '-')}"
    if r.get("wall_s") is not None:
        head += f" ({_training_seconds(r['wall_s'])} s training)"
    parts = [head] + ([f"loss {r['loss']:.4f}"] if r.get("loss") is not None else [])
    if r.get("steps") == 0:  # a resume at the end of an epoch: no step was trained in this period
        parts.append("no steps left in this epoch (resumed at its end)")
    else:
        parts += [f"{r['real_tokens_per_s']:.0f} real tok/s ({r['padded_tokens_per_s']:.0f} padded)",
                  f"padding eff {r['padding_efficiency']:.2f}",
                  "time: " + _split(r),
                  f"peak mem {r['peak_memory_bytes'] / 2**20:.0f} MiB",
                  f"MFU {mfu}"]
    if r.get("gpu_util") is not None:  # NVML's figure; a CPU run has none to show
        parts.append(f"GPU util {r['gpu_util']:.0f}%")
    if r.get("dev_f1") is not None:
        parts.append(f"dev {r.get('dev_metric', 'F1')} {r['dev_f1']:.4f}")
    return " | ".join(parts)


def append_jsonl(path: str, record: dict) -> None:
    """Append one JSON line and flush it to disk (a killed run keeps what it reported). A write
    that fails (a full disk) is cut back off, so no half line is left for the next one to join."""
    line = (json.dumps(record) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # unbuffered: nothing left to flush later
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)
