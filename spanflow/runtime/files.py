"""The files runtime choices are read from: profile.json (written by `spanflow tune`, and
cached by `--max-tokens auto`) and the cached precision verdicts of `--precision auto`.
Each has a pydantic model; a file that does not fit is an error naming the file, the field
and the value found there."""
from __future__ import annotations

import json
import os
import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from spanflow.atomic import atomic_open
from spanflow.errors import ConfigError
from spanflow.schemas import NonNegativeInt, PositiveInt, explain


class Point(BaseModel):
    """One measured (budget, max length) of a profile; the sweep's Point, as stored."""

    model_config = ConfigDict(extra="allow")

    max_tokens: PositiveInt
    max_length: PositiveInt | None = None
    real_tokens_per_s: float | None = None
    quality: float | None = None
    oom: bool = False


class BackendChoice(BaseModel):
    """Eager against compiled at the best point (`spanflow tune --mode infer`)."""

    eager: float | None = None
    compile: float | None = None
    compile_s: float | None = None
    best: Literal["eager", "compile"]


class Profile(BaseModel):
    """profile.json: what was measured, for which model, task and mode, and the best point."""

    model_config = ConfigDict(extra="allow")

    device: str | None = None
    cpu: str | None = None  # the CPU measured on (runtime.cache.cpu_description), where the device is one
    model: str | None = None
    task: str | None = None
    mode: Literal["train", "infer"] | None = None
    precision: Literal["fp32", "bf16", "fp16"] | None = None  # what tune ran in (the policy's name)
    quantize: Literal["int8"] | None = None
    best: Point | None = None
    points: list[Point] = []
    backend: BackendChoice | None = None


class Verdict(BaseModel):
    """The cached result of one `--precision auto` check."""

    precision: Literal["bf16", "fp16"]  # the reduced precision that was checked against fp32
    measure: str  # the task's agreement measure: "entity F1", "mean cosine", ...
    score: float
    gate: float
    n: NonNegativeInt  # texts checked on
    passed: bool
    source: Literal["input", "sample"]  # the command's input, or built-in sentences (serve)
    inputs: NonNegativeInt | None = None  # of the n, texts of the input (None, older files: all n)
    compared: NonNegativeInt | None = None  # results fp32 found to compare with (0: nothing, no pass)


def load_json(path: str, what: str):
    """The parsed JSON of `path`; ConfigError when absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {path} is unreadable: {e}") from None


def read_profile(path: str, *, task: str | None = None, mode: str | None = None) -> Profile:
    """A profile with a usable best point; a task/mode mismatch is an error."""
    if os.path.isdir(path):  # tune's --out, given for the file it wrote there
        inside = os.path.join(path, "profile.json")
        raise ConfigError(f"profile {path} is a directory" + (f"; give the profile tune wrote in it: {inside}"
                                                             if os.path.isfile(inside) else ""))
    try:
        prof = Profile.model_validate(load_json(path, "profile"))
    except ValidationError as e:
        raise ConfigError(f"profile {path}: {explain(e)}") from None
    if prof.best is None:
        raise ConfigError(f"profile {path} has no best point (every point ran out of memory or broke a limit)")
    if prof.best.oom:  # tune never picks one: a hand-edited file would run a budget known not to fit
        raise ConfigError(f"profile {path}: its best point (max_tokens {prof.best.max_tokens}) ran out of memory")
    for k, v in (("task", task), ("mode", mode)):
        if v and getattr(prof, k) and getattr(prof, k) != v:
            raise ConfigError(f"profile {path} was measured for {k} {getattr(prof, k)!r}, not {v!r}")
    return prof


def write_profile(path: str, profile: dict) -> None:
    """profile.json as tune measured it (written aside, then renamed into place)."""
    with atomic_open(path) as f:
        json.dump(profile, f, indent=2)


def read_verdict(path: str) -> Verdict:
    """A cached verdict; ConfigError saying what is wrong with it (the check then runs again)."""
    data = load_json(path, "cached verdict")
    try:
        return Verdict.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"cached verdict {path} is incomplete ({explain(e)})") from None


def write_verdict(path: str, verdict: Verdict) -> None:
    with atomic_open(path) as f:
        f.write(verdict.model_dump_json(indent=2))


def cache_write(write, path: str, value, what: str) -> bool:
    """`write(path, value)` for a cache ($SPANFLOW_CACHE): best effort. A cache that cannot be
    written (full, read-only) is one warning naming it; the command goes on without it."""
    try:
        write(path, value)
        return True
    except (OSError, ConfigError) as e:
        logging.getLogger("spanflow").warning("could not cache the %s at %s (%s); it is measured again next time",
                                              what, path, getattr(e, "strerror", None) or e)
        return False
