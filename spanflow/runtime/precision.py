"""`--precision auto` for inference: the fastest precision that keeps the model's results.

Where the device runs a reduced precision natively (bf16 on CPUs with AVX512-BF16/AMX and on
GPUs that have it, fp16 on older GPUs), the model runs once in fp32 and once in that
precision on a sample of the input, and the task's agreement measure (embeddings: mean
cosine; NER: entity F1; relations: triple F1, fp32's results taken as gold) must reach the
task's gate. Otherwise fp32. The verdict is cached per model, device and precision beside
the tune profiles, so the check runs once. Without input to check on (serve), a few
built-in sentences stand in, and the next run on real input checks again.

The models the check runs come from a `Loads`, so the command then runs the chosen one
without loading it again.
"""
from __future__ import annotations

import os
from collections.abc import Callable

from spanflow.errors import ConfigError
from spanflow.runtime.cache import cache_path
from spanflow.runtime.files import Verdict, read_verdict, write_verdict
from spanflow.runtime.loads import Loads
from spanflow.runtime.policy import pick_device, resolve_policy

SAMPLE = 256  # texts of the input the check runs on


def builtin_sample() -> list[str]:
    """The sentences a check runs on when the command has no input (serve)."""
    from spanflow.data.synthetic import synthetic_ner

    return [e.text for e in synthetic_ner(64, seed=7, max_clauses=3)]


def usable(texts: list | None) -> list[str]:
    """Up to SAMPLE non-empty texts (records that failed to parse come as None)."""
    return [t for t in (texts or []) if isinstance(t, str) and t.strip()][:SAMPLE]


def auto_precision(task, path: str, *, device: str, texts: list | None = None, loads: Loads | None = None,
                   log: Callable[[str], None] = print) -> tuple[str, str]:
    """(precision, why) for `--precision auto`: fp32, or the device's reduced precision where it
    passed the task's check (on `texts`, or an earlier run's cached verdict)."""
    candidate = resolve_policy("auto", device, cpu_bf16=True).name
    gate = getattr(task, "precision_gate", None)
    if candidate == "fp32":
        return "fp32", "auto: no faster precision runs natively here"
    if gate is None:
        return "fp32", f"auto: a {task.name} model has no agreement measure to check {candidate} by"
    cached = cache_path("verdicts", model=path, device=pick_device(device), task=task.name, mode="infer",
                        precision=candidate)
    texts = usable(texts)
    verdict = _cached(cached, log)
    if verdict and (verdict.source == "input" or not texts):  # a check on real input stands
        return _said(verdict, "checked before")
    source = "input"
    if not texts:  # serve has no input: built-in sentences, until a run on real input checks again
        texts, source = builtin_sample(), "sample"
    loads = loads or Loads(task, path)
    ref = list(loads.get(device, "fp32").predict_stream(texts))
    got = list(loads.get(device, candidate).predict_stream(texts))
    score = float(task.agreement(ref, got))
    verdict = Verdict(precision=candidate, measure=task.agreement_name, score=score, gate=gate, n=len(texts),
                      passed=score >= gate, source=source)
    write_verdict(cached, verdict)
    return _said(verdict, f"on {len(texts)} {'input' if source == 'input' else 'built-in sample'} texts")


def _cached(path: str, log: Callable[[str], None]) -> Verdict | None:
    """A cached verdict, or None (none yet, or unreadable or incomplete: said, and checked again)."""
    if not os.path.exists(path):
        return None
    try:
        return read_verdict(path)
    except ConfigError as e:
        log(f"precision auto: the {e}; checking again")
        return None


def _said(v: Verdict, where: str) -> tuple[str, str]:
    if v.passed:
        return v.precision, f"auto: {v.measure} {v.score:.4f} to fp32 {where}, gate {v.gate}"
    return "fp32", (f"auto: {v.precision} reached {v.measure} {v.score:.4f} to fp32 {where}, below the gate "
                    f"{v.gate}")
