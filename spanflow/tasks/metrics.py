"""Entity-level precision / recall / F1 on exact character spans, overall and per label."""
from __future__ import annotations

from collections import Counter

from spanflow.data.examples import Span


def _prf(tp: int, n_pred: int, n_gold: int) -> dict:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"f1": f, "precision": p, "recall": r, "support": n_gold}


def span_prf(gold: list[list[Span]], pred: list[list[Span]]) -> dict:
    """{"f1", "precision", "recall", "support", "per_label": {label: {...}}}; a span counts
    only when start, end and label all match."""
    tp, npred, ngold = Counter(), Counter(), Counter()
    for g, p in zip(gold, pred, strict=True):
        gs, ps = set(map(tuple, g)), set(map(tuple, p))
        for s in gs:
            ngold[s[2]] += 1
        for s in ps:
            npred[s[2]] += 1
        for s in gs & ps:
            tp[s[2]] += 1
    out = _prf(sum(tp.values()), sum(npred.values()), sum(ngold.values()))
    labels = sorted(set(ngold) | set(npred))
    out["per_label"] = {lab: _prf(tp[lab], npred[lab], ngold[lab]) for lab in labels}
    return out


def format_table(m: dict) -> str:
    """A per-label table for the terminal."""
    rows = [f"{'label':<20} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>8}"]
    for lab, r in m["per_label"].items():
        rows.append(f"{lab:<20} {r['precision']:>9.4f} {r['recall']:>9.4f} {r['f1']:>9.4f} {r['support']:>8}")
    rows.append(f"{'overall':<20} {m['precision']:>9.4f} {m['recall']:>9.4f} {m['f1']:>9.4f} {m['support']:>8}")
    return "\n".join(rows)
