"""One precision and device policy: auto picks CUDA > MPS > CPU and the fastest safe dtype.

int8 is no precision here: it is a quantization of an fp32 model (runtime/resolve.py,
`--quantize int8`).
"""
from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass, field

import torch

from spanflow.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
INT8_IS_QUANTIZATION = ("int8 is a quantization, not a precision: use --quantize int8 (embed, serve and tune, CPU; "
                        "Python: quantize=\"int8\")")
log = logging.getLogger("spanflow")


@functools.lru_cache(maxsize=1)
def cpu_has_bf16() -> bool:
    """True when the CPU has native bf16 instructions (AVX512-BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass(frozen=True)
class Policy:
    """Where and in what precision to compute. Weights stay fp32; autocast does the rest."""

    device: torch.device
    amp_dtype: torch.dtype | None  # None = plain fp32
    use_scaler: bool  # fp16 on CUDA needs loss scaling
    why: str = field(default="", compare=False)  # the reason for the precision, said with it

    @property
    def name(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.amp_dtype]

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to the policy's compute dtype on its device (nothing in fp32)."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def describe(self, *, training: bool = True) -> str:
        """One line: the device and precision (and why); master weights only where they train."""
        what = self.name + ((" autocast, fp32 master weights" if training else " autocast") if self.amp_dtype else "")
        if self.use_scaler and training:  # loss scaling is a training matter
            what += ", GradScaler"
        dev = str(self.device)
        if self.device.type == "cuda":
            dev += f" ({torch.cuda.get_device_name(self.device)})"
            if torch.backends.cuda.matmul.allow_tf32:
                what += ", TF32 matmuls"
        return f"device {dev}, precision {what}" + (f" ({self.why})" if self.why else "")


DEVICES = "auto, cpu, cuda, cuda:N or mps"


def check_names(precision: str = "auto", device: str = "auto") -> None:
    """A ConfigError for a precision or device name spanflow does not run (whatever this machine
    has: TrainOptions checks its names where it is made, the devices where it runs)."""
    if precision == "int8":
        raise ConfigError(INT8_IS_QUANTIZATION)
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if device != "auto":
        _device_named(device)


def _device_named(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {device}: not a device name; use {DEVICES}") from None
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {device}: spanflow runs on {DEVICES}")
    return dev


def pick_device(device: str = "auto") -> torch.device:
    """`device` as torch names it; "auto": a CUDA GPU, else Apple's MPS, else the CPU. A name
    torch does not know, or a device this machine lacks, is a ConfigError saying what it has."""
    if device != "auto":
        dev = _device_named(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"--device {device} asked, but no CUDA device is available (torch sees none; "
                              "--device auto, the default, runs on what the machine has)")
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                              f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ConfigError("--device mps asked, but this machine has no MPS device")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def twin_precision(precision: str) -> str:
    """`precision` for a model's with_precision: 'auto' is refused (a ConfigError), as its choice is a
    check of the model's results that a load runs, not the device's fastest precision."""
    if precision == "auto":
        raise ConfigError("with_precision takes 'fp32', 'bf16' or 'fp16'; 'auto' is chosen by a check of the "
                          "model's results when it loads: load(path, precision='auto'), the default")
    return precision


def resolve_policy(precision: str = "auto", device: str = "auto", *, cpu_bf16: bool = False) -> Policy:
    """bf16 where the accelerator has it, fp16 + GradScaler otherwise on CUDA; TF32 matmuls
    on Ampere and newer. On CPU `auto` is fp32, or bf16 when `cpu_bf16` and the CPU runs
    bf16 natively (training: dev F1 equal to fp32's within seed noise, docs/defaults.md)."""
    check_names(precision)
    dev = pick_device(device)
    why = "as asked" if precision != "auto" else ""
    if dev.type == "cuda":
        if torch.cuda.get_device_capability(dev) >= (8, 0):
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if precision == "auto":
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
            why = "this GPU runs bf16" if precision == "bf16" else "this GPU has no bf16"
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise ConfigError("bf16 asked, but this GPU has no bf16 support; use --precision fp16")
    elif dev.type == "mps":
        precision = "fp32" if precision == "auto" else precision
    else:
        if precision == "auto":
            precision = "bf16" if cpu_bf16 and cpu_has_bf16() else "fp32"
            if cpu_bf16:
                why = "this CPU runs bf16 natively" if precision == "bf16" else "this CPU has no native bf16"
        if precision == "fp16":
            raise ConfigError("fp16 is for CUDA devices; on CPU use --precision bf16 or fp32")
        if precision == "bf16" and not cpu_has_bf16():
            _warn_emulated_bf16()
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return Policy(dev, dtype, use_scaler=(dtype is torch.float16 and dev.type == "cuda"), why=why)


@functools.lru_cache(maxsize=1)
def _warn_emulated_bf16() -> None:
    """Said once per process: a command resolves its precision more than once (the load, then the
    run's twin), and the CPU is the same each time."""
    log.warning("this CPU has no native bf16 instructions: bf16 will run emulated, slower than fp32")


QUANTIZATIONS = ("int8",)  # CPU dynamic quantization of the Linear layers of an fp32 model
INT8_MIN_COSINE = 0.99  # the least mean cosine to fp32 an int8 model must reach on its calibration sample


def check_quantize(quantize: str | None, precision: str, device: str | torch.device) -> None:
    """A ConfigError unless `quantize` (None or one of QUANTIZATIONS) can run at `precision` on `device`."""
    if precision == "int8":
        raise ConfigError(INT8_IS_QUANTIZATION)
    if quantize is None:
        return
    if quantize not in QUANTIZATIONS:
        raise ConfigError(f"unknown quantization {quantize!r}; expected {', '.join(QUANTIZATIONS)}")
    if precision not in ("auto", "fp32"):
        raise ConfigError(f"--quantize {quantize} computes in fp32 between its {quantize} matmuls; use --precision "
                          "auto or fp32 with it")
    if torch.device(device).type != "cpu":
        raise ConfigError(f"{quantize} dynamic quantization runs on CPU only; use --device cpu")
