"""`--precision auto` for inference: the fastest precision that keeps the model's results.

Where the device runs a reduced precision natively (bf16 on CPUs with AVX512-BF16/AMX and on
GPUs that have it, fp16 on older GPUs), the model runs once in fp32 and once in that
precision on a sample of the input, and the task's agreement measure (embeddings: mean
cosine; NER: entity F1; relations: triple F1, fp32's results taken as gold) must reach the
task's gate. Otherwise fp32. The verdict is cached per model, device and precision beside
the tune profiles and printed, so the check runs once. Without input to check on (serve), a
few built-in sentences stand in, and the next run on real input checks again.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

from spanflow.training.precision import pick_device, resolve_policy
from spanflow.tuning.profile import cache_path

SAMPLE = 256  # texts of the input the check runs on


def auto_precision(path: str, *, task, device: str = "auto", texts: list[str] | None = None,
                   log: Callable[[str], None] = print) -> str:
    """The precision `--precision auto` runs `path` in on `device`: fp32, or the device's reduced
    precision where it passed the task's check (on `texts`, or an earlier run's cached verdict)."""
    candidate = resolve_policy("auto", device, cpu_bf16=True).name
    gate = getattr(task, "precision_gate", None)
    if candidate == "fp32" or gate is None:  # nothing faster here, or a task without an agreement measure
        return "fp32"
    cached = cache_path(path, pick_device(device), task.name, "infer-precision", candidate)
    texts = [t for t in (texts or []) if isinstance(t, str) and t.strip()][:SAMPLE]
    verdict = _read_verdict(cached, log)
    if verdict and (verdict["source"] == "input" or not texts):  # a check on real input stands
        return _say(verdict, log, "checked before")
    source = "input"
    if not texts:  # serve has no input: built-in sentences, until a run on real input checks again
        from spanflow.data.synthetic import synthetic_ner

        texts, source = [e.text for e in synthetic_ner(64, seed=7, max_clauses=3)], "sample"
    ref = list(task.load(path, device=device, precision="fp32").predict_stream(texts))
    got = list(task.load(path, device=device, precision=candidate).predict_stream(texts))
    score = float(task.agreement(ref, got))
    verdict = {"precision": candidate, "measure": task.agreement_name, "score": score, "gate": gate,
               "n": len(texts), "passed": score >= gate, "source": source}
    from spanflow.atomic import atomic_open

    with atomic_open(cached) as f:
        json.dump(verdict, f, indent=2)
    return _say(verdict, log, f"on {len(texts)} {'input' if source == 'input' else 'built-in sample'} texts")


VERDICT_KEYS = {"precision", "measure", "score", "gate", "n", "passed", "source"}


def _read_verdict(path: str, log: Callable[[str], None]) -> dict | None:
    """A cached verdict, or None (none yet, or unreadable: said, and the check runs again)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            verdict = json.load(f)
    except (OSError, ValueError) as e:
        log(f"precision auto: the cached verdict {path} is unreadable ({str(e)[:100]}); checking again")
        return None
    if not isinstance(verdict, dict) or not VERDICT_KEYS <= set(verdict):
        log(f"precision auto: the cached verdict {path} is incomplete; checking again")
        return None
    return verdict


def _say(v: dict, log: Callable[[str], None], where: str) -> str:
    if v["passed"]:
        log(f"precision auto: {v['precision']} ({v['measure']} {v['score']:.4f} to fp32 {where}, gate {v['gate']})")
        return v["precision"]
    log(f"precision auto: fp32 ({v['precision']} reached {v['measure']} {v['score']:.4f} to fp32 {where}, below "
        f"the gate {v['gate']})")
    return "fp32"


def infer_precision(precision: str, path: str, device: str = "auto", texts: list | None = None) -> str:
    """The precision a model runs in: as asked, or for `auto` auto_precision's choice (said on
    stderr: stdout may be a result, as with evaluate --json)."""
    if precision != "auto":
        return precision
    from spanflow.tasks.registry import task_of_dir

    return auto_precision(path, task=task_of_dir(path), device=device, texts=texts,
                          log=lambda s: print(s, file=sys.stderr))
