"""Triple precision / recall / F1: exact (subject text, relation, object text) and the
"partial" last-word match used by published WebNLG*/NYT* numbers."""
from __future__ import annotations

from collections import Counter


def _prf(tp: int, npred: int, ngold: int) -> dict:
    p = tp / npred if npred else 0.0
    r = tp / ngold if ngold else 0.0
    return {"f1": 2 * p * r / (p + r) if p + r else 0.0, "precision": p, "recall": r, "support": ngold}


def _last_word(s: str) -> str:
    parts = s.split()
    return parts[-1] if parts else s


def partial(t: tuple[str, str, str]) -> tuple[str, str, str]:
    return (_last_word(t[0]), t[1], _last_word(t[2]))


def triple_prf(gold: list[set], pred: list[set], *, per_relation: bool = False) -> dict:
    tp, npred, ngold = Counter(), Counter(), Counter()
    for g, p in zip(gold, pred, strict=True):
        for t in g:
            ngold[t[1]] += 1
        for t in p:
            npred[t[1]] += 1
        for t in g & p:
            tp[t[1]] += 1
    out = _prf(sum(tp.values()), sum(npred.values()), sum(ngold.values()))
    if per_relation:
        out["per_relation"] = {r: _prf(tp[r], npred[r], ngold[r]) for r in sorted(set(ngold) | set(npred))}
    return out


def re_metrics(gold: list[set], pred: list[set]) -> dict:
    """Exact match at top level, plus "partial" (last word of subject and object) and per relation."""
    out = triple_prf(gold, pred, per_relation=True)
    out["partial"] = triple_prf([{partial(t) for t in g} for g in gold], [{partial(t) for t in p} for p in pred])
    out["partial"]["note"] = "last-word match of subject and object (WebNLG*/NYT* convention)"
    return out
