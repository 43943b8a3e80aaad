"""Triple precision / recall / F1: exact (subject text, relation, object text) and the
"partial" last-word match used by published WebNLG*/NYT* numbers."""
from __future__ import annotations

from spanflow.tasks.metrics import prf_by_key


def _last_word(s: str) -> str:
    parts = s.split()
    return parts[-1] if parts else s


def partial(t: tuple[str, str, str]) -> tuple[str, str, str]:
    return (_last_word(t[0]), t[1], _last_word(t[2]))


def triple_prf(gold: list[set], pred: list[set], *, per_relation: bool = False) -> dict:
    out, per = prf_by_key(gold, pred, key=lambda t: t[1])
    if per_relation:
        out["per_relation"] = per
    return out


def re_metrics(gold: list[set], pred: list[set]) -> dict:
    """Exact match at top level, plus "partial" (last word of subject and object) and per relation."""
    out = triple_prf(gold, pred, per_relation=True)
    out["partial"] = triple_prf([{partial(t) for t in g} for g in gold], [{partial(t) for t in p} for p in pred])
    out["partial"]["note"] = "last-word match of subject and object (WebNLG*/NYT* convention)"
    return out
