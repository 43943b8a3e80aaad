"""`--precision auto` for inference: the fastest precision that keeps the model's results.

Where the device runs a reduced precision natively (bf16 on CPUs with AVX512-BF16/AMX and on
GPUs that have it, fp16 on older GPUs), the model runs once in fp32 and once in that
precision on a sample of the input, and the task's agreement measure (embeddings: mean
cosine; NER: entity F1; relations: triple F1, fp32's results taken as gold) must reach the
task's gate. Otherwise fp32.

The sample is sized so that the verdict means something: up to SAMPLE texts of the input, and
at least MIN_SAMPLE (an input with fewer is topped up with built-in sentences, and the line
says so). Where fp32 finds nothing at all on the sample (no entity, no triple), there is
nothing to agree on: no pass, fp32. The verdict is cached per model, device and precision
beside the tune profiles; a later run takes it unless its sample (up to SAMPLE texts of its
input) is more than GROWTH times the input texts the verdict was checked on: a verdict checked
on SAMPLE / GROWTH texts or more stands for any input, whose check would take SAMPLE again.
Without input to check on (serve, the Python API's load), built-in sentences stand in, and the
next run on real input checks again.

The models the check runs come from a `Loads`, so the command then runs the chosen one
without loading it again.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from spanflow.errors import ConfigError, counted
from spanflow.runtime.cache import cache_path
from spanflow.runtime.files import Verdict, cache_write, read_verdict, write_verdict
from spanflow.runtime.loads import Loads
from spanflow.runtime.policy import pick_device, resolve_policy

SAMPLE = 256  # texts of the input the check runs on, at most
MIN_SAMPLE = 64  # texts it runs on, at least: fewer input texts are topped up with built-in sentences
GROWTH = 4  # a verdict stands for a sample of up to this many times the input texts it was checked on
logger = logging.getLogger("spanflow")


def builtin_sample() -> list[str]:
    """The sentences a check runs on when the command has no input (serve), or too little."""
    from spanflow.data.synthetic import synthetic_ner

    return [e.text for e in synthetic_ner(MIN_SAMPLE, seed=7, max_clauses=3)]


def usable(texts: list | None) -> list[str]:
    """Up to SAMPLE non-empty texts (records that failed to parse come as None)."""
    return [t for t in (texts or []) if isinstance(t, str) and t.strip()][:SAMPLE]


def check_sample(texts: list[str]) -> list[str]:
    """`texts` (usable ones), topped up with built-in sentences to MIN_SAMPLE."""
    return texts + builtin_sample()[:max(0, MIN_SAMPLE - len(texts))]


def sample_words(n: int, inputs: int) -> str:
    """How a check's sample of `n` texts, `inputs` of them from the input, is told."""
    if not inputs:
        return f"{n} built-in sample texts"
    if inputs < n:
        return (f"{counted(inputs, 'input text')} and {counted(n - inputs, 'built-in sentence')} (the input has "
                f"fewer than {MIN_SAMPLE})")
    return counted(n, "input text")


def auto_precision(task, path: str, *, device: str, texts: list | None = None, loads: Loads | None = None,
                   log: Callable[[str], None] = print) -> tuple[str, str]:
    """(precision, why) for `--precision auto`: fp32, or the device's reduced precision where it
    passed the task's check (on `texts`, or an earlier run's cached verdict)."""
    candidate = resolve_policy("auto", device, cpu_bf16=True).name
    gate = getattr(task, "precision_gate", None)
    if candidate == "fp32":
        return "fp32", "auto: no faster precision runs natively here"
    if gate is None:
        return "fp32", f"auto: a model of task {task.name!r} has no agreement measure to check {candidate} by"
    cached = cache_path("verdicts", model=path, device=pick_device(device), task=task.name, mode="infer",
                        precision=candidate)
    texts = usable(texts)
    verdict = _cached(cached, log)
    if verdict and _stands(verdict, len(texts)):
        return _said(verdict, earlier=True)
    sample = check_sample(texts) if texts else builtin_sample()
    loads = loads or Loads(task, path)
    ref = list(loads.get(device, "fp32").predict_stream(sample))
    got = list(loads.get(device, candidate).predict_stream(sample))
    compared = found(ref)
    score = float(task.agreement(ref, got)) if compared else 0.0
    verdict = Verdict(precision=candidate, measure=task.agreement_name, score=score, gate=gate, n=len(sample),
                      passed=bool(compared) and score >= gate, source="input" if texts else "sample",
                      inputs=len(texts), compared=compared)
    cache_write(write_verdict, cached, verdict, "precision verdict")
    return _said(verdict)


def found(results: list) -> int:
    """What fp32's results hold to compare: the items of list results (spans, triples), one for
    any other result (an embedding)."""
    return sum(len(r) if isinstance(r, (list, tuple)) else 1 for r in results)


def _stands(v: Verdict, n_texts: int) -> bool:
    """Whether a cached verdict answers for an input of `n_texts` usable texts: any verdict where
    there is no input; a check on input for an input up to GROWTH times its input texts."""
    if not n_texts:
        return True
    inputs = v.n if v.inputs is None else v.inputs
    return v.source == "input" and n_texts <= GROWTH * inputs


def _cached(path: str, log: Callable[[str], None]) -> Verdict | None:
    """A cached verdict, or None (none yet, or unreadable or incomplete: said, and checked again)."""
    if not os.path.exists(path):
        return None
    try:
        return read_verdict(path)
    except ConfigError as e:
        log(f"precision auto: the {e}; checking again")
        return None


def _said(v: Verdict, earlier: bool = False) -> tuple[str, str]:
    """(precision, why) of verdict `v`; `earlier`: cached by an earlier run, whose input the texts were
    (another file, perhaps), not this one's."""
    where = "on " + sample_words(v.n, v.n if v.inputs is None and v.source == "input" else v.inputs or 0)
    where += " (an earlier run's check)" if earlier else ""
    if v.compared == 0:
        return "fp32", (f"auto: the {v.precision} check had nothing to compare: the model found nothing in fp32 "
                        f"{where}; fp32 kept")
    if v.compared is not None and v.compared != v.n:  # spans or triples: how few the score rests on
        where += f", where fp32 found {v.compared}"
    if v.passed:
        return v.precision, f"auto: {v.measure} {v.score:.4f} to fp32 {where}, gate {v.gate}"
    return "fp32", (f"auto: {v.precision} reached {v.measure} {v.score:.4f} to fp32 {where}, below the gate "
                    f"{v.gate}")


def load_auto(task, path: str, *, device: str = "auto") -> Any:
    """The model of `path` in what `--precision auto` picks for it: an earlier run's cached verdict,
    or the check on built-in sentences (as `spanflow serve` and the spaCy component make it). The
    Python API's `load(path)` (precision="auto") comes here; its choice is logged on the "spanflow"
    logger and is the model's `policy.name`."""
    loads = Loads(task, path)
    precision, why = auto_precision(task, path, device=device, loads=loads, log=logger.warning)
    logger.info("%s: precision %s (%s)", path, precision, why)
    return loads.get(device, precision)
