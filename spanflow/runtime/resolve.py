"""Runtime choices, made once per command before the model it runs is loaded: device,
precision, quantization, token budget and backend, printed as one line with the reason for
each. Every command that runs a model (train, predict, evaluate, embed, serve, tune) comes
through `resolve_runtime`; the CLI only parses the flags into `Asked`.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spanflow.errors import ConfigError
from spanflow.runtime.backend import choose_backend
from spanflow.runtime.budget import default_budget
from spanflow.runtime.cache import cache_path, cpu_description, device_name
from spanflow.runtime.files import Profile, cache_write, read_profile, write_profile
from spanflow.runtime.loads import Loads
from spanflow.runtime.policy import QUANTIZATIONS, check_quantize, pick_device, resolve_policy
from spanflow.runtime.precision import auto_precision, builtin_sample, check_sample, sample_words, usable

JOBS = ("infer", "serve", "train")  # the budget table's jobs: predict/evaluate/embed/tune, serve, train


@dataclass(frozen=True)
class Asked:
    """The runtime flags as given: `auto` (or None) leaves the choice to resolve_runtime."""

    device: str = "auto"
    precision: str = "auto"
    quantize: str | None = None
    max_tokens: str | int | None = None  # a number, "auto", or None (the default)
    profile: str | None = None  # a profile.json whose best token budget (and backend) to run
    backend: str = "auto"
    force: bool = False  # accept an int8 quantization below its quality gate

    @classmethod
    def from_args(cls, a, **given) -> Asked:
        """From parsed flags (those a command lacks keep their defaults); `given` overrides."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in vars(a).items() if k in names}, **given})


@dataclass(frozen=True)
class Runtime:
    """What a command runs with."""

    device: str  # "cpu", "cuda:0", "mps"
    precision: str  # fp32, bf16 or fp16
    quantize: str | None  # None or "int8" (CPU dynamic quantization of an fp32 model)
    max_tokens: int | None  # padded tokens per batch; None in training: sized from the data
    backend: str  # eager or compile
    why: str = dataclasses.field(default="", compare=False)  # the line printed


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)  # stdout may be a result (evaluate --json)


def resolve_runtime(task, model: str, asked: Asked, *, job: str = "infer", data: str | None = None,
                    texts: list | None = None, field: str = "text", column: int | None = None,
                    loads: Loads | None = None, measure: Callable[..., dict] | None = None, batching: bool = False,
                    sweeps: bool = False, name: str | None = None, log: Callable[[str], None] = _stderr) -> Runtime:
    """Decide device, precision, quantization, token budget and backend for running `model` (a
    directory of `task`, or an encoder to train from) in `job`, and say so in one line.

    `texts`: a sample of the input, which `--precision auto` and the int8 gate check on
    (built-in sentences when None); `data`: the input file `--max-tokens auto` measures on
    with `measure` (spanflow.tuning.auto.quick_profile) when no profile is cached; `loads`:
    where the checks load the model, for the command to take the chosen one from; `sweeps`:
    the command measures token budgets and backends itself (tune), so the line leaves them out."""
    if job not in JOBS:
        raise ValueError(f"job {job!r}; expected one of {JOBS}")
    mode = "train" if job == "train" else "infer"
    loads = loads or Loads(task, model)
    device, why = _device(asked)
    said = [f"device {device} ({why})"]
    quantize = _quantize(task, model, asked, device)
    precision, why = _precision(task, model, asked, job, device=device, quantize=quantize, texts=texts, loads=loads,
                                log=log)
    said.append(f"precision {precision} ({why})")
    if quantize:  # the gate runs on the model the command then takes from `loads`
        said.append(f"quantize {quantize} ({_gate(loads.get(device, precision, quantize), texts, asked.force)})")
    prof = read_profile(asked.profile, task=task.name, mode=mode) if asked.profile else None
    key = {"model": model, "device": torch.device(device), "task": task.name, "mode": mode, "precision": precision,
           "quantize": quantize}
    max_tokens, why = _max_tokens(asked, prof, key, job, data=data, field=field, column=column, measure=measure,
                                  bulk=getattr(task, "bulk_command", "predict"), log=log)
    backend, why_backend = _backend(asked, prof, batching)
    if not sweeps:
        said += [f"max_tokens {max_tokens or 'sized from the data'} ({why})", f"backend {backend} ({why_backend})"]
    line = f"runtime{' for ' + name if name else ''}: " + ", ".join(said)
    log(line)
    return Runtime(device, precision, quantize, max_tokens, backend, line)


def _device(asked: Asked) -> tuple[str, str]:
    if asked.quantize and asked.device == "auto":
        return "cpu", f"{asked.quantize} quantization runs on CPU"
    dev = pick_device(asked.device)
    if asked.device != "auto":
        return str(dev), "as asked"
    if dev.type == "cuda":
        return str(dev), f"auto: {torch.cuda.get_device_name(dev)}"
    return str(dev), "auto: " + ("Apple MPS" if dev.type == "mps" else "no CUDA or MPS device")


def _quantize(task, model: str, asked: Asked, device: str) -> str | None:
    """The quantization asked, checked against the task, device and precision."""
    q = asked.quantize
    check_quantize(None, asked.precision, device)  # --precision int8: the line that names --quantize
    if q is not None and q in QUANTIZATIONS and q not in getattr(task, "quantizations", ()):
        raise ConfigError(f"--quantize {q} is for embedding models; {model} holds a model of task {task.name!r}")
    check_quantize(q, asked.precision, device)
    return q


def _precision(task, model: str, asked: Asked, job: str, *, device: str, quantize: str | None,
               texts: list | None, loads: Loads, log: Callable[[str], None]) -> tuple[str, str]:
    """(precision, why): fp32 under a quantization; training's policy; `auto`'s check for inference."""
    if quantize:
        return "fp32", f"{quantize} quantization computes in fp32 between its {quantize} matmuls"
    if job == "train":
        name = resolve_policy(asked.precision, device, cpu_bf16=True).name
        return name, "as asked" if asked.precision != "auto" else "auto: training's choice for this device"
    if asked.precision == "auto":
        return auto_precision(task, model, device=device, texts=texts, loads=loads, log=log)
    return resolve_policy(asked.precision, device).name, "as asked"


def _backend(asked: Asked, prof: Profile | None, batching: bool) -> tuple[str, str]:
    """(backend, why): as asked, or what the profile measured faster, or compile for a batching server."""
    measured = prof.backend.best if prof and prof.backend else None
    backend = choose_backend(asked.backend, batching=batching, measured=measured)
    if asked.backend != "auto":
        return backend, "as asked"
    if not batching:
        return backend, "auto: eager without a batching server"
    return backend, f"auto: measured faster in {asked.profile}" if measured else "auto: a batching server compiles"


def _gate(model, texts: list | None, force: bool) -> str:
    """The quantized model's quality check against fp32 (refused below its gate unless `force`)."""
    sample = usable(texts)
    cal = model.check_precision(check_sample(sample) if sample else builtin_sample(), force=force)
    below = cal["mean_cosine"] < cal["threshold"]
    least = f", min {cal['min_cosine']:.4f}" if "min_cosine" in cal else ""  # the worst text, as bf16's line says it
    return (f"mean cosine {cal['mean_cosine']:.4f}{least} to fp32 on {sample_words(cal['n'], len(sample))}, gate "
            f"{cal['threshold']}" + (", accepted by --force" if below else ""))


def _where(model: str) -> str:
    """A model as a profile names it: a directory's real path, or a name such as `tiny`."""
    return os.path.realpath(model) if os.path.exists(model) else model


def _cpus(measured: str | None, mine: str) -> tuple[str, str]:
    """(" of CPU", " of CPU") naming a profile's CPU and this one where they differ (by name, else
    whole: a cloud VM's name can be as vague as "AMD EPYC"); ("", "") where they do not, or a
    profile names none."""
    if not measured or measured == mine:
        return "", ""
    short = measured.split(" | ")[0], mine.split(" | ")[0]
    was, now = short if short[0] != short[1] else (measured, mine)
    return f" of {was}", f" of {now}"


def _max_tokens(asked: Asked, prof: Profile | None, key: dict, job: str, *, data: str | None, field: str,
                column: int | None, measure: Callable[..., dict] | None, bulk: str,
                log: Callable[[str], None]) -> tuple[int | None, str]:
    """An explicit number wins; then --profile; `auto` uses the cached profile for this model,
    device, task, mode, precision and quantization, measuring a short one (up to about 30 s) with
    `measure` when none exists; else the default of the budget table. `bulk`: the task's command that
    measures one over a file."""
    value = asked.max_tokens
    if value not in (None, "auto"):
        try:
            n = int(value)
        except ValueError:
            raise ConfigError(f"--max-tokens must be a number or 'auto', got {value!r}") from None
        if n <= 0:
            raise ConfigError("--max-tokens must be positive")
        return n, "as asked"
    if prof is not None:
        measured = " ".join(x for x in (prof.precision, prof.quantize) if x)
        running = " ".join(x for x in (key["precision"], key["quantize"]) if x)
        other = f"; measured in {measured}, this run is {running}: tune again in it" if measured and (
            measured != running) else ""  # another precision holds other memory per token
        here = device_name(key["device"])
        cpus = prof.device and prof.device.startswith("cpu") and here.startswith("cpu")
        if prof.device and prof.device != here and not cpus:
            # another device's budget may not fit this one's memory (a CPU's thread count changes none)
            other += f"; measured on {prof.device}, this run is on {here}: tune again here"
        elif cpus:  # memory holds it; its fastest budget is of other threads, or of another CPU's caches
            was, now = _cpus(prof.cpu, cpu_description())
            if prof.device != here or was:
                other += (f"; measured on {prof.device}{was}, this run is on {here}{now}: its fastest budget may "
                          "differ here (tune again here)")
        if prof.model and key["model"] and _where(prof.model) != _where(str(key["model"])):
            # another model's budget: other widths and lengths hold other memory and speed per token
            other += f"; measured for {prof.model}, this run is {key['model']}: tune again for it"
        return prof.best.max_tokens, f"from {asked.profile}{other}"
    default = None if job == "train" else default_budget(job, key["device"])
    why_default = "the default for this device" if default else "training's default"
    if value is None:
        return default, why_default
    # 'tiny' is built from the training data: its budget is of that data's model (another data's was taken)
    cached = cache_path("profiles", **key, data=data if job == "train" and key["model"] == "tiny" else None)
    if os.path.exists(cached):
        try:
            return read_profile(cached, task=key["task"], mode=key["mode"]).best.max_tokens, f"auto: cached {cached}"
        except ConfigError as e:  # a damaged cache entry is measured again, never a dead end
            log(f"max_tokens auto: the cached profile is unreadable ({e}); "
                + ("measuring it again" if data and measure is not None else "left aside"))
    if not data or measure is None:  # nothing to measure on (serve): the default, and how to get a measured one
        log(f"max_tokens auto: no cached profile for {key['model']} on this device; using the default (a "
            f"`spanflow {bulk} --model {key['model']} --input YOUR_TEXTS --output OUT --max-tokens auto` measures and "
            f"caches one; or `spanflow tune --task {key['task']} --mode {key['mode']} --model {key['model']} --data "
            "YOUR_TEXTS --out DIR` and --profile DIR/profile.json)")
        return default, f"auto: no cached profile, {why_default}"
    log("max_tokens auto: no profile for this model and device yet; measuring one (up to about 30 s)")
    prof = measure(task=key["task"], model=key["model"], data=data, mode=key["mode"], precision=key["precision"],
                   quantize=key["quantize"], device=str(key["device"]), field=field, column=column)
    kept = cache_write(write_profile, cached, prof, "measured profile")  # measure() raises where no point ran
    return int(prof["best"]["max_tokens"]), "auto: measured now" + (f", cached at {cached}" if kept else "")
