"""Entity-level precision / recall / F1 on exact character spans, overall and per label."""
from __future__ import annotations

from collections import Counter

from spanflow.data.examples import Span


def prf(tp: int, n_pred: int, n_gold: int) -> dict:
    """Precision, recall, F1 and support from counts."""
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"f1": f, "precision": p, "recall": r, "support": n_gold}


def prf_by_key(gold: list[set], pred: list[set], key) -> tuple[dict, dict]:
    """Overall P/R/F1 of exact matches between gold and predicted sets, and per `key(item)`."""
    tp, npred, ngold = Counter(), Counter(), Counter()
    for g, p in zip(gold, pred, strict=True):
        ngold.update(key(x) for x in g)
        npred.update(key(x) for x in p)
        tp.update(key(x) for x in g & p)
    overall = prf(sum(tp.values()), sum(npred.values()), sum(ngold.values()))
    return overall, {k: prf(tp[k], npred[k], ngold[k]) for k in sorted(set(ngold) | set(npred))}


def span_prf(gold: list[list[Span]], pred: list[list[Span]]) -> dict:
    """{"f1", "precision", "recall", "support", "per_label": {label: {...}}}; a span counts
    only when start, end and label all match."""
    out, per_label = prf_by_key([set(map(tuple, g)) for g in gold], [set(map(tuple, p)) for p in pred],
                                key=lambda s: s[2])
    out["per_label"] = per_label
    return out


def unknown_names(known: list[str], gold: set[str], what: str) -> list[str]:
    """The warning for labelled data that names `what` (labels, relations) the model was not
    trained on: each of them counts as a miss. [] when the model knows every one."""
    unknown = sorted(gold - set(known))
    if not unknown:
        return []

    def near(name: str) -> str:  # "person" for a model's PER: the same name spelt another way?
        low = name.lower()
        k = next((k for k in sorted(known) if k.lower() == low or low.startswith(k.lower())
                  or k.lower().startswith(low)), None)
        return f"{name} (the model's {k}?)" if k else name

    def listed(names: list[str], fmt=str) -> str:
        return ", ".join(fmt(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")

    if not gold & set(known):
        return [f"none of the data's {what} is one the model was trained on ({listed(sorted(known))}): every "
                f"one counts as a miss and F1 is 0; check that model and data match: {listed(unknown, near)}"]
    verb = "is not the model's and counts as a miss" if len(unknown) == 1 else "are not the model's and count as misses"
    return [f"{len(unknown)} of the data's {what} {verb}: {listed(unknown, near)}"]


def with_warning(metrics: dict, line: str | None) -> dict:
    """`metrics` with `line` added to its "warnings" (none where `line` is None)."""
    return {**metrics, "warnings": [*metrics.get("warnings", []), line]} if line else metrics


def with_unknown(metrics: dict, known: list[str], gold: set[str], what: str) -> dict:
    """`metrics` with its "warnings" (unknown_names) where the data names `what` the model lacks."""
    warnings = unknown_names(known, gold, what)
    return {**metrics, "warnings": warnings} if warnings else metrics


def agreement_f1(ref: list, got: list) -> float:
    """F1 of `got` against `ref` taken as gold, over any hashable items per text (spans,
    triples); 1.0 when neither has any."""
    ref_sets, got_sets = [set(map(_hashable, r)) for r in ref], [set(map(_hashable, g)) for g in got]
    n_ref, n_got = sum(map(len, ref_sets)), sum(map(len, got_sets))
    if not n_ref and not n_got:
        return 1.0
    hit = sum(len(r & g) for r, g in zip(ref_sets, got_sets))
    return 2 * hit / (n_ref + n_got)


def _hashable(x):
    return tuple(_hashable(v) for v in x) if isinstance(x, (list, tuple)) else x


def format_table(m: dict, name: str = "label") -> str:
    """A per-label table for the terminal, `name` heading the first column; every column as wide
    as its widest cell, so that long label names keep the columns aligned."""
    cells = [[name, "precision", "recall", "f1", "support"]]
    for lab, r in [*m["per_label"].items(), ("overall", m)]:
        cells.append([str(lab), f"{r['precision']:.4f}", f"{r['recall']:.4f}", f"{r['f1']:.4f}", str(r["support"])])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(" ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])])
                     for row in cells)
